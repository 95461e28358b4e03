"""Score multiple-choice requests with a causal LM: the log-likelihood of each choice's tokens.

The numbers equal lm-eval's `_loglikelihood_tokens` (no attention mask, right padding,
log-softmax in the logits' dtype, continuation log-probs summed in that dtype), computed with
less work:

- one forward pass per question: the four choices differ only in their last token, so they
  share one input, as lm-eval's one-token logits cache also finds;
- logits only where a continuation token is scored (`logits_to_keep`), not for every position
  and the whole vocabulary;
- requests sorted by length (longest first, as lm-eval) so batches carry little padding;
- a prompt prefix shared by many questions (the description and few-shot examples of a
  subject) runs once: its KV cache is reused for each batch of question suffixes. Cached and
  uncached attention can differ in the last float bit, so a question whose two best choices
  are closer than `EXACT_MARGIN` is scored again without the cache.

Batches of another shape than lm-eval's (and the cache) move log-likelihoods by float rounding
(~1e-6 on CPU in fp32, as lm-eval's own numbers move with its batch size); the chosen answers are
the same unless two choices are that close (tests/test_eval_agreement.py, benchmarks/eval_speed.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

MIN_SHARED_PREFIX = 32  # tokens; shorter shared prefixes are not worth a cache
PREFIX_GROUP_MIN = 2  # questions that must share the prefix


@dataclass
class Request:
    """One forward pass: `tokens` (already truncated on the left to the window) and, per choice
    it scores, that choice's continuation tokens (predicted by the last len(cont) positions)."""

    key: int  # the question it belongs to
    tokens: list[int]
    choices: list[tuple[int, list[int]]]  # (choice index, continuation tokens)
    truncated: bool  # the context lost tokens on the left
    group: int = -1  # prompts sharing a prefix (e.g. one subject): candidates for the prefix cache

    @property
    def n_scored(self) -> int:
        return len(self.choices[0][1])


def requests_for(
    key: int, context: list[int], continuations: Sequence[list[int]], max_length: int, group: int
) -> list[Request]:
    """lm-eval's input for (context, continuation): `(context + continuation)[-(max_length+1):][:-1]`.
    Choices that differ only in their last token share one request."""
    first = continuations[0]
    shared = all(len(c) == len(first) and c[:-1] == first[:-1] for c in continuations)
    groups = [list(enumerate(continuations))] if shared else [[(i, c)] for i, c in enumerate(continuations)]
    out = []
    for choices in groups:
        cont = choices[0][1]
        if not cont:
            raise ValueError("a continuation encodes to no tokens")
        whole = context + cont
        out.append(
            Request(
                key=key,
                tokens=whole[-(max_length + 1) :][:-1],
                choices=[(i, c) for i, c in choices],
                truncated=len(whole) > max_length + 1,
                group=group,
            )
        )
    return out


def resolve_device(device: str) -> str:
    """`device` checked before any model loads: one torch knows, that can hold weights (not `meta`)
    and that this machine has (cuda, mps, xpu... available, the index within its count)."""
    import torch

    from gym.errors import ConfigError

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(
            f"device {device!r}: not a torch device (auto, cpu, cuda, cuda:1, mps...)"
        ) from None
    if kind.type == "cpu":
        return device
    backend = getattr(torch, kind.type, None)
    available = getattr(backend, "is_available", None)
    if kind.type == "mps":
        available = torch.backends.mps.is_available
    if not callable(available):  # meta holds no weights; lazy, xla... need what gym doesn't set up
        raise ConfigError(
            f"device {device!r}: gym can't score on it; use auto, cpu, cuda, cuda:1, mps or xpu"
        )
    name = {"cuda": "CUDA GPU", "mps": "MPS GPU"}.get(kind.type, f"{kind.type.upper()} device")
    if not available():
        raise ConfigError(
            f"device {device!r} asked for, but torch sees no {name} here: use --device auto or cpu"
        )
    count = getattr(backend, "device_count", None)
    if kind.index is not None and callable(count) and kind.index >= count():
        raise ConfigError(
            f"device {device!r} asked for, but torch sees {count()} {name}(s) here "
            f"({kind.type}:0 to {kind.type}:{count() - 1})"
        )
    return device


def exact_margin(dtype: Any) -> float:
    import torch

    return 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2


