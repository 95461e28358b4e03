"""The OpenAI-compatible HTTP API over an `Engine` (FastAPI).

    GET  /v1/models              the served model
    GET  /v1/models/{model}      its card by id (an unknown id: 404 model_not_found)
    POST /v1/chat/completions    chat, streamed over SSE with "stream": true
    POST /v1/completions         raw-prompt completion, streamed likewise (the prompt as sent; see build_app)
                                 `logprobs`/`echo` (chat: `logprobs`/`top_logprobs`) score tokens, unstreamed
    GET  /health                 liveness (no key needed)

Every error is a JSON body in OpenAI's shape: bad input is a 400 (never a 500), an unknown model
a 404, a missing or wrong key a 401, and requests beyond the concurrency cap a 429 with
Retry-After. The API key is compared in constant time and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gym.serve.engine import Delta, Engine, Finished, RequestError, Result
from gym.serve.logprobs import (
    Scored,
    chat_logprobs,
    completion_logprobs,
    pieces_many,
    score_choices,
    score_next_token,
)
from gym.serve.params import SamplingParams, Scoring
from gym.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    envelope,
    error_body,
    new_id,
    usage,
)
from gym.serve.requests import CONTEXT_LENGTH_EXCEEDED
from gym.serve.settings import Limits

log = logging.getLogger("gym.serve")


class APIError(Exception):
    def __init__(
        self, status: int, message: str, kind: str, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code


class _Gate:
    """Counts requests in progress; refuses one beyond the cap (a single event loop: no lock needed)."""

    def __init__(self, cap: int) -> None:
        self.cap, self.active = cap, 0

    def enter(self) -> None:
        if self.active >= self.cap:
            raise APIError(
                429, f"server busy: {self.cap} requests in progress; retry shortly", "rate_limit_error"
            )
        self.active += 1

    def leave(self) -> None:
        self.active -= 1


def build_app(
    engine: Engine,
    limits: Limits | None = None,
    api_key: str | None = None,
    completion_experiences: Literal["none", "prefix"] = "none",
) -> FastAPI:
    """The API for `engine`. `api_key`: the bearer token clients must send (None: no auth).

    A TF-GRPO model's experience library goes into every chat request's system message. A raw
    /v1/completions prompt is generated from exactly as sent unless `completion_experiences` is
    `prefix`: it has no system message to hold the block, it is often already a rendered chat or
    few-shot prompt whose layout the caller chose, and OpenAI's and vLLM's servers never alter it.
    """
    limits = limits or Limits()
    gate = _Gate(limits.max_concurrent)
    app = FastAPI(title="gym serve", description=f"OpenAI-compatible API serving {engine.name}")
    app.state.gate = gate

    _install_error_handlers(app)

    @app.middleware("http")
    async def authorize(request: Request, call_next: Any) -> Any:
        # A middleware, not a dependency: unauthenticated callers learn nothing, not even validation errors.
        if api_key is not None and request.url.path.startswith("/v1/"):
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(), api_key.encode()):
                message = "invalid or missing API key (send it as a bearer token)"
                body = error_body(message, "invalid_request_error", code="invalid_api_key")
                return JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    app.add_middleware(ShutdownCancelled)  # added last: outside the API key's middleware

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(engine)]}

    @app.get("/v1/models/{model:path}")  # `path`: an id may hold slashes (an MLflow URI, an org/name)
    async def retrieve_model(model: str) -> dict[str, Any]:
        _check_model(engine, model)
        return _model_card(engine)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Any:
        _check_model(engine, body.model)
        prompt = engine.encode_chat([m.as_dict() for m in body.messages])
        params = _params(engine, limits, body, len(prompt), default_budget=limits.default_max_tokens)
        return await _respond(engine, gate, body, [prompt], [0], params, chat=True, request=request)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        _check_model(engine, body.model)
        prefix = completion_experiences == "prefix"
        texts = body.prompts()
        if len(texts) > limits.max_prompts:  # before any of them is tokenized
            raise APIError(
                400,
                f"the request carries {len(texts)} prompts; this server accepts at most "
                f"{limits.max_prompts} per request (gym serve --limits.max_prompts): send them in smaller "
                "batches",
                "invalid_request_error",
                "prompt",
            )
        # Each prompt's ids, and where the caller's own prompt begins (after an experience block, if any).
        encoded = [engine.completion_ids(p, experiences=prefix) for p in texts]
        if not encoded:
            raise APIError(400, "prompt is empty", "invalid_request_error", "prompt")
        prompts, starts = [ids for ids, _ in encoded], [start for _, start in encoded]
        params = _params(engine, limits, body, max(len(p) for p in prompts), default_budget=16)
        return await _respond(engine, gate, body, prompts, starts, params, chat=False, request=request)

    return app


def _model_card(engine: Engine) -> dict[str, Any]:
    """The served model as OpenAI's `model` object (with vLLM's `max_model_len` when it is known, and
    gym's `digest` of what answers: weights, template, injected experience library)."""
    card: dict[str, Any] = {"id": engine.name, "object": "model", "created": 0, "owned_by": "gym"}
    if engine.context_length:
        card["max_model_len"] = engine.context_length
    if engine.digest:
        card["digest"] = engine.digest
    return card


