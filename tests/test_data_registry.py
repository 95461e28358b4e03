"""Dataset registry: every shipped entry is valid, bad entries are named, and resolve_dataset finds
registry names, local paths (format detected) and hub ids.

Run: .venv/bin/pytest tests/test_data_registry.py
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from gym.data.demo import DEMO_DATASETS
from gym.data.registry import DatasetSpec, load_registry, resolve_dataset
from gym.errors import ConfigError, DataError, GymWarning, RegistryError

DATA = Path(__file__).parent / "fixtures" / "data"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GYM_DATA_DIR", raising=False)


def write_registry(tmp_path: Path, entries: dict) -> Path:
    f = tmp_path / "datasets.json"
    f.write_text(json.dumps(entries))
    return f


def test_shipped_registry_is_valid_and_covers_every_demo_dataset():
    entries = load_registry()
    for name, fmt in DEMO_DATASETS.items():
        assert entries[name]["generator"] == name
        assert entries[name]["format"] == fmt
    for name in entries:
        spec = resolve_dataset(name)
        assert spec.kind in ("sft", "preference", "kto", "prompt", "text") and spec.description


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ({"file": "a.jsonl", "format": "yaml"}, "format", "is not one of"),
        ({"file": "a.jsonl", "format": "alpaca", "colums": {}}, None, "allowed fields"),
        (
            {"file": "a.jsonl", "hub_id": "a/b", "format": "alpaca"},
            None,
            "exactly one of file, hub_id, generator",
        ),
        ({"format": "alpaca"}, None, "exactly one of"),
        ({"file": "a.jsonl", "format": "alpaca", "num_samples": 0}, "num_samples", "minimum"),
        ({"file": "a.jsonl", "format": "alpaca", "columns": {"output": 3}}, "columns.output", "not of type"),
        ({"file": "a.jsonl", "format": "alpaca", "revision": "main"}, None, "hub_id"),
    ],
)
def test_bad_entries_name_entry_and_field(tmp_path: Path, entry: dict, field: str | None, words: str):
    f = write_registry(tmp_path, {"good": {"generator": "demo_sft", "format": "alpaca"}, "mine": entry})
    with pytest.raises(RegistryError) as e:
        load_registry(f)
    text = str(e.value)
    assert "entry 'mine'" in text and words in text
    if field:
        assert f"field {field!r}" in text


def test_registry_file_entry_resolves_against_the_data_dir(tmp_path: Path):
    f = write_registry(
        tmp_path,
        {
            "qa": {
                "file": "qa.jsonl",
                "format": "alpaca",
                "columns": {"instruction": "question", "output": "answer"},
            }
        },
    )
    spec = resolve_dataset("qa", registry=f, data_root=DATA)
    assert spec.file == str(DATA.resolve() / "qa.jsonl")
    assert spec.columns == {"instruction": "question", "output": "answer"} and spec.split == "train"


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("alpaca.json", "alpaca"),
        ("alpaca.csv", "alpaca"),
        ("alpaca_folder", "alpaca"),
        ("sharegpt.json", "sharegpt"),
        ("openai.jsonl", "openai"),
        ("preference_trl.jsonl", "preference"),
        ("preference_lf.json", "preference"),
        ("kto.jsonl", "kto"),
        ("kto_trl.jsonl", "kto"),
    ],
)
def test_local_paths_get_their_format_detected(name: str, fmt: str):
    spec = resolve_dataset(DATA / name)
    assert spec.format == fmt and spec.file == str((DATA / name).resolve())


def test_relative_path_and_columns(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GYM_DATA_DIR", str(DATA))
    spec = resolve_dataset("qa.jsonl", columns={"instruction": "question", "output": "answer"})
    assert spec.format == "alpaca"


def test_a_columns_key_no_format_reads_is_refused_naming_the_entry(tmp_path, monkeypatch):
    # A typo (or the mapping written file -> gym) renamed the file's own column away: the error then said
    # the file lacked a field it has
    import shutil

    from gym.paths import registry_dir

    registry = tmp_path / "registry"
    shutil.copytree(registry_dir(), registry)
    entries = json.loads((registry / "datasets.json").read_text())
    columns = {"instrucion": "question"}
    entries["mine"] = {"file": str(DATA / "qa.jsonl"), "format": "alpaca", "columns": columns}
    (registry / "datasets.json").write_text(json.dumps(entries))
    monkeypatch.setenv("GYM_REGISTRY", str(registry))
    says = r"entry 'mine', field columns\.instrucion: .*did you mean 'instruction'\? columns maps gym's name"
    with pytest.raises(RegistryError, match=says):
        resolve_dataset("mine")
    with pytest.raises(ConfigError, match=r"columns\.question: no field gym reads"):  # the Python API too
        resolve_dataset(DATA / "qa.jsonl", columns={"question": "instruction"})


def test_undetectable_format_says_what_to_do():
    with pytest.raises(DataError, match="cannot tell the dataset format") as e:
        resolve_dataset(DATA / "qa.jsonl")
    assert e.value.record == 1 and "describe the file (its format and `columns`)" in str(e.value)


def test_hub_ids_resolve_without_network():
    spec = resolve_dataset("tatsu-lab/alpaca")
    assert spec.hub_id == "tatsu-lab/alpaca" and spec.format is None and spec.file is None
    assert resolve_dataset("tatsu-lab/alpaca", format="alpaca").kind == "sft"


def test_unknown_name_suggests_registry_entries():
    with pytest.raises(ConfigError, match="did you mean demo_sft"):
        resolve_dataset("demo_sfx")


def test_spec_needs_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one"):
        DatasetSpec(name="x", file="a.jsonl", generator="demo_sft")
    with pytest.raises(ValueError, match="exactly one"):
        DatasetSpec(name="x")


def test_unknown_generator_is_named(tmp_path: Path):
    f = write_registry(tmp_path, {"mine": {"generator": "demo_nothing", "format": "alpaca"}})
    with pytest.raises(RegistryError, match="entry 'mine', field 'generator': unknown demo dataset"):
        resolve_dataset("mine", registry=f)


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_dataset_name_is_an_error_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
):
    """Path("") is Path("."): `--dataset ""` trained on every data file of the current directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    with pytest.raises(ConfigError, match="the dataset name is empty"):
        resolve_dataset(name)


