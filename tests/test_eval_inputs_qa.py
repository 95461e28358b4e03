"""MMLU / C-Eval / CMMLU inputs a QA sweep found mishandled: a missing data folder written as a relative
path (read as a hub id: huggingface_hub's traceback), a device torch knows but this machine can't use
(a traceback after the model loaded), the hub error blaming HF_HUB_OFFLINE when it wasn't set, a
missing subject in the hub's parquet layout named in the CSV form, and `datasets` save_to_disk copies
(`<subject>/<split>/data-*.arrow`) refused as not a layout."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from flows.cli import main
from gym.errors import ConfigError, DataError
from gym.eval.mc_data import load_benchmark
from gym.eval.mc_score import resolve_device
from gym.eval.suite import BenchmarkOptions, check_benchmarks
from tests.eval_fixtures import SUBJECTS, write_benchmark

# 1. A relative path is a path, never a hub id.


@pytest.mark.parametrize("given", ["./nope", "../nope", "~/nope"])
def test_a_missing_relative_data_path_is_one_line_not_a_hub_lookup(tmp_path, monkeypatch, given):
    work = tmp_path / "work" / "here"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(
        ConfigError, match=rf"^mmlu data {re.escape(given)} does not exist \(a folder, a \.zip or a hub"
    ):
        load_benchmark("mmlu", given)
    with pytest.raises(ConfigError, match=rf"mmlu data {re.escape(given)} does not exist"):  # a flow's entry
        check_benchmarks([f"mmlu={given}"], BenchmarkOptions())


def test_gym_eval_with_a_missing_relative_data_dir_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--model", "gym-tiny", "--benchmark", "mmlu", "--data-dir", "../nope"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: mmlu data ../nope does not exist (a folder, a .zip or a hub dataset id)", (
        err
    )


def test_relative_and_home_paths_that_exist_are_read(tmp_path, monkeypatch):
    write_benchmark("mmlu", tmp_path / "home" / "mmlu")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = load_benchmark("mmlu", "~/mmlu")
    parent = load_benchmark("mmlu", "../home/mmlu")
    assert home.n_questions == parent.n_questions == 12


def test_neither_a_path_nor_a_valid_hub_id_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^ceval data no such/dir does not exist"):
        load_benchmark("ceval", "no such/dir")  # one `/` but not a repo id: huggingface_hub refused it


# 2. A device torch knows but this machine can't use is refused before any model loads.


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("meta", "device 'meta': gym can't score on it"),
        ("lazy", "device 'lazy': gym can't score on it"),
        ("xpu", "device 'xpu' asked for, but torch sees no XPU device here"),
        ("mps", "device 'mps' asked for, but torch sees no MPS GPU here"),
        ("cuda", "device 'cuda' asked for, but torch sees no CUDA GPU here"),
        ("bogus", "device 'bogus': not a torch device"),
    ],
)
def test_devices_this_machine_cannot_use_are_refused(monkeypatch, device, message):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=message):
        resolve_device(device)
    assert resolve_device("cpu") == "cpu" and resolve_device("auto") == "cpu"


def test_an_available_device_passes_and_its_index_is_checked(monkeypatch):
    import torch

    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 1)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("xpu") == "xpu" and resolve_device("xpu:0") == "xpu:0"
    assert resolve_device("mps") == "mps"
    with pytest.raises(ConfigError, match=r"device 'xpu:1' asked for, but torch sees 1 XPU device\(s\) here"):
        resolve_device("xpu:1")


@pytest.mark.parametrize("device", ["meta", "xpu"])
def test_gym_eval_refuses_the_device_before_the_model_loads(tmp_path, capsys, gym_home, device):
    import torch

    if device == "xpu" and torch.xpu.is_available():
        pytest.skip("this machine has an XPU")
    data = write_benchmark("ceval", tmp_path / "ceval")
    argv = [
        "eval",
        "--model",
        "gym-tiny",
        "--benchmark",
        f"ceval={data}",
        "--no-progress",
        "--device",
        device,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: device '{device}'") and "Traceback" not in err, err
    assert not (gym_home / "models").exists()  # before resolving (building) the model


# 3. The hub error says what happened, in words that fit gym eval and a flow.


def _hub_failing(monkeypatch, error: Exception) -> None:
    import huggingface_hub

    def snapshot_download(*args, **kwargs):
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)


def test_hub_unreachable_is_not_blamed_on_offline_mode(monkeypatch):
    import httpx
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    error = LocalEntryNotFoundError("An error happened while trying to locate the files on the Hub")
    error.__cause__ = httpx.ConnectError("[Errno -2] Name or service not known")
    _hub_failing(monkeypatch, error)
    with pytest.raises(ConfigError) as e:
        load_benchmark("cmmlu", subjects=["agronomy"])
    text = str(e.value)
    assert "HF_HUB_OFFLINE" not in text and "offline" not in text, text
    assert "the hub could not be reached (ConnectError: [Errno -2] Name or service not known)" in text
    assert "--data-dir DIR (gym eval) or cmmlu=DIR (--benchmarks)" in text
    assert "(dev/<subject>.csv and test/<subject>.csv per subject)" in text


def test_offline_mode_is_named_with_its_value(monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    monkeypatch.setenv("HF_HUB_OFFLINE", "true")
    error = LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder")
    error.__cause__ = OfflineModeIsEnabled("offline")
    _hub_failing(monkeypatch, error)
    with pytest.raises(
        ConfigError,
        match=r"^mmlu: cais/mmlu is not a local folder nor in the hub cache, and offline mode is on "
        r"\(HF_HUB_OFFLINE=true\): give the files .* or mmlu=DIR \(--benchmarks\), or unset HF_HUB_OFFLINE",
    ):
        load_benchmark("mmlu")


def test_real_offline_lookup_fits_a_flow_too(tmp_path, monkeypatch):
    """The conftest sets HF_HUB_OFFLINE=1; huggingface_hub's own offline error comes through."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"offline mode is on \(HF_HUB_OFFLINE=1\)") as e:
        check_benchmarks(["ceval=nobody/nothing-here"], BenchmarkOptions())
    assert "pass --data-dir" not in str(e.value) and "ceval=DIR (--benchmarks)" in str(e.value)


