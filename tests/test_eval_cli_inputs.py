"""`gym eval` on what users hand it: damaged zips and model folders, a device or --output that can't
work, a model folder gym didn't write, an --output that is a link, and data holding fewer subjects than
the mapping. Each mistake is one `error:` line and exit status 2, found before the evaluation runs."""

from __future__ import annotations

import json
import os
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

from flows.cli import main
from gym.workspace import atomic_write_text
from tests.eval_fixtures import write_benchmark


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def tiny_copy(target: Path) -> Path:
    """gym-tiny's folder as a user would copy it: config, weights, tokenizer (with its chat template), no
    gym metadata."""
    from gym.models import MODEL_META, resolve

    shutil.copytree(resolve("gym-tiny").path, target)
    (target / MODEL_META).unlink(missing_ok=True)
    return target


def _truncated_zip(tmp: Path) -> Path:
    whole = write_benchmark("mmlu", tmp / "whole", as_zip=True)
    cut = tmp / "cut.zip"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    return cut


def _damaged_member(tmp: Path) -> Path:
    """A zip whose directory is intact but one member's compressed bytes are flipped."""
    source = write_benchmark("mmlu", tmp / "src")
    path = tmp / "damaged.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for file in sorted(p for p in source.rglob("*.csv")):
            zf.write(file, file.relative_to(source).as_posix())
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("data/test/abstract_algebra_test.csv")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for i in range(start + 2, start + 40):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    (tmp / "mapping.json").write_text((source / "mapping.json").read_text())
    return path


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("cut_zip", "not a readable zip file"),
        ("damaged_member", "damaged.zip!data/test/abstract_algebra_test.csv: damaged in the zip"),
        ("device", "device 'foo': not a torch device"),
        ("output", "--output /proc/gym-nowhere/r.json: can't write in /proc"),
    ],
)
def test_damaged_data_a_bad_device_or_output_stop_before_the_model_loads(tmp_path, capsys, case, message):
    """Each was a traceback: zipfile's or zlib's, torch's after the prompts were built, or the --output's
    after the whole evaluation."""
    good = write_benchmark("mmlu", tmp_path / "good")
    data = {"cut_zip": _truncated_zip, "damaged_member": _damaged_member}.get(case, lambda _t: good)(tmp_path)
    extra = {"device": ["--device", "foo"], "output": ["--output", "/proc/gym-nowhere/r.json"]}.get(case, [])
    argv = ["eval", "--model", "gym-tiny", "--benchmark", f"mmlu={data}", "--no-progress", *extra]
    if case == "damaged_member":
        argv += ["--mapping", str(tmp_path / "mapping.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err, err
    assert not (tmp_path / "gym_home" / "models").exists()  # before resolving (building) the model


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("tokenizer", "has no tokenizer files (none of tokenizer.json"),
        ("weights", "can't be loaded (Error no file named model.safetensors"),
        ("config", "can't be loaded (It looks like the config file"),
        ("cut_weights", "can't be loaded (Error while deserializing header"),
    ],
)
def test_a_model_folder_with_files_missing_or_damaged_is_one_error_line(tmp_path, capsys, broken, message):
    folder = tiny_copy(tmp_path / "copy")
    if broken == "tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
            (folder / name).unlink(missing_ok=True)
    elif broken == "weights":
        (folder / "model.safetensors").unlink()
    elif broken == "cut_weights":  # a copy cut short
        os.truncate(folder / "model.safetensors", 1000)
    else:
        (folder / "config.json").write_text("{")
    data = write_benchmark("mmlu", tmp_path / "data")
    argv = ["eval", "--model", str(folder), "--benchmark", f"mmlu={data}", "--no-progress", "--limit", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err  # after gym-tiny's first build's progress, in a fresh workspace
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"error: model folder {folder} ") and message in line, err
    assert "Traceback" not in err


