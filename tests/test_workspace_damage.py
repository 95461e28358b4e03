"""A damaged workspace (files cut short by a full disk, a copy or a kill; edited by hand), a full disk and
interrupts: each is found where it is loaded and either made again or refused in one line naming the folder
and what to do; nothing damaged is served as finished, registered or resumed from."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import sqlite3
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gym import progress, train, workspace
from gym.data.ingest import DamagedDataset, ingest, saved_problem
from gym.data.registry import resolve_dataset
from gym.data.tokenize import TokenizeSettings, tokenize
from gym.errors import DiskFullError, GymError
from gym.models import load_model, load_tokenizer, resolve
from gym.train import TrainConfig
from tests.helpers import tiny, tokenized

STEPS = dict(
    method="sft",
    finetuning_type="lora",
    max_steps=4,
    per_device_train_batch_size=8,
    logging_steps=1,
    save_steps=2,
    save_total_limit=3,
)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cut(path: Path, size: int) -> None:
    os.truncate(path, size)


def arrow_file(folder: str | Path) -> Path:
    return next(Path(folder).glob("data-*.arrow"))


# ---- safetensors checks ----------------------------------------------------------------------------


def test_weights_problem_finds_a_safetensors_file_cut_short_anywhere_and_passes_a_whole_one(tmp_path):
    whole = Path(tiny().path) / "model.safetensors"
    assert workspace.weights_problem(whole.parent) is None
    size = whole.stat().st_size
    (length,) = struct.unpack("<Q", whole.read_bytes()[:8])
    for keep in (0, 5, 8 + length // 2, 8 + length + 10, size - 1):
        folder = tmp_path / f"cut-{keep}"
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(whole.read_bytes()[:keep])
        problem = workspace.weights_problem(folder)
        assert problem is not None and problem.startswith("model.safetensors is cut short"), (keep, problem)
    empty = tmp_path / "no-weights"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    assert workspace.weights_problem(empty) == "it holds no weights file"
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    (sharded / "model-00001-of-00002.safetensors").write_bytes(whole.read_bytes())
    assert "model-00002-of-00002.safetensors is missing" in str(workspace.weights_problem(sharded))


# ---- finding 1: a finished stage whose weights were cut short --------------------------------------


def test_a_finished_stage_whose_model_was_cut_short_is_trained_again_not_served(gym_home, capsys):
    model = tiny()
    data = tokenized("demo_sft", model, max_samples=64)
    config = TrainConfig(**STEPS)
    first = train.run(config, model, data)
    weights = Path(first.model_dir) / "model.safetensors"
    whole = digest(weights)
    cut(weights, 100_000)
    capsys.readouterr()

    again = train.run(config, model, data)
    err = capsys.readouterr().err
    assert f"{first.model_dir} can't be read (model.safetensors is cut short" in err
    assert "training the stage again" in err
    assert again.model_dir == first.model_dir and digest(weights) == whole, "the same weights, whole"
    assert workspace.weights_problem(Path(again.adapter_dir)) is None
    # and it is served as finished once whole again: the next run trains nothing
    assert train.run(config, model, data).train_seconds == again.train_seconds
    assert "can't be read" not in capsys.readouterr().err


def test_a_damaged_result_json_trains_the_stage_again(gym_home, capsys):
    model = tiny()
    data = tokenized("demo_sft", model, max_samples=64)
    config = TrainConfig(**STEPS)
    first = train.run(config, model, data)
    result = Path(first.stage_dir) / "result.json"
    result.write_text(result.read_text()[:50])
    again = train.run(config, model, data)
    assert f"{result} can't be read" in capsys.readouterr().err
    assert again.global_step == 4  # a result again, not pydantic's traceback


def test_registering_or_exporting_a_model_whose_weights_were_cut_short_is_refused(gym_home, tmp_path):
    from tasks.register import export, register_model

    stage_model = workspace.path("models", "sft-0123456789abcdef", "model")
    stage_model.mkdir(parents=True)
    for f in Path(tiny().path).iterdir():
        (stage_model / f.name).write_bytes(f.read_bytes())
    cut(stage_model / "model.safetensors", 100_000)
    ref = resolve(str(stage_model), template="chatml")
    with pytest.raises(GymError) as info:
        register_model.fn(ref, "tiny-damaged", "challenger", {})
    message = str(info.value)
    assert f"model folder {ref.path} can't be read (model.safetensors is cut short" in message
    assert "delete" in message and "trains the stage again" in message
    with pytest.raises(GymError, match="can't be read"):
        export.fn(ref, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


# ---- finding 2: damaged datasets -------------------------------------------------------------------


def test_a_damaged_tokenized_dataset_is_refused_by_training_in_one_line_and_remade_by_tokenize(
    gym_home, capsys
):
    model = tiny()
    data = ingest(resolve_dataset("demo_sft"))
    settings = TokenizeSettings(max_samples=64)
    first = tokenize(data.path, model.path, model.template, settings)
    cut(arrow_file(first.path), 1000)
    with pytest.raises(DamagedDataset) as info:
        train.run(TrainConfig(**STEPS), model, first.path)
    message = str(info.value)
    assert f"dataset folder {first.path} can't be read (Expected to be able to read" in message
    assert "delete the folder and run the same command again" in message and "\n" not in message

    again = tokenize(data.path, model.path, model.template, settings)  # a re-run, or --refresh-cache
    assert f"tokenized folder {first.path} can't be read" in capsys.readouterr().err
    assert again.path == first.path and saved_problem(again.path) is None
    assert again.num_records == first.num_records == 64
    leftovers = [p.name for p in Path(first.path).parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_a_damaged_ingested_dataset_is_made_again_by_ingest_and_refused_by_tokenize(gym_home, capsys):
    spec = resolve_dataset("demo_sft")
    first = ingest(spec)
    meta = json.loads((Path(first.path) / "meta.json").read_text())
    cut(arrow_file(first.path), 20_000)
    model = tiny()
    with pytest.raises(DamagedDataset, match=f"dataset folder {first.path} can't be read"):
        tokenize(first.path, model.path, model.template, TokenizeSettings(max_samples=8))
    again = ingest(spec)
    assert f"dataset folder {first.path} can't be read" in capsys.readouterr().err
    assert again.path == first.path and again.num_records == meta["num_records"]
    assert saved_problem(again.path) is None
    damaged_meta = Path(first.path) / "meta.json"
    damaged_meta.write_text("{")
    assert "meta.json" in str(saved_problem(first.path))
    assert ingest(spec).num_records == meta["num_records"]
    assert json.loads(damaged_meta.read_text())["num_records"] == meta["num_records"]


def test_every_reader_of_a_damaged_dataset_folder_says_which_in_one_line(gym_home):
    """Splitting, held-out exact match and TF-GRPO's questions (and mixing, previewing, online RL's prompt
    check) read the folder with load_from_disk and gave pyarrow's traceback, naming no folder."""
    from gym.data.split import split
    from gym.eval.exact_match import evaluate
    from gym.tfgrpo.data import questions_from

    data = ingest(resolve_dataset("demo_sft"))
    cut(arrow_file(data.path), 20_000)
    says = f"dataset folder {data.path} can't be read"
    for read in (
        lambda: split(data, 0.1, 0, "demo_sft"),
        lambda: evaluate(tiny(), Path(data.path), limit=2),
        lambda: questions_from(Path(data.path)),
    ):
        with pytest.raises(DamagedDataset, match=says):
            read()
    assert saved_problem(data.path) is not None


