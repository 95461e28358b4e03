"""Several datasets as one (`--dataset a.jsonl,b.jsonl`): one artifact of both, in order, written once;
a mix of record kinds fails naming each part, before any model loads."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import datasets
import pytest

from gym.data import mix
from gym.data.ingest import load_meta
from gym.errors import ConfigError
from gym.preflight import check_dataset
from tests.test_flows import run_script


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "alpaca": write(
            tmp_path / "a.jsonl", [{"instruction": f"a{i}", "output": f"A{i}"} for i in range(3)]
        ),
        "sharegpt": write(
            tmp_path / "s.jsonl",
            [{"conversations": [{"from": "human", "value": "s0"}, {"from": "gpt", "value": "S0"}]}],
        ),
        "pairs": write(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "y", "rejected": "n"}]),
    }


def test_a_comma_list_names_several_datasets_and_a_path_with_a_comma_is_one(tmp_path):
    assert mix.names("demo_sft") == ["demo_sft"]
    assert mix.names("demo_sft, ./mine.jsonl ,hub/x") == ["demo_sft", "./mine.jsonl", "hub/x"]
    odd = write(tmp_path / "a,b.jsonl", [{"instruction": "i", "output": "o"}])
    assert mix.names(str(odd)) == [str(odd)]
    with pytest.raises(ConfigError, match="empty entry"):
        mix.names("demo_sft,,x")


def test_a_mix_is_the_parts_records_in_order_written_once(files):
    value = f"{files['alpaca']},{files['sharegpt']}"
    data = mix.ingest_named(value)
    rows = datasets.load_from_disk(str(data.path)).to_list()
    assert data.kind == "sft" and data.num_records == len(rows) == 4
    firsts = [r["messages"][0]["content"] for r in rows]
    assert firsts == ["a0", "a1", "a2", "s0"], "alpaca and sharegpt records, canonical, one after the other"
    meta = load_meta(data.path)
    assert [p["num_records"] for p in meta["mix_of"]] == [3, 1] and meta["format"] == "mix"

    written = os.stat(data.path / "meta.json").st_mtime_ns
    again = mix.ingest_named(value)
    assert again == data and os.stat(data.path / "meta.json").st_mtime_ns == written, "reused, not rewritten"
    reversed_ = mix.ingest_named(f"{files['sharegpt']},{files['alpaca']}")
    assert reversed_.digest != data.digest
    assert mix.ingest_named(str(files["alpaca"])).num_records == 3, "one name: that dataset alone"


def test_max_samples_caps_each_dataset_of_a_mix_as_llamafactory_does(files):
    from gym.data.tokenize import TokenizeSettings, tokenize
    from gym.models import load_tokenizer, resolve

    model = resolve("gym-tiny")
    data = mix.ingest_named(f"{files['alpaca']},{files['sharegpt']}")
    capped = tokenize(data.path, model.path, model.template, TokenizeSettings(max_samples=2))
    rows = datasets.load_from_disk(str(capped.path))
    assert capped.num_records == len(rows) == 3, "2 of the alpaca file's 3 records, then the sharegpt one"
    tok = load_tokenizer(model)
    texts = [tok.decode(r["input_ids"]) for r in rows]
    assert ["a0" in texts[0], "a1" in texts[1], "s0" in texts[2]] == [True, True, True]
    single = mix.ingest_named(str(files["alpaca"]))
    assert tokenize(single.path, model.path, model.template, TokenizeSettings(max_samples=2)).num_records == 2


def test_a_mix_of_record_kinds_fails_naming_each_part(files):
    value = f"{files['alpaca']},{files['pairs']}"
    with pytest.raises(ConfigError) as caught:
        mix.ingest_named(value)
    assert f"{files['alpaca']} (sft), {files['pairs']} (preference)" in str(caught.value)
    with pytest.raises(ConfigError, match=r"dataset: datasets .* hold different kinds"):
        check_dataset("dataset", value, "tf_grpo")  # a use with no required kind: the mix alone is wrong
    with pytest.raises(ConfigError) as caught:
        check_dataset("dataset", value, "sft")
    assert f"but dataset '{files['pairs']}' holds preference records" in str(caught.value)
    # sft and prompt parts for online RL, which reads each alone as prompts: advice that fits
    prompts = files["alpaca"].with_name("prompts.jsonl")
    write(prompts, [{"prompt": "2+2?", "answer": "4"}])
    with pytest.raises(ConfigError, match="online RL reads an sft dataset as prompts on its own, but"):
        check_dataset("dataset", f"{files['alpaca']},{prompts}", "grpo")


def test_the_cache_key_of_a_mix_follows_each_part(files):
    value = f"{files['alpaca']},{files['sharegpt']}"
    before = mix.source_stamp(value)
    assert len(before["mix"]) == 2
    write(
        files["sharegpt"],
        [{"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "yy"}]}],
    )
    os.utime(files["sharegpt"], ns=(1, 1))
    assert mix.source_stamp(value) != before
    assert "unresolved" in mix.source_stamp("a,,b")


@pytest.mark.slow
def test_gym_train_trains_on_a_mix_of_demo_and_own_data(gym_home, files):
    gym = str(Path(sys.executable).parent / "gym")
    value = f"demo_sft,{files['alpaca']}"
    out = run_script([gym, "train", "--dataset", value, "--max-steps", "30", "--json"], gym_home)
    assert out["metric_last"] < out["metric_first"]
    assert out["exact_match_before"] is None, "a mix is not the demo data: no demo scoring"
    metas = [json.loads(p.read_text()) for p in (gym_home / "datasets").glob("*/meta.json")]
    (mixed,) = [m for m in metas if m.get("format") == "mix"]
    assert [p["dataset"] for p in mixed["mix_of"]] == ["demo_sft", str(files["alpaca"])]
    assert mixed["num_records"] == 6003


@pytest.fixture
def two_parts(tmp_path: Path) -> tuple[str, Path, Path]:
    """A mix of 6 records marked A0..A5 and 2 marked B0, B1: (the dataset list, the two files)."""
    a = write(tmp_path / "a.jsonl", [{"instruction": f"A{i}", "output": "x"} for i in range(6)])
    b = write(tmp_path / "b.jsonl", [{"instruction": f"B{i}", "output": "y"} for i in range(2)])
    return f"{a},{b}", a, b


MARKS = [*(f"A{i}" for i in range(6)), "B0", "B1"]


def tokenized_marks(data_path: Path, **settings) -> list[str]:
    """The A/B marks of the records a stage would train on, in order, after tokenizing with `settings`."""
    from gym.data.tokenize import TokenizeSettings, tokenize
    from gym.models import load_tokenizer, resolve

    model = resolve("gym-tiny")
    out = tokenize(data_path, model.path, model.template, TokenizeSettings(**settings))
    tok = load_tokenizer(model)
    texts = [tok.decode(r["input_ids"]) for r in datasets.load_from_disk(str(out.path))]
    marks = [next(w for w in MARKS if w in t) for t in texts]
    assert out.num_records == len(marks)
    return marks


def test_interleave_under_and_over_draw_the_parts_in_turn_as_llamafactory(two_parts):
    data = mix.ingest_named(two_parts[0])
    assert tokenized_marks(data.path) == ["A0", "A1", "A2", "A3", "A4", "A5", "B0", "B1"], "concat"
    assert tokenized_marks(data.path, mix_strategy="interleave_under") == ["A0", "B0", "A1", "B1"]
    over = tokenized_marks(data.path, mix_strategy="interleave_over")
    assert over[:4] == ["A0", "B0", "A1", "B1"] and over[4:6] == ["A2", "B0"], "B starts over"
    assert [over.count(f"A{i}") for i in range(6)] == [1] * 6 and len(over) == 12, "until A runs out"
    capped = tokenized_marks(data.path, mix_strategy="interleave_over", max_samples=3)
    assert capped == ["A0", "B0", "A1", "B1", "A2", "B0"], "max_samples caps each part first"


def test_interleave_probs_set_each_parts_share_and_the_seed_the_draw(two_parts):
    a = write(
        Path(two_parts[1]).with_name("big_a.jsonl"),
        [{"instruction": f"A{i % 6}", "output": "x"} for i in range(300)],
    )
    b = write(
        Path(two_parts[1]).with_name("big_b.jsonl"),
        [{"instruction": f"B{i % 2}", "output": "y"} for i in range(300)],
    )
    data = mix.ingest_named(f"{a},{b}")
    shares = {}
    for probs in ([0.9, 0.1], [1.0, 1.0]):
        marks = tokenized_marks(data.path, mix_strategy="interleave_under", interleave_probs=probs)
        drawn = [sum(m.startswith(x) for m in marks) for x in "AB"]
        assert 300 in drawn and len(marks) < 600, "until the first part runs out"
        shares[probs[0]] = sum(m.startswith("A") for m in marks) / len(marks)
    assert shares[0.9] > 0.8 and 0.4 < shares[1.0] < 0.6, shares
    again = tokenized_marks(data.path, mix_strategy="interleave_under", interleave_probs=[0.9, 0.1])
    other = tokenized_marks(
        data.path, mix_strategy="interleave_under", interleave_probs=[0.9, 0.1], interleave_seed=7
    )
    first = tokenized_marks(data.path, mix_strategy="interleave_under", interleave_probs=[0.9, 0.1])
    assert again == first and other != first


def test_interleave_probs_need_one_share_per_dataset(two_parts):
    from gym.data.tokenize import TokenizeSettings

    data = mix.ingest_named(two_parts[0])
    with pytest.raises(ConfigError, match=r"gives 3 share.* for the 2 datasets mixed"):
        tokenized_marks(data.path, mix_strategy="interleave_under", interleave_probs=[0.5, 0.3, 0.2])
    with pytest.raises(ValueError, match="one share of at least 0"):
        TokenizeSettings(interleave_probs=[0.5, -0.1])
    single = mix.ingest_named(str(two_parts[1]))
    assert len(tokenized_marks(single.path, mix_strategy="interleave_over", interleave_probs=[1, 2])) == 6, (
        "one dataset: nothing to interleave (the setting applies to every stage's data, mixed or not)"
    )


def test_a_held_out_split_of_a_mix_keeps_the_train_records_in_their_parts(two_parts):
    from gym.data.split import split

    data = mix.ingest_named(two_parts[0])
    train, held = split(data, val_size=3, seed=0)
    train_meta = load_meta(train.path)
    counts = [p["num_records"] for p in train_meta["mix_of"]]
    assert sum(counts) == train.num_records == 5 and held.num_records == 3
    marks = tokenized_marks(train.path)
    assert marks == sorted(marks), "each part's records together, in order"
    assert [sum(m.startswith(x) for m in marks) for x in "AB"] == counts
    held_marks = set(tokenized_marks(held.path))
    assert not held_marks & set(marks) and len(held_marks) == 3, "held-out records are not trained on"
    over = tokenized_marks(train.path, mix_strategy="interleave_over")
    assert set(over) == set(marks), "the split train part still interleaves per dataset"


def test_preflight_checks_the_interleave_shares_against_each_mix(two_parts):
    from gym import preflight
    from gym.pipeline import TrainFlowConfig

    def check(**data) -> None:
        preflight.check(TrainFlowConfig(dataset=two_parts[0], data=data))

    check(mix_strategy="interleave_under", interleave_probs=[0.7, 0.3])
    with pytest.raises(ConfigError, match=r"3 share\(s\), but dataset mixes 2 datasets"):
        check(mix_strategy="interleave_under", interleave_probs=[0.5, 0.3, 0.2])
    with pytest.raises(ConfigError, match=r"read when data\.mix_strategy interleaves"):
        check(interleave_probs=[0.7, 0.3])


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_dataset_setting_is_an_error(value):
    with pytest.raises(ConfigError, match="the dataset name is empty"):
        mix.names(value)