def _check_model(engine: Engine, model: str) -> None:
    """A 404 in OpenAI's shape (code `model_not_found`) unless `model` is the one this server serves."""
    if model != engine.name:
        raise APIError(
            404,
            f"model {model!r} does not exist; this server serves {engine.name!r}",
            "invalid_request_error",
            "model",
            "model_not_found",
        )


def _params(
    engine: Engine,
    limits: Limits,
    body: ChatCompletionRequest | CompletionRequest,
    prompt_len: int,
    default_budget: int | None,
) -> SamplingParams:
    if prompt_len > limits.max_prompt_tokens:
        raise APIError(
            400,
            f"the prompt has {prompt_len} tokens; this server accepts at most {limits.max_prompt_tokens}",
            "invalid_request_error",
            _field("prompt", body),
            CONTEXT_LENGTH_EXCEEDED,
        )
    budget = body.budget()
    if budget is not None and budget > limits.max_tokens:
        field = _field("max_tokens", body)
        raise APIError(
            400,
            f"{field}={budget} exceeds this server's cap of {limits.max_tokens}",
            "invalid_request_error",
            field,
        )
    if budget is None:  # chat: --limits.default_max_tokens, else as much as fits; completions: OpenAI's 16
        room = (engine.context_length or limits.max_tokens + prompt_len) - prompt_len
        budget = max(1, min(default_budget or limits.max_tokens, room))
    return SamplingParams(
        max_tokens=budget,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        n=body.n,
        stop=body.stops(),
        seed=body.seed,
        ignore_eos=body.ignore_eos,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        logit_bias=body.bias_pairs(),
        top_k=max(0, body.top_k or 0),
        min_p=body.min_p or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
    )


def _field(param: str | None, body: GenerationRequest) -> str | None:
    """The request's own name for what the engine calls `param`: a chat's prompt is its `messages`, and
    its token budget is `max_completion_tokens` when that is the field it sent."""
    if param == "prompt" and isinstance(body, ChatCompletionRequest):
        return "messages"
    if param == "max_tokens" and getattr(body, "max_completion_tokens", None) is not None:
        return "max_completion_tokens"
    return param


