"""The serving engine: one loaded model, a scheduler thread that batches waiting requests into one
`generate` call, and per-request sampling, stop strings, token budgets and streaming.

    engine = Engine.load("gym-tiny")                        # registry name, model dir or models:/ URI
    result = engine.chat([{"role": "user", "content": "hi"}], max_tokens=32, temperature=0)
    print(result.choices[0].text)

Every request (HTTP or in-process) goes through `submit`: its prompt ids and `SamplingParams` join a
queue; the scheduler takes everything waiting (up to `max_batch_size` rows, one row per choice),
left-pads it into one batch and runs `generate` once. `RowSampler` (sampling.py) samples each
row with its own parameters; `RowTracker` (requests.py), a stopping criterion called after every
step, ends each row on its own end-of-sequence token, stop string or budget and publishes its
text to the request as it grows. `score` scores given ids, several sequences per forward pass (OpenAI's
`logprobs`, gym/serve/logprobs.py), taking turns with generation. The engine stays usable as a
library: `generate`/`chat` block, `agenerate`/`astream` await, and `submit` takes any callback.
A TF-GRPO model's shipped experience library is injected into every chat prompt
(gym.tfgrpo.injection): all of it, or, when the run set `retrieval_top_k`, the k experiences most
similar to the request's last user message, as in training.
"""

from __future__ import annotations

import asyncio
import copy
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from gym import attention
from gym.errors import GymError
from gym.hashing import hash_obj
from gym.models import context_window
from gym.serve import scoring
from gym.serve.params import SamplingParams
from gym.serve.requests import (
    CONTEXT_LENGTH_EXCEEDED,
    Delta,
    Event,
    Failed,
    Finished,
    Request,
    RequestError,
    Result,
    Row,
    RowTracker,
)
from gym.serve.sampling import Penalties, RowSampler, row_generator
from gym.serve.scoring import TokenLogprob
from gym.templates import with_system
from gym.tfgrpo.injection import ShippedLibrary, inject, inject_text, query_of

__all__ = [
    "Delta",
    "Engine",
    "Event",
    "Failed",
    "Finished",
    "Request",
    "RequestError",
    "Result",
    "TokenLogprob",
]