class Scorer:
    """Log-likelihoods of every request's choices: `scores[key][choice]`."""

    def __init__(self, model: Any, batch_size: int = 16, prefix_cache: bool = True, pad_id: int = 0) -> None:
        self.model = model
        self.batch_size = max(1, batch_size)
        self.prefix_cache = prefix_cache
        self.pad_id = pad_id
        self.rescored = 0  # questions re-scored without the cache (close calls)
        self.cached = 0  # requests scored on a shared prefix
        self._cache: Any = None
        self._cached_prefix: list[int] | None = None

    def run(
        self, requests: list[Request], progress: Callable[[int], None] | None = None
    ) -> dict[int, dict[int, float]]:
        """Every request's choice log-likelihoods by question key; `progress(key)` after each request."""
        import torch

        scores: dict[int, dict[int, float]] = {}
        plain, by_group = self._split(requests)
        with torch.inference_mode():
            for prefix, members in by_group:
                for batch in _batches(members, self.batch_size):
                    self._store(scores, batch, self._forward_cached(prefix, batch), progress)
            for batch in _batches(sorted(plain, key=lambda r: (-len(r.tokens), r.tokens)), self.batch_size):
                self._store(scores, batch, self._forward(batch), progress)
            self._rescore_close_calls(scores, [r for _, group in by_group for r in group])
        return scores

    def _split(self, requests: list[Request]) -> tuple[list[Request], list[tuple[list[int], list[Request]]]]:
        """Requests scored plainly, and groups sharing a prefix long enough to cache."""
        if not self.prefix_cache:
            return list(requests), []
        candidates: dict[int, list[Request]] = {}
        plain = []
        for r in requests:
            if r.truncated or r.group < 0:
                plain.append(r)
            else:
                candidates.setdefault(r.group, []).append(r)
        grouped = []
        for members in candidates.values():
            length = _common_prefix(members)
            if len(members) < PREFIX_GROUP_MIN or length < MIN_SHARED_PREFIX:
                plain.extend(members)
                continue
            members.sort(key=lambda r: (-len(r.tokens), r.tokens))
            grouped.append((members[0].tokens[:length], members))
        return plain, grouped

    def _forward(self, batch: list[Request]) -> list[list[float]]:
        import torch

        width = max(len(r.tokens) for r in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        for row, r in enumerate(batch):
            ids[row, : len(r.tokens)] = torch.tensor(r.tokens, dtype=torch.long)
        return self._score_rows(batch, ids.to(self.model.device), [len(r.tokens) for r in batch], {})

    def _forward_cached(self, prefix: list[int], batch: list[Request]) -> list[list[float]]:
        import torch

        cache = self._prefix_cache(prefix)
        cache.batch_repeat_interleave(len(batch))
        width = max(len(r.tokens) for r in batch) - len(prefix)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        for row, r in enumerate(batch):
            suffix = r.tokens[len(prefix) :]
            ids[row, : len(suffix)] = torch.tensor(suffix, dtype=torch.long)
        self.cached += len(batch)
        ends = [len(r.tokens) - len(prefix) for r in batch]
        return self._score_rows(batch, ids.to(self.model.device), ends, {"past_key_values": cache})

    def _prefix_cache(self, prefix: list[int]) -> Any:
        import torch

        if self._cached_prefix != prefix:
            ids = torch.tensor([prefix], dtype=torch.long, device=self.model.device)
            self._cache = self.model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
            self._cached_prefix = prefix
        return copy.deepcopy(self._cache)

    def _score_rows(
        self, batch: list[Request], ids: Any, ends: list[int], kwargs: dict[str, Any]
    ) -> list[list[float]]:
        """Run the model keeping logits only at scored positions; sum each choice's log-probs."""
        import torch
        import torch.nn.functional as F

        wanted = sorted(
            {end - r.n_scored + j for r, end in zip(batch, ends, strict=True) for j in range(r.n_scored)}
        )
        column = {pos: i for i, pos in enumerate(wanted)}
        keep = torch.tensor(wanted, dtype=torch.long, device=ids.device)
        logits = self.model(input_ids=ids, logits_to_keep=keep, **kwargs).logits
        # Each row's own scored positions only, then lm-eval's log-softmax over the vocabulary.
        rows_at = [row for row, r in enumerate(batch) for _ in range(r.n_scored)]
        cols_at = [
            column[end - r.n_scored + j]
            for r, end in zip(batch, ends, strict=True)
            for j in range(r.n_scored)
        ]
        picked = logits[torch.tensor(rows_at, device=ids.device), torch.tensor(cols_at, device=ids.device)]
        logprobs = F.log_softmax(picked, dim=-1)
        out, start = [], 0
        for r in batch:
            rows = logprobs[start : start + r.n_scored].unsqueeze(0)  # [1, n, vocab] as lm-eval slices it
            start += r.n_scored
            values = []
            for _, cont in r.choices:
                target = torch.tensor([cont], dtype=torch.long, device=ids.device)
                values.append(float(torch.gather(rows, 2, target.unsqueeze(-1)).squeeze(-1).sum()))
            out.append(values)
        return out

    def _store(
        self,
        scores: dict[int, dict[int, float]],
        batch: list[Request],
        values: list[list[float]],
        progress: Callable[[int], None] | None,
    ) -> None:
        for r, vals in zip(batch, values, strict=True):
            slot = scores.setdefault(r.key, {})
            for (choice, _), v in zip(r.choices, vals, strict=True):
                slot[choice] = v
            if progress is not None:
                progress(r.key)

    def _rescore_close_calls(self, scores: dict[int, dict[int, float]], cached: list[Request]) -> None:
        margin = exact_margin(self.model.dtype)
        close = []
        for r in cached:
            ranked = sorted(scores[r.key].values(), reverse=True)
            if len(ranked) > 1 and ranked[0] - ranked[1] < margin:
                close.append(r)
        for batch in _batches(close, self.batch_size):
            self._store(scores, batch, self._forward(batch), None)
        self.rescored += len(close)


def _common_prefix(requests: list[Request]) -> int:
    """Tokens every request shares at its start, leaving each at least its scored positions after."""
    first = requests[0].tokens
    length = min(len(r.tokens) - r.n_scored for r in requests)
    for r in requests[1:]:
        limit = min(length, len(r.tokens))
        i = 0
        while i < limit and r.tokens[i] == first[i]:
            i += 1
        length = i
        if length == 0:
            break
    return length


def _batches(items: list[Request], size: int) -> Iterator[list[Request]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