@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "two-renames"])
def test_atomic_dir_with_replace_puts_the_new_folder_in_place_of_the_old(tmp_path, monkeypatch, swap):
    if not swap:
        monkeypatch.setattr(workspace, "_exchange", lambda a, b: False)
    final = tmp_path / "artifact"
    final.mkdir()
    (final / "data").write_text("old, damaged")
    with workspace.atomic_dir(final) as tmp:  # equal names: the one there is kept
        (tmp / "data").write_text("new")
    assert (final / "data").read_text() == "old, damaged"
    with workspace.atomic_dir(final, replace=True) as tmp:
        (tmp / "data").write_text("new")
    assert (final / "data").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"], "no temp or old folder left"
    with pytest.raises(RuntimeError), workspace.atomic_dir(final, replace=True) as tmp:
        (tmp / "data").write_text("half")
        raise RuntimeError("the build failed")
    assert (final / "data").read_text() == "new", "a failed rebuild leaves the one there"


# ---- finding 3: a damaged last checkpoint ----------------------------------------------------------


def test_a_checkpoint_whose_weights_were_cut_short_is_skipped_and_the_run_resumes_from_the_one_before(
    gym_home, capsys
):
    model = tiny()
    data = tokenized("demo_sft", model, max_samples=64)
    config = TrainConfig(**STEPS)
    first = train.run(config, model, data)
    stage = Path(first.stage_dir)
    # as a run killed after its checkpoint at step 4 leaves it, that checkpoint then cut short
    for name in ("result.json", "model", "adapter"):
        workspace.discard(stage / name) if (stage / name).is_dir() else (stage / name).unlink()
    damaged = stage / "checkpoints" / "checkpoint-4" / "adapter_model.safetensors"
    cut(damaged, 1000)
    capsys.readouterr()

    again = train.run(config, model, data)
    err = capsys.readouterr().err
    assert (
        f"{stage / 'checkpoints' / 'checkpoint-4'} can't be used (adapter_model.safetensors is cut short"
        in err
    )
    assert "resuming from checkpoint-2" in err and "left as they are" in err
    assert again.resumed_from == str(stage / "checkpoints" / "checkpoint-2") and again.global_step == 4
    assert workspace.weights_problem(damaged.parent) is None, "step 4's checkpoint saved again over it"
    assert [s for s, _ in again.losses] == [1, 2, 3, 4]
    # the console's last line counts the steps this run took, and the run's first loss (as the summary)
    done = next(line for line in err.splitlines() if line.startswith("sft: done"))
    assert done.startswith("sft: done, 2 steps (resumed at 2) in ")
    assert f"loss {again.loss_first:.4g} -> {again.loss_last:.4g}" in done


