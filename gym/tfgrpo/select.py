"""Group selection: which groups of rollouts teach something.

A group (the G rollouts of one question) is informative when its rewards differ by more than
`eps`: only then is there a better and a worse attempt to compare. Equal graded rewards
({0.5, 0.5, 0.5}) are not informative, whatever their value. A group with a failed rollout is
kept out whole (reason `incomplete`) rather than silently shrunk to the rollouts that succeeded.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict


class GroupVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    informative: bool
    reason: str


def judge_group(rewards: Sequence[float | None], eps: float = 1e-6) -> GroupVerdict:
    """Whether a group's rewards can teach something, and why (not)."""
    failed = sum(r is None for r in rewards)
    if failed:
        return GroupVerdict(
            informative=False, reason=f"incomplete: {failed} of {len(rewards)} rollouts failed"
        )
    values = [float(r) for r in rewards if r is not None]
    if len(values) < 2:
        return GroupVerdict(informative=False, reason="a single rollout has nothing to compare with")
    spread = max(values) - min(values)
    if spread <= eps:
        return GroupVerdict(informative=False, reason=f"all rewards equal ({values[0]:g})")
    return GroupVerdict(informative=True, reason=f"rewards differ by {spread:g}")
