"""Typed settings of a Training-Free GRPO run (Prefect UI form fields and `gym train` flags).

Defaults follow the paper: groups of G=5 rollouts, 3 epochs, experiences of at most 32 words.
Three roles call LLMs: the policy (answers questions with the library in its system prompt), the
optimizer (summarize, extract, consolidate) and the judge (reward = LLM verdict). Each role
takes an OpenAI-compatible endpoint or, without one, runs the model locally through transformers;
unset fields of the optimizer and judge fall back to the policy's (the paper uses one model).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gym import secrets
from gym.errors import ConfigError

Reward = Literal["auto", "exact", "numeric", "judge", "majority"]
ROLES = ("policy", "optimizer", "judge")


def _http_url(value: str | None) -> str | None:
    """An endpoint the OpenAI client can call: `not-a-url` ran a whole default run of failing calls."""
    if value is not None:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("an http(s) URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1")
        if secrets.url_credentials(value):
            raise ValueError(
                "the URL may hold a credential (a user part, or a key-like parameter; not shown): the "
                "endpoint is kept in Prefect's parameters and MLflow, so give it without one and put the "
                "key in the environment variable api_key_env names (OPENAI_API_KEY unless set)"
            )
    return value


Endpoint = Annotated[str | None, AfterValidator(_http_url)]


class RoleSettings(BaseModel):
    """One LLM role: where it runs and how it samples. Unset fields fall back (see the module doc)."""

    model_config = ConfigDict(extra="forbid")

    endpoint: Endpoint = Field(
        None, description="OpenAI-compatible base URL (…/v1); unset: the run's endpoint, else a local model."
    )
    model: str | None = Field(
        None,
        description="Model name at the endpoint, or a registry model / checkpoint dir to run locally; "
        "unset: the run's model.",
    )
    api_key_env: secrets.EnvName = Field(
        None, description="Environment variable holding the API key (never the key itself)."
    )
    temperature: float | None = Field(None, ge=0, description="Sampling temperature (0 = greedy).")
    max_tokens: int | None = Field(None, ge=1, description="Most tokens per reply.")
    concurrency: int | None = Field(None, ge=1, description="Most calls in flight to this role's endpoint.")
    max_n: int | None = Field(
        None, ge=1, description="Samples one request may ask for (`n`); 1 for APIs without `n` (DeepSeek)."
    )
    timeout_s: float | None = Field(None, gt=0, description="Seconds before one HTTP request times out.")
    max_retries: int | None = Field(
        None, ge=0, description="Retries (with backoff) on 429, 5xx but 501, and timeouts."
    )
    price_prompt: float | None = Field(None, ge=0, description="USD per million prompt tokens (cost ledger).")
    price_completion: float | None = Field(
        None, ge=0, description="USD per million completion tokens (cost ledger)."
    )


class ResolvedRole(BaseModel):
    """A role with every field decided."""

    model_config = ConfigDict(frozen=True)

    name: str
    endpoint: str | None
    model: str
    api_key_env: str
    temperature: float
    max_tokens: int
    concurrency: int
    max_n: int
    timeout_s: float
    max_retries: int
    price_prompt: float
    price_completion: float


ROLE_DEFAULTS = {
    "policy": {"temperature": 0.7, "max_tokens": 512},
    "optimizer": {"temperature": 0.3, "max_tokens": 1024},
    "judge": {"temperature": 0.0, "max_tokens": 8},
}


class TfGrpoSettings(BaseModel):
    """Training-Free GRPO: learn an experience library (in context) instead of weights."""

    model_config = ConfigDict(extra="forbid")

    endpoint: Endpoint = Field(
        None, description="OpenAI-compatible base URL serving the model (…/v1); unset: run it locally."
    )
    api_key_env: Annotated[str, AfterValidator(secrets.env_name)] = Field(
        "OPENAI_API_KEY", description="Environment variable holding the API key (never the key itself)."
    )
    group_size: int = Field(5, ge=1, description="Rollouts per question (G).")
    epochs: int = Field(3, ge=1, description="Passes over the training questions.")
    batch_size: int = Field(8, ge=1, description="Questions per step (one consolidation per step).")
    max_train_questions: int | None = Field(
        100, ge=1, description="Use the first N training questions (the paper learns from 100)."
    )
    reward: Reward = Field(
        "auto",
        description="auto (numeric match if the answer is a number, else exact), exact, numeric, judge "
        "(LLM verdict), majority (no ground truth: agreement with the group's majority answer).",
    )
    eps: float = Field(1e-6, ge=0, description="A group is informative when max - min reward exceeds this.")
    max_items: int = Field(100, ge=1, description="Cap on the library's experiences.")
    max_words: int = Field(32, ge=1, description="Cap on the words of one experience.")
    max_ops_per_group: int = Field(3, ge=1, description="Operations the extract stage may propose per group.")
    retrieval_top_k: int | None = Field(
        None,
        ge=1,
        description="Once the library is larger, inject only the k experiences most similar to the "
        "question (all-MiniLM-L6-v2, `embed` extra); unset: inject them all.",
    )
    seed: int = Field(42, description="Seed of batch order and of every sampled call.")
    eval_samples: int = Field(4, ge=1, description="Samples per held-out question for Mean@k / Pass@k.")
    max_eval_questions: int | None = Field(
        50, ge=1, description="Evaluate on the first N held-out questions."
    )
    budget_tokens: int | None = Field(None, ge=1, description="Stop (resumably) after this many paid tokens.")
    budget_usd: float | None = Field(None, gt=0, description="Stop (resumably) after this much paid cost.")
    retry_degraded: bool = Field(
        True, description="On resume, redo steps that ended degraded (with fresh optimizer calls)."
    )
    experience_lib_path: str | None = Field(
        None,
        description="Also write the library (the final one as experiences.json, every version) to this "
        "directory. A library already there is the starting point (a new run), unless it is this same "
        "command's output: then the run resumes.",
    )
    policy: RoleSettings = Field(default_factory=RoleSettings, description="The model answering questions.")
    optimizer: RoleSettings = Field(
        default_factory=RoleSettings, description="The model that summarizes, extracts and consolidates."
    )
    judge: RoleSettings = Field(default_factory=RoleSettings, description="The model judging answers.")

    def role(self, name: str, model: str | None) -> ResolvedRole:
        """The role `name` with fallbacks applied.

        Where it runs (endpoint, model, key, limits, prices): its own field, else the policy's, else
        the run's. How it samples (temperature, max tokens): its own field, else the role's default.
        """
        own: RoleSettings = getattr(self, name)

        def shared(field: str) -> Any:
            mine = getattr(own, field)
            return mine if mine is not None else getattr(self.policy, field)

        def sampling(field: str) -> Any:
            mine = getattr(own, field)
            return mine if mine is not None else ROLE_DEFAULTS[name][field]

        endpoint = shared("endpoint") or self.endpoint
        chosen_model = shared("model") or model
        if chosen_model is None:
            raise ConfigError(f"TF-GRPO role {name!r} has no model: pass --model (or --{name}.model)")
        local = endpoint is None
        retries = shared("max_retries")
        return ResolvedRole(
            name=name,
            endpoint=endpoint,
            model=chosen_model,
            api_key_env=shared("api_key_env") or self.api_key_env,
            temperature=float(sampling("temperature")),
            max_tokens=int(sampling("max_tokens")),
            concurrency=int(shared("concurrency") or (1 if local else 8)),
            max_n=int(shared("max_n") or (64 if local else 1)),
            timeout_s=float(shared("timeout_s") or 120.0),
            max_retries=int(retries if retries is not None else 4),
            price_prompt=float(shared("price_prompt") or 0.0),
            price_completion=float(shared("price_completion") or 0.0),
        )

    def learning_fields(self) -> dict[str, Any]:
        """The settings that decide what a run learns (not budgets, timeouts, limits or evaluation)."""
        return self.model_dump(
            exclude={
                "policy", "optimizer", "judge", "budget_tokens", "budget_usd", "retry_degraded",
                "experience_lib_path", "eval_samples", "max_eval_questions", "api_key_env", "endpoint",
            }
        )  # fmt: skip
