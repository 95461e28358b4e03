"""`gym serve` settings: one typed model, so each field is a command-line flag (and a form field)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym import secrets


class Limits(BaseModel):
    """What one server accepts: larger requests get a 400, requests beyond the concurrency cap a 429."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(1024, ge=1, description="Largest max_tokens a request may ask for.")
    default_max_tokens: int | None = Field(
        None,
        ge=1,
        description="max_tokens of a chat request that sends none (LLaMA-Factory's max_new_tokens); default: "
        "as much as fits, up to max_tokens.",
    )
    max_prompt_tokens: int = Field(4096, ge=1, description="Longest prompt accepted, in tokens.")
    max_prompts: int = Field(
        256, ge=1, description="Most prompts one /v1/completions request may carry (a list of prompts)."
    )
    max_concurrent: int = Field(
        64, ge=1, description="Requests in progress at once (queued or generating); more get a 429."
    )

    @model_validator(mode="after")
    def _default_within_cap(self) -> Limits:
        if self.default_max_tokens is not None and self.default_max_tokens > self.max_tokens:
            raise ValueError(
                f"default_max_tokens {self.default_max_tokens} is over max_tokens {self.max_tokens}, the "
                "largest a request may ask for: lower it or raise --limits.max_tokens"
            )
        return self


class ServeSettings(BaseModel):
    """Serve a model over an OpenAI-compatible HTTP API."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        description="Registry name, local model directory or MLflow model URI (models:/name@alias)."
    )
    template: str | None = Field(
        None, description="Chat template (registry/templates); default: the model's, else its tokenizer's."
    )
    system: str | None = Field(
        None,
        description="System message for each conversation that opens without one; default: the one the "
        "model was trained with (its data's default_system), if any.",
    )
    served_model_name: str | None = Field(None, description="Name clients pass as `model`; default: --model.")
    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="Port (0: any free port, printed at start).")
    api_key_env: secrets.EnvName = Field(
        None, description="Environment variable holding the API key clients must send as a bearer token."
    )
    limits: Limits = Field(default_factory=Limits, description="Request caps.")
    max_batch_size: int = Field(32, ge=1, description="Most sequences generated together in one batch.")
    shutdown_timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds a stopping server (SIGINT, SIGTERM) waits for the requests in flight before "
        "cancelling them; default: until they finish (a second Ctrl-C stops at once).",
    )
    completion_experiences: Literal["none", "prefix"] = Field(
        "none",
        description="A TF-GRPO model's experience library in /v1/completions: none (the raw prompt is "
        "generated from exactly as sent; chat requests always get it) or prefix (the block, a blank "
        "line, then the prompt).",
    )
    trust_remote_code: bool = Field(False, description="Run Python code from the model repository.")
    backend: Literal["transformers", "vllm", "sglang"] = Field(
        "transformers",
        description="Inference engine: gym's own (transformers), or vLLM / SGLang if installed.",
    )
