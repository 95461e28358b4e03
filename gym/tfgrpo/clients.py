"""LLM clients behind one protocol: `complete(messages, temperature, max_tokens, seed, n)`.

    OpenAIClient("http://127.0.0.1:8000/v1", "gym-tiny")  # OpenAI, DeepSeek, vLLM, SGLang, Ollama, gym serve
    LocalClient("gym-tiny")                                # a registry model or checkpoint, via transformers

The HTTP client is the official `openai` package (retries with exponential backoff on 408/409/429/5xx
and connection errors, honouring Retry-After; a timeout per request); the API key is read from an
environment variable, never passed around or logged. Calls to one endpoint share a semaphore, so
the concurrency limit holds per endpoint across every role and thread of the process. The local
client generates the n samples of a call in one batch, seeded, one call at a time.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Protocol

from pydantic import BaseModel

from gym.errors import GymError, MissingExtraError

Messages = list[dict[str, str]]


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Completion(BaseModel):
    texts: list[str]
    usage: Usage = Usage()


class LLMError(GymError, RuntimeError):
    """A call failed for good (after the client's retries)."""


class LLMClient(Protocol):
    identity: str
    """What answers: endpoint and model, or a local model's digest. Part of every call's cache key."""
    max_n: int
    """Most samples one call may ask for."""

    def complete(
        self, messages: Messages, *, temperature: float, max_tokens: int, seed: int, n: int = 1
    ) -> Completion: ...


_SEMAPHORES: dict[str, threading.BoundedSemaphore] = {}
_SEMAPHORES_LOCK = threading.Lock()


def endpoint_semaphore(endpoint: str, limit: int) -> threading.BoundedSemaphore:
    """The process-wide limiter of one endpoint (created with the first caller's limit)."""
    with _SEMAPHORES_LOCK:
        if endpoint not in _SEMAPHORES:
            _SEMAPHORES[endpoint] = threading.BoundedSemaphore(limit)
        return _SEMAPHORES[endpoint]


class OpenAIClient:
    """Chat completions from any OpenAI-compatible server."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 120.0,
        max_retries: int = 4,
        concurrency: int = 8,
        max_n: int = 1,
    ) -> None:
        try:
            import openai
        except ImportError as exc:  # pragma: no cover - the api extra is part of every install we test
            raise MissingExtraError("the OpenAI-compatible client needs `pip install 'gym[api]'`") from exc
        self.base_url, self.model, self.max_n = base_url.rstrip("/"), model, max_n
        self.identity = f"openai:{self.base_url}#{model}"
        # Servers that need no key (vLLM, Ollama, gym serve) still want the header to be there.
        key = os.environ.get(api_key_env) or "EMPTY"
        self._client = openai.OpenAI(
            base_url=self.base_url, api_key=key, timeout=timeout_s, max_retries=max_retries
        )
        self._limit = endpoint_semaphore(self.base_url, concurrency)
        self._errors = (openai.OpenAIError,)

    def complete(
        self, messages: Messages, *, temperature: float, max_tokens: int, seed: int, n: int = 1
    ) -> Completion:
        with self._limit:
            try:
                response = self._client.chat.completions.create(
                    model=self.model,
                    messages=messages,  # type: ignore[arg-type]
                    temperature=temperature,
                    max_tokens=max_tokens,
                    seed=seed,
                    n=n,
                )
            except self._errors as exc:
                raise LLMError(f"{self.identity}: {type(exc).__name__}: {exc}") from exc
        texts = [choice.message.content or "" for choice in response.choices]
        if len(texts) != n:
            raise LLMError(f"{self.identity}: asked for {n} completions, got {len(texts)}")
        usage = response.usage
        return Completion(
            texts=texts,
            usage=Usage(
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
            ),
        )


class LocalClient:
    """A registry model or checkpoint run in-process with transformers (loaded once, on first use)."""

    def __init__(
        self, model: Any, *, template: str | None = None, trust_remote_code: bool = False, max_n: int = 64
    ) -> None:
        from gym.models import ModelRef, resolve

        self.ref: ModelRef = (
            model if isinstance(model, ModelRef) else resolve(str(model), template, trust_remote_code)
        )
        self.identity = f"local:{self.ref.base_model}@{self.ref.digest}"
        # the system message the model was trained with, opening prompts that have none
        self.default_system = self.ref.default_system
        self.max_n = max_n
        self._lock = threading.Lock()
        self._loaded: tuple[Any, Any] | None = None

    def _load(self) -> tuple[Any, Any]:
        if self._loaded is None:
            from gym.models import load_model, load_tokenizer

            tokenizer = load_tokenizer(self.ref)
            tokenizer.padding_side = "left"
            self._loaded = (load_model(self.ref).eval(), tokenizer)
        return self._loaded

    def _render(self, tokenizer: Any, messages: Messages) -> str:
        from gym.templates import render

        return render(tokenizer, messages, self.ref.template, add_generation_prompt=True)

    def _room(self, model: Any, prompt_tokens: int, max_tokens: int) -> int:
        """`max_tokens`, cut to what is left of the model's window after the prompt: generation stops
        there (as a reply cut by max_tokens does), instead of running on past the positions the model
        was trained on. A prompt that fills the window fails the call, saying so."""
        from gym.models import context_window

        window = context_window(model.config)
        if window is None:
            return max_tokens
        if prompt_tokens >= window:
            raise LLMError(
                f"{self.identity}: the prompt has {prompt_tokens} tokens and the model's context window is "
                f"{window}: nothing is left to generate; shorten the prompt (fewer experiences, a shorter "
                "question) or use a model with a longer window"
            )
        return min(max_tokens, window - prompt_tokens)

    def complete(
        self, messages: Messages, *, temperature: float, max_tokens: int, seed: int, n: int = 1
    ) -> Completion:
        import torch

        with self._lock:  # one generation at a time: the torch RNG below is process-wide
            model, tokenizer = self._load()
            prompt = self._render(tokenizer, messages)
            batch = tokenizer([prompt] * n, return_tensors="pt", add_special_tokens=False)
            max_tokens = self._room(model, int(batch["input_ids"].shape[1]), max_tokens)
            torch.manual_seed(seed)
            sampling: dict[str, Any] = (
                {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
                if temperature > 0
                else {"do_sample": False}
            )
            with torch.inference_mode():
                out = model.generate(
                    **batch,
                    max_new_tokens=max_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                    **sampling,
                )
            new = out[:, batch["input_ids"].shape[1] :]
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
            produced = int((new != tokenizer.pad_token_id).sum())
        return Completion(
            texts=texts,
            usage=Usage(prompt_tokens=int(batch["input_ids"].shape[1]), completion_tokens=produced),
        )


class LoadedClient(LocalClient):
    """A transformers model and tokenizer already in memory (`GRPOTrainer(model=..., tokenizer=...)`).

    Prompts are rendered with gym's `template` if given, else with the tokenizer's own chat template.
    """

    def __init__(self, model: Any, tokenizer: Any, *, template: str | None = None, max_n: int = 64) -> None:
        from gym.hashing import hash_obj

        first = next(model.parameters())
        fingerprint = hash_obj(
            [getattr(model.config, "_name_or_path", ""), sum(p.numel() for p in model.parameters()),
             float(first.detach().float().sum())]
        )  # fmt: skip
        self.identity = f"loaded:{getattr(model.config, '_name_or_path', 'model')}@{fingerprint}"
        self.template, self.max_n = template, max_n
        self._lock = threading.Lock()
        tokenizer.padding_side = "left"
        self._loaded = (model.eval(), tokenizer)

    def _render(self, tokenizer: Any, messages: Messages) -> str:
        if self.template is not None:
            from gym.templates import render

            return render(tokenizer, messages, self.template, add_generation_prompt=True)
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