async def _respond(
    engine: Engine,
    gate: _Gate,
    body: GenerationRequest,
    prompts: list[list[int]],
    starts: list[int],
    params: SamplingParams,
    chat: bool,
    request: Request | None = None,
) -> Any:
    for prompt in prompts:
        try:
            engine.check(prompt, params)
        except RequestError as exc:
            raise APIError(400, str(exc), "invalid_request_error", _field(exc.param, body), exc.code) from exc
    gate.enter()
    if body.stream:
        return EventSourceResponse(_stream(engine, gate, body, prompts, params, chat))
    scoring = body.scoring()
    scored: list[Scored | None]  # per choice, in order: what its logprobs are read from (None: not asked)
    try:
        if params.max_tokens == 0:  # OpenAI's legacy completions: the prompt only, echoed and scored
            scores = (
                None if scoring.top is None else await asyncio.to_thread(engine.score, prompts, scoring.top)
            )
            results = [
                Result([Finished(j, "", "length", 0) for j in range(params.n)], len(p)) for p in prompts
            ]
            scored = [
                None if scores is None else Scored(prompts[i], c, [], scores[i])
                for i, result in enumerate(results)
                for c in result.choices
            ]
        elif _next_token_only(params, scoring, chat):
            assert scoring.top is not None
            found = await score_next_token(engine, prompts, scoring.top)
            results, scored = [Result([s.choice], len(s.prompt)) for s in found], list(found)
        else:
            generating = asyncio.gather(*(engine.agenerate(p, params) for p in prompts))
            if request is not None and not await _finished_before_leaving(request, generating):
                return Response(status_code=CLIENT_CLOSED)  # nobody reads it
            results = list(await generating)
            pairs = [(prompts[i], c) for i, result in enumerate(results) for c in result.choices]
            if scoring.top is None:
                scored = [None] * len(pairs)
            else:
                scored = list(await score_choices(engine, pairs, scoring.top, chat))
        flat = [(i, c) for i, result in enumerate(results) for c in result.choices]
        # The echoed prompts' token texts, each prompt once (prompts that open alike share the work).
        echoes: list[list[str] | None] = [None] * len(prompts)
        if scoring.echo:
            echoes = list(
                pieces_many(engine.decode_many, [p[a:] for p, a in zip(prompts, starts, strict=True)])
            )
        choices = [
            _choice(engine, starts[i], i * params.n + c.index, c, chat, s, echoes[i])
            for (i, c), s in zip(flat, scored, strict=True)
        ]
    finally:
        gate.leave()
    prompt_tokens = sum(r.prompt_tokens for r in results)
    kind, prefix = ("chat.completion", "chatcmpl") if chat else ("text_completion", "cmpl")
    return envelope(
        kind,
        new_id(prefix),
        engine.name,
        choices,
        usage=usage(prompt_tokens, sum(r.completion_tokens for r in results)),
    )


CLIENT_CLOSED = 499  # nginx's status for a request its client closed before the answer


async def _finished_before_leaving(request: Request, work: asyncio.Future[Any]) -> bool:
    """Wait for `work`; if the client disconnects first, cancel it and say False. A streamed request
    stops when its client leaves; an unstreamed one generated on to its last token, holding its rows of
    the batch and its concurrency slot for a reply nobody would read (vLLM aborts it too).

    The disconnect is awaited as the ASGI message it is: Starlette's `request.is_disconnected()` never
    sees it behind an HTTP middleware (the API key's), whose receive it polls with a cancelled scope."""

    async def left() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(left())
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if work in done:
        return True
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    return False


def _next_token_only(params: SamplingParams, scoring: Scoring, chat: bool) -> bool:
    """Whether the reply is one greedy token, scored: the scoring pass alone gives it (no generation)."""
    plain = params.greedy and not (params.penalized or params.stop or params.ignore_eos)
    return not chat and scoring.top is not None and plain and params.max_tokens == 1 and params.n == 1


def _choice(
    engine: Engine,
    start: int,
    index: int,
    c: Finished,
    chat: bool,
    scored: Scored | None,
    shown: list[str] | None,
) -> dict[str, Any]:
    """One finished choice in the response, with its log-probabilities when the request asks (`scored`)
    and, for an echoed completion, the prompt's token texts (`shown`)."""
    text, logprobs = c.text, None
    if chat and scored is not None:
        logprobs = chat_logprobs(engine, scored)
    elif scored is not None:
        text, logprobs = completion_logprobs(engine, scored, start, shown)
    elif shown is not None:
        text = "".join(shown) + c.text
    item: dict[str, Any] = {"index": index, "finish_reason": c.finish_reason, "logprobs": logprobs}
    item.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    return item


