"""Answer-format rewards: a final answer after a marker, a required form, a regex, a length penalty.

    from gym.rewards.answer import final_answer, answer_format, regex_reward
    final_answer("Answer: 42", "42")      # 1.0: the text after the last marker equals the answer
    final_answer("42", "42")              # 0.0: no marker, no final answer
    answer_format("答案：42")              # 1.0: one line, a marker and something after it
    regex_reward(r"\\d+")("  42 ")         # 1.0: the stripped completion fully matches

Markers: `Answer:` (any case), `答案：`/`答案:`, and GSM8K's `####`. The demo answer-format task
(gym/data/demo.py) asks for `Answer: X` / `答案：X`; `final_answer` is its accuracy reward and
`answer_format` its format reward (partial credit while the answer itself is still wrong).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from gym.errors import ConfigError
from gym.rewards.match import normalize

MARKER = re.compile(r"(?:answer\s*[:：]|答案\s*[:：]|####)", re.IGNORECASE)
_FORM = re.compile(rf"{MARKER.pattern}\s*\S.*", re.IGNORECASE)


def extract_final_answer(completion: str) -> str | None:
    """The text after the last answer marker (whitespace-normalised), None when there is none."""
    found = list(MARKER.finditer(completion))
    if not found:
        return None
    return normalize(completion[found[-1].end() :])


def final_answer(completion: str, answer: str | None) -> float:
    """1.0 when the completion gives a final answer (after a marker) equal to `answer`, else 0.0."""
    got = extract_final_answer(completion)
    return float(got is not None and answer is not None and got == normalize(answer))


def answer_format(completion: str) -> float:
    """1.0 when the completion is a single line starting with an answer marker and giving an answer."""
    text = completion.strip()
    return float("\n" not in text and _FORM.fullmatch(text) is not None)


def regex_reward(pattern: str) -> Callable[[str], float]:
    """A reward that is 1.0 when the stripped completion fully matches `pattern`, else 0.0."""
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as e:
        raise ConfigError(f"reward regex {pattern!r} is not a valid regular expression: {e}") from None

    def regex(completion: str) -> float:
        return float(compiled.fullmatch(completion.strip()) is not None)

    return regex
