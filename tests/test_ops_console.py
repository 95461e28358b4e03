"""What a person sees while a stage trains, and MLflow runs that span the work they describe."""

from __future__ import annotations

import io
import logging
import time

import pytest
from mlflow import MlflowClient

from gym import progress, tracking
from gym.data.tokenize import TokenizeSettings
from gym.train import TrainConfig
from tasks.data import ingest_dataset, tokenize_dataset
from tasks.model import resolve_model
from tasks.train import train_stage


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_not_a_terminal_gets_a_line_per_quarter_with_loss_speed_and_eta():
    out = io.StringIO()
    bar = progress.Progress("sft", 100, stream=out, now=0.0)
    for step in range(1, 101):
        bar.update(step, loss=10.0 / step, tokens_per_s=2500.0, now=step * 0.5)
    bar.done(now=50.0, tokens=125_000)  # the run's tokens: 2.5k a second over its 50 s
    lines = out.getvalue().splitlines()
    assert lines[0] == "sft: 100 steps"
    assert [line.split(" (")[0] for line in lines[1:4]] == ["sft: 25%", "sft: 50%", "sft: 75%"]
    assert "loss 0.4  2.5k tok/s  ETA 0:38" in lines[1]  # 25 steps in 12.5 s: 75 more take 37.5 s
    assert lines[-1] == "sft: done, 100 steps in 0:50, loss 10 -> 0.1, 2.5k tok/s"
    assert len(lines) == 5


def test_a_stage_without_a_loss_reports_its_own_note():
    """TF-GRPO's steps have no loss: its library's size is what they report."""
    out = io.StringIO()
    bar = progress.Progress("tf_grpo", 4, start=1, stream=out, now=0.0)
    for step in (2, 3, 4):
        bar.update(step, note=f"library {step * 2} items", now=(step - 1) * 10.0)
    bar.done(now=30.0)
    lines = out.getvalue().splitlines()
    assert lines[0] == "tf_grpo: 4 steps, resuming at step 1"
    assert lines[1] == "tf_grpo: 50% (step 2/4)  library 4 items  ETA 0:20"
    assert lines[-1] == "tf_grpo: done, 3 steps (resumed at 1) in 0:30, library 8 items"  # ran 2, 3, 4


def test_a_terminal_gets_one_bar_redrawn_in_place():
    out = Tty()
    bar = progress.Progress("dpo", 40, stream=out, now=0.0)
    for step in range(1, 41):
        bar.update(step, loss=0.69, now=step * 1.0)
    bar.done(now=40.0)
    text = out.getvalue()
    assert text.count("\n") == 2, "the bar and the closing line, nothing else"
    assert text.count("\r") >= 40 and "━" * progress.BAR_WIDTH in text
    assert "40/40  loss 0.69" in text and text.endswith("dpo: done, 40 steps in 0:40, loss 0.69 -> 0.69\n")


def test_clock_and_rate_read_naturally():
    assert [progress.clock(s) for s in (0, 65, 3600 + 62)] == ["0:00", "1:05", "1:01:02"]
    assert progress.rate(41234) == "41.2k" and progress.rate(950) == "950"


@pytest.fixture
def tiny_sft_data(gym_home):
    model = resolve_model.fn("gym-tiny")
    data = tokenize_dataset.fn(ingest_dataset.fn("demo_sft"), model, TokenizeSettings(max_samples=256))
    return model, data


