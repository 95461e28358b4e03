"""Each method's main training signal, for TrainResult.metric_name / metric_first / metric_last.

A method module may define `signal(eval_before, eval_after, log_history) -> Signal | None`; `run`
calls it when present (a method without one reports its training loss). The signal is read from the
held-out evaluation when the stage has one, else from the first and last training logs, and then
named `train_<name>`: two different training batches, not a fixed set scored before and after (a
held-out `logp_gap` and a training one are told apart, as SFT's `eval_loss` and `loss` are).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Signal(NamedTuple):
    name: str
    first: float | None
    last: float | None


def metric(
    name: str,
    key: str,
    eval_before: dict[str, float],
    eval_after: dict[str, float],
    log_history: list[dict[str, Any]],
) -> Signal:
    """Signal `name` from eval metric `eval_<key>` (held-out), else `train_<name>` from training log `key`
    (its first and last values)."""
    if f"eval_{key}" in eval_after:
        return Signal(name, eval_before.get(f"eval_{key}"), eval_after[f"eval_{key}"])
    logged = [float(e[key]) for e in log_history if key in e]
    return Signal(f"train_{name}", logged[0] if logged else None, logged[-1] if logged else None)


def difference(
    name: str,
    plus: str,
    minus: str,
    eval_before: dict[str, float],
    eval_after: dict[str, float],
    log_history: list[dict[str, Any]],
) -> Signal:
    """Signal `name` = metric `plus` - metric `minus`, held-out where available (as `metric`)."""
    a = metric(name, plus, eval_before, eval_after, log_history)
    b = metric(name, minus, eval_before, eval_after, log_history)

    def sub(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else x - y

    return Signal(a.name, sub(a.first, b.first), sub(a.last, b.last))
