"""Ingest: every file type and format lands as canonical Arrow records under a content digest; bad
input raises one DataError that names file, record and field, and leaves nothing behind.

Run: .venv/bin/pytest tests/test_data_ingest.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gym import workspace
from gym.data.demo import demo_records
from gym.data.formats import require_kind
from gym.data.ingest import ingest
from gym.data.readers import read_source
from gym.data.registry import DatasetSpec, resolve_dataset
from gym.errors import ConfigError, DataError

DATA = Path(__file__).parent / "fixtures" / "data"
SYSTEM_ZH = {"role": "system", "content": "你是一个翻译助手。"}
ZH = [SYSTEM_ZH, {"role": "user", "content": "把下面的句子翻译成英文。\n你好，世界"}]


@pytest.fixture(autouse=True)
def _home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "home"))


def load(result) -> list[dict]:
    return datasets.load_from_disk(str(result.path)).to_list()


def datasets_area() -> set[str]:
    return {p.name for p in workspace.path("datasets").iterdir()}


def binary_copies(tmp_path: Path) -> dict[str, Path]:
    """The alpaca fixture as parquet, Arrow IPC and a save_to_disk folder."""
    rows = json.loads((DATA / "alpaca.json").read_text(encoding="utf-8"))[:2]
    table = pa.Table.from_pylist([{**r, "system": r.get("system")} for r in rows])
    pq.write_table(table, tmp_path / "alpaca.parquet")
    with pa.OSFile(str(tmp_path / "alpaca.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    datasets.Dataset(table).save_to_disk(str(tmp_path / "saved"))
    return {
        "parquet": tmp_path / "alpaca.parquet",
        "arrow": tmp_path / "alpaca.arrow",
        "saved": tmp_path / "saved",
    }


@pytest.mark.parametrize(
    "source", ["alpaca.json", "alpaca.jsonl", "alpaca_lines.json", "parquet", "arrow", "saved"]
)
def test_alpaca_from_every_file_type(tmp_path: Path, source: str):
    path = binary_copies(tmp_path).get(source, DATA / source)
    result = ingest(resolve_dataset(path))
    records = load(result)
    assert result.kind == "sft" and result.num_records == len(records) >= 2
    assert records[0]["messages"] == [
        {"role": "user", "content": "Add the numbers.\n2 3"},
        {"role": "assistant", "content": "5"},
    ]
    assert records[1]["messages"] == [*ZH, {"role": "assistant", "content": "Hello, world"}]


def test_csv_and_folder():
    csv = load(ingest(resolve_dataset(DATA / "alpaca.csv")))
    folder = load(ingest(resolve_dataset(DATA / "alpaca_folder")))
    assert csv[1]["messages"][-1]["content"] == "Hello, world"
    assert [r["messages"][0]["content"] for r in folder] == [
        "Add the numbers.\n2 3",
        "把下面的句子翻译成英文。\n你好，世界",
    ]


def test_sharegpt_and_openai():
    chat = load(ingest(resolve_dataset(DATA / "sharegpt.json")))
    assert [m["role"] for m in chat[0]["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert chat[0]["messages"][3]["content"] == "再来一个。"
    assert chat[1]["messages"][0] == {"role": "system", "content": "Be kind."}
    openai = load(ingest(resolve_dataset(DATA / "openai.jsonl")))
    assert openai[1]["messages"][1]["content"] == "你好！有什么可以帮你？"


def test_preference_in_trl_and_llamafactory_styles():
    trl = load(ingest(resolve_dataset(DATA / "preference_trl.jsonl")))
    assert trl[0] == {
        "prompt": [{"role": "user", "content": "Name a prime."}],
        "chosen": "7",
        "rejected": "8",
    }
    assert trl[1]["prompt"][0] == {"role": "system", "content": "Be exact."} and trl[1]["rejected"] == "5"
    assert trl[2] == {
        "prompt": [{"role": "user", "content": "中国的首都是哪里？"}],
        "chosen": "北京",
        "rejected": "上海",
    }
    lf = load(ingest(resolve_dataset(DATA / "preference_lf.json")))
    assert lf[1]["prompt"] == [
        {"role": "system", "content": "只回答数字。"},
        {"role": "user", "content": "把数字加起来。\n2 3"},
    ]
    assert [m["role"] for m in lf[2]["prompt"]] == ["user", "assistant", "user"] and lf[2]["chosen"] == "4"


def test_kto_from_json_csv_and_trl_style():
    for name in ("kto.jsonl", "kto.csv", "kto_trl.jsonl"):
        result = ingest(resolve_dataset(DATA / name))
        records = load(result)
        assert result.kind == "kto"
        assert [r["label"] for r in records][:2] == [True, False], name
        assert all(isinstance(r["label"], bool) for r in records)


def test_column_mapping_from_the_registry(tmp_path: Path):
    registry = tmp_path / "datasets.json"
    cols = {"instruction": "question", "output": "answer"}
    registry.write_text(json.dumps({"qa": {"file": "qa.jsonl", "format": "alpaca", "columns": cols}}))
    records = load(ingest(resolve_dataset("qa", registry=registry, data_root=DATA)))
    assert records[1]["messages"] == [
        {"role": "user", "content": "中国的首都是哪里？"},
        {"role": "assistant", "content": "北京"},
    ]


def test_num_samples_keeps_the_first_records():
    spec = resolve_dataset(DATA / "alpaca.jsonl").model_copy(update={"num_samples": 2})
    result = ingest(spec)
    assert result.num_records == 2 and load(result)[1]["messages"][0] == SYSTEM_ZH


def test_content_addressing(tmp_path: Path):
    first = ingest(resolve_dataset(DATA / "alpaca.jsonl"))
    stamp = (first.path / "meta.json").stat().st_mtime_ns
    again = ingest(resolve_dataset(DATA / "alpaca.jsonl"))
    assert again == first and (first.path / "meta.json").stat().st_mtime_ns == stamp
    moved = tmp_path / "elsewhere.jsonl"
    shutil.copy(DATA / "alpaca.jsonl", moved)
    assert ingest(resolve_dataset(moved)).digest == first.digest  # content, not location
    moved.write_text(moved.read_text(encoding="utf-8").replace('"5"', '"five"'), encoding="utf-8")
    assert ingest(resolve_dataset(moved)).digest != first.digest
    spec = resolve_dataset(DATA / "alpaca.jsonl")
    for change in ({"num_samples": 1}, {"columns": {"output": "instruction", "instruction": "output"}}):
        assert ingest(spec.model_copy(update=change)).digest != first.digest, change


def test_num_samples_over_the_files_size_repeats_its_records_in_order():
    """It kept the 5 records a file has: LLaMA-Factory's way of weighting a small set up in a mix."""
    whole = load(ingest(resolve_dataset(DATA / "alpaca.jsonl")))
    n = len(whole)
    spec = resolve_dataset(DATA / "alpaca.jsonl").model_copy(update={"num_samples": 2 * n + 1})
    more = ingest(spec)
    assert more.num_records == 2 * n + 1
    assert list(load(more)) == [*whole, *whole, whole[0]]


