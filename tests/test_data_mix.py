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