def test_a_model_folder_gym_did_not_write_is_scored_without_a_template(tmp_path, capsys):
    """It was refused ("pass --template") even for lm-eval's plain prompt, which needs no chat template;
    the chat style now renders with the folder's own chat template, as gym serve does."""
    data = write_benchmark("mmlu", tmp_path / "data")
    folder = tiny_copy(tmp_path / "copy")
    base = ["eval", "--benchmark", f"mmlu={data}", "--no-progress", "--shots", "1", "--json"]
    scores = {}
    for model, style in (("gym-tiny", "lm-eval"), (str(folder), "lm-eval"), (str(folder), "chat")):
        assert main([*base, "--model", model, "--style", style]) == 0
        scores[(model, style)] = last_json(capsys.readouterr().out)["subjects"]
    assert scores[(str(folder), "lm-eval")] == scores[("gym-tiny", "lm-eval")]
    from gym.models import registry_entry

    template = registry_entry("gym-tiny").template  # what the folder's tokenizer holds
    assert main([*base, "--model", "gym-tiny", "--style", "chat", "--template", template]) == 0
    assert scores[(str(folder), "chat")] == last_json(capsys.readouterr().out)["subjects"]

    (folder / "chat_template.jinja").unlink()  # no chat template anywhere: chat style says what to do
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert main([*base, "--model", str(folder), "--style", "chat"]) == 2
    err = capsys.readouterr().err
    assert "tokenizer has none): pass --template (a flow run's `template` parameter; one of alpaca, " in err


@pytest.mark.parametrize("engine", ["gym", "lm-eval"])
def test_output_through_a_link_keeps_the_link_and_holds_every_answer(tmp_path, capsys, engine):
    """--output replaced a symbolic link (and /dev/full) with a file of its own; the results file now
    also holds each question's correct answer beside the prediction (lm-eval's engine keyed the answers
    by its task names, `mmlu_anatomy`, and the rest by subject)."""
    if engine == "lm-eval":
        pytest.importorskip("lm_eval")
    data = write_benchmark("mmlu", tmp_path / "data")
    real = tmp_path / "kept" / "r.json"
    real.parent.mkdir()
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    argv = ["eval", "--model", "gym-tiny", "--benchmark", f"mmlu={data}", "--no-progress", "--json"]
    assert main([*argv, "--engine", engine, "--output", str(link)]) == 0
    summary = last_json(capsys.readouterr().out)
    assert link.is_symlink() and json.loads(real.read_text())["overall"] == summary["overall"]
    full = json.loads(real.read_text())
    assert set(full["answers"]) == set(full["predictions"]) == set(full["subjects"])
    for subject, chosen in full["predictions"].items():
        hits = [p == a for p, a in zip(chosen, full["answers"][subject], strict=True)]
        assert full["subjects"][subject] == sum(hits) / len(hits)

    atomic_write_text(Path("/dev/null"), "written through")  # a device is written to, never replaced
    assert stat.S_ISCHR(Path("/dev/null").stat().st_mode)


def test_data_with_fewer_subjects_than_the_mapping_says_what_to_do(tmp_path, capsys):
    """Without a mapping.json, gym's own (57 subjects for MMLU) is read: the error named mapping.json the
    user doesn't have and a path without the data/ folder. A stray subject's files no longer stop a run
    that names its --subjects."""
    data = write_benchmark("mmlu", tmp_path / "data")
    (data / "mapping.json").unlink()
    argv = ["eval", "--model", "gym-tiny", "--benchmark", f"mmlu={data}", "--no-progress", "--limit", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "gym's mmlu mapping (no mapping.json here) names subject" in err
    assert (
        "(expected data/dev/anatomy_dev.csv)" in err and "gym eval --subjects (abstract_algebra, " in err
    ), err

    write_benchmark("mmlu", tmp_path / "two")
    mapping = json.loads((tmp_path / "two" / "mapping.json").read_text())
    first = sorted(mapping)[0]
    del mapping[sorted(mapping)[1]]  # files of a subject the mapping lacks
    (tmp_path / "two" / "mapping.json").write_text(json.dumps(mapping))
    argv[4] = f"mmlu={tmp_path / 'two'}"
    assert main(argv) == 2 and "has no entry in the mapping" in capsys.readouterr().err
    assert main([*argv, "--subjects", first, "--json"]) == 0
    assert list(last_json(capsys.readouterr().out)["subjects"]) == [first]


def test_no_progress_silences_lm_evals_bars_too(tmp_path, capsys):
    """`--no-progress` left lm-eval's own bars (tokenizing inputs, running requests) on the console."""
    pytest.importorskip("lm_eval")
    from tests.test_eval_cli import _toy_tasks

    tasks = _toy_tasks(tmp_path / "tasks")
    argv = ["eval", "--model", "gym-tiny", "--lm-eval-task", "toy", "--include-path", str(tasks)]
    assert main([*argv, "--no-progress", "--json"]) == 0
    quiet = capsys.readouterr()
    assert "Running loglikelihood requests" not in quiet.err and "Tokenizing inputs" not in quiet.err
    assert main([*argv, "--json"]) == 0  # the bars are there without the flag
    assert "Running loglikelihood requests" in capsys.readouterr().err
    assert last_json(quiet.out)["n_questions"] == 7