def test_a_split_other_than_train_of_a_plain_file_is_refused_not_ignored():
    """A file has no test split: every record was read, as if it were the test split."""
    spec = resolve_dataset(DATA / "alpaca.jsonl").model_copy(update={"split": "test"})
    with pytest.raises(
        DataError, match="field 'split': split 'test': a file or a folder of files is one split"
    ):
        ingest(spec)


def test_demo_generators_write_a_jsonl_file_then_ingest_it():
    result = ingest(resolve_dataset("demo_chat"))
    demo_file = workspace.path("datasets", "demo-files", "demo_chat.jsonl")
    lines = [json.loads(line) for line in demo_file.read_text(encoding="utf-8").splitlines()]
    assert lines == demo_records("demo_chat") and result.num_records == len(lines)
    assert result.kind == "sft" and ingest(resolve_dataset("demo_chat")) == result
    for name, kind in (("demo_dpo", "preference"), ("demo_kto", "kto"), ("demo_sft_eval", "sft")):
        assert ingest(resolve_dataset(name)).kind == kind


def test_unknown_generator():
    with pytest.raises(ConfigError, match="unknown demo generator"):
        ingest(DatasetSpec(name="x", generator="demo_nothing", format="alpaca"))


@pytest.mark.parametrize(
    ("name", "fmt", "record", "field", "words"),
    [
        ("bad_line.jsonl", "alpaca", 3, None, "line 3 is not valid JSON"),
        ("missing_output.jsonl", "alpaca", 2, "output", "alpaca records need instruction and output"),
        ("mistyped.jsonl", "alpaca", 3, "output", "must be a string, got int 42"),
        ("empty.jsonl", "alpaca", None, None, "the dataset is empty"),
        ("bad_label.csv", "kto", 1, "label", "must be a boolean, got str 'yes'"),
        ("tool_role.json", "sharegpt", 1, "conversations", "tool turns are not supported"),
        ("not_alternating.jsonl", "openai", 1, "messages", "turn 2 is user, expected assistant"),
    ],
)
def test_bad_input_names_file_record_field_and_leaves_nothing(name, fmt, record, field, words):
    ingest(resolve_dataset(DATA / "alpaca.jsonl"))  # something that existed before
    before = datasets_area()
    path = DATA / "bad" / name
    with pytest.raises(DataError) as e:
        ingest(DatasetSpec(name=name, file=str(path), format=fmt))
    assert e.value.file == str(path) and e.value.record == record and e.value.field == field
    assert words in str(e.value) and name in str(e.value)
    assert datasets_area() == before