def test_online_hub_answers_are_one_line(monkeypatch):
    import httpx
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    response = httpx.Response(401, request=httpx.Request("GET", "https://huggingface.co/api/datasets/x/y"))
    _hub_failing(monkeypatch, RepositoryNotFoundError("404 Client Error", response=response))
    with pytest.raises(ConfigError, match=r"^mmlu data someone/typo does not exist"):
        load_benchmark("mmlu", "someone/typo")
    _hub_failing(monkeypatch, GatedRepoError("403 Client Error: gated", response=response))
    with pytest.raises(
        ConfigError, match=r"hub dataset someone/gated could not be downloaded .*hf auth login"
    ):
        load_benchmark("mmlu", "someone/gated")


# 4 and 6. The hub's parquet layout and a `datasets` save_to_disk copy of it.


def _records(subject: str, questions) -> list[dict]:
    return [
        {"question": q.question, "subject": subject, "choices": list(q.choices), "answer": q.answer}
        for q in questions
    ]


def _parquet_layout(tmp_path: Path, root: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    original = load_benchmark("mmlu", write_benchmark("mmlu", tmp_path / "csv"))
    for subject in original.subjects:
        key = subject.info.key
        for split, rows in (("dev", subject.pool), ("test", subject.questions)):
            (root / key).mkdir(parents=True, exist_ok=True)
            table = pa.Table.from_pylist(_records(key, rows))
            pq.write_table(table, root / key / f"{split}-00000-of-00001.parquet")
    return root


def test_missing_parquet_files_are_named_in_the_parquet_form(tmp_path):
    hub = tmp_path / "hub"
    _parquet_layout(tmp_path, hub / "data")
    (hub / "data" / "abstract_algebra" / "dev-00000-of-00001.parquet").unlink()
    with pytest.raises(DataError, match=r"missing data/abstract_algebra/dev-\*\.parquet \(subject") as e:
        load_benchmark("mmlu", hub)
    assert ".csv" not in str(e.value)
    # gym's mapping names subjects these files don't have: the expected file is a parquet one.
    hub_only = _parquet_layout(tmp_path, tmp_path / "hub2")
    with pytest.raises(DataError, match=r"no files for it \(expected anatomy/dev-\*\.parquet\)"):
        load_benchmark("mmlu", hub_only)


def _save_to_disk(tmp_path: Path, root: Path, benchmark: str = "mmlu") -> Path:
    import datasets

    original = load_benchmark(benchmark, write_benchmark(benchmark, tmp_path / f"csv-{benchmark}"))
    for subject in original.subjects:
        key = subject.info.key
        if benchmark == "mmlu":
            split = {"dev": _records(key, subject.pool), "test": _records(key, subject.questions)}
        else:  # ceval-exam's and cmmlu's columns, the answer a letter
            split = {
                name: [
                    {
                        "question": q.question,
                        **dict(zip("ABCD", q.choices, strict=True)),
                        "answer": "ABCD"[q.answer],
                    }
                    for q in rows
                ]
                for name, rows in (("dev", subject.pool), (original.spec.scored_split, subject.questions))
            }
        parts = {name: datasets.Dataset.from_list(rows) for name, rows in split.items()}
        datasets.DatasetDict(parts).save_to_disk(str(root / key))
    (root / "mapping.json").write_text((tmp_path / f"csv-{benchmark}" / "mapping.json").read_text())
    return root


@pytest.mark.parametrize("benchmark", ["mmlu", "ceval"])
def test_save_to_disk_layout_reads_like_the_csvs(tmp_path, benchmark):
    original = load_benchmark(benchmark, write_benchmark(benchmark, tmp_path / "orig"))
    saved = load_benchmark(benchmark, _save_to_disk(tmp_path, tmp_path / "saved", benchmark))
    assert [s.info.key for s in saved.subjects] == list(SUBJECTS[benchmark])
    assert [s.questions for s in saved.subjects] == [s.questions for s in original.subjects]
    assert [s.shots for s in saved.subjects] == [s.shots for s in original.subjects]
    assert saved.subjects[0].files[0].endswith("/dev/data-00000-of-00001.arrow")


def test_save_to_disk_layout_in_a_zip_and_its_missing_files(tmp_path):
    root = _save_to_disk(tmp_path, tmp_path / "saved")
    path = tmp_path / "saved.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for file in root.rglob("*"):
            if file.is_file():  # the data a folder deep, the mapping at the top
                name = file.relative_to(root).as_posix()
                zf.write(file, name if name == "mapping.json" else f"mmlu/{name}")
    assert load_benchmark("mmlu", path).n_questions == 12
    (root / "high_school_biology" / "test" / "data-00000-of-00001.arrow").unlink()
    with pytest.raises(DataError, match=r"missing high_school_biology/test/data-\*\.arrow \(subject"):
        load_benchmark("mmlu", root)


def test_damaged_arrow_file_is_named(tmp_path):
    root = _save_to_disk(tmp_path, tmp_path / "saved")
    target = root / "abstract_algebra" / "test" / "data-00000-of-00001.arrow"
    target.write_bytes(target.read_bytes()[:40])
    with pytest.raises(
        DataError, match=r"abstract_algebra/test/data-00000-of-00001\.arrow: not a readable arrow"
    ):
        load_benchmark("mmlu", root)


def test_not_a_layout_names_the_save_to_disk_form(tmp_path):
    root = tmp_path / "flat"
    root.mkdir()
    (root / "notes.txt").write_text("x")
    with pytest.raises(DataError, match=r"<subject>/test-\*\.parquet or <subject>/test/data-\*\.arrow"):
        load_benchmark("mmlu", root)


def test_a_split_sharded_over_several_files_is_refused_not_read_in_part(tmp_path):
    """Only one of a split's shards was read: the other questions were dropped without a word."""
    import shutil

    hub = tmp_path / "hub"
    _parquet_layout(tmp_path, hub / "data")
    subject = hub / "data" / "abstract_algebra"
    shutil.copy(subject / "test-00000-of-00001.parquet", subject / "test-00001-of-00002.parquet")
    with pytest.raises(DataError, match=r"'abstract_algebra': its test split is in several files") as e:
        load_benchmark("mmlu", hub)
    assert "join them into one" in str(e.value)