async def _stream(
    engine: Engine,
    gate: _Gate,
    body: GenerationRequest,
    prompts: list[list[int]],
    params: SamplingParams,
    chat: bool,
) -> AsyncIterator[str]:
    """SSE lines: one chunk per text delta and per finished choice, optionally usage, then [DONE]."""
    kind, rid = ("chat.completion.chunk", new_id("chatcmpl")) if chat else ("text_completion", new_id("cmpl"))
    completion_tokens = 0

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return (
            "data: "
            + json.dumps(envelope(kind, rid, engine.name, choices, **extra), ensure_ascii=False)
            + "\n\n"
        )

    try:
        for p_index, prompt in enumerate(prompts):
            if chat:
                yield chunk(
                    [
                        {"index": j, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                        for j in range(params.n)
                    ]
                )
            async for event in engine.astream(prompt, params):
                index = p_index * params.n + event.index
                if isinstance(event, Delta):
                    piece: dict[str, Any] = (
                        {"delta": {"content": event.text}} if chat else {"text": event.text}
                    )
                    yield chunk([{"index": index, **piece, "finish_reason": None, "logprobs": None}])
                elif isinstance(event, Finished):
                    completion_tokens += event.completion_tokens
                    piece = {"delta": {}} if chat else {"text": ""}
                    yield chunk(
                        [{"index": index, **piece, "finish_reason": event.finish_reason, "logprobs": None}]
                    )
        if body.stream_options and body.stream_options.include_usage:
            yield chunk([], usage=usage(sum(len(p) for p in prompts), completion_tokens))
        yield "data: [DONE]\n\n"
    except Exception as exc:  # headers are sent: report in-band, as OpenAI does
        log.exception("generation failed")
        yield "data: " + json.dumps(error_body(f"generation failed: {exc}", "server_error")) + "\n\n"
    finally:
        gate.leave()


class ShutdownCancelled:
    """A request the server cancels while stopping (past --shutdown-timeout, or a second Ctrl-C) gets an
    OpenAI-shaped 503 to retry elsewhere, not uvicorn's plain-text 500 and a traceback in the log. A
    streamed reply that has begun can only end where it is.

    A second Ctrl-C also cancels the app's lifespan task, waiting for the shutdown uvicorn then skips:
    Starlette reports that cancellation as a failed shutdown carrying its traceback, which uvicorn logged
    as an ERROR. Nothing failed (the server stops at once, as asked), so the report goes without it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        started = False

        async def sending(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except asyncio.CancelledError:
            if scope["type"] != "http" or started:
                raise
            log.warning("request cancelled: the server is stopping")
            body = error_body("the server is shutting down: send the request again", "server_error")
            headers = [(b"content-type", b"application/json"), (b"retry-after", b"1")]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": json.dumps(body).encode()})

    async def _lifespan(self, scope: Any, receive: Any, send: Any) -> None:
        cancelled = False

        async def receiving() -> Any:
            nonlocal cancelled
            try:
                return await receive()
            except asyncio.CancelledError:
                cancelled = True  # cancelled while waiting for startup or shutdown: the server is stopping
                raise

        async def sending(message: dict[str, Any]) -> None:
            if cancelled and message["type"].endswith(".failed"):
                log.debug("lifespan cancelled: the server stops at once")
                message = {"type": message["type"]}  # without its traceback, uvicorn logs nothing
            await send(message)

        await self.app(scope, receiving, sending)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status == 429 else None
        return JSONResponse(
            error_body(exc.message, exc.kind, exc.param, exc.code), exc.status, headers=headers
        )

    @app.exception_handler(RequestError)
    async def bad_request(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "invalid_request_error", exc.param, exc.code), 400)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first: dict[str, Any] = dict(exc.errors()[0]) if exc.errors() else {"loc": (), "msg": "invalid"}
        if first.get("type") == "json_invalid":
            detail = (first.get("ctx") or {}).get("error", "")
            return JSONResponse(
                error_body(f"the request body is not valid JSON: {detail}", "invalid_request_error"), 400
            )
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        if not where and first.get("type") == "model_attributes_type":  # not JSON, or not an object
            sent = request.headers.get("content-type", "")
            message = "the request body must be a JSON object"
            if sent.split(";")[0].strip().lower() != "application/json":  # `curl -d` sends a form
                came = sent or "no type"
                message += f", sent with Content-Type: application/json (this one came as {came!r})"
            return JSONResponse(error_body(message, "invalid_request_error"), 400)
        if first.get("type") in ("unsupported", "param"):  # a check across fields, naming the one at fault
            message, where = str(first.get("msg")), str((first.get("ctx") or {}).get("param"))
        else:  # pydantic's "Value error, " says nothing to a client
            message = f"{where or 'body'}: {str(first.get('msg', 'invalid')).removeprefix('Value error, ')}"
        return JSONResponse(error_body(message, "invalid_request_error", where or None), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error"), exc.status_code)

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return JSONResponse(error_body("internal server error", "server_error"), 500)
