"""What one generation request asks for, in OpenAI's names and meanings (no torch import here)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """What one request asks of generation (OpenAI's names and meanings)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # NaN: "a finite number"

    max_tokens: int = Field(
        16,
        ge=0,
        description="Most tokens to generate per choice (0: none; completions then only score the prompt).",
    )
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 is greedy; higher is more random.")
    top_p: float = Field(
        1.0, gt=0.0, le=1.0, description="Nucleus: sample from the smallest set of this mass."
    )
    n: int = Field(1, ge=1, description="Choices to generate for the prompt.")
    stop: tuple[str, ...] = Field((), description="Generation ends before the first of these strings.")
    seed: int | None = Field(None, description="Same seed, same prompt, same parameters: same text.")
    ignore_eos: bool = Field(False, description="Keep generating past end-of-sequence (benchmarks).")
    presence_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="Subtracted from the logit of every token the reply already has."
    )
    frequency_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="Subtracted from a token's logit once per time the reply has it."
    )
    logit_bias: tuple[tuple[int, float], ...] = Field(
        (), description="(token id, bias) pairs: each bias (-100 to 100) is added to that token's logit."
    )
    top_k: int = Field(0, ge=0, description="Sample from the k most likely tokens only (0: all; vLLM's).")
    min_p: float = Field(
        0.0, ge=0.0, le=1.0, description="Drop tokens less likely than min_p times the most likely (vLLM's)."
    )
    repetition_penalty: float = Field(
        1.0,
        gt=0.0,
        le=2.0,
        description="Divides the positive logits (multiplies the negative) of every token the prompt or the "
        "reply holds (vLLM's and transformers'; 1: off).",
    )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether the logits need adjusting before the token is picked (penalties or a logit bias)."""
        repeats = self.repetition_penalty != 1.0
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias or repeats)


@dataclass(frozen=True)
class Scoring:
    """What a request asks of log-probabilities: `top` alternatives per token (None: no logprobs) and
    whether the prompt is echoed (completions only)."""

    top: int | None
    echo: bool = False

    @property
    def wanted(self) -> bool:
        return self.top is not None or self.echo
