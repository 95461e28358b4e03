"""OpenAI's request bodies for /v1/chat/completions and /v1/completions, validated, and the JSON
the endpoints answer with (the shapes the official `openai` client parses).

The fields are an allow-list: those declared below are served, IGNORED ones (`user`, `store`,
`metadata`...: no effect on what is generated) are accepted and dropped, and every other field is refused
with a 400 naming it, as OpenAI refuses an unrecognized argument, rather than silently dropped:
UNSUPPORTED lists those accepted only at the value that asks for nothing (tools, response_format,
vLLM's min_tokens...), and a field gym has never heard of (`reasoning_effort`, `audio`, vLLM's
`guided_decoding_backend`...) is refused whatever it holds, except null. Types are strict, as
OpenAI's: `"max_tokens": "5"`, `"n": true` or `"stream": "yes"` are a 400, not 5, 1 or true (an
integer is a number, so `"temperature": 1` is served). vLLM's `top_k`, `min_p`,
`repetition_penalty` and `ignore_eos` (for benchmarks) are served. Log-probabilities are served
(`logprobs`/`echo` on completions, `logprobs`/`top_logprobs` on chat: gym/serve/logprobs.py), except
while streaming.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gym.serve.params import Scoring

MAX_STOPS = 4
MAX_TOP_LOGPROBS = 20  # OpenAI's cap for chat's top_logprobs (vLLM's default for both endpoints)
# Fields that change nothing gym serve generates, accepted (whatever they hold) and dropped: who the end
# user is (`user`, `safety_identifier`: OpenAI's abuse monitoring), storing the exchange for OpenAI's
# evals (`store`, `metadata`: nothing is stored here, as in vLLM), OpenAI's processing tier and prompt
# cache routing (`service_tier`, `prompt_cache_key`), and `parallel_tool_calls`, which means something
# only beside `tools` (refused unless empty). Clients such as the `openai` SDK, LangChain or LiteLLM send
# these as a matter of course; refusing them would break clients for nothing.
IGNORED = frozenset(
    {
        "user",
        "safety_identifier",
        "store",
        "metadata",
        "service_tier",
        "prompt_cache_key",
        "parallel_tool_calls",
    }
)
# Fields gym serve does not implement -> the values that mean "not asked for" (besides null, always), which
# clients send by default: OpenAI's tools and structured output, and vLLM's extensions that change what
# is generated or how the prompt is built (clients send them through `extra_body`). Any other value is
# refused with a 400 naming the field, never silently dropped, as is any field not declared, IGNORED or
# here (vLLM's guided_json, allowed_token_ids...). Compared by type too: `best_of: 0` is not `false`.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "suffix": ("",),
    "best_of": (1,),
    "response_format": ({"type": "text"},),
    "length_penalty": (1, 1.0),
    "min_tokens": (0,),
    "stop_token_ids": ([],),
    "bad_words": ([],),
    "include_stop_str_in_output": (False,),
    "use_beam_search": (False,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "echo": (False,),  # chat's (vLLM); completions' own `echo` is served
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "chat_template_kwargs": ({},),
    "modalities": (["text"],),  # OpenAI's audio output; text alone is what every reply is
}


def unasked(value: Any, neutral: tuple[Any, ...]) -> bool:
    return value is None or any(type(value) is type(v) and value == v for v in neutral)


def unicode_text(value: str) -> str:
    """`value` if it is text a tokenizer can read: JSON's `\\ud800`-style escapes (and undecodable bytes
    read with surrogateescape) can carry a lone surrogate half, which is no character and no UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"holds {value[exc.start]!r} at character {exc.start}, an unpaired surrogate (no character): "
            "send valid Unicode text"
        ) from None
    return value


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of a chat. Only an assistant's may go without content (OpenAI's rule: there it
    stands beside tool calls); its parts, when a list, are text: gym serves text-only models."""

    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = Field(None, validate_default=True)  # checked when absent too

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        """A part that is not text (an image, audio, a file) is refused by its type, before the union's
        own errors ("should be a valid string") would say nothing of parts."""
        for i, part in enumerate(value if isinstance(value, list) else []):
            if isinstance(part, dict) and part.get("type") != "text":
                got = f"type {part['type']!r}" if "type" in part else "no type"
                raise ValueError(
                    f"part {i} has {got}: this server supports only text content parts "
                    '({"type": "text", "text": ...}), not images, audio or files'
                )
        return value

    @field_validator("content")
    @classmethod
    def _text(cls, value: str | list[TextPart] | None, info: ValidationInfo) -> str | list[TextPart] | None:
        role = info.data.get("role")  # absent when the role itself was refused
        if value is None and role not in (None, "assistant"):
            raise ValueError(
                f"a {role} message needs content (text or a list of text parts); "
                "only an assistant message may leave it null"
            )
        for text in [value] if isinstance(value, str) else [p.text for p in value or []]:
            unicode_text(text)
        return value

    def as_dict(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool = False


class GenerationRequest(BaseModel):
    """What both endpoints share. Numbers must be finite: JSON parsers that take NaN and Infinity (Python's
    json writes them) would otherwise see a NaN fail every range check with a message about the range.
    Strict: a value of the wrong JSON type is refused, never coerced (`true` is no 1, `"5"` no 5).
    Fields not declared land in `model_extra`, where `_refuse_unsupported` checks them against the
    allow-list (IGNORED, UNSUPPORTED's neutral values, null)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)

    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    top_k: int | None = Field(None, ge=-1)  # vLLM's: -1 and 0 mean no cut
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for token, bias in (value or {}).items():
            if not token.strip().isdecimal():  # what int() reads
                raise ValueError(f"keys are token ids, not {token!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"biases lie in [-100, 100], not {bias}")
        return value

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(token), float(bias)) for token, bias in (self.logit_bias or {}).items())

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty strings")
        for stop in stops:
            unicode_text(stop)
        return stops

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> GenerationRequest:
        for key, value in (self.model_extra or {}).items():
            if key not in IGNORED and not unasked(value, UNSUPPORTED.get(key, ())):
                raise PydanticCustomError(  # its own type: the error names `key` as its param
                    "unsupported", "{param} is not supported by this server; leave it unset", {"param": key}
                )
        return self

    def stops(self) -> tuple[str, ...]:
        return tuple(self.stop or ())

    def scoring(self) -> Scoring:
        return Scoring(None)

    @model_validator(mode="after")
    def _no_streamed_logprobs(self) -> GenerationRequest:
        scoring = self.scoring()
        if self.stream and scoring.wanted:
            asked = "echo" if scoring.top is None else "logprobs"
            raise PydanticCustomError(
                "unsupported",
                "{param} is not served while streaming; send the request with stream false",
                {"param": asked},
            )
        return self


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def scoring(self) -> Scoring:
        return Scoring(self.top_logprobs or 0 if self.logprobs else None)

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise PydanticCustomError(
                "param", "{param} needs logprobs set to true", {"param": "top_logprobs"}
            )
        return self


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    max_tokens: int | None = Field(None, ge=0)  # 0: nothing generated, the prompt echoed/scored (legacy)

    @field_validator("prompt", mode="before")
    @classmethod
    def _shape(cls, value: Any) -> Any:
        """A prompt of no shape the union takes is refused in one message naming `prompt`, not as the first
        of the union's errors (`prompt.str: Input should be a valid string` for `[1.0, 2.0]`)."""

        def ids(item: Any) -> bool:
            return isinstance(item, list) and all(type(i) is int for i in item)

        if isinstance(value, str) or ids(value):
            return value
        if isinstance(value, list) and (all(isinstance(p, str) for p in value) or all(ids(p) for p in value)):
            return value
        raise ValueError("send text, a list of texts, a list of token ids (integers) or a list of such lists")

    @field_validator("prompt")
    @classmethod
    def _text(cls, value: Any) -> Any:
        for text in [value] if isinstance(value, str) else [p for p in value if isinstance(p, str)]:
            unicode_text(text)
        return value

    @model_validator(mode="after")
    def _nothing_to_stream(self) -> CompletionRequest:
        if self.stream and self.max_tokens == 0:
            raise PydanticCustomError(
                "unsupported",
                "{param} 0 generates nothing to stream; send the request with stream false",
                {"param": "max_tokens"},
            )
        return self

    def budget(self) -> int | None:
        return self.max_tokens

    def scoring(self) -> Scoring:
        return Scoring(self.logprobs, self.echo)

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def envelope(kind: str, rid: str, model: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The fields every response and chunk carries (`kind` is OpenAI's `object`)."""
    return {
        "id": rid,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        **extra,
    }


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