class Engine:
    """A loaded model serving generation requests in batches (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        chat_template: str,
        experiences: list[str] | ShippedLibrary | None = None,
        max_batch_size: int = 32,
        default_system: str | None = None,
        source: str | None = None,
        digest: str | None = None,
    ) -> None:
        attention.use(model)  # grouped-query heads shared inside SDPA under the batch's padding mask
        self.model, self.name, self.chat_template = model.eval(), name, chat_template
        self.source = source  # the folder the weights and tokenizer were loaded from (None: given objects)
        # What decides the answers behind `name` (weights, template, default system, injected library):
        # /v1/models shows it, so that a client caching answers (TF-GRPO's call cache) tells two models
        # served under one name apart. None: unknown (a model given as objects).
        self.digest = digest
        self.default_system = default_system  # conversations without a system message open with it
        if isinstance(experiences, list):
            experiences = ShippedLibrary(texts=experiences)
        self.library = experiences
        self.max_batch_size = max_batch_size
        config = model.config.get_text_config()
        self.context_length: int | None = context_window(config)
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        defaults = model.generation_config
        eos = defaults.eos_token_id if defaults.eos_token_id is not None else config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self.eos = frozenset(eos_ids)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos), 0)
        self.pad_id = int(pad)
        # The engine owns this model instance: generation is configured per row (RowSampler, RowTracker),
        # so the batch-wide config only pads; end-of-sequence is each row's own decision.
        model.generation_config = GenerationConfig(
            pad_token_id=self.pad_id, bos_token_id=defaults.bos_token_id
        )
        # Requests are encoded on callers' threads while the scheduler decodes: tokenizers must not be
        # shared across threads (a Rust tokenizer raises "Already borrowed"), hence two and a lock.
        self._encoder, self._decoder = tokenizer, copy.deepcopy(tokenizer)
        self._encode_lock = threading.Lock()
        self._token_texts: dict[int, str] = {}
        self._model_lock = threading.Lock()  # one forward at a time: a batch's generate, or scoring
        self._scoring_memo = scoring.Memo()  # the last scored opening (read and kept under the lock)
        self.stats = {
            "batches": 0,
            "rows": 0,
            "largest_batch": 0,
        }  # batching at work, for tests and benchmarks
        self._queue: queue.Queue[Request | None] = queue.Queue()
        self._carry: deque[Request] = deque()
        self._thread = threading.Thread(target=self._loop, name=f"gym-serve:{name}", daemon=True)
        self._thread.start()

    @classmethod
    def load(
        cls,
        model: str,
        *,
        template: str | None = None,
        name: str | None = None,
        trust_remote_code: bool = False,
        max_batch_size: int = 32,
        dtype: str = "auto",
        system: str | None = None,
    ) -> Engine:
        """Load a registry name, model directory or MLflow model URI (gym/serve/loading.py); `system`
        replaces the default system message the model was trained with."""
        from transformers import AutoTokenizer

        from gym.models import load_model
        from gym.serve.loading import resolve_served

        served = resolve_served(model, template, trust_remote_code, system)
        library = served.library
        digest = hash_obj(
            {
                "weights": served.ref.digest,
                "template": served.chat_template,
                "system": served.ref.default_system,
                "library": [library.hash, library.texts, library.retrieval_top_k] if library else None,
            }
        )
        tokenizer = AutoTokenizer.from_pretrained(
            served.path, revision=served.ref.revision, trust_remote_code=served.ref.trust_remote_code
        )
        return cls(
            load_model(served.ref, dtype=dtype),
            tokenizer,
            name=name or model,
            chat_template=served.chat_template,
            experiences=served.library,
            max_batch_size=max_batch_size,
            default_system=served.ref.default_system,
            source=str(served.path),
            digest=digest,
        )

    # ---- prompts --------------------------------------------------------------------------------------

    @property
    def experiences(self) -> list[str] | None:
        """The whole shipped library (None: the model ships none)."""
        return self.library.texts if self.library is not None else None

    def experiences_for(self, query: str) -> list[str]:
        """The experiences a prompt asking `query` gets: all, or the shipped retrieval_top_k most similar."""
        return self.library.texts_for(query) if self.library is not None else []

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        """The prompt for `messages`: the model's default system message where they have none, experiences
        injected (after it), chat template applied, assistant cue added."""
        from jinja2 import TemplateError

        messages = with_system([list(messages)], self.default_system)[0]
        try:
            with self._encode_lock:
                text = self._encoder.apply_chat_template(
                    inject(messages, self.experiences_for(query_of(messages))),
                    chat_template=self.chat_template,
                    add_generation_prompt=True,
                    tokenize=False,
                )
        except TemplateError as exc:  # templates raise on conversations they don't support
            raise RequestError(f"the chat template refused these messages: {exc}", "messages") from exc
        return str(text)

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self.encode_text(self.render_chat(messages))

    def encode_completion(self, prompt: str | list[int], experiences: bool = False) -> list[int]:
        """A raw completion prompt's ids: as sent, or (`experiences`, when the model ships a library)
        after the experience block and a blank line, the only place a raw prompt has for it."""
        return self.completion_ids(prompt, experiences)[0]

    def completion_ids(self, prompt: str | list[int], experiences: bool = False) -> tuple[list[int], int]:
        """`encode_completion`'s ids, and where the caller's own prompt begins in them."""
        ids = self.encode_text(prompt) if isinstance(prompt, str) else list(prompt)
        if not (experiences and self.experiences):
            return ids, 0
        query = prompt if isinstance(prompt, str) else self.decode(ids)  # the raw prompt is the question
        # Text and ids are encoded apart so that ids sent by the caller stay exactly as sent.
        block = self.encode_text(inject_text("", self.experiences_for(query)))
        return block + ids, len(block)

    def encode_text(self, prompt: str) -> list[int]:
        # The template (or the caller) already wrote any special tokens the prompt needs.
        with self._encode_lock:
            return list(self._encoder(prompt, add_special_tokens=False, verbose=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids' text (special tokens left out), from any thread."""
        with self._encode_lock:
            return str(self._encoder.decode(list(ids), skip_special_tokens=True))

    def decode_many(self, sequences: Sequence[Sequence[int]]) -> list[str]:
        """`decode` for a batch of id lists (one call into the tokenizer)."""
        if not sequences:
            return []
        with self._encode_lock:
            texts = self._encoder.batch_decode([list(ids) for ids in sequences], skip_special_tokens=True)
        return [str(t) for t in texts]

    def token_text(self, token: int) -> str:
        """One token's text on its own, as `decode` gives it (remembered: the same ids recur)."""
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.decode([token])
        return text

    def score(
        self, sequences: Sequence[Sequence[int]], top: int = 0, next_token: bool = False
    ) -> list[list[TokenLogprob | None]]:
        """Each sequence's tokens' log-probabilities given the ones before them (None for the first,
        which has no context), with the `top` most likely tokens at each place, as OpenAI's `logprobs`
        report them: the model's own distribution (no temperature). With `next_token`, each list ends
        with one more entry: the most likely token after the sequence (what greedy decoding picks).
        Sequences are batched, and a shared opening is run once (gym/serve/scoring.py)."""
        return scoring.score(
            self.model, self._model_lock, self.pad_id, sequences, top, next_token, self._scoring_memo
        )

    # ---- requests -------------------------------------------------------------------------------------

    def check(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise RequestError for what this model cannot do: an empty prompt, too many choices or tokens."""
        if not prompt_ids:
            raise RequestError("the prompt is empty", "prompt")
        if min(prompt_ids) < 0 or max(prompt_ids) >= self.vocab_size:
            raise RequestError(f"prompt token ids must lie in [0, {self.vocab_size})", "prompt")
        if any(not 0 <= token < self.vocab_size for token, _ in params.logit_bias):
            raise RequestError(f"logit_bias token ids must lie in [0, {self.vocab_size})", "logit_bias")
        if params.n > self.max_batch_size:
            raise RequestError(f"n={params.n} exceeds the server's batch size {self.max_batch_size}", "n")
        total = len(prompt_ids) + params.max_tokens
        if self.context_length is not None and total > self.context_length:
            full = len(prompt_ids) >= self.context_length  # no max_tokens can make room
            raise RequestError(
                f"this model's maximum context length is {self.context_length} tokens; the request needs "
                f"{total} ({len(prompt_ids)} in the prompt, {params.max_tokens} to generate): shorten the "
                f"prompt{'' if full else ' or lower max_tokens'}",
                "prompt" if full else "max_tokens",
                CONTEXT_LENGTH_EXCEEDED,
            )

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        emit: Callable[[Event], None],
        stream: bool = False,
    ) -> Request:
        """Queue a request; `emit` gets its events on the scheduler thread. Returns it (for `cancel`)."""
        self.check(prompt_ids, params)
        if params.max_tokens == 0:
            raise RequestError("max_tokens is 0: there is nothing to generate", "max_tokens")
        if not self._thread.is_alive():
            raise GymError(f"engine {self.name!r} is closed")
        request = Request(list(prompt_ids), params, emit, stream)
        self._queue.put(request)
        return request

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Result:
        """Block until the request is done."""
        events: queue.Queue[Event] = queue.Queue()
        self.submit(prompt_ids, params, events.put)
        return _collect(iter(events.get, None), params.n, len(prompt_ids))

    def chat(self, messages: Sequence[dict[str, str]], **params: Any) -> Result:
        """`generate` for a conversation; keyword arguments are SamplingParams fields."""
        return self.generate(self.encode_chat(messages), SamplingParams(**params))

    def stream_chat(self, messages: Sequence[dict[str, str]], **params: Any) -> Iterator[str]:
        """The reply to a conversation, piece by piece as it is generated (blocking iterator)."""
        events: queue.Queue[Event] = queue.Queue()
        request = self.submit(self.encode_chat(messages), SamplingParams(**params), events.put, stream=True)
        try:
            while not isinstance(event := events.get(), Finished):
                if isinstance(event, Failed):
                    raise event.error
                yield event.text
        finally:
            request.cancel()  # a no-op once finished; stops generating if the reader left early

    async def agenerate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Result:
        events = [e async for e in self.astream(prompt_ids, params, stream=False)]
        return _collect(iter(events), params.n, len(prompt_ids))

    async def astream(
        self, prompt_ids: Sequence[int], params: SamplingParams, stream: bool = True
    ) -> AsyncIterator[Delta | Finished]:
        """Yield the request's events as they come; cancelling the iteration cancels the request."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        request = self.submit(prompt_ids, params, emit, stream)
        remaining = params.n
        try:
            while remaining:
                event = await events.get()
                if isinstance(event, Failed):
                    raise event.error
                if isinstance(event, Finished):
                    remaining -= 1
                yield event
        finally:
            if remaining:
                request.cancel()

    def close(self) -> None:
        """Finish what is running, then stop the scheduler."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the scheduler thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            batch, closing = self._next_batch()
            if batch:
                self._run(batch)
            if closing:
                return

    def _next_batch(self) -> tuple[list[Request], bool]:
        """Everything waiting, up to `max_batch_size` rows (waits for the first request)."""
        first = self._carry.popleft() if self._carry else self._queue.get()
        if first is None:
            return [], True
        batch, rows = [first], first.params.n
        while rows < self.max_batch_size:
            try:
                nxt = self._carry.popleft() if self._carry else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                return batch, True
            if rows + nxt.params.n > self.max_batch_size:
                self._carry.appendleft(nxt)
                break
            batch.append(nxt)
            rows += nxt.params.n
        return [r for r in batch if not r.cancelled.is_set()], False

    def _run(self, batch: list[Request]) -> None:
        rows = [Row(req, j, self.eos, self._decode) for req in batch for j in range(req.params.n)]
        self.stats["batches"] += 1
        self.stats["rows"] += len(rows)
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(rows))
        params = [row.request.params for row in rows]
        width = max(len(row.request.prompt_ids) for row in rows)
        ids = [[self.pad_id] * (width - len(r.request.prompt_ids)) + r.request.prompt_ids for r in rows]
        mask = [[0] * (width - len(r.request.prompt_ids)) + [1] * len(r.request.prompt_ids) for r in rows]
        processors = LogitsProcessorList()
        if any(p.penalized for p in params):
            lengths = [len(r.request.prompt_ids) for r in rows]
            processors.append(Penalties(params, width, self.vocab_size, lengths))
        if not all(p.greedy for p in params):
            gens = [
                None if p.greedy else row_generator(p.seed, row.index, self.model.device)
                for p, row in zip(params, rows, strict=True)
            ]
            processors.append(RowSampler(params, gens))
        try:
            with self._model_lock, torch.inference_mode():
                self.model.generate(
                    input_ids=torch.tensor(ids, device=self.model.device),
                    attention_mask=torch.tensor(mask, device=self.model.device),
                    max_new_tokens=max(p.max_tokens for p in params),
                    logits_processor=processors,
                    stopping_criteria=StoppingCriteriaList([RowTracker(rows)]),
                )
        except Exception as exc:  # the whole batch fails together; each caller gets the error
            for req in batch:
                req.emit(Failed(exc))
            return
        for row in rows:
            if not row.done:
                row.finish("length")

    def _decode(self, ids: list[int]) -> str:
        return str(self._decoder.decode(ids, skip_special_tokens=True))


def _collect(events: Any, n: int, prompt_tokens: int) -> Result:
    done: dict[int, Finished] = {}
    for event in events:
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Finished):
            done[event.index] = event
            if len(done) == n:
                break
    return Result([done[i] for i in range(n)], prompt_tokens)
