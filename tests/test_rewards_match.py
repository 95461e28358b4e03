"""Ground-truth verifiers on hand-written cases."""

from __future__ import annotations

import pytest

from gym.rewards.match import exact_match, numeric_match, parse_number


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [("42", "42", 1.0), ("  42\n", "42", 1.0), ("a  b", "a b", 1.0), ("42.", "42", 0.0), ("", "42", 0.0)],
)
def test_exact_match(completion, answer, expected):
    assert exact_match(completion, answer) == expected


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("The answer is 1,234.", "1234", 1.0),
        ("first 3 then 7", "7", 1.0),
        ("first 7 then 3", "7", 0.0),
        ("\\boxed{1/2} and 9 later", "0.5", 1.0),
        ("-3", "-3.0", 1.0),
        ("no number", "1", 0.0),
        ("x = 0.33", "1/3", 0.0),
    ],
)
def test_numeric_match(completion, answer, expected):
    assert numeric_match(completion, answer) == expected


def test_parse_number_none_without_digits():
    assert parse_number("none here") is None
