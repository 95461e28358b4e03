"""Log-probabilities in OpenAI's two shapes, from one scoring pass of the engine.

/v1/completions (`logprobs: k`, `echo`): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`,
one entry per token, the prompt's first when echoed (its first token has no context: None). This is
what lm-eval's `local-completions` model reads to score multiple-choice tasks over HTTP.
/v1/chat/completions (`logprobs: true`, `top_logprobs: k`): `{"content": [{"token", "logprob",
"bytes", "top_logprobs": [...]}]}` for the reply's tokens.

A token's text is what it adds to the decoded whole, so the pieces join into the returned text (a
character split over several tokens shows on the last of them). In the completions shape each
position's top tokens include the chosen one, as OpenAI's did (up to k + 1 entries); chat gives the
k most likely. A reply cut at a stop string keeps the tokens that begin inside the returned text.
A reply that ended on the end-of-sequence token lists it in the completions shape (its text is
empty), as OpenAI and vLLM do: lm-eval reads every prompt token's score as all but the last entry,
so `max_tokens: 1` must always add one, even when the model's most likely next token ends the text.
Chat's content lists the reply's text tokens only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from gym.serve.engine import Engine, Finished, TokenLogprob
from gym.serve.params import Scoring

LOOKBACK = 6  # tokens decoded before each one to read its text in context


def pieces(decode: Callable[[Sequence[int]], str], ids: Sequence[int]) -> list[str]:
    """Each token's share of `decode(ids)`: what decoding it after the few tokens before it adds (a
    short window, as incremental detokenizers do: a long prompt costs linear time, not quadratic)."""
    out, carry = [], 0  # carry: tokens whose bytes don't make a whole character yet
    for i in range(len(ids)):
        start = max(0, i - carry - LOOKBACK)
        before = decode(ids[start : i - carry]).rstrip("\ufffd")
        after = decode(ids[start : i + 1])
        if after.endswith("\ufffd"):  # a character still missing bytes shows once its last byte comes
            out.append("")
            carry += 1
            continue
        out.append(after[len(before) :])
        carry = 0
    return out


async def score(engine: Engine, ids: Sequence[int], top: int) -> list[TokenLogprob | None]:
    return await asyncio.to_thread(engine.token_logprobs, ids, top)


def _kept(tokens: list[str], text: str) -> int:
    """How many of the reply's tokens begin inside `text` (the reply as returned)."""
    offset = 0
    for i, piece in enumerate(tokens):
        if offset >= len(text) and piece:
            return i
        offset += len(piece)
    return len(tokens)


async def completion_logprobs(
    engine: Engine, prompt: list[int], start: int, choice: Finished, scoring: Scoring
) -> tuple[str, dict[str, Any] | None]:
    """The choice's text (after the echoed prompt) and its legacy `logprobs` object (None unless asked).
    `prompt` is the ids the model saw; the caller's own prompt begins at `start` (before it: an
    experience block gym put there)."""
    shown = pieces(engine.decode, prompt[start:]) if scoring.echo else []
    text = "".join(shown) + choice.text if scoring.echo else choice.text
    if scoring.top is None:
        return text, None
    reply = pieces(engine.decode, choice.token_ids)
    reply = reply[: _kept(reply, choice.text)]
    scored = await score(engine, [*prompt, *choice.token_ids[: len(reply)]], scoring.top)
    scored = scored[start:] if scoring.echo else scored[len(prompt) :]
    if scoring.echo:
        scored[0] = None  # the caller's prompt opens with no context (gym's experience block aside)
    tokens = [*shown, *reply]
    offsets, at = [], 0
    for piece in tokens:
        offsets.append(at)
        at += len(piece)
    return text, {
        "tokens": tokens,
        "token_logprobs": [s.logprob if s else None for s in scored],
        "top_logprobs": [_top_map(engine, s) if s else None for s in scored],
        "text_offset": offsets,
    }


def _top_map(engine: Engine, scored: TokenLogprob) -> dict[str, float]:
    best = {engine.decode([t]): lp for t, lp in scored.top}
    best.setdefault(engine.decode([scored.token]), scored.logprob)
    return best


async def chat_logprobs(engine: Engine, prompt: list[int], choice: Finished, top: int) -> dict[str, Any]:
    """The reply's `logprobs` object as chat completions give it."""
    reply = pieces(engine.decode, choice.token_ids[: choice.completion_tokens])  # not the end token
    reply = reply[: _kept(reply, choice.text)]
    scored = (await score(engine, [*prompt, *choice.token_ids[: len(reply)]], top))[len(prompt) :]
    content = []
    for piece, s in zip(reply, scored, strict=True):
        assert s is not None
        alternatives = [(engine.decode([t]), lp) for t, lp in s.top]
        content.append(
            {
                **_entry(piece, s.logprob),
                "top_logprobs": [_entry(token, lp) for token, lp in alternatives],
            }
        )
    return {"content": content, "refusal": None}


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}
