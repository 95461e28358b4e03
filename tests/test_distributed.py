"""Training on several processes (gym.train.distributed): DDP over gloo on this CPU machine (the same
launch as on several GPUs), killed and resumed, against one process; and the checks that keep the
other stages in one process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gym import train
from gym.errors import ConfigError
from gym.train import distributed
from gym.train.config import TrainConfig
from tests.helpers import tiny, tokenized

REPO = Path(__file__).resolve().parents[1]


def weights(model_dir: str) -> dict[str, torch.Tensor]:
    return load_file(f"{model_dir}/model.safetensors")


def resolved(monkeypatch: pytest.MonkeyPatch, gpus: int, **fields) -> int | str:
    monkeypatch.setattr(distributed, "_gpu_count", lambda: gpus)
    return distributed.resolve(TrainConfig(**fields)).distributed.num_processes


def test_auto_is_every_gpu_when_there_are_several_else_this_process(monkeypatch: pytest.MonkeyPatch):
    assert resolved(monkeypatch, 0, method="sft") == 1  # CPU
    assert resolved(monkeypatch, 1, method="sft") == 1
    assert resolved(monkeypatch, 4, method="dpo", finetuning_type="lora") == 4
    # Stages that train in one process stay there.
    assert resolved(monkeypatch, 4, method="grpo") == 1
    assert resolved(monkeypatch, 4, method="sft", finetuning_type="qlora") == 1
    assert resolved(monkeypatch, 4, method="sft", speed={"unsloth": True}) == 1
    assert resolved(monkeypatch, 0, method="sft", distributed={"num_processes": 2}) == 2  # CPU: gloo


@pytest.mark.parametrize(
    ("gpus", "fields", "says"),
    [
        (4, {"method": "ppo", "distributed": {"num_processes": 2}}, "method 'ppo' trains in one process"),
        (4, {"method": "sft", "finetuning_type": "qlora", "distributed": {"num_processes": 2}}, "use lora"),
        (2, {"method": "sft", "distributed": {"num_processes": 4}}, "2 CUDA GPU(s) are visible"),
    ],
)
def test_what_cannot_train_on_several_processes_says_why(monkeypatch, gpus, fields, says):
    with pytest.raises(ConfigError, match=r"distributed.num_processes=\d") as error:
        resolved(monkeypatch, gpus, **fields)
    assert says in str(error.value)


@pytest.mark.parametrize("value", [0, "0", "two", 1.5, True])
def test_num_processes_is_a_whole_number_of_at_least_one_or_auto(value):
    with pytest.raises(ValueError, match="a number of processes of at least 1, or auto"):
        TrainConfig(distributed={"num_processes": value})
    assert TrainConfig(distributed={"num_processes": "3"}).distributed.num_processes == 3


def test_the_flags_are_checked_before_prefect_starts(gym_home):
    """`gym train` refuses a stage that can't train on several processes in about a second, with no run."""
    from flows.commands import cmd_train

    assert cmd_train(["--method", "grpo", "--train.distributed.num_processes", "2"]) == 2
    assert not gym_home.exists()  # nothing written: no workspace, no MLflow or Prefect database


RESUMED = dict(
    method="sft",
    max_steps=24,
    logging_steps=4,
    save_steps=4,
    learning_rate=3e-3,
    eval_steps=8,  # held-out loss during training too, over both processes
    per_device_eval_batch_size=1,
)
HELD_OUT = 21  # records: an odd number, so the two processes' shares differ
SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repo!r})
    from tests.test_distributed import two_process_stage
    two_process_stage()
    """
)


def two_process_stage() -> train.TrainResult:
    model = tiny()
    config = TrainConfig(per_device_train_batch_size=4, distributed={"num_processes": 2}, **RESUMED)
    held_out = tokenized("demo_sft_eval", model, max_samples=HELD_OUT)
    return train.run(config, model, tokenized("demo_sft", model, max_samples=200), held_out)


def launched(home: Path) -> list[int]:
    """Processes (torchrun and its workers) training a stage of the workspace `home`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if str(home) in command and "launch.json" in command:
            found.append(int(proc.name))
    return found


