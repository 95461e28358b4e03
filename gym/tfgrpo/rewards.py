"""Rewards of a group of rollouts: ground-truth verifiers, an LLM judge, or the majority vote.

- `exact` / `numeric`: gym.rewards.match against the reference answer; `auto` picks numeric when
  the reference is a number (nothing else, and no leading zeros), exact otherwise.
- `judge`: an LLM says CORRECT or WRONG (with the reference when there is one); a verdict it does
  not give leaves the reward unknown (None), which keeps the group out of learning.
- `majority` (no ground truth, the paper's self-discrimination): a rollout is rewarded when its
  final answer agrees with the group's unique most common answer; with a tie nothing is rewarded
  (the group then teaches nothing, rather than something arbitrary).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from gym.rewards.match import exact_match, normalize, numeric_match, parse_number

VERIFIERS = {"exact": exact_match, "numeric": numeric_match}
_VERDICT = re.compile(r"\b(correct|wrong|incorrect)\b", re.IGNORECASE)


# A reference that is a number and nothing else (`12`, `-3.5`, `1,024`, `1/2`, `$12`, `40%`, `\boxed{7}`):
# `auto` compares it numerically. One that only holds a number (`Vitamin B12`, `\frac{1}{2}`) or a digit
# string whose leading zeros count (`014`, the demo's reversed digits) is compared exactly.
_WHOLE_NUMBER = re.compile(r"(?:\\boxed\{)?\$?-?(?:\d[\d,]*(?:\.\d+)?(?:/\d+)?|\.\d+)%?\}?")
_LEADING_ZERO = re.compile(r"-?0\d")


def verifier_for(kind: str, reference: str) -> str:
    """The verifier `kind` stands for: `auto` is numeric when the reference is a number (and not a digit
    string with leading zeros), exact otherwise."""
    if kind == "auto":
        text = reference.strip()
        number = _WHOLE_NUMBER.fullmatch(text) and not _LEADING_ZERO.match(text)
        return "numeric" if number and parse_number(text) is not None else "exact"
    return kind


def verify(kind: str, completion: str, reference: str) -> float:
    return VERIFIERS[verifier_for(kind, reference)](completion, reference)


def final_answer(completion: str) -> str | None:
    """The answer a completion commits to: its last number, else its last non-empty line."""
    number = parse_number(completion)
    if number is not None:
        return str(number)
    lines = [normalize(line) for line in completion.splitlines() if line.strip()]
    return lines[-1].casefold() if lines else None


def majority_rewards(completions: Sequence[str]) -> list[float]:
    """1.0 for completions agreeing with the unique most common final answer, else 0.0."""
    answers = [final_answer(c) for c in completions]
    counts = Counter(a for a in answers if a is not None).most_common()
    if not counts or (len(counts) > 1 and counts[0][1] == counts[1][1]):
        return [0.0] * len(completions)
    winner = counts[0][0]
    return [float(a == winner) for a in answers]


def parse_verdict(text: str | None) -> float | None:
    """1.0 for CORRECT, 0.0 for WRONG/INCORRECT (the first verdict word); None when there is none."""
    match = _VERDICT.search(text or "")
    if match is None:
        return None
    return 1.0 if match.group(1).lower() == "correct" else 0.0
