"""Ground-truth verifiers: exact match and numeric (math) answer match, each returning 1.0 or 0.0.

from gym.rewards.match import exact_match, numeric_match
exact_match(" 42 ", "42")                            # 1.0 (whitespace-insensitive)
numeric_match("so the answer is \\boxed{1/2}", "0.5")  # 1.0
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def normalize(text: str) -> str:
    """Collapse whitespace and strip it from both ends."""
    return " ".join(text.split())


def exact_match(completion: str, answer: str) -> float:
    """1.0 when the completion equals the answer up to surrounding and repeated whitespace."""
    return float(normalize(completion) == normalize(answer))


def parse_number(text: str) -> Fraction | None:
    """The number in `text`: the content of the last \\boxed{} if any, else the last number written
    (thousands separators, decimals, fractions and a leading minus understood); None if there is none."""
    boxed = _BOXED.findall(text)
    candidates = _NUMBER.findall(boxed[-1] if boxed else text)
    if not candidates:
        return None
    try:
        return Fraction(candidates[-1].replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def numeric_match(completion: str, answer: str, tolerance: float = 1e-6) -> float:
    """1.0 when the completion's final number equals the answer's within `tolerance` (relative)."""
    got, want = parse_number(completion), parse_number(answer)
    if got is None or want is None:
        return 0.0
    return float(abs(got - want) <= tolerance * max(Fraction(1), abs(want)))