def wait_for_a_checkpoint(proc: subprocess.Popen, home: Path) -> None:
    """Until the stage training in `home` has saved a checkpoint; it must still be training then."""
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if list(home.glob("models/*/checkpoints/checkpoint-*/trainer_state.json")):
            break
        time.sleep(0.02)
    assert proc.poll() is None and launched(home), (
        "training finished (or failed) before it could be interrupted"
    )


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the training processes through /proc")
def test_two_processes_stop_with_the_flows_process_resume_and_train_as_one_process(tmp_path, monkeypatch):
    """SIGKILL to the process that launched the stage (as the OOM killer sends): the processes training
    it end too, instead of racing a re-run, which resumes from the last checkpoint. The stage ends as
    one process training on the same global batch ends."""
    home = tmp_path / "home"
    env = {**os.environ, "GYM_HOME": str(home), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(repo=str(REPO))],
        env=env,
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_a_checkpoint(proc, home)
        os.kill(proc.pid, signal.SIGKILL)  # that process alone, not its process group
        proc.wait(timeout=60)
        deadline = time.time() + 30
        while launched(home) and time.time() < deadline:
            time.sleep(0.2)
        assert not launched(home)
        assert not list(home.glob("models/*/launch-result.json"))  # they ended, not finished the stage
    finally:
        for pid in launched(home):
            os.kill(pid, signal.SIGKILL)
    monkeypatch.setenv("GYM_HOME", str(home))
    resumed = two_process_stage()
    assert resumed.resumed_from is not None and resumed.global_step == RESUMED["max_steps"]
    stage = sorted(p.name for p in Path(resumed.stage_dir).iterdir())  # the main process's files only
    assert stage == [
        "checkpoints",
        "eval_before.json",
        "launch-result.json",
        "launch.json",
        "model",
        "result.json",
    ]

    # 2 processes x batch 4 (DDP averages the gradients) train as 1 process x batch 8 does: the same
    # examples per step, so the same losses, token count and final weights.
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "one"))
    model = tiny()
    data = tokenized("demo_sft", model, max_samples=200)
    held_out = tokenized("demo_sft_eval", model, max_samples=HELD_OUT)
    one = train.run(TrainConfig(per_device_train_batch_size=8, **RESUMED), model, data, held_out)
    assert resumed.tokens_seen == one.tokens_seen  # counted over both processes
    losses = [loss for _, loss in resumed.losses]
    assert losses[-1] < losses[0] - 0.5  # it learns
    assert losses == pytest.approx([loss for _, loss in one.losses], rel=1e-4)
    base, got, want = weights(model.path), weights(resumed.model_dir), weights(one.model_dir)
    assert all(not torch.equal(got[k], base[k]) for k in got if "norm" not in k)  # every matrix trained
    assert all(torch.allclose(got[k], want[k], atol=1e-5) for k in want)
    # With held-out data, the processes still train as one (the evaluation before training used to
    # leave the model unwrapped: no gradient averaging). The held-out loss is measured before, during
    # and after, and falls. Close to one process's, not equal: with several processes transformers
    # averages each step's loss over the tokens of all processes' batches (average_tokens_across_devices),
    # where one process at batch 1 averages over records; 21 records also give one process a repeat.
    assert [s for s, _ in resumed.evals["eval_loss"]] == [8, 16, 24]
    held = [resumed.eval_before["eval_loss"], *(loss for _, loss in resumed.evals["eval_loss"])]
    assert held == sorted(held, reverse=True) and held[-1] < held[0] - 1
    reference = [one.eval_before["eval_loss"], *(loss for _, loss in one.evals["eval_loss"])]
    assert held == pytest.approx(reference, rel=0.05)

    # Finished: asked again, the stage is read back without launching anything.
    monkeypatch.setenv("GYM_HOME", str(home))
    again = two_process_stage()
    assert again.model_dir == resumed.model_dir and again.losses == resumed.losses


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the training processes through /proc")
def test_ctrl_c_during_two_processes_ends_the_run_with_one_line_and_every_process(tmp_path):
    """Ctrl-C reaches the whole process group: torchrun's agent and each worker printed a traceback
    (about 70 lines); now the command ends as a one-process run does."""
    home = tmp_path / "home"
    env = {**os.environ, "GYM_HOME": str(home), "OMP_NUM_THREADS": "1"}
    argv = [
        "train",
        "--method",
        "sft",
        "--max-steps",
        "400",
        "--train.save_steps",
        "10",
        "--max_samples",
        "200",
    ]
    argv += ["--train.distributed.num_processes", "2", "--eval_limit", "2"]
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "gym"), *argv],
        env=env,
        cwd=tmp_path,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_a_checkpoint(proc, home)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130
        assert "interrupted: run the same command again" in err and "Traceback" not in err, err[-3000:]
        deadline = time.time() + 30
        while launched(home) and time.time() < deadline:
            time.sleep(0.2)
        assert not launched(home)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in launched(home):
            os.kill(pid, signal.SIGKILL)
