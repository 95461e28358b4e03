"""The demo datasets: deterministic, held-out splits disjoint from training, every answer checked
by a solver written here independently of gym/data/demo.py, both languages, exact fields.

Run: .venv/bin/pytest -q tests/test_demo.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from gym.data.demo import DEMO_DATASETS, demo_records
from gym.errors import ConfigError

TRAIN = ("demo_sft", "demo_dpo", "demo_kto", "demo_chat", "demo_format_sft", "demo_prompts")
EVAL = ("demo_sft_eval", "demo_dpo_eval", "demo_kto_eval")
FIELDS = {
    "alpaca": {"instruction": str, "input": str, "output": str},
    "preference": {"instruction": str, "input": str, "chosen": str, "rejected": str},
    "kto": {"instruction": str, "input": str, "output": str, "label": bool},
    "prompt": {"prompt": str, "answer": str, "metadata": dict},
    "text": {"text": str},
}
ZH = "〇一二三四五六七八九"

# (task, keywords in the instruction, solver). Order matters: "Sort ... smallest to largest" is a sort.
SOLVERS: list[tuple[str, tuple[str, ...], Callable[[str], str]]] = [
    ("sort", ("Sort", "ascending", "从小到大"), lambda s: "".join(sorted(s))),
    ("reverse", ("reverse", "Reverse", "倒"), lambda s: s[::-1]),
    ("copy", ("Repeat", "Copy", "重复", "复制"), lambda s: s),
    ("max", ("largest digit", "最大"), lambda s: str(max(int(c) for c in s))),
    ("min", ("smallest digit", "最小"), lambda s: str(min(int(c) for c in s))),
    ("count", ("How many", "Count", "几个"), lambda s: str(len(s))),
    ("larger", ("larger", "bigger", "更大", "较大"), lambda s: str(max(int(x) for x in s.split(",")))),
    ("add", ("sum", "Add", "加法", "求和"), lambda s: str(sum(int(x) for x in s.split("+")))),
    ("zh_digits", ("Chinese", "汉字"), lambda s: "".join(ZH[int(c)] for c in s)),
]


def solve(instruction: str, inp: str) -> tuple[str, str]:
    """(task, right answer) for a demo problem, found from the instruction's wording."""
    for task, words, fn in SOLVERS:
        if any(w in instruction for w in words):
            return task, fn(inp)
    raise AssertionError(f"no independent solver for instruction {instruction!r}")


def problems(name: str) -> list[tuple[str, str, str]]:
    """(instruction, input, task) of every problem in dataset `name` (chat: every human turn)."""
    out = []
    for r in demo_records(name):
        if DEMO_DATASETS[name] == "sharegpt":
            pairs = [t["value"].split("\n", 1) for t in r["conversations"] if t["from"] == "human"]
        elif DEMO_DATASETS[name] == "prompt":
            pairs = [r["prompt"].split("\n", 1)]
        else:
            pairs = [(r["instruction"], r["input"])]
        out += [(ins, inp, solve(ins, inp)[0]) for ins, inp in pairs]
    return out


