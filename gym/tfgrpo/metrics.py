"""Held-out metrics: Mean@k and the unbiased Pass@k estimator, with bootstrap confidence intervals.

    mean_at_k([[1, 0, 1], [0, 0, 0]])            # 1/3: mean reward over questions and samples
    pass_at_k(n=5, c=2, k=1)                      # 0.4 (Chen et al. 2021, unbiased)
    report([[1, 0, 1], [0, 0, 0]], k=3, seed=0)   # both, each with a 95% bootstrap interval

Several seeds are pooled by concatenating their per-question rows: the bootstrap resamples rows.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from math import comb

from pydantic import BaseModel


def mean_at_k(rewards: Sequence[Sequence[float]]) -> float:
    """Mean reward over every question and its k samples (questions weigh equally)."""
    rows = [sum(row) / len(row) for row in rewards if row]
    return sum(rows) / len(rows) if rows else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples (drawn from n, c of them correct) is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(rewards: Sequence[Sequence[float]], k: int, threshold: float = 0.5) -> float:
    rows = [pass_at_k(len(row), sum(r > threshold for r in row), k) for row in rewards if len(row) >= k]
    return sum(rows) / len(rows) if rows else 0.0


def bootstrap_ci(
    rows: Sequence[Sequence[float]],
    statistic: Callable[[Sequence[Sequence[float]]], float],
    *,
    samples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic`, resampling rows (questions) with replacement."""
    if not rows:
        return 0.0, 0.0
    rng = random.Random(seed)
    values = sorted(statistic([rows[rng.randrange(len(rows))] for _ in rows]) for _ in range(samples))
    low = values[int((1 - level) / 2 * (samples - 1))]
    high = values[int((1 + level) / 2 * (samples - 1))]
    return low, high


class MetricReport(BaseModel):
    k: int
    questions: int
    mean_at_k: float
    mean_at_k_ci: tuple[float, float]
    pass_at_k: float
    pass_at_k_ci: tuple[float, float]


def report(rewards: Sequence[Sequence[float]], k: int, seed: int = 0, samples: int = 1000) -> MetricReport:
    pass_k = lambda rows: mean_pass_at_k(rows, k)  # noqa: E731
    return MetricReport(
        k=k,
        questions=len(rewards),
        mean_at_k=mean_at_k(rewards),
        mean_at_k_ci=bootstrap_ci(rewards, mean_at_k, samples=samples, seed=seed),
        pass_at_k=pass_k(rewards),
        pass_at_k_ci=bootstrap_ci(rewards, pass_k, samples=samples, seed=seed),
    )