def test_hub_id_offline_fails_fast_and_leaves_nothing():
    before = datasets_area()
    with pytest.raises(DataError, match="HF_HUB_OFFLINE"):
        ingest(resolve_dataset("gym-test-org/no-such-dataset", format="alpaca"))
    assert datasets_area() == before


def test_an_unpinned_hub_dataset_is_identified_by_the_commit_its_branch_points_to(tmp_path, monkeypatch):
    # Keyed on the hub id and revision `main` only, a dataset updated on the hub was never read again
    # (--refresh-cache included): its first download's records were served as the new ones
    from huggingface_hub import constants

    from gym.data import readers
    from gym.data.ingest import dataset_digest, source_stamp

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    refs = tmp_path / "datasets--gym-test-org--changing" / "refs"
    refs.mkdir(parents=True)
    spec = DatasetSpec(name="gym-test-org/changing", hub_id="gym-test-org/changing", format="alpaca")
    digests, stamps = [], []
    for commit in ("a" * 40, "b" * 40):  # as `datasets` left the branch after each download
        (refs / "main").write_text(commit)
        readers.hub_commit.cache_clear()  # once per process: a new run
        digests.append(dataset_digest(spec))
        stamps.append(source_stamp("gym-test-org/changing"))
    assert digests[0] != digests[1] and stamps[0] != stamps[1]
    assert stamps[1]["commit"] == "b" * 40
    readers.hub_commit.cache_clear()
    pinned = spec.model_copy(update={"revision": "c" * 40})  # a commit pins itself, cached or not
    assert readers.hub_commit(spec.hub_id, pinned.revision) == "c" * 40
    (refs / "main").unlink()
    readers.hub_commit.cache_clear()
    assert readers.hub_commit(spec.hub_id, None) is None, "unknown: the id and revision alone, as before"
    readers.hub_commit.cache_clear()


def test_wrong_format_for_the_method():
    result = ingest(resolve_dataset(DATA / "alpaca.jsonl"))
    with pytest.raises(ConfigError, match="'dpo' needs a preference dataset"):
        require_kind(result.kind, "dpo", dataset="alpaca.jsonl")
    with pytest.raises(ConfigError, match="'kto' needs a kto dataset"):
        require_kind(ingest(resolve_dataset(DATA / "preference_lf.json")).kind, "kto")


@pytest.mark.parametrize(
    ("method", "fixture", "columns", "takes"),
    [
        ("dpo", "alpaca.jsonl", "with chosen and rejected answers", "(sft, ppo, grpo, gspo, tf_grpo)"),
        ("kto", "preference_lf.json", "and a boolean label", "trains on preference data (dpo, ipo, "),
    ],
)
def test_the_flows_check_of_data_of_the_wrong_shape_names_the_columns_needed(method, fixture, columns, takes):
    """The check a flow makes before any model loads said the format only, not its columns."""
    from gym import preflight

    with pytest.raises(ConfigError, match=r"^dataset: ") as e:
        preflight.check_dataset("dataset", str(DATA / fixture), method)
    assert columns in str(e.value) and takes in str(e.value)


@pytest.mark.parametrize("fixture", ["sharegpt.json", "openai.jsonl", "kto.jsonl"])
@pytest.mark.parametrize("kind", ["parquet", "arrow", "saved"])
def test_binary_file_types_for_chat_and_kto(tmp_path: Path, fixture: str, kind: str):
    """Nested message lists and booleans survive Arrow types; missing optional fields arrive as None."""
    expected = load(ingest(resolve_dataset(DATA / fixture)))
    source = resolve_dataset(DATA / fixture)
    raws = [raw for _, _, raw in read_source(DATA / fixture)]
    keys = sorted({k for raw in raws for k in raw})  # from_pylist takes its columns from row 1 only
    table = pa.Table.from_pylist([{k: raw.get(k) for k in keys} for raw in raws])
    path = tmp_path / f"data.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    elif kind == "arrow":
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    else:
        datasets.Dataset(table).save_to_disk(str(path))
    result = ingest(resolve_dataset(path))
    assert resolve_dataset(path).format == source.format and load(result) == expected


def test_a_lone_surrogate_is_a_data_error_not_an_arrow_traceback(tmp_path: Path):
    (tmp_path / "a.jsonl").write_text('{"instruction": "a\\ud800b", "output": "c"}\n', encoding="utf-8")
    before = datasets_area()
    with pytest.raises(DataError, match="invalid Unicode: lone surrogate") as e:
        ingest(resolve_dataset(tmp_path / "a.jsonl"))
    assert (e.value.file, e.value.record, e.value.field) == (str(tmp_path / "a.jsonl"), 1, "instruction")
    assert datasets_area() == before


