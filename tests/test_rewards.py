"""Reward functions by name: built-ins on hand-written cases, parameterised rewards, dotted-path
callables (per completion and TRL-style batched), reward models, weights, and the errors for bad specs.

Run: .venv/bin/pytest -q tests/test_rewards.py
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

import pytest

from gym.errors import ConfigError
from gym.rewards import load_reward, load_rewards, weighted_sum
from gym.rewards.answer import answer_format, extract_final_answer, final_answer, regex_reward


def call(spec: str, completions: list[str], answers: list[str | None] | None = None, **columns) -> list:
    """Call a reward the way TRL does: conversational prompts and completions plus dataset columns."""
    prompts = [[{"role": "user", "content": "q"}]] * len(completions)
    convo = [[{"role": "assistant", "content": c}] for c in completions]
    return load_reward(spec)(prompts, convo, answer=answers or [None] * len(completions), **columns)


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("Answer: 42", "42", 1.0),
        ("answer：42", "42", 1.0),
        ("答案：一二三", "一二三", 1.0),
        ("答案: 42 ", "42", 1.0),
        ("#### 1,234", "1,234", 1.0),
        ("Answer: 41\nAnswer: 42", "42", 1.0),  # the last marker counts
        ("42", "42", 0.0),  # no marker: no final answer
        ("Answer: 42", "43", 0.0),
        ("Answer:", "42", 0.0),
        ("Answer: 42", None, 0.0),  # nothing to compare with
    ],
)
def test_final_answer(completion: str, answer: str | None, expected: float):
    assert final_answer(completion, answer) == expected


def test_extract_final_answer():
    assert extract_final_answer("so... Answer:  4 2 ") == "4 2"
    assert extract_final_answer("no marker here") is None


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("Answer: 42", 1.0),
        ("  答案：四十二  ", 1.0),
        ("#### 7", 1.0),
        ("42", 0.0),
        ("Answer:", 0.0),
        ("The Answer: 42", 0.0),  # must start with the marker
        ("Answer: 4\n2", 0.0),  # one line only
    ],
)
def test_answer_format(completion: str, expected: float):
    assert answer_format(completion) == expected


def test_regex_reward():
    digits = regex_reward(r"\d+")
    assert [digits(c) for c in ("123", " 123\n", "12a", "")] == [1.0, 1.0, 0.0, 0.0]
    assert call(r"regex:<think>.*</think>.+", ["<think>hm\nok</think>4", "4"]) == [1.0, 0.0]
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        load_reward("regex:(unclosed")


def test_exact_and_numeric_match_through_the_trl_convention():
    assert call("exact_match", [" 42 ", "42.0", "forty-two"], ["42", "42", "42"]) == [1.0, 0.0, 0.0]
    assert call("numeric_match", [r"\boxed{1/2}", "0.5", "x"], ["0.5", "1/2", "1"]) == [1.0, 1.0, 0.0]


def test_rewards_that_compare_with_the_answer_leave_out_records_without_one():
    """A prompt without an `answer` crashed exact_match and numeric_match (normalize(None)) mid-run."""
    for spec in ("exact_match", "numeric_match", "final_answer"):
        assert call(spec, ["4", "Answer: 4"], [None, None]) == [None, None], spec  # TRL's "not applicable"
    assert call("exact_match", ["4", "4"], ["4", None]) == [1.0, None]
    assert call("numeric_match", ["4", "4"], [None, "4.0"]) == [None, 1.0]
    assert call("final_answer", ["Answer: 4", "Answer: 4"], ["4", None]) == [1.0, None]
    assert call("answer_format", ["Answer: 4"], [None]) == [1.0], "it needs no answer"
    assert [r.spec for r in load_rewards(["exact_match", "answer_format"])[0] if r.needs_answer] == [
        "exact_match"
    ]


def test_length_penalty_is_dapos_soft_overlong_penalty():
    # MAX 8, CACHE 4: 0 up to 4 tokens, then -1/4 per token, -1 beyond 8.
    ids = [[1] * n for n in (3, 4, 5, 6, 8, 9)]
    got = call("length_penalty:8,4", ["x"] * len(ids), completion_ids=ids)
    assert got == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert call("length_penalty:8", ["x"], completion_ids=[[1] * 7]) == [-0.5]  # CACHE defaults to MAX/4 = 2
    for bad in ("length_penalty:x", "length_penalty:8,9", "length_penalty:"):
        with pytest.raises(ConfigError, match="length_penalty"):
            load_reward(bad)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable module of user reward functions, both conventions."""
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            def shorter(completion):
                return -len(completion)

            def uses_metadata(completion, answer=None, *, metadata):
                return float(metadata.get("bonus", 0)) + float(completion == answer)

            def skips_some(completion, answer):
                return None if answer is None else 1.0

            def batched(prompts, completions, answer, **kwargs):
                return [float(c[0]["content"] == a) * 2 for c, a in zip(completions, answer)]

            def says_high(completion):
                return "high"

            def one_short(prompts, completions, **kwargs):
                return [1.0] * (len(completions) - 1)

            def counts(completion):
                return len(completion) > 1  # a bool: a number
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_dotted_path_callables_in_both_conventions(user_module: str):
    assert call(f"{user_module}:shorter", ["ab", "abcd"]) == [-2.0, -4.0]
    assert call(f"{user_module}.shorter", ["ab"]) == [-2.0]  # module.function works too
    meta = [json.dumps({"bonus": 0.5}), json.dumps({})]
    assert call(f"{user_module}:uses_metadata", ["4", "5"], ["4", "4"], metadata=meta) == [1.5, 0.0]
    assert call(f"{user_module}:skips_some", ["4", "4"], [None, "4"]) == [None, 1.0]
    reward = load_reward(f"{user_module}:batched")
    assert reward.batched and reward.name == "batched"
    assert call(f"{user_module}:batched", ["4", "5"], ["4", "4"]) == [2.0, 0.0]


