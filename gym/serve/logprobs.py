"""Log-probabilities in OpenAI's two shapes, from one scoring pass of the engine per response.

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

A greedy one-token completion (what lm-eval asks for every answer it scores) is not generated at all:
`score_next_token` reads the token greedy decoding would pick, and its score, from the scoring pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gym.serve.engine import Engine, Finished, TokenLogprob

LOOKBACK = 6  # tokens decoded before each one to read its text in context


def pieces(decode_many: Callable[[list[list[int]]], list[str]], ids: Sequence[int]) -> list[str]:
    """Each token's share of the decoded whole: what decoding it after the few tokens before it adds (a
    short window, as incremental detokenizers do: a long prompt costs linear time, not quadratic).
    `decode_many` decodes a batch of id lists; every window is decoded in one call, and only a
    character split over tokens needs more."""
    return _pieces(decode_many, list(ids), [], 0)[0]


def pieces_many(
    decode_many: Callable[[list[list[int]]], list[str]], sequences: Sequence[Sequence[int]]
) -> list[list[str]]:
    """`pieces` of each sequence. A token's piece depends only on the tokens up to it, so a sequence
    opening like another (the same few-shot context, another answer) takes that part's pieces as they are."""
    out: list[list[str]] = [[] for _ in sequences]
    prev: list[int] = []
    prev_pieces: list[str] = []
    prev_carries = [0]  # the carry entering each position of `prev`, and after its last
    for i in sorted(range(len(sequences)), key=lambda j: list(sequences[j])):
        ids = list(sequences[i])
        k = 0
        while k < min(len(prev), len(ids)) and prev[k] == ids[k]:
            k += 1
        out[i], carries = _pieces(decode_many, ids, prev_pieces[:k], prev_carries[k])
        prev, prev_pieces, prev_carries = ids, out[i], prev_carries[:k] + carries
    return out


def _pieces(
    decode_many: Callable[[list[list[int]]], list[str]], ids: list[int], known: list[str], carry: int
) -> tuple[list[str], list[int]]:
    """`pieces` of `ids` whose first len(known) are known, `carry` entering the next (tokens whose
    bytes don't make a whole character yet); with the carry entering each later position and the last."""
    k, n = len(known), len(ids)
    texts = decode_many([ids[max(0, i - LOOKBACK) : i + end] for end in (0, 1) for i in range(k, n)])
    out, carries = list(known), []
    for j, i in enumerate(range(k, n)):
        carries.append(carry)
        if carry:
            start = max(0, i - carry - LOOKBACK)
            before, after = decode_many([ids[start : i - carry], ids[start : i + 1]])
        else:
            before, after = texts[j], texts[n - k + j]
        before = before.rstrip("\ufffd")
        if after.endswith("\ufffd"):  # a character still missing bytes shows once its last byte comes
            out.append("")
            carry += 1
            continue
        out.append(after[len(before) :])
        carry = 0
    carries.append(carry)
    return out, carries


def _kept(tokens: list[str], text: str) -> int:
    """How many of the reply's tokens begin inside `text` (the reply as returned)."""
    offset = 0
    for i, piece in enumerate(tokens):
        if offset >= len(text) and piece:
            return i
        offset += len(piece)
    return len(tokens)


@dataclass(frozen=True)
class Scored:
    """A finished choice with what its logprobs are read from: its prompt (the ids the model saw), the
    texts of the reply's tokens that begin in the returned text, and the scores of prompt + those tokens."""

    prompt: list[int]
    choice: Finished
    reply: list[str]
    scores: list[TokenLogprob | None]


def _reply(engine: Engine, choice: Finished, chat: bool) -> list[str]:
    text_ids = choice.token_ids[: choice.completion_tokens]  # without the end token it may have ended on
    reply = pieces(engine.decode_many, text_ids)
    reply = reply[: _kept(reply, choice.text)]
    if not chat and len(reply) == choice.completion_tokens < len(choice.token_ids):
        reply.append("")  # the end token: listed (completions shape), adding nothing to the text
    return reply


async def score_choices(
    engine: Engine, choices: list[tuple[list[int], Finished]], top: int, chat: bool
) -> list[Scored]:
    """Every (prompt, choice) of a response scored together: one call of the engine, sequences batched."""
    replies = [_reply(engine, c, chat) for _, c in choices]
    sequences = [[*p, *c.token_ids[: len(r)]] for (p, c), r in zip(choices, replies, strict=True)]
    scores = await asyncio.to_thread(engine.score, sequences, top)
    return [Scored(p, c, r, s) for (p, c), r, s in zip(choices, replies, scores, strict=True)]


async def score_next_token(engine: Engine, prompts: list[list[int]], top: int) -> list[Scored]:
    """Greedy one-token completions with their logprobs from one scoring pass, no generation: the most
    likely token after each prompt is the one greedy decoding picks, and its score is already there.
    This is every request lm-eval's `local-completions` makes to score a multiple-choice answer."""
    scores = await asyncio.to_thread(engine.score, prompts, top, True)
    out = []
    for prompt, scored in zip(prompts, scores, strict=True):
        last = scored[-1]
        assert last is not None
        if last.token in engine.eos:
            choice = Finished(0, "", "stop", 0, (last.token,))
        else:
            choice = Finished(0, engine.token_text(last.token), "length", 1, (last.token,))
        out.append(Scored(prompt, choice, _reply(engine, choice, chat=False), scored))
    return out


def completion_logprobs(
    engine: Engine, scored: Scored, start: int, shown: list[str] | None
) -> tuple[str, dict[str, Any]]:
    """The choice's text and its legacy `logprobs` object; `shown`: the echoed prompt's token texts (None:
    not echoed). The caller's own prompt begins at `start` in the ids the model saw (before it: an
    experience block gym put there)."""
    choice, prompt = scored.choice, scored.prompt
    text = "".join(shown) + choice.text if shown is not None else choice.text
    entries = scored.scores[start:] if shown is not None else scored.scores[len(prompt) :]
    if shown is not None:
        entries[0] = None  # the caller's prompt opens with no context (gym's experience block aside)
    tokens = [*(shown or []), *scored.reply]
    offsets, at = [], 0
    for piece in tokens:
        offsets.append(at)
        at += len(piece)
    return text, {
        "tokens": tokens,
        "token_logprobs": [s.logprob if s else None for s in entries],
        "top_logprobs": [_top_map(engine, s) if s else None for s in entries],
        "text_offset": offsets,
    }


def _top_map(engine: Engine, scored: TokenLogprob) -> dict[str, float]:
    best = {engine.token_text(t): lp for t, lp in scored.top}
    best.setdefault(engine.token_text(scored.token), scored.logprob)
    return best


def chat_logprobs(engine: Engine, scored: Scored) -> dict[str, Any]:
    """The reply's `logprobs` object as chat completions give it."""
    content = []
    for piece, s in zip(scored.reply, scored.scores[len(scored.prompt) :], strict=True):
        assert s is not None
        alternatives = [(engine.token_text(t), lp) for t, lp in s.top]
        content.append(
            {
                **_entry(piece, s.logprob),
                "top_logprobs": [_entry(token, lp) for token, lp in alternatives],
            }
        )
    return {"content": content, "refusal": None}


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}