def test_a_bad_record_after_blank_lines_is_named_with_its_line(tmp_path: Path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"instruction": "a", "output": "b"}\n\n\n{"instruction": "a"}\n', encoding="utf-8")
    with pytest.raises(DataError) as e:
        ingest(resolve_dataset(path))
    assert e.value.record == 2 and e.value.field == "output"
    assert f"file {path}, record 2 (line 4), field 'output'" in str(e.value)


def test_alpaca_with_a_label_column_is_sft_and_a_guess_that_fails_says_so(tmp_path: Path):
    rows = [{"instruction": "Classify: great", "output": "positive", "label": "sentiment"}]
    (tmp_path / "meta.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = ingest(resolve_dataset(tmp_path / "meta.jsonl"))
    assert result.kind == "sft" and load(result)[0]["messages"][1]["content"] == "positive"
    rows = [
        {"instruction": "a", "output": "b", "label": True},
        {"instruction": "c", "output": "d", "label": "x"},
    ]
    (tmp_path / "kto.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    spec = resolve_dataset(tmp_path / "kto.jsonl")
    assert spec.format == "kto" and "format_guessed" not in spec.model_dump()
    with pytest.raises(DataError, match="must be a boolean") as e:
        ingest(spec)
    assert "format kto was guessed from the first record's fields" in str(e.value)
    with pytest.raises(DataError) as e:  # a format named is no guess
        ingest(resolve_dataset(tmp_path / "kto.jsonl", format="kto"))
    assert "guessed" not in str(e.value)


def test_records_stream_to_disk_so_memory_stays_flat_whatever_the_file_size(tmp_path: Path):
    """The whole table used to be built in memory before it was saved: ~7x the file at its peak (1.4 GB for
    a 168 MB file). Arrow's own peak allocation now stays near one batch, far below the data's size."""
    import os
    import subprocess
    import sys

    rows = ({"instruction": f"question {i} " + "x" * 200, "output": f"answer {i}"} for i in range(20_000))
    data = tmp_path / "big.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = (
        "import json, sys, pyarrow as pa\n"
        "from gym.data.ingest import ingest\n"
        "from gym.data.registry import resolve_dataset\n"
        "r = ingest(resolve_dataset(sys.argv[1]))\n"
        "print(json.dumps([pa.default_memory_pool().max_memory(), r.num_records]))\n"
    )
    env = {**os.environ, "GYM_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", script, str(data)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    peak, records = json.loads(out.stdout.strip().splitlines()[-1])
    artifact = sum(f.stat().st_size for f in (tmp_path / "home" / "datasets").rglob("*.arrow"))
    assert records == 20_000 and artifact > 4_000_000
    assert peak < artifact / 4, (peak, artifact)


def test_a_record_in_another_format_is_said_to_be_one(tmp_path: Path) -> None:
    """An OpenAI record among alpaca ones failed with "field 'output': missing", as if it were a broken
    alpaca record."""
    path = tmp_path / "mixed.jsonl"
    chat = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}
    path.write_text(json.dumps({"instruction": "a", "output": "b"}) + "\n" + json.dumps(chat) + "\n")
    with pytest.raises(DataError) as caught:
        ingest(resolve_dataset(str(path)))
    message = str(caught.value)
    assert "record 2, field 'output': missing" in message
    assert "looks like openai data (fields messages), while the dataset is read as alpaca" in message
    broken = tmp_path / "broken.jsonl"  # a broken record of the file's own format: no such hint
    broken.write_text(
        json.dumps({"instruction": "a", "output": "b"})
        + "\n"
        + json.dumps({"instruction": 3, "output": "b"})
        + "\n"
    )
    with pytest.raises(DataError) as caught:
        ingest(resolve_dataset(str(broken)))
    assert "record 2" in str(caught.value) and "looks like" not in str(caught.value)


def test_a_folder_whose_files_hold_different_formats_is_told_to_give_them_apart(tmp_path: Path) -> None:
    """It was told to "keep one format per file", which each of its files did."""
    folder = tmp_path / "chats"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps({"instruction": "a", "output": "b"}) + "\n")
    chat = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}
    (folder / "b.jsonl").write_text(json.dumps(chat) + "\n")
    with pytest.raises(DataError) as caught:
        ingest(resolve_dataset(str(folder)))
    message = str(caught.value)
    assert str(folder / "b.jsonl") in message and "record 1" in message
    assert "give each format's files as their own dataset, separated by commas" in message
    assert "one format per file" not in message
