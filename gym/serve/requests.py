"""One request's life inside the engine: the events it receives, and how each of its rows (one per
choice) ends on its own terms inside a shared batch.

`RowTracker` is the stopping criterion `generate` calls after every step: for each unfinished row
it reads the newest token, ends the row on its end-of-sequence token, a stop string or its token
budget, and publishes new text to the request (holding back what might still become a stop
string or a multi-byte character).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import StoppingCriteria

from gym.errors import GymError
from gym.serve.params import SamplingParams

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's error code for a request past the window


class RequestError(GymError, ValueError):
    """A request the engine cannot serve as asked (a 400 over HTTP); `param` names the field (`prompt`
    for the prompt, also a chat's messages) and `code` is OpenAI's error code, if it has one."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code


@dataclass(frozen=True)
class Delta:
    """New text of choice `index` (streaming requests only)."""

    index: int
    text: str


@dataclass(frozen=True)
class Finished:
    """Choice `index` is complete: its whole text, why it ended, how many tokens it took and their ids
    (with the end-of-sequence token it ended on, which the count and the text leave out; with a stop
    string, the tokens that formed it)."""

    index: int
    text: str
    finish_reason: str  # "stop" (end of turn or a stop string) or "length" (budget reached)
    completion_tokens: int
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Failed:
    """Generation raised: the request ends with this error."""

    error: BaseException


Event = Delta | Finished | Failed


@dataclass(frozen=True)
class Result:
    """A finished request: its choices in order and the token counts OpenAI's `usage` reports."""

    choices: list[Finished]
    prompt_tokens: int

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)


@dataclass
class Request:
    """A submitted request; `emit` receives its events from the scheduler thread."""

    prompt_ids: list[int]
    params: SamplingParams
    emit: Callable[[Event], None]
    stream: bool = False
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Stop generating for this request (its rows finish at the next step)."""
        self.cancelled.set()


class Row:
    """One choice of one request while its batch runs."""

    def __init__(self, request: Request, index: int, eos: frozenset[int], decode: Callable[..., str]) -> None:
        self.request, self.index, self.decode = request, index, decode
        self.eos = frozenset() if request.params.ignore_eos else eos
        self.stops = request.params.stop
        self.hold = max((len(s) for s in self.stops), default=1) - 1  # a stop may still be forming
        self.ids: list[int] = []
        self.emitted = 0
        self.done = False

    def step(self, token: int) -> None:
        if self.request.cancelled.is_set():
            self.done = True
            return
        if token in self.eos:
            self.finish("stop", end=token)
            return
        self.ids.append(token)
        text = None
        if self.stops or self.request.stream:
            text = self.decode(self.ids)
            hits = [i for i in (text.find(s, max(self.emitted - self.hold, 0)) for s in self.stops) if i >= 0]
            if hits:
                self.finish("stop", text[: min(hits)])
                return
        if len(self.ids) >= self.request.params.max_tokens:
            self.finish("length", text)
        elif self.request.stream and text is not None:
            end = len(text) - self.hold
            while end > self.emitted and text[end - 1] == "\ufffd":  # a multi-byte character in progress
                end -= 1
            if end > self.emitted:
                self.request.emit(Delta(self.index, text[self.emitted : end]))
                self.emitted = end

    def finish(self, reason: str, text: str | None = None, end: int | None = None) -> None:
        text = self.decode(self.ids) if text is None else text
        if self.request.stream and len(text) > self.emitted:
            self.request.emit(Delta(self.index, text[self.emitted :]))
        ids = (*self.ids, end) if end is not None else tuple(self.ids)
        self.request.emit(Finished(self.index, text, reason, len(self.ids), ids))
        self.done = True


class RowTracker(StoppingCriteria):
    """Stopping criterion that ends each row on its own terms and publishes its text (module docstring)."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        newest = input_ids[:, -1].tolist()
        for row, token in zip(self.rows, newest, strict=True):
            if not row.done:
                row.step(token)
        return torch.tensor([row.done for row in self.rows], device=input_ids.device)