def test_a_missing_path_names_the_flag_and_close_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chats.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    with pytest.raises(ConfigError) as e:
        resolve_dataset("chat.jsonl")
    assert "no such file or folder 'chat.jsonl'; did you mean 'chats.jsonl'?" in str(e.value)
    assert "--dataset_dir" in str(e.value) and "$GYM_DATA_DIR" in str(e.value)
    with pytest.raises(ConfigError) as e:
        resolve_dataset("unrelated.jsonl")
    assert "did you mean" not in str(e.value) and "--dataset_dir" in str(e.value)
    assert str(e.value).startswith("no such file or folder 'unrelated.jsonl' (relative paths")  # no "; "
    # An absolute path is looked up there only: no word on where relative ones are, nor --dataset_dir
    # (a deployment run has no such parameter)
    with pytest.raises(ConfigError) as e:
        resolve_dataset(str(tmp_path / "chat.jsonl"))
    assert str(e.value) == f"no such file or folder {str(tmp_path / 'chat.jsonl')!r}; did you mean "\
        f"{str(tmp_path / 'chats.jsonl')!r}?"  # fmt: skip


@pytest.mark.parametrize("pattern", ["*.jsonl", "data/chat?.jsonl", "data/[ab].jsonl"])
def test_a_wildcard_is_said_not_to_be_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pattern: str):
    """A quoted `--dataset '*.jsonl'` was asked "did you mean 'chats.jsonl'?", one of the files it meant."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for name in ("chats.jsonl", "data/chat1.jsonl", "data/a.jsonl"):
        (tmp_path / name).write_text('{"instruction": "a", "output": "b"}\n')
    with pytest.raises(ConfigError) as e:
        resolve_dataset(pattern)
    assert str(e.value) == (
        f"no such file or folder {pattern!r}: gym does not expand wildcards; give the folder that holds "
        "the files (all of them are read), or list them separated by commas"
    )


@pytest.mark.parametrize("name", ["link.jsonl", "linked"])
def test_a_broken_symlink_is_named_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str):
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).symlink_to(tmp_path / "gone.jsonl")
    with pytest.raises(ConfigError, match=f"'{name}' is a symlink pointing to a missing target .*gone.jsonl"):
        resolve_dataset(name)


def test_the_registry_file_may_start_with_a_bom_but_must_be_utf8(tmp_path: Path):
    f = tmp_path / "datasets.json"
    f.write_bytes(
        b"\xef\xbb\xbf" + json.dumps({"mine": {"generator": "demo_sft", "format": "alpaca"}}).encode()
    )
    assert resolve_dataset("mine", registry=f).generator == "demo_sft"
    f.write_bytes(b'{"mine": {"generator": "demo_sft", "format": "alpaca", "description": "caf\xe9"}}')
    with pytest.raises(RegistryError, match=r"datasets.json: not UTF-8 text: line 1, byte 75 is 0xe9"):
        resolve_dataset("mine", registry=f)


@pytest.mark.parametrize(("label", "warned"), [("yes", True), ("No", True), (-1, True), ("math", False)])
def test_alpaca_data_with_yes_no_labels_is_said_not_to_be_kto(tmp_path: Path, label, warned: bool):
    """A `label` column that is no KTO label (true/false, 1/0) makes an alpaca file: its user, meaning KTO
    data labelled yes/no, was only told that kto needs a kto dataset. A category is ignored quietly."""
    path = tmp_path / "labelled.jsonl"
    path.write_text(json.dumps({"instruction": "a", "output": "b", "label": label}) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = resolve_dataset(str(path))
    assert spec.format == "alpaca"
    said = [str(w.message) for w in caught if issubclass(w.category, GymWarning)]
    assert said == (
        [f"{path}: its 'label' column (record 1: {label!r}) is no KTO label (true/false or 1/0), so the data "
         "is read as alpaca and the column ignored; for KTO, write its labels as true/false"]
        if warned else []
    )  # fmt: skip
