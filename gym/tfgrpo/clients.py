"""LLM clients behind one protocol: `complete(messages, temperature, max_tokens, seed, n)`.

    OpenAIClient("http://127.0.0.1:8000/v1", "gym-tiny")  # OpenAI, DeepSeek, vLLM, SGLang, Ollama, gym serve
    LocalClient("gym-tiny")                                # a registry model or checkpoint, via transformers

The HTTP client is the official `openai` package (retries with exponential backoff on 408/409/429/5xx
and connection errors, honouring Retry-After; a timeout per request); the API key is read from an
environment variable, never passed around or logged. An answer no retry can change (401, 403: the
key refused; 404, 405, 501: no such model or route, or no API there at all, as from a static file
server) is not retried: it raises EndpointError, and every later call of the client raises it too,
sending nothing, so a run stops at its first call instead of failing every call it would make. An
endpoint that stops answering (a call got no connection or a gateway's 502/503/504 after its retries,
or as many calls in a row as can be in flight at once timed out) raises EndpointDown, likewise
remembered. Calls to one endpoint under one concurrency limit share a semaphore, so the limit holds
across every role and thread of the process that asks for it; a role given a limit of its own (or a
later run given another) gets a semaphore of that size. The local client runs gym serve's engine
in-process: calls made at the same time are generated in one batch, each with its own seed.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import warnings
from typing import Any, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel

from gym import secrets
from gym.errors import ConfigError, GymError, GymWarning, MissingExtraError

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


# How an OpenAIClient error's text (LLMError, a manifest's `error`) carries the server's HTTP answer:
# the openai package's "Error code: 400 - <the server's message>".
_HTTP_ERROR = re.compile(r"Error code: (\d{3})(?: - (.*))?", re.DOTALL)


def http_refusal(error: str) -> tuple[int, str] | None:
    """(HTTP status, the server's message) of a failed call's error text; None when no HTTP answer
    came back (connection refused, timeout) or the client was not an HTTP one."""
    match = _HTTP_ERROR.search(error)
    if match is None:
        return None
    return int(match.group(1)), (match.group(2) or "").strip()


# Answers every call to the endpoint would get, whatever its retries: the key refused (401) or not
# allowed the model (403), no such route or model (404), no POST there (405; 501 from
# `python -m http.server` and other static file servers).
PERMANENT_STATUS = (401, 403, 404, 405, 501)
REFUSAL_CHARS = 300  # of the server's message, quoted in an error
WINDOW_FULL = "nothing is left to generate"  # a local model's prompt fills its window (engine says why)


class EndpointError(ConfigError):
    """The endpoint answered with a PERMANENT_STATUS: no call to it can succeed, so the run stops."""


# A call the server behind the URL was not there to answer, after the client's retries (with backoff,
# ~8 s at the default 4): no connection, or a gateway's 502/503/504 (what a proxy says while the model
# server behind it is down). A timeout is not one: a server can be slow for one request only.
UNANSWERED_STATUS = (502, 503, 504)
# How long the model list (whose digest identifies the served weights) may take, per try (two tries).
DIGEST_TIMEOUT_S = 30.0
BUSY_STATUS = (429, 500, *UNANSWERED_STATUS)  # a model list the server is there for but did not give


class EndpointDown(GymError, RuntimeError):
    """The endpoint stopped answering: a call got no connection (or a gateway's 502/503/504) after its
    retries, or as many calls in a row as can be in flight at once timed out. Every later call raises it,
    sending nothing: the run stops (resumably) instead of failing each of its remaining calls, retries
    and backoff included, one by one, and ending steps as degraded for want of a server."""


def down(endpoint: str, what: str, error: str, timeout_s: float | None = None) -> str:
    """EndpointDown's one line: the endpoint without credentials, what went unanswered, the error
    (`timeout_s`: the calls timed out after that long, so the server may only be slow)."""
    where = secrets.strip_url(endpoint)
    slow = (
        f" (or, if it is only slow, raise the role's timeout of {timeout_s:g} s: --policy.timeout_s, "
        "--optimizer.timeout_s or --judge.timeout_s)"
        if timeout_s is not None
        else ""
    )
    return (
        f"{where} stopped answering: {what} ({error[:REFUSAL_CHARS]}); check that the server is up and "
        f"reachable{slow}, then run the same command again: the calls already answered are reused and the "
        "run goes on from its last finished step"
    )


def refusal(
    endpoint: str,
    model: str,
    status: int,
    reason: str,
    message: str,
    api_key_env: str = "OPENAI_API_KEY",
    key_set: bool = True,
) -> str:
    """The one-line error of a call answered with a PERMANENT_STATUS (`reason`: the HTTP status line's,
    `message`: the server's own, if any), the endpoint shown without credentials: a key refused (or
    none sent: `key_set` False, $api_key_env is not set), a server that knows the route but not the
    model, else one that is no OpenAI-compatible API at that URL."""
    where = secrets.strip_url(endpoint)
    said = " ".join(f"HTTP {status} {message or reason}".split())[:REFUSAL_CHARS]
    if status in (401, 403) and not key_set:
        return (
            f"{where} refused the model {model!r} without an API key ({said}): ${api_key_env} is not set; "
            f"export {api_key_env}=<a key it accepts>, or name the variable holding one with --api_key_env "
            "(or the role's --policy.api_key_env, --optimizer.api_key_env, --judge.api_key_env)"
        )
    if status in (401, 403):
        return (
            f"{where} refused the API key in ${api_key_env} for the model {model!r} ({said}): export a key "
            f"it accepts as {api_key_env}, or name the variable holding one with --api_key_env (or the "
            "role's --policy.api_key_env, --optimizer.api_key_env, --judge.api_key_env)"
        )
    if status == 404 and "model" in message.lower():
        return (
            f"{where} does not serve the model {model!r} ({said}): give a model it serves (--model, or the "
            "role's --policy.model, --optimizer.model, --judge.model)"
        )
    return (
        f"{where} is not an OpenAI-compatible API: POST {where}/chat/completions answered {said}; point "
        "--endpoint (or the role's --policy.endpoint, --optimizer.endpoint, --judge.endpoint) at the base "
        "URL, ending in /v1, of an OpenAI-compatible server (vLLM, SGLang, Ollama, gym serve, a hosted API)"
    )


@functools.cache
def _openai_class() -> Any:
    """openai.OpenAI, retrying none of the PERMANENT_STATUS answers (it retries every 5xx, 501 included:
    5 attempts with backoff per call, against a server that will never answer otherwise)."""
    import openai

    class Client(openai.OpenAI):
        def _should_retry(self, response: Any) -> bool:
            return response.status_code not in PERMANENT_STATUS and super()._should_retry(response)

    return Client


class LLMClient(Protocol):
    identity: str
    """What answers: endpoint and model, or a local model's digest. Part of every call's cache key."""
    max_n: int
    """Most samples one call may ask for."""

    def complete(
        self, messages: Messages, *, temperature: float, max_tokens: int, seed: int, n: int = 1
    ) -> Completion: ...


_SEMAPHORES: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_SEMAPHORES_LOCK = threading.Lock()
# Hosted APIs that answer nothing without a key (servers of one's own need none).
KEYED_HOSTS = ("api.openai.com", "api.deepseek.com")


def endpoint_semaphore(endpoint: str, limit: int) -> threading.BoundedSemaphore:
    """The process-wide limiter of `limit` calls in flight to one endpoint: shared by the roles and
    threads that ask for the same two (a role's own limit is its own, never another caller's)."""
    key = (endpoint, limit)
    with _SEMAPHORES_LOCK:
        if key not in _SEMAPHORES:
            _SEMAPHORES[key] = threading.BoundedSemaphore(limit)
        return _SEMAPHORES[key]


def served_context(base_url: str, model: str, timeout_s: float = 5.0) -> int | None:
    """The context length an OpenAI-compatible server reports for `model` in /v1/models (gym serve's and
    vLLM's `max_model_len`); None when it reports none, needs a key, or does not answer in time."""
    import httpx

    if urlsplit(base_url).hostname in KEYED_HOSTS:  # hosted APIs list no context length
        return None
    try:
        listed = httpx.get(f"{base_url.rstrip('/')}/models", timeout=timeout_s).json()
        entry = next(
            (m for m in listed.get("data", []) if isinstance(m, dict) and m.get("id") == model), None
        )
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        return None
    length = entry.get("max_model_len") if entry else None
    return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None


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
        try:
            secrets.env_name(api_key_env)
        except ValueError as exc:
            raise ConfigError(f"api_key_env: {exc}") from None
        if secrets.url_credentials(base_url):  # it would be in cache keys, messages and manifests
            raise ConfigError(
                "the endpoint URL may hold a credential (not shown): give the URL without it and the key "
                f"in ${api_key_env}"
            )
        self.base_url, self.model, self.max_n = base_url.rstrip("/"), model, max_n
        self.api_key_env, self.timeout_s = api_key_env, timeout_s
        # Servers that need no key (vLLM, Ollama, gym serve) still want the header to be there; the
        # hosted APIs refuse every call without one: said now, not as a run of failed calls.
        key = os.environ.get(api_key_env) or "EMPTY"
        if key == "EMPTY" and urlsplit(self.base_url).hostname in KEYED_HOSTS:
            raise ConfigError(
                f"{self.base_url} needs an API key and ${api_key_env} is not set: export {api_key_env}=... "
                "(gym reads it from the environment only, never from settings)"
            )
        self._client = _openai_class()(
            base_url=self.base_url, api_key=key, timeout=timeout_s, max_retries=max_retries
        )
        # What answers: the URL and the model's name, and the digest of the weights behind them when the
        # server reports one (gym serve does, in /v1/models): another model served under the same URL and
        # name is then another identity, and gets none of the cached answers or finished steps.
        hosted = urlsplit(self.base_url).hostname in KEYED_HOSTS
        self.digest = None if hosted else self._served_digest(timeout_s)
        self.identity = f"openai:{self.base_url}#{model}" + (f"@{self.digest}" if self.digest else "")
        self._limit = endpoint_semaphore(self.base_url, concurrency)
        self._errors = (openai.OpenAIError,)
        self._refused: str | None = None  # the first permanent refusal, raised again by every later call
        # Calls in a row that timed out; at `_down_after` (every call that can be in flight at once, and
        # at least 3) the endpoint is taken as down. `_down` is raised by every later call.
        self._timeouts, self._down_after = 0, max(3, concurrency)
        self._down: str | None = None
        self._count = threading.Lock()
        self._timeout_error, self._connection_error = openai.APITimeoutError, openai.APIConnectionError

    def _served_digest(self, timeout_s: float) -> str | None:
        """The `digest` the server's /v1/models lists for the model (gym serve's: its weights, template
        and library); None when it lists none (vLLM, Ollama, a hosted API: the name is the identity) or
        does not answer. A server that is there but slow to list gets a warning: without the digest the run
        has another identity, so it would not resume (or reuse the answers of) a run that had it."""
        import openai

        wait = min(timeout_s, DIGEST_TIMEOUT_S)
        try:
            listed = self._client.with_options(max_retries=1, timeout=wait).models.list()
            for entry in listed.data:
                digest = getattr(entry, "digest", None)
                if entry.id == self.model and isinstance(digest, str) and digest:
                    return digest
        except (openai.APITimeoutError, openai.APIStatusError) as exc:
            if getattr(exc, "status_code", 503) not in BUSY_STATUS:  # 404, 501: the server lists no models
                return None
            warnings.warn(
                f"{secrets.strip_url(self.base_url)}/models gave no model list in two tries of up to "
                f"{wait:g} s ({type(exc).__name__}): the run is identified by the URL and model name alone, "
                "not by the served weights' digest, so it does not resume a run that was; if one was "
                "interrupted, stop this one and run the same command again once the server answers",
                GymWarning,
                stacklevel=2,
            )
        except (openai.OpenAIError, ValueError, TypeError, AttributeError):
            pass
        return None

    def complete(
        self, messages: Messages, *, temperature: float, max_tokens: int, seed: int, n: int = 1
    ) -> Completion:
        with self._limit:
            if self._refused is not None:  # calls waiting here while the first was refused send nothing
                raise EndpointError(self._refused)
            if self._down is not None:
                raise EndpointDown(self._down)
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
                quoted = self._masked(str(exc)) != str(exc)  # the server quoted the key back
                raise self._failure(exc) from (None if quoted else exc)  # then not even chained
            with self._count:
                self._timeouts = 0
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

    def _masked(self, text: str) -> str:
        """`text` without the key sent (some servers and proxies quote the Authorization header back in
        their error): it becomes messages, manifests, Prefect logs and states."""
        return secrets.mask(text, os.environ.get(self.api_key_env))

    def _failure(self, exc: Exception) -> GymError:
        """A failed call's error: EndpointError (remembered) for a PERMANENT_STATUS, EndpointDown
        (remembered) for no answer (no connection, UNANSWERED_STATUS, `_down_after` timeouts in a row),
        else LLMError."""
        status = getattr(exc, "status_code", None)
        error = self._masked(f"{type(exc).__name__}: {exc}")
        what, slow = None, None
        with self._count:
            if isinstance(exc, self._timeout_error):
                self._timeouts += 1
                if self._timeouts >= self._down_after:
                    what = f"the last {self._timeouts} calls in a row timed out, each after its retries"
                    slow = self.timeout_s
            elif isinstance(exc, self._connection_error) or status in UNANSWERED_STATUS:
                what = "a call got no answer after its retries"
            if what is not None:
                self._down = self._down or down(self.base_url, what, error, slow)
                return EndpointDown(self._down)
        if status not in PERMANENT_STATUS:
            return LLMError(f"{self.identity}: {error}")
        refused = http_refusal(error)
        reason = getattr(getattr(exc, "response", None), "reason_phrase", "") or ""
        said = refused[1] if refused else ""
        key_set = bool(os.environ.get(self.api_key_env))
        self._refused = refusal(self.base_url, self.model, status, reason, said, self.api_key_env, key_set)
        return EndpointError(self._refused)


class LocalClient:
    """A registry model or checkpoint run in-process (loaded once, on first use) by gym serve's engine
    (gym.serve.engine): calls made at the same time, from the rollout and optimizer threads, are
    generated together in batches, each row sampled with its own seed."""

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
        self._engine: Any = None
        self._tokenizer: Any = None

    def _render(self, tokenizer: Any, messages: Messages) -> str:
        from gym.templates import render

        return render(tokenizer, messages, self.ref.template, add_generation_prompt=True)

    def _room(self, window: int | None, prompt_tokens: int, max_tokens: int) -> int:
        """`max_tokens`, cut to what is left of the model's window after the prompt: generation stops
        there (as a reply cut by max_tokens does), instead of running on past the positions the model
        was trained on. A prompt that fills the window fails the call, saying so."""
        if window is None:
            return max_tokens
        if prompt_tokens >= window:
            raise LLMError(
                f"{self.identity}: the prompt has {prompt_tokens} tokens and the model's context window is "
                f"{window}: {WINDOW_FULL}"
            )
        return min(max_tokens, window - prompt_tokens)

    def _load(self) -> tuple[Any, Any]:
        """The engine over this client's own copy of the model (it owns its generation config), and the
        tokenizer prompts are rendered with."""
        with self._lock:
            if self._engine is None:
                from gym.models import load_model, load_tokenizer
                from gym.serve.engine import Engine

                tokenizer = load_tokenizer(self.ref)
                self._engine = Engine(
                    load_model(self.ref),
                    tokenizer,
                    name=self.identity,
                    chat_template=tokenizer.chat_template or "",  # prompts are rendered here, not there
                    max_batch_size=self.max_n,
                )
                self._tokenizer = tokenizer
            return self._engine, self._tokenizer

    def complete(
        self, messages: Messages, *, temperature: float, max_tokens: int, seed: int, n: int = 1
    ) -> Completion:
        from pydantic import ValidationError

        from gym.serve.params import SamplingParams
        from gym.serve.requests import RequestError

        engine, tokenizer = self._load()
        with self._lock:
            prompt = self._render(tokenizer, messages)
        ids = engine.encode_text(prompt)
        try:
            params = SamplingParams(
                max_tokens=self._room(engine.context_length, len(ids), max_tokens),
                temperature=temperature,
                n=n,
                seed=seed,
            )
            result = engine.generate(ids, params)
        except (RequestError, ValidationError) as exc:
            raise LLMError(f"{self.identity}: {exc}") from exc
        return Completion(
            texts=[choice.text for choice in result.choices],
            usage=Usage(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens),
        )


class LoadedClient(LocalClient):
    """A transformers model and tokenizer already in memory (`GRPOTrainer(model=..., tokenizer=...)`).

    Prompts are rendered with gym's `template` if given, else with the tokenizer's own chat template.
    The model stays the caller's, its generation config untouched: it generates with transformers'
    `generate`, the n samples of a call in one batch, one call at a time (the torch RNG is
    process-wide), replies stopping at its context window as LocalClient's do.
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

    def _load(self) -> tuple[Any, Any]:
        """The caller's model and tokenizer (no engine: see the class docstring)."""
        return self._loaded

    def _render(self, tokenizer: Any, messages: Messages) -> str:
        if self.template is not None:
            from gym.templates import render

            return render(tokenizer, messages, self.template, add_generation_prompt=True)
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def complete(
        self, messages: Messages, *, temperature: float, max_tokens: int, seed: int, n: int = 1
    ) -> Completion:
        import torch

        from gym.models import context_window

        with self._lock:
            model, tokenizer = self._load()
            prompt = self._render(tokenizer, messages)
            batch = tokenizer([prompt] * n, return_tensors="pt", add_special_tokens=False)
            prompt_tokens = int(batch["input_ids"].shape[1])
            budget = self._room(context_window(model.config), prompt_tokens, max_tokens)
            torch.manual_seed(seed)
            sampling: dict[str, Any] = (
                {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
                if temperature > 0
                else {"do_sample": False}
            )
            with torch.inference_mode():
                out = model.generate(
                    **batch,
                    max_new_tokens=budget,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                    **sampling,
                )
            new = out[:, prompt_tokens:]
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
            produced = int((new != tokenizer.pad_token_id).sum())
        return Completion(texts=texts, usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=produced))