def test_no_usable_checkpoint_starts_the_stage_over_and_says_so(gym_home, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    good = Path(tiny().path)
    for step in (2, 4):
        folder = checkpoints / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text("{}")
        (folder / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
        (folder / "optimizer.pt").write_bytes(b"PK\x03\x04 cut short")
    skipped: list[tuple[Path, str]] = []
    assert train.last_checkpoint(checkpoints, skipped) is None
    assert [(p.name, why) for p, why in skipped] == [
        ("checkpoint-4", "optimizer.pt is cut short or damaged"),
        ("checkpoint-2", "optimizer.pt is cut short or damaged"),
    ]
    (checkpoints / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": ')
    (checkpoints / "checkpoint-2" / "optimizer.pt").unlink()
    skipped = []
    assert train.last_checkpoint(checkpoints, skipped) == str(checkpoints / "checkpoint-2")
    assert skipped[0][1].startswith("trainer_state.json can't be read")


# ---- finding 4: a full disk ------------------------------------------------------------------------


def test_a_full_disk_while_writing_an_artifact_is_one_line_naming_it_and_leaves_nothing(tmp_path):
    final = tmp_path / "tokenized" / "abc"
    with pytest.raises(DiskFullError) as info, workspace.atomic_dir(final) as tmp:
        (tmp / "part").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "part"))
    message = str(info.value)
    assert message.startswith(f"no space left on the disk holding {final} (")
    assert "free space there and run the same command again" in message and "\n" not in message
    assert list(final.parent.iterdir()) == []


def test_a_full_disk_while_tokenizing_is_one_line(gym_home, monkeypatch):
    import datasets

    model = tiny()
    data = ingest(resolve_dataset("demo_sft"))

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", full)
    with pytest.raises(DiskFullError, match=r"no space left on the disk holding .*tokenized"):
        tokenize(data.path, model.path, model.template, TokenizeSettings(max_samples=8))
    assert list(workspace.path("tokenized").iterdir()) == []


def test_a_full_disk_while_registering_is_one_line(gym_home, monkeypatch):
    import tasks.register

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(tasks.register, "register", full)
    with pytest.raises(DiskFullError) as info:
        tasks.register.register_model.fn(tiny(), "tiny-full", "challenger", {})
    assert "(database or disk is full): free space there" in str(info.value)


def test_a_full_disk_anywhere_ends_a_run_with_one_error_line(monkeypatch, capsys):
    from flows import runner
    from flows.train import TrainFlowConfig, train

    def full(*args, **kwargs):
        raise RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, ... })")

    monkeypatch.setattr(runner, "run_flow", full)
    monkeypatch.setattr(runner.preflight, "check", lambda config: None)
    assert runner.main(train, TrainFlowConfig, ["--max-steps", "1"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: no space left on the disk holding the workspace (GYM_HOME)")

    def bug(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(runner, "run_flow", bug)
    with pytest.raises(RuntimeError, match="a bug"):  # anything else keeps its traceback
        runner.main(train, TrainFlowConfig, ["--max-steps", "1"])


def test_a_full_disk_in_any_command_ends_it_with_one_error_line_and_a_bug_keeps_its_traceback(tmp_path):
    script = (
        "import errno, sys\n"
        "from gym.cli import run_console\n"
        "def command():\n"
        "    if sys.argv[1] == 'full':\n"
        "        raise OSError(errno.ENOSPC, 'No space left on device', '/data/out/model.safetensors')\n"
        "    raise ValueError('a bug')\n"
        "run_console(command)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    full = subprocess.run([sys.executable, "-c", script, "full"], capture_output=True, text=True, env=env)
    assert full.returncode == 2
    assert full.stderr.splitlines() == [
        "error: no space left on the disk holding /data/out/model.safetensors ([Errno 28] No space left on "
        "device: '/data/out/model.safetensors'): free space there and run the same command again (nothing "
        "half-written was kept)"
    ]
    bug = subprocess.run([sys.executable, "-c", script, "bug"], capture_output=True, text=True, env=env)
    assert bug.returncode == 1 and "Traceback" in bug.stderr and "ValueError: a bug" in bug.stderr


# ---- finding 5: advice for folders gym made --------------------------------------------------------


def test_a_damaged_folder_gym_made_is_to_be_deleted_and_one_of_yours_copied_again(gym_home, tmp_path):
    base = tiny()
    built = Path(base.path)
    cut(built / "model.safetensors", 100_000)
    with pytest.raises(GymError) as info:
        load_model(base)
    assert f"delete {built} and run the same command again: gym builds it again" in str(info.value)

    folders = {
        "trains the stage again": workspace.path("models", "sft-0123456789abcdef", "model"),
        "downloads the registered version again": workspace.path("models", "mlflow-0123456789ab", "model"),
        "copy the folder again from where it came from": tmp_path / "mine",
    }
    for advice, folder in folders.items():
        folder.mkdir(parents=True)
        for f in built.iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        with pytest.raises(GymError) as info:
            load_model(resolve(str(folder), template="chatml"))
        assert f"model folder {folder} can't be loaded (" in str(info.value) and advice in str(info.value)


def test_a_registered_version_downloaded_damaged_is_one_line_saying_to_delete_it(gym_home):
    from gym import tracking

    base = tiny()
    tracking.register_model(
        tracking.start_run("register"), Path(base.path), "tiny-dl", {"template": "chatml"}
    )
    ref = resolve("models:/tiny-dl@challenger")
    cut(Path(ref.path) / "model.safetensors", 100_000)
    with pytest.raises(GymError) as info:
        load_model(ref)
    download = Path(ref.path).parent
    assert download.name.startswith("mlflow-")
    assert f"delete {download} and run the same command again: gym downloads" in str(info.value)
    load_tokenizer(ref)  # the rest of the folder is whole


# ---- finding 6: Ctrl-C pressed again while the process ends ----------------------------------------


def test_ctrl_c_during_the_exit_teardown_still_silences_it(monkeypatch):
    import gc
    import signal

    from gym import process

    class Interrupted(io.StringIO):
        def flush(self) -> None:
            raise KeyboardInterrupt

    calls = []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "triton._C.libtriton", object())
    monkeypatch.setattr(process.os, "dup2", lambda fd, to: calls.append(to))
    previous = signal.getsignal(signal.SIGINT)
    try:
        with monkeypatch.context() as m:
            m.setattr(sys, "stdout", Interrupted())
            process._quiet_native_teardown()
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C came out of the teardown (printed as 'Exception ignored in atexit callback')")
    try:
        assert calls == [2], "stderr sent to /dev/null all the same"
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


# ---- finding 7: the console's closing line after a resume ------------------------------------------


def test_the_done_line_counts_the_steps_since_the_resume_and_keeps_the_runs_first_loss():
    out = io.StringIO()
    bar = progress.Progress("sft", 300, start=100, stream=out, tty=False, now=0.0)
    bar.first_loss = 8.2299  # the run's first, from the history the resume brought back
    bar.update(200, loss=7.9, now=13.0)
    bar.update(300, loss=7.744, now=27.0)
    bar.done(now=27.0)
    assert (
        out.getvalue().splitlines()[-1] == "sft: done, 200 steps (resumed at 100) in 0:27, loss 8.23 -> 7.744"
    )


# ---- finding 8: trained weights readable by others -------------------------------------------------


def test_a_stages_model_adapter_and_checkpoints_are_readable_as_a_copy_would_be(gym_home):
    model = tiny()
    result = train.run(TrainConfig(**STEPS), model, tokenized("demo_sft", model, max_samples=64))
    expected = 0o666 & ~workspace.umask()
    files = [
        *Path(result.model_dir).glob("*.safetensors"),
        *Path(result.adapter_dir).glob("*.safetensors"),
        *Path(result.stage_dir).glob("checkpoints/*/*.safetensors"),
    ]
    assert len(files) >= 3
    assert {str(f): stat.S_IMODE(f.stat().st_mode) for f in files} == {str(f): expected for f in files}