def has_cjk(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def test_names_and_formats() -> None:
    assert DEMO_DATASETS == {
        "demo_sft": "alpaca",
        "demo_sft_eval": "alpaca",
        "demo_dpo": "preference",
        "demo_dpo_eval": "preference",
        "demo_kto": "kto",
        "demo_chat": "sharegpt",
        "demo_kto_eval": "kto",
        "demo_format_sft": "alpaca",
        "demo_prompts": "prompt",
        "demo_prompts_eval": "prompt",
        "demo_text": "text",
        "demo_text_eval": "text",
    }


def test_unknown_name_lists_the_names() -> None:
    with pytest.raises(ConfigError) as err:
        demo_records("demo_nope")
    assert all(name in str(err.value) for name in DEMO_DATASETS)


@pytest.mark.parametrize("name", sorted(DEMO_DATASETS))
def test_fields(name: str) -> None:
    records = demo_records(name)
    assert records
    fmt = DEMO_DATASETS[name]
    for r in records:
        if fmt == "sharegpt":
            assert set(r) == {"conversations"}
            turns = r["conversations"]
            if turns[0]["from"] == "system":
                turns = turns[1:]
            assert len(turns) >= 4 and len(turns) % 2 == 0  # multi-turn
            for i, t in enumerate(turns):
                assert set(t) == {"from", "value"} and isinstance(t["value"], str) and t["value"]
                assert t["from"] == ("human", "gpt")[i % 2]
        else:
            assert set(r) == set(FIELDS[fmt])
            for field, typ in FIELDS[fmt].items():
                assert isinstance(r[field], typ), (name, field, r)


def test_deterministic_within_and_across_processes() -> None:
    here = {name: demo_records(name) for name in DEMO_DATASETS}
    assert here == {name: demo_records(name) for name in DEMO_DATASETS}
    code = "import json; from gym.data.demo import DEMO_DATASETS as D, demo_records as r; "
    code += "print(json.dumps({n: r(n) for n in D}, ensure_ascii=False))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout) == here


def test_held_out_text_shares_no_document_with_training() -> None:
    train, held = ({r["text"] for r in demo_records(n)} for n in ("demo_text", "demo_text_eval"))
    assert len(train) == len(demo_records("demo_text")) and len(held) == len(demo_records("demo_text_eval"))
    assert not train & held


def test_callers_get_fresh_records() -> None:
    demo_records("demo_sft")[0]["output"] = "tampered"
    assert demo_records("demo_sft")[0]["output"] != "tampered"


def test_eval_splits_share_no_problem_with_training() -> None:
    train = {(task, inp) for name in TRAIN for _, inp, task in problems(name)}
    seen: set[tuple[str, str]] = set()
    for name in EVAL:
        keys = [(task, inp) for _, inp, task in problems(name)]
        assert len(keys) == len(set(keys)), f"{name} repeats a problem"
        assert not set(keys) & train, f"{name} overlaps training data"
        assert not set(keys) & seen, "two eval splits overlap"
        seen |= set(keys)


@pytest.mark.parametrize("name", ["demo_sft", "demo_sft_eval"])
def test_sft_answers_are_right(name: str) -> None:
    for r in demo_records(name):
        assert r["output"] == solve(r["instruction"], r["input"])[1], r


@pytest.mark.parametrize("name", ["demo_dpo", "demo_dpo_eval"])
def test_chosen_right_rejected_wrong(name: str) -> None:
    for r in demo_records(name):
        right = solve(r["instruction"], r["input"])[1]
        assert r["chosen"] == right, r
        assert r["rejected"] != r["chosen"] and r["rejected"], r


@pytest.mark.parametrize("name", ["demo_kto", "demo_kto_eval"])
def test_kto_label_says_whether_output_is_right(name: str) -> None:
    records = demo_records(name)
    for r in records:
        assert r["label"] == (r["output"] == solve(r["instruction"], r["input"])[1]), r
    labels = [r["label"] for r in records]
    assert 0.3 < sum(labels) / len(labels) < 0.7


def test_chat_answers_are_right() -> None:
    for r in demo_records("demo_chat"):
        turns = [t for t in r["conversations"] if t["from"] != "system"]
        for human, gpt in zip(turns[::2], turns[1::2], strict=True):
            assert gpt["value"] == solve(*human["value"].split("\n", 1))[1]


@pytest.mark.parametrize("name", sorted(DEMO_DATASETS))
def test_both_languages_and_every_task(name: str) -> None:
    if DEMO_DATASETS[name] == "text":  # raw text: no tasks
        texts = [r["text"] for r in demo_records(name)]
        assert any(has_cjk(t) for t in texts) and any(t.isascii() for t in texts)
        return
    if DEMO_DATASETS[name] == "sharegpt":
        texts = [t["value"] for r in demo_records(name) for t in r["conversations"]]
    else:
        texts = [r.get("instruction", r.get("prompt", "")) for r in demo_records(name)]
    assert any(has_cjk(t) for t in texts) and any(t.isascii() for t in texts)
    assert {task for _, _, task in problems(name)} == {task for task, _, _ in SOLVERS}