def test_a_reward_that_is_not_a_number_per_completion_names_itself_and_the_value(user_module: str):
    """A string failed in float() deep in the trainer, with a traceback naming neither."""
    with pytest.raises(
        ConfigError, match=r"reward my_rewards:says_high: returned str 'high' for completion 0; a rew"
    ):
        call(f"{user_module}:says_high", ["4"])
    with pytest.raises(ConfigError, match=r"my_rewards:one_short: returned 1 values for 2 completions"):
        call(f"{user_module}:one_short", ["4", "5"])
    assert call(f"{user_module}:counts", ["4", "45"]) == [0.0, 1.0]


def test_trl_reward_functions_work_by_dotted_path():
    assert call("trl.rewards:think_format_reward", ["<think>\nhm\n</think>\n4", "4"]) == [1.0, 0.0]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("nonsense", "not a built-in"),
        ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
        ("gym.rewards.match:nope", "has no function 'nope'"),
        ("regex:", "needs an argument"),
        # it loaded, then failed at the first reward with a TypeError traceback
        ("os:getcwd", r"'os:getcwd': \(\) takes no completion"),
        ("os:getpid", r"'os:getpid': \(\) takes no completion"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, words: str):
    with pytest.raises(ConfigError, match=words):
        load_reward(spec)


def test_weights_and_unique_names():
    rewards, weights = load_rewards(["regex:a", "regex:b", "exact_match"], [1.0, 0.5, 2.0])
    assert [r.name for r in rewards] == ["regex", "regex_2", "exact_match"] and weights == [1.0, 0.5, 2.0]
    assert load_rewards(["exact_match"])[1] == [1.0]
    with pytest.raises(ConfigError, match="2 reward weights for 1 rewards"):
        load_rewards(["exact_match"], [1.0, 2.0])
    with pytest.raises(ConfigError, match="no reward function"):
        load_rewards([])


def test_weighted_sum_skips_rewards_that_do_not_apply():
    scores = [[1.0, None, None], [0.5, 0.5, None]]
    got = weighted_sum(scores, [2.0, 1.0])
    assert got[:2] == [2.5, 0.5] and math.isnan(got[2])


def _score_model(directory: Path, template_meta: bool = True) -> Path:
    """A sequence-classification model (gym-tiny's backbone, a seeded score head) saved like a gym model."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from tests.helpers import tiny

    base = tiny()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(base.path, num_labels=1)
    model.save_pretrained(directory)
    from gym.models import load_tokenizer

    load_tokenizer(base).save_pretrained(directory)
    if template_meta:
        (directory / "gym_model.json").write_text(
            json.dumps({"template": "chatml", "base_model": "gym-tiny"})
        )
    return directory


def test_reward_model_from_a_directory_scores_like_a_direct_forward(tmp_path: Path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = _score_model(tmp_path / "rm")
    completions = ["Answer: 4", "4", "no idea"]
    got = call(f"reward_model:{path}", completions)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()
    want = []
    for c in completions:
        text = tok.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": c}], tokenize=False
        )
        with torch.no_grad():
            want.append(model(**tok(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item())
    assert got == pytest.approx(want, abs=1e-5)
    assert len(set(got)) == 3, "different completions get different scores"


def test_reward_model_without_a_score_head_is_refused(tmp_path: Path):
    from tests.helpers import tiny

    with pytest.raises(ConfigError, match=r"no `score\.weight`"):
        load_reward(f"reward_model:{tiny().path}")  # a causal LM directory
    with pytest.raises(ConfigError, match=r"no `score\.weight`"):
        load_reward("reward_model:gym-tiny")  # the registry entry: built locally, no score head
    with pytest.raises(ConfigError, match="unknown model"):
        load_reward("reward_model:no-such-reward-model")
