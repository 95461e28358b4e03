"""Scoring given token ids with the served model: each token's log-probability where it stands.

    entries = score(model, lock, pad_id, [ids_a, ids_b], top=1, next_token=True)

The sequences of one call are planned into forward passes (`plan`): sequences that open with the
same tokens (the same few-shot context followed by each answer, as lm-eval sends a multiple-choice
question) share one pass over that context, whose cache then serves every continuation, as a
server's prefix cache does; the rest share right-padded passes, similar lengths together. Within a
shared pass, continuations that go on alike (one question's answers, where a request holds several
questions under one context) share a second level the same way (`_branches`), and a call's opening
starts from the one the call before it ran (`Memo`: lm-eval's consecutive requests repeat the same
few-shot context) as far as the two agree. A batch's padding
only ever follows a row's own tokens, which causal attention never lets them see, so no attention
mask is passed and SDPA keeps its fused causal kernel.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

SCORE_CHUNK = 512  # positions per float32 normalisation (bounds the memory of a long prompt)
SCORE_TOKENS = 4096  # positions per forward pass (rows x the longest), beyond one long sequence
SHARED_PREFIX = 32  # tokens sequences must share before their shared part is run once for all


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability where it stands, and the most likely tokens there: (id, logprob)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


Entries = list[TokenLogprob | None]


@dataclass
class Memo:
    """The shared opening the last call ran, kept for the next: its tokens, its KV cache (kept as it
    was: calls extend copies of it) and its tokens' entries with `top` alternatives."""

    tokens: list[int] = field(default_factory=list)
    cache: Any = None
    entries: Entries = field(default_factory=list)
    top: int = -1


@dataclass(frozen=True)
class Pass:
    """Sequences (their indices) run in one forward pass; `shared`: how many tokens they all open with
    that are run once (0: a right-padded batch)."""

    members: list[int]
    shared: int = 0


def _branches(rows: Sequence[Sequence[int]], start: int) -> list[tuple[int, list[int]]]:
    """Rows (sorted, all equal up to `start`) grouped by how they go on: (length, members) where the
    members share `length` more tokens (at least SHARED_PREFIX, each keeping its last token), and
    one (0, members) entry for the rows sharing nothing further."""
    branches, alone = [], []
    group, length = [0], len(rows[0]) - 1 - start
    for i in [*range(1, len(rows)), None]:
        if i is not None:
            common = _common(rows[group[0]][start:], rows[i][start:], min(length, len(rows[i]) - 1 - start))
            if common >= SHARED_PREFIX:
                group.append(i)
                length = common
                continue
        if len(group) > 1:
            branches.append((length, group))
        else:
            alone.extend(group)
        if i is not None:
            group, length = [i], len(rows[i]) - 1 - start
    return [*branches, (0, alone)] if alone else branches


def _common(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = 0
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def plan(sequences: Sequence[Sequence[int]]) -> list[Pass]:
    """The forward passes that score `sequences` (see the module docstring). A shared part always
    leaves each member at least its last token, whose logits only the member's own pass can give."""
    if not sequences:
        return []
    order = sorted(range(len(sequences)), key=lambda i: tuple(sequences[i]))  # shared openings side by side
    passes, alone = [], []
    group, shared = [order[0]], len(sequences[order[0]]) - 1 if order else 0
    for i in [*order[1:], None]:
        if i is not None:
            seq, first = sequences[i], sequences[group[0]]
            common = _common(first, seq, min(shared, len(seq) - 1))
            widest = max(len(sequences[j]) for j in [*group, i]) - common
            if common >= SHARED_PREFIX and (len(group) + 1) * widest <= SCORE_TOKENS:
                group.append(i)
                shared = common
                continue
        if len(group) > 1:
            passes.append(Pass(group, shared))
        else:
            alone.extend(group)
        if i is not None:
            group, shared = [i], len(sequences[i]) - 1
    group = []
    for i in sorted(alone, key=lambda j: len(sequences[j])):
        if group and (len(group) + 1) * len(sequences[i]) > SCORE_TOKENS:
            passes.append(Pass(group))
            group = []
        group.append(i)
    if group:
        passes.append(Pass(group))
    return passes


def score(
    model: Any,
    lock: threading.Lock,
    pad_id: int,
    sequences: Sequence[Sequence[int]],
    top: int = 0,
    next_token: bool = False,
    memo: Memo | None = None,
) -> list[Entries]:
    """Each sequence's entries: None for its first token (no context), then each token's
    log-probability with the `top` most likely tokens at its place; with `next_token`, one more entry
    for the most likely token after the sequence (what greedy decoding picks). `lock` is held while
    the model runs (generation takes turns with scoring). `memo`: the opening of a previous call to
    start from, updated with this call's (the caller keeps one per model)."""
    out: dict[int, Entries] = {}
    with torch.inference_mode():
        for p in plan(sequences):
            rows = [list(sequences[i]) for i in p.members]
            if p.shared:
                scored = _shared(model, lock, pad_id, rows, p.shared, top, next_token, memo)
            else:
                scored = _padded(model, lock, pad_id, rows, top, next_token)
            out.update(zip(p.members, scored, strict=True))
    return [out[i] for i in range(len(sequences))]


def _padded(
    model: Any, lock: threading.Lock, pad_id: int, rows: list[list[int]], top: int, next_token: bool
) -> list[Entries]:
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], device=model.device)
    with lock:
        logits = model(input_ids=ids).logits
    return [_entries(logits[b], r, top, next_token) for b, r in enumerate(rows)]