def test_training_shows_a_bar_not_log_dicts_and_its_mlflow_run_spans_it(
    tiny_sft_data, capfd, caplog, monkeypatch
):
    monkeypatch.delenv(progress.VERBOSE_ENV, raising=False)
    model, data = tiny_sft_data
    parent = tracking.start_run("flow")
    config = TrainConfig(method="sft", learning_rate=3e-3, max_steps=20, per_device_train_batch_size=16)
    before = time.time() * 1000
    with caplog.at_level(logging.INFO, logger="gym.train"):
        result, _ = train_stage.fn(config, model, data, None, parent)
    after = time.time() * 1000

    out, err = capfd.readouterr()
    assert "{'loss'" not in out + err, "no raw Trainer log dictionaries on the console"
    assert "sft: 20 steps" in err and "sft: done, 20 steps" in err
    steps = [r.getMessage() for r in caplog.records if r.name == "gym.train" and '"loss"' in r.getMessage()]
    assert len(steps) >= 4, "every logged step goes to the gym.train logger (Prefect's run logs)"

    client = MlflowClient(tracking.tracking_uri())
    child = client.search_runs(
        [client.get_run(parent).info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'"
    )[0]
    assert child.info.status == "FINISHED"
    assert before <= child.info.start_time and child.info.end_time <= after
    assert (child.info.end_time - child.info.start_time) / 1000 >= result.train_seconds
    assert child.data.tags["gym.stage_digest"] == result.digest


def test_the_score_before_training_is_logged_as_such_not_as_step_0_of_0(caplog):
    from types import SimpleNamespace

    from gym.train.progress import ProgressCallback

    callback = ProgressCallback("dpo")
    with caplog.at_level(logging.INFO, logger="gym.train"):
        for step, steps in ((0, 0), (5, 40)):  # the trainer's state before training, then during it
            state = SimpleNamespace(is_local_process_zero=True, global_step=step, max_steps=steps)
            callback.on_log(None, state, None, logs={"eval_loss": 1.5})
    lines = [r.getMessage() for r in caplog.records if r.name == "gym.train"]
    assert lines == ['dpo before training {"eval_loss": 1.5}', 'dpo step 5/40 {"eval_loss": 1.5}']


def test_verbose_brings_back_every_log_line(tiny_sft_data, capfd, monkeypatch):
    monkeypatch.setenv(progress.VERBOSE_ENV, "1")
    model, data = tiny_sft_data
    config = TrainConfig(method="sft", learning_rate=3e-3, max_steps=10, per_device_train_batch_size=16)
    train_stage.fn(config, model, data)
    out, err = capfd.readouterr()
    assert out.count("{'loss'") >= 2 and "sft: done" not in err


def test_a_span_is_open_during_the_work_and_failed_if_it_raises(gym_home):
    client = MlflowClient(tracking.tracking_uri())
    with tracking.span("stage", params={"lr": 0.1}) as run_id:
        assert client.get_run(run_id).info.status == "RUNNING"
    assert client.get_run(run_id).info.status == "FINISHED"
    with pytest.raises(ValueError), tracking.span("broken") as failed:
        raise ValueError("boom")
    assert client.get_run(failed).info.status == "FAILED"


def test_ctrl_c_inside_an_mlflow_write_ends_the_span_killed_without_waiting(gym_home, monkeypatch):
    """The interrupt lands right after SQLite ran a statement of MLflow's (as a real Ctrl-C can): that
    statement kept the store locked while the exception lived, so ending the run waited 20 s and failed
    with "database is locked" (then the flow's failure hook did the same)."""
    from sqlalchemy.engine import default

    client = MlflowClient(tracking.tracking_uri())
    real, armed = default.DefaultDialect.do_execute, [True]

    def interrupted(self, cursor, statement, parameters, context=None):
        real(self, cursor, statement, parameters, context)
        if armed and statement.lstrip().upper().startswith("SELECT") and "runs" in statement:
            armed.clear()
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), tracking.span("stage") as run_id:
        monkeypatch.setattr(default.DefaultDialect, "do_execute", interrupted)
        client.set_tag(run_id, "step", "1")
    assert not armed  # the interrupt came from inside MLflow's write
    assert client.get_run(run_id).info.status == "KILLED"


def test_open_runs_of_a_failed_flow_run_are_ended(gym_home):
    client = MlflowClient(tracking.tracking_uri())
    parent = tracking.start_run("flow", tags={"prefect_flow_run_id": "abc"})
    child = tracking.start_run("sft", parent_run_id=parent)
    other = tracking.start_run("flow", tags={"prefect_flow_run_id": "other"})
    assert set(tracking.end_open_runs("prefect_flow_run_id", "abc")) == {parent, child}
    assert client.get_run(parent).info.status == client.get_run(child).info.status == "FAILED"
    assert client.get_run(other).info.status == "RUNNING"


def test_runs_a_killed_process_left_running_are_ended_by_the_next_flow_run(gym_home):
    """SIGKILL (or the OOM killer) leaves the runs of the process RUNNING in MLflow for good: nothing ends
    them. The next flow run on the machine ends them as KILLED; live runs, and runs made on another
    machine, are left as they are."""
    import signal
    import subprocess
    import sys

    from tasks.tracking import start_tracking

    client = MlflowClient(tracking.tracking_uri())
    script = (
        "import time; from gym import tracking; parent = tracking.start_run('flow'); "
        "print(parent, tracking.start_run('sft', parent_run_id=parent), flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    killed = proc.stdout.readline().split()
    alive = tracking.start_run("alive")  # this process's
    elsewhere = tracking.start_run("elsewhere", tags={tracking.PROCESS_TAG: "another-host|1|42|1.00"})
    assert len(killed) == 2 and tracking.end_orphaned_runs() == []  # its process still runs
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert {client.get_run(r).info.status for r in killed} == {"RUNNING"}
    new = start_tracking.fn("train", {}, None, None)
    assert [client.get_run(r).info.status for r in killed] == ["KILLED", "KILLED"]
    for run_id in (alive, elsewhere, new):
        assert client.get_run(run_id).info.status == "RUNNING"


def test_a_stages_warning_reaches_the_console_of_a_flow_run(gym_home, tmp_path, capfd):
    """gym's logger goes to the Prefect run's logs during a stage; its warnings were lost to the console."""
    import json

    from flows.runner import main
    from flows.train import train
    from gym.pipeline import TrainFlowConfig

    data = tmp_path / "my.jsonl"
    data.write_text(
        "".join(json.dumps({"instruction": f"Say {i}", "output": str(i)}) + "\n" for i in range(16))
    )
    argv = ["--dataset", str(data), "--train.max_steps", "2", "--train.eval_steps", "1", "--eval_limit", "2"]
    assert main(train, TrainFlowConfig, argv) == 0
    err = capfd.readouterr().err
    assert (
        "gym: warning: sft: eval_strategy steps, eval_steps 1 ignored: the stage has no held-out data" in err
    )
    assert "{'loss'" not in err, "the stage's INFO records stay off the console"
