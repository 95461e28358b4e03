"""Flow parameters as typed configs: the Prefect UI renders a form from them, `gym train`
turns each field into a flag, and tasks receive the parts they need.

Defaults run the embedded gym-tiny on the demo data in a few minutes on a CPU.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gym.cli_options import merge
from gym.data.registry import AUTO, held_out
from gym.data.tokenize import TokenizeSettings
from gym.errors import ConfigError
from gym.eval.suite import BenchmarkOptions
from gym.secrets import NO_LOGIN_ITEMS, NO_LOGIN_SCHEMA
from gym.tfgrpo.config import TfGrpoSettings
from gym.train.config import SCORING_METHODS, TrainConfig
from gym.train.rl_config import ONLINE_METHODS
from gym.train.warm_start import WarmStart

# Learning rate, epochs and batch size come from the model's registry `train_defaults` (gym-tiny's
# were measured with scripts/check_demo_learnable.py) unless set here or on the command line.
DEFAULT_SFT = TrainConfig(method="sft", save_steps=500)
DEFAULT_DPO = TrainConfig(method="dpo")


def registry_choices(kind: str, other: str) -> Any:
    """JSON Schema for a form (the Prefect UI): pick a registry name from a list, or switch to `other` and
    type any value (validation is unchanged: any string)."""

    def extra(schema: dict[str, Any]) -> None:
        if kind == "model":
            from gym.registry import load_models

            names = list(load_models())
        else:
            from gym.data.registry import load_registry

            names = list(load_registry())
        schema.pop("type", None)
        schema["anyOf"] = [
            {"type": "string", "enum": names, "title": "registry"},
            {"type": "string", "title": other, **NO_LOGIN_SCHEMA},  # a URL's login: not in a parameter
        ]

    return extra


def unscored(what: str, dataset: str, flag: str) -> str:
    return (
        f"no {what}: {dataset} is not a demo dataset, and the demo's held-out data would score your model "
        f"on tasks it did not train for; name held-out data of your own with {flag} FILE_OR_NAME"
    )


class OutputSettings(BaseModel):
    """Where the result goes once trained."""

    model_config = ConfigDict(extra="forbid")

    register_as: str | None = Field(
        None, description="MLflow registered-model name; default: '<model>-<flow>' (e.g. gym-tiny-sft-dpo)."
    )
    alias: str = Field(
        "challenger", description="Alias set on the new model version (promotion is a later step)."
    )
    output_dir: str | None = Field(
        None,
        description="Also copy the final model directory here (a local folder).",
        json_schema_extra=NO_LOGIN_SCHEMA,
    )
    promote_metric: str | None = Field(
        None,
        description="Then promote the new version to `champion` if it beats the current one on this score "
        "(exact_match_after, mmlu_after, mmlu_after.stem, <method>_reward_accuracy, <method>_loss_last...; "
        "see gym/lineage.py); None: never promote.",
    )
    promote_margin: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="Promotion needs a win by more than this margin."
    )
    promote_mode: Literal["auto", "max", "min"] = Field(
        "auto", description="max: higher scores win; min: lower win; auto: min for losses, else max."
    )
    experiment: str = Field(
        "gym", min_length=1, pattern=r"\S", description="MLflow experiment name (not empty, not blank)."
    )
    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI, without a login (MLFLOW_TRACKING_USERNAME / _PASSWORD hold it); "
        "default: $MLFLOW_TRACKING_URI or SQLite in the workspace.",
        json_schema_extra=NO_LOGIN_SCHEMA,
    )


class FlowConfig(BaseModel):
    """What every training flow shares: the model, held-out evaluation, tokenization and output."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "gym-tiny",
        description="Registry name, local model directory, hub id or MLflow version (models:/name@alias).",
        json_schema_extra=registry_choices("model", "folder, hub id or models:/name@alias"),
    )
    template: str | None = Field(
        None, description="Chat template; default: the registry entry's.", json_schema_extra=NO_LOGIN_SCHEMA
    )
    trust_remote_code: bool = Field(
        False,
        description="Let transformers run Python code from the model repository (off by default).",
    )
    new_special_tokens: list[str] = Field(
        [],
        description="Tokens added to the model's vocabulary (never split), their embedding rows trained "
        "(gym.vocab); LLaMA-Factory's comma-separated string works too.",
    )
    eval_dataset: str | None = Field(
        AUTO,
        description="Held-out instruction data for exact match before/after (None to skip); auto: "
        "demo_sft_eval when training on a demo dataset, none on your own data, none for pt (raw text).",
        json_schema_extra=NO_LOGIN_SCHEMA,
    )
    val_size: float = Field(
        0.0,
        ge=0,
        description="Hold out this share (below 1) or number (from 1) of each stage's training records as "
        "its held-out data where it has none (LLaMA-Factory's val_size); 0: hold out nothing.",
    )
    eval_limit: int | None = Field(None, description="Evaluate on the first N held-out records only.")
    eval_metrics: list[str] = Field(
        ["exact_match"],
        description="Metrics on the held-out data: exact_match, bleu, rouge, or your own as pkg.module:fn.",
    )
    benchmarks: list[str] = Field(
        [],
        description="Benchmarks scored before and after training: mmlu, ceval, cmmlu (NAME=DIR for a folder, "
        ".zip or hub id; default: the hub) or lm-eval:TASK for any lm-eval task.",
        json_schema_extra=NO_LOGIN_ITEMS,
    )
    benchmark_options: BenchmarkOptions = Field(
        default_factory=BenchmarkOptions,
        description="Questions per subject, shots, batch size of the benchmarks.",
    )
    data: TokenizeSettings = Field(default_factory=TokenizeSettings, description="Templating, tokenization.")
    output: OutputSettings = Field(default_factory=OutputSettings, description="Registration and export.")

    @field_validator("new_special_tokens", mode="before")
    @classmethod
    def _tokens(cls, value: Any) -> list[str]:
        from gym.vocab import parse

        return parse(value)

    @field_validator("val_size")
    @classmethod
    def _share_or_count(cls, value: float) -> float:
        if value >= 1 and value != int(value):
            raise ValueError("neither a share below 1 (such as 0.1) nor a whole number of records (200)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _partial_sections(cls, data: Any) -> Any:
        """A section given in part (`{"sft": {"max_steps": 10}}`, as a deployment's parameters or an API call
        give it) is completed from this flow's default for the section, as the command line does, not from
        the section class's own defaults: the same parameters make the same run (and cache keys) however
        they arrive."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, field in cls.model_fields.items():
            given = out.get(name)
            if isinstance(given, dict) and field.default_factory is not None:
                default = field.default_factory()  # type: ignore[call-arg]
                if isinstance(default, BaseModel):
                    out[name] = merge(default.model_dump(), given)
        return out

    def trained_on(self) -> str:
        """The dataset the first stage trains on (what `eval_dataset: auto` goes by)."""
        raise NotImplementedError

    def exact_match_dataset(self) -> str | None:
        """The held-out data scored by exact match before and after, with `auto` resolved."""
        return held_out(self.eval_dataset, self.trained_on(), "demo_sft_eval")

    def held_out_notes(self) -> list[str]:
        """What `auto` left unscored, and how to score it (the flow logs these as it starts)."""
        if self.eval_dataset == AUTO and self.exact_match_dataset() is None:
            return [unscored("exact match before/after", self.trained_on(), "--eval_dataset")]
        return []

    def dataset_uses(self) -> dict[str, tuple[str, str]]:
        """Each dataset field that is set -> (dataset name, what reads it: a method or `exact_match`).

        gym.preflight checks, before any work, that each holds the record kind its reader needs.
        """
        held = self.exact_match_dataset()
        return {"eval_dataset": (held, "exact_match")} if held else {}


class SftThenDpoConfig(FlowConfig):
    """SFT on instruction data, then DPO on preference pairs, evaluated before and after."""

    sft_dataset: str = Field(
        "demo_sft",
        description="Dataset registry name or path for SFT.",
        json_schema_extra=registry_choices("dataset", "file, folder or hub id"),
    )
    dpo_dataset: str = Field(
        "demo_dpo",
        description="Preference dataset (registry name or path) for DPO.",
        json_schema_extra=registry_choices("dataset", "file, folder or hub id"),
    )
    dpo_eval_dataset: str | None = Field(
        AUTO,
        description="Held-out preference pairs for DPO reward accuracy (None to skip); auto: demo_dpo_eval "
        "when dpo_dataset is a demo dataset, none on your own data.",
        json_schema_extra=NO_LOGIN_SCHEMA,
    )
    sft: TrainConfig = Field(default_factory=lambda: DEFAULT_SFT.model_copy(), description="SFT stage.")
    dpo: TrainConfig = Field(default_factory=lambda: DEFAULT_DPO.model_copy(), description="DPO stage.")

    @model_validator(mode="after")
    def _second_stage_generates(self) -> SftThenDpoConfig:
        if self.dpo.method in SCORING_METHODS:  # exact match after the flow would score a reward model
            raise ValueError(
                f"dpo.method: {self.dpo.method} trains a reward model, which generates no answers for this "
                f"flow's exact match to score; train it after SFT with `gym train --method {self.dpo.method} "
                "--warm_start.dataset <sft data>`"
            )
        return self

    def trained_on(self) -> str:
        return self.sft_dataset

    def dpo_held_out(self) -> str | None:
        """The held-out pairs for the DPO stage's signal, with `auto` resolved."""
        return held_out(self.dpo_eval_dataset, self.dpo_dataset, "demo_dpo_eval")

    def held_out_notes(self) -> list[str]:
        notes = super().held_out_notes()
        if self.dpo_eval_dataset == AUTO and self.dpo_held_out() is None and not self.val_size:
            notes.append(unscored("held-out DPO reward accuracy", self.dpo_dataset, "--dpo_eval_dataset"))
        return notes

    def dataset_uses(self) -> dict[str, tuple[str, str]]:
        uses = {
            "sft_dataset": (self.sft_dataset, self.sft.method),
            "dpo_dataset": (self.dpo_dataset, self.dpo.method),
        }
        if dpo_held := self.dpo_held_out():
            uses["dpo_eval_dataset"] = (dpo_held, self.dpo.method)
        return {**uses, **super().dataset_uses()}


class TrainFlowConfig(FlowConfig):
    """One training method on one dataset, evaluated before and after."""

    dataset: str = Field(
        "demo_sft",
        description="Training dataset: registry name or path.",
        json_schema_extra=registry_choices("dataset", "file, folder or hub id"),
    )
    method_eval_dataset: str | None = Field(
        None,
        description="Held-out data in the training format (e.g. preference pairs for DPO).",
        json_schema_extra=NO_LOGIN_SCHEMA,
    )
    train: TrainConfig = Field(default_factory=lambda: DEFAULT_SFT.model_copy(), description="The stage.")
    warm_start: WarmStart | None = Field(
        None, description="SFT first, then the method from the result (online RL on gym-tiny needs it)."
    )

    @model_validator(mode="after")
    def _scoring_generates_nothing(self) -> TrainFlowConfig:
        """A reward model (rm) scores answers and generates none: no exact match, no benchmarks."""
        method = self.train.method
        if method not in SCORING_METHODS:
            return self
        if self.eval_dataset not in (AUTO, None):
            raise ValueError(
                f"eval_dataset: method {method} trains a reward model, which scores answers and generates "
                "none, so exact match does not apply; drop --eval_dataset (held-out pairs for its reward "
                "accuracy go in --method_eval_dataset, or use --val_size)"
            )
        if self.benchmarks:
            raise ValueError(
                f"benchmarks: method {method} trains a reward model, which answers no benchmark questions; "
                "drop --benchmarks (score the model it starts from, or the policy it trains with PPO/GRPO)"
            )
        return self

    def trained_on(self) -> str:
        return self.dataset

    def trains_raw_text(self) -> bool:
        """The method trains on raw text (pt): it learns no answers for exact match to score."""
        from gym.data.formats import METHOD_KIND

        return METHOD_KIND.get(self.train.method) == "text"

    def exact_match_dataset(self) -> str | None:
        """As FlowConfig's, except that `auto` scores nothing after pretraining on raw text (pt)."""
        if self.eval_dataset == AUTO and self.trains_raw_text():
            return None
        if self.train.method in SCORING_METHODS:
            return None  # a reward model (rm) generates no answers to match
        return super().exact_match_dataset()

    def held_out_notes(self) -> list[str]:
        if self.train.method in SCORING_METHODS:
            return []  # nothing to score by exact match: not a gap to point out
        if self.eval_dataset == AUTO and self.trains_raw_text():
            return [
                f"no exact match before/after: {self.train.method} trains on raw text, not answers to "
                "instructions; name instruction data with --eval_dataset to score them anyway"
            ]
        notes = super().held_out_notes()
        if self.train.method in ONLINE_METHODS and not self.method_eval_dataset and not self.val_size:
            notes.append(  # its signal, mean_reward, is sampled on held-out prompts only
                f"no held-out mean_reward before/after: the summary's metric_first/last are the first and "
                "last logged training rewards (train_mean_reward, each of another batch); name held-out "
                f"prompts with --method_eval_dataset FILE_OR_NAME, or hold out part of {self.dataset} with "
                "--val_size 0.1"
            )
        return notes

    def dataset_uses(self) -> dict[str, tuple[str, str]]:
        uses = {"dataset": (self.dataset, self.train.method)}
        if self.method_eval_dataset:
            uses["method_eval_dataset"] = (self.method_eval_dataset, self.train.method)
        if self.warm_start:
            uses["warm_start.dataset"] = (self.warm_start.dataset, self.warm_start.train.method)
        return {**uses, **super().dataset_uses()}


class TfGrpoFlowConfig(TfGrpoSettings):
    """Training-Free GRPO: learn an experience library for a frozen model, evaluated on held-out questions.

    The model runs behind `endpoint` (any OpenAI-compatible API) or, without one, locally.
    """

    model: str = Field(
        "gym-tiny",
        description="Model at the endpoint, or a registry name / checkpoint dir to run locally.",
        json_schema_extra=NO_LOGIN_SCHEMA,
    )
    template: str | None = Field(
        None,
        description="Chat template for a local model; default: the registry's.",
        json_schema_extra=NO_LOGIN_SCHEMA,
    )
    trust_remote_code: bool = Field(False, description="Let transformers run the model repo's code (local).")
    dataset: str = Field(
        "demo_sft",
        description="Training questions: registry name or path (sft format).",
        json_schema_extra=registry_choices("dataset", "file, folder or hub id"),
    )
    eval_dataset: str | None = Field(
        AUTO,
        description="Held-out questions for Mean@k / Pass@k before and after (None to skip); auto: "
        "demo_sft_eval when training on a demo dataset, none on your own questions.",
        json_schema_extra=NO_LOGIN_SCHEMA,
    )
    benchmarks: list[str] = Field(
        [],
        description="Benchmarks scored before and after (the learned library injected after): mmlu, ceval, "
        "cmmlu (NAME=DIR for local files) or lm-eval:TASK. Needs the model's weights (no --endpoint).",
        json_schema_extra=NO_LOGIN_ITEMS,
    )
    benchmark_options: BenchmarkOptions = Field(
        default_factory=BenchmarkOptions,
        description="Questions per subject, shots, batch size of the benchmarks.",
    )
    output: OutputSettings = Field(default_factory=OutputSettings, description="Registration and export.")
    steps: int | None = Field(
        None,
        ge=1,
        description="TF-GRPO steps (a batch of questions and one library update each; --max-steps too) "
        "instead of the epochs; unset: the epochs. Like a budget, it says where the run stops.",
    )

    @field_validator("benchmarks")
    @classmethod
    def _benchmarks_need_weights(cls, value: list[str], info: ValidationInfo) -> list[str]:
        policy = info.data.get("policy")
        endpoint = (policy.endpoint if policy is not None else None) or info.data.get("endpoint")
        if value and endpoint:
            raise ValueError(
                f"benchmarks score the model's weights, and this policy runs behind {endpoint}, whose "
                "weights gym does not have: drop --benchmarks, or run the policy locally (no --endpoint; "
                "--model a registry name or model folder)"
            )
        return value

    def held_out_questions(self) -> str | None:
        """The held-out questions, with `auto` resolved."""
        return held_out(self.eval_dataset, self.dataset, "demo_sft_eval")

    def held_out_notes(self) -> list[str]:
        if self.eval_dataset == AUTO and self.held_out_questions() is None:
            return [unscored("held-out Mean@k before/after", self.dataset, "--eval_dataset")]
        return []

    def settings(self) -> TfGrpoSettings:
        return TfGrpoSettings.model_validate(self.model_dump(include=set(TfGrpoSettings.model_fields)))

    @property
    def model_is_remote(self) -> bool:
        """The policy runs behind an endpoint: `model` is a name there, not one gym must resolve."""
        return bool(self.endpoint or self.policy.endpoint)

    def dataset_uses(self) -> dict[str, tuple[str, str]]:
        """None for gym.preflight: the run's first task reads the datasets (question/answer files too,
        which preflight's format detection does not know) and rejects a bad one before any LLM call."""
        return {}

    @classmethod
    def from_train_flow(cls, config: TrainFlowConfig) -> TfGrpoFlowConfig:
        """The train flow's config with method tf_grpo: its model, data and output; its stage's
        epochs, max_steps and seed over the paper's defaults."""
        epochs = config.train.num_train_epochs
        if config.new_special_tokens:
            raise ConfigError(
                "new_special_tokens: tf_grpo trains no weights (it learns an experience library for the "
                "frozen model), so new tokens would have untrained embeddings; leave new_special_tokens unset"
            )
        if config.data.default_system is not None:
            raise ConfigError(
                "data.default_system: tf_grpo writes its own prompts (the question with the experience "
                "library injected), so a default system message would not reach them; leave it unset"
            )
        return cls(
            model=config.model,
            template=config.template,
            trust_remote_code=config.trust_remote_code,
            dataset=config.dataset,
            eval_dataset=config.eval_dataset,
            benchmarks=config.benchmarks,
            benchmark_options=config.benchmark_options,
            output=config.output,
            seed=config.train.seed,
            **({"epochs": max(1, round(epochs))} if epochs is not None else {}),
            **({"steps": config.train.max_steps} if config.train.max_steps > 0 else {}),
        )