def _shared(
    model: Any,
    lock: threading.Lock,
    pad_id: int,
    rows: list[list[int]],
    shared: int,
    top: int,
    next_token: bool,
    memo: Memo | None = None,
) -> list[Entries]:
    """The shared opening once (`_opening`), then each branch (`_branches`) from a copy of its cache:
    the part its rows share once more, then each row's own tokens, right-padded, the cache copied per
    row."""
    with lock:
        opened = _opening(model, rows[0][:shared], top, memo)
        if opened is not None:
            cache, last, opening = opened
            logits = _after_opening(model, pad_id, rows, shared, cache, last)
    if opened is None:  # a model that keeps no cache this can copy: each row in full
        return _padded(model, lock, pad_id, rows, top, next_token)
    return [opening + _entries(logits[b], r[shared - 1 :], top, next_token)[1:] for b, r in enumerate(rows)]


def _after_opening(
    model: Any, pad_id: int, rows: list[list[int]], shared: int, head: Any, last: torch.Tensor
) -> dict[int, torch.Tensor]:
    """Each row's logits after the opening (whose cache is `head` and last logits `last`) to its end,
    branch by branch (`_branches`)."""
    branches = _branches(rows, shared)
    logits: dict[int, torch.Tensor] = {}
    for n, (length, members) in enumerate(branches):
        # the last branch extends the opening's cache itself, the others a copy of it
        cache = head if n == len(branches) - 1 else copy.deepcopy(head)
        before = [last]  # predicts each row's first token after the opening
        if length:
            part = torch.tensor([rows[members[0]][shared : shared + length]], device=model.device)
            before.append(model(input_ids=part, past_key_values=cache, use_cache=True).logits[0])
        start = shared + length
        width = max(len(rows[m]) for m in members) - start
        tails = [rows[m][start:] + [pad_id] * (width - len(rows[m]) + start) for m in members]
        cache.batch_repeat_interleave(len(members))
        out = model(input_ids=torch.tensor(tails, device=model.device), past_key_values=cache).logits
        for b, m in enumerate(members):
            logits[m] = torch.cat([*before, out[b, : len(rows[m]) - start]])
    return logits


def _opening(
    model: Any, ids: list[int], top: int, memo: Memo | None
) -> tuple[Any, torch.Tensor, Entries] | None:
    """Run a shared opening: its KV cache, the logits after it ([1, vocab]) and its tokens' entries;
    None where the model keeps no cache this can copy.

    Where `memo` holds an opening that begins like this one (at least SHARED_PREFIX tokens, with the
    same `top`), a copy of its cache, cut back to where the two part, starts the pass: only the rest
    runs. The memo then keeps this opening (a copy of its cache, which branches will extend).
    """
    agree = 0
    if memo is not None and memo.cache is not None and memo.top == top:
        agree = _common(memo.tokens, ids, min(len(memo.tokens), len(ids)))
    if memo is not None and agree >= SHARED_PREFIX:
        keep = agree - 1  # the last agreeing token runs again: its logits score the next one
        cache = copy.deepcopy(memo.cache)
        cache.crop(-(len(memo.tokens) - keep))
        tail = torch.tensor([ids[keep:]], device=model.device)
        rest = model(input_ids=tail, past_key_values=cache).logits[0]
        entries = memo.entries[: keep + 1] + _entries(rest, ids[keep:], top, False)[1:]
    else:
        head = model(input_ids=torch.tensor([ids], device=model.device), use_cache=True)
        cache, rest = head.past_key_values, head.logits[0]
        if not callable(getattr(cache, "batch_repeat_interleave", None)):
            return None
        entries = _entries(rest, ids, top, False)
    if memo is not None:
        if _croppable(cache):
            memo.tokens, memo.cache, memo.entries, memo.top = list(ids), copy.deepcopy(cache), entries, top
        else:
            memo.cache = None
    return cache, rest[-1:], entries


def _croppable(cache: Any) -> bool:
    """A cache whose layers all keep every past position (so cutting it back leaves an exact prefix):
    not a sliding window's, a quantized or a linear-attention one."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers:
        return False
    return all(type(layer) is DynamicLayer for layer in layers)


def _entries(logits: torch.Tensor, ids: list[int], top: int, next_token: bool) -> Entries:
    """One row's entries from its logits ([positions, vocab], float32 a slice at a time): a token's
    log-probability is its logit less the log-sum-exp of its position's logits."""
    out: Entries = [None]
    end = len(ids) if next_token else len(ids) - 1
    for start in range(0, end, SCORE_CHUNK):
        x = logits[start : min(start + SCORE_CHUNK, end)].float()
        norm = x.logsumexp(-1, keepdim=True)
        given = ids[start + 1 : start + 1 + len(x)]
        target = torch.tensor(given, dtype=torch.long, device=x.device)
        if len(given) < len(x):  # the position after the sequence: its most likely token
            target = torch.cat([target, x[-1].argmax().reshape(1)])
        chosen = (x.gather(1, target.unsqueeze(1)) - norm).squeeze(1).tolist()
        alternatives: list[list[tuple[int, float]]] = [[] for _ in chosen]
        if top:
            best = x.topk(min(top, x.shape[-1]), dim=-1) if top > 1 else x.max(-1, keepdim=True)
            pairs = zip(best.indices.tolist(), (best.values - norm).tolist(), strict=True)
            alternatives = [list(zip(i, v, strict=True)) for i, v in pairs]
        out.extend(map(TokenLogprob, target.tolist(), chosen, alternatives))
    return out
