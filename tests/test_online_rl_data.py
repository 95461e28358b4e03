"""Prompt datasets for online RL: the `prompt` format, what tokenization stores, and the demo
answer-format task (right answers, half-formatted warm-up data, held-out prompts).

Run: .venv/bin/pytest -q tests/test_online_rl_data.py
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from gym import templates
from gym.data.demo import ANSWER_PREFIX, demo_records
from gym.data.formats import Where, detect_format, normalize, require_kind
from gym.data.ingest import ingest
from gym.data.registry import resolve_dataset
from gym.data.tokenize import tokenize
from gym.errors import ConfigError, DataError
from gym.models import load_tokenizer
from tests.helpers import tiny

W = Where("prompts.jsonl", 3)


def test_prompt_records_in_every_shape():
    user = [{"role": "user", "content": "2+2?"}]
    assert normalize({"prompt": "2+2?", "answer": 4}, "prompt", W) == {
        "prompt": user,
        "answer": "4",
        "metadata": "{}",
    }
    alpaca = normalize({"instruction": "Add.", "input": "2+2", "system": "Be brief."}, "prompt", W)
    assert alpaca["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add.\n2+2"},
    ]
    assert alpaca["answer"] is None
    chat = [
        {"from": "human", "value": "hi"},
        {"from": "gpt", "value": "hello"},
        {"from": "human", "value": "2+2?"},
    ]
    rec = normalize({"conversations": chat, "metadata": {"task": "add", "level": 1}}, "prompt", W)
    assert [m["role"] for m in rec["prompt"]] == ["user", "assistant", "user"]
    assert json.loads(rec["metadata"]) == {"task": "add", "level": 1}


@pytest.mark.parametrize(
    ("record", "field", "words"),
    [
        ({"answer": "4"}, "prompt", "missing"),
        ({"prompt": "2+2?", "answer": ["4"]}, "answer", "text or a number"),
        ({"prompt": "2+2?", "metadata": "task=add"}, "metadata", "object"),
        (
            {"prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "prompt",
            "user",
        ),
    ],
)
def test_bad_prompt_records_name_file_record_and_field(record: dict, field: str, words: str):
    with pytest.raises(DataError) as e:
        normalize(record, "prompt", W)
    assert (e.value.file, e.value.record, e.value.field) == ("prompts.jsonl", 3, field)
    assert words in str(e.value)


def test_detect_and_require_the_prompt_kind():
    assert detect_format(["prompt", "answer"]) == "prompt"
    assert detect_format(["instruction", "input", "answer"]) == "prompt"
    assert detect_format(["prompt", "completion", "label"]) == "kto"
    for method in ("ppo", "grpo", "gspo"):
        require_kind("prompt", method)
    with pytest.raises(ConfigError, match="'grpo' needs a prompt dataset"):
        require_kind("sft", "grpo", dataset="demo_sft")


def test_tokenized_prompts_are_the_templates_generation_prompt(tmp_path: Path):
    data = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "Add.\n2+2", "answer": "4", "metadata": {"task": "add"}}, {"prompt": "Copy.\n12"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = tiny()
    ingested = ingest(resolve_dataset(str(data)))
    assert ingested.kind == "prompt"
    result = tokenize(ingested.path, model.path, model.template)
    got = datasets.load_from_disk(str(result.path)).to_list()
    tok = load_tokenizer(model)
    for row, raw in zip(got, rows, strict=True):
        text = templates.render(
            tok, [{"role": "user", "content": raw["prompt"]}], "chatml", add_generation_prompt=True
        )
        assert row["prompt_text"] == text and text.endswith("<|im_start|>assistant\n")
        # TRL renders the messages with the tokenizer's template: the same ids gym stores.
        trl_ids = tok.apply_chat_template(
            row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True
        )
        assert row["prompt_ids"] == list(trl_ids["input_ids"])
    assert [r["answer"] for r in got] == ["4", None]
    assert json.loads(got[0]["metadata"]) == {"task": "add"}
    assert result.stats["max_prompt_len"] == max(len(r["prompt_ids"]) for r in got)


def test_sft_records_tokenized_as_prompts_keep_their_last_answer_as_the_answer(tmp_path: Path):
    # LLaMA-Factory's PPO samples from its alpaca files' prompts: gym's online RL reads sft data so too
    data = tmp_path / "alpaca.jsonl"
    rows = [
        {"instruction": "Add.", "input": "2+2", "output": "4", "system": "Be brief."},
        {"instruction": "Copy.", "input": "12", "output": "12"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = tiny()
    ingested = ingest(resolve_dataset(str(data)))
    assert ingested.kind == "sft"
    result = tokenize(ingested.path, model.path, model.template, as_prompts=True)
    assert result.kind == "prompt"
    got = datasets.load_from_disk(str(result.path)).to_list()
    assert [r["answer"] for r in got] == ["4", "12"]
    assert got[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add.\n2+2"},
    ]
    tok = load_tokenizer(model)
    assert got[1]["prompt_text"] == templates.render(
        tok, [{"role": "user", "content": "Copy.\n12"}], "chatml", add_generation_prompt=True
    )
    assert json.loads(got[0]["metadata"]) == {}
    plain = tokenize(ingested.path, model.path, model.template)
    assert plain.kind == "sft" and plain.digest != result.digest, "its own artifact, beside the sft one"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "2+2?", "answer": "4"}) + "\n")
    ingested = ingest(resolve_dataset(str(prompts)))
    same = tokenize(ingested.path, model.path, model.template, as_prompts=True)
    assert same.digest == tokenize(ingested.path, model.path, model.template).digest, "prompt data as it is"


def test_demo_toy_task():
    warmup, prompts, held_out = (
        demo_records(n) for n in ("demo_format_sft", "demo_prompts", "demo_prompts_eval")
    )
    sft, sft_eval = demo_records("demo_sft"), demo_records("demo_sft_eval")
    # Same problems as the plain SFT data and its held-out split: the eval prompts were never trained on.
    assert [(r["input"], r["output"]) for r in sft] == [
        (r["input"], r["output"].removeprefix(ANSWER_PREFIX["en"]).removeprefix(ANSWER_PREFIX["zh"]))
        for r in warmup
    ]
    assert [(r["prompt"].split("\n", 1)[1], r["answer"]) for r in prompts] == [
        (r["input"], r["output"]) for r in sft[: len(prompts)]
    ]
    assert [(r["prompt"].split("\n", 1)[1], r["answer"]) for r in held_out] == [
        (r["input"], r["output"]) for r in sft_eval
    ]
    # Every question asks for the form; about half of the warm-up answers use it, in the question's language.
    formatted = [r for r in warmup if r["output"] != r["output"].split("：")[-1].split(": ")[-1]]
    assert 0.4 < len(formatted) / len(warmup) < 0.6
    for r in formatted:
        lang = "zh" if "答案" in r["instruction"] else "en"
        assert r["output"].startswith(ANSWER_PREFIX[lang]) and ANSWER_PREFIX[lang].strip() in r["instruction"]
    assert {r["metadata"]["lang"] for r in held_out} == {"en", "zh"}
    assert len({r["metadata"]["task"] for r in held_out}) == 9
