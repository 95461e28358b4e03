"""A user's mistake ends a run with one clear message, exit status 2 and no traceback, before any work.

Checked where people meet it: `gym train` and `python flows/<flow>.py` (console), and the Prefect
run's logs and final state (what the UI shows for a deployment run).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.runner import main
from flows.train import train
from gym import preflight
from gym.errors import ConfigError, DataError, GymError
from gym.pipeline import SftThenDpoConfig, TrainFlowConfig
from gym.train.config import TrainConfig
from tasks._logs import UserErrorFilter

REPO = Path(__file__).resolve().parents[1]
GYM = str(Path(sys.executable).parent / "gym")


def truncated_jsonl(path: Path) -> Path:
    path.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c", "out', encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("config", "error", "words"),
    [
        (TrainFlowConfig(model="gym-tinyy"), ConfigError, ["model:", "gym-tinyy", "did you mean: gym-tiny"]),
        (TrainFlowConfig(template="chatmll"), ConfigError, ["template:", "chatmll", "chatml"]),
        (
            TrainFlowConfig(dataset="demo_sfft"),
            ConfigError,
            ["dataset:", "demo_sfft", "did you mean demo_sft"],
        ),
        (TrainFlowConfig(dataset="missing/data.jsonl"), ConfigError, ["dataset:", "no such file"]),
        (TrainFlowConfig(dataset="demo_dpo"), ConfigError, ["dataset:", "method 'sft'", "preference"]),
        (
            TrainFlowConfig(eval_dataset="demo_dpo"),
            ConfigError,
            ["eval_dataset:", "exact match needs sft", "goes in method_eval_dataset"],
        ),
        (
            TrainFlowConfig(train=TrainConfig(method="kto"), dataset="demo_dpo"),
            ConfigError,
            ["dataset:", "method 'kto'", "kto records"],
        ),
        (
            SftThenDpoConfig(dpo_dataset="demo_sft"),
            ConfigError,
            ["dpo_dataset:", "method 'dpo'", "preference"],
        ),
        (
            TrainFlowConfig(model="Qwen/Qwen3-7B", template="qwen3"),
            ConfigError,
            ["model:", "not in the local Hugging Face cache", "HF_HUB_OFFLINE"],
        ),
    ],
)
def test_preflight_names_the_field_and_builds_nothing(gym_home, config, error, words):
    with pytest.raises(error) as caught:
        preflight.check(config)
    message = str(caught.value).lower()
    assert all(w.lower() in message for w in words), message
    assert not (gym_home / "models").exists(), "no model is built or loaded to find a mistake"


def test_preflight_passes_good_inputs_without_building_anything(gym_home, tmp_path):
    good = tmp_path / "mine.jsonl"
    good.write_text('{"instruction": "a", "output": "b"}\n', encoding="utf-8")
    preflight.check(SftThenDpoConfig())
    preflight.check(TrainFlowConfig(dataset=str(good)))
    assert not (gym_home / "models").exists()


def test_bad_flag_values_end_with_one_error_line(capsys):
    assert main(train, TrainFlowConfig, ["--train.learning_rate", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: train.learning_rate: Input should be greater than 0 (got -1.0)"]

    # HF's Trainer would read 0 (or -5) steps as "train the epochs": a slip, not a request.
    for steps in ("0", "-5"):
        assert main(train, TrainFlowConfig, ["--max-steps", steps]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"error: train.max_steps: give 1 or more steps, or -1 to train num_train_epochs (got {steps})"
        ]

    # pydantic said "String should match pattern '\\S'"
    assert main(train, TrainFlowConfig, ["--output.experiment", " \t"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: output.experiment: must not be blank (got ' \\t')"
    ]

    with pytest.raises(SystemExit) as caught:
        main(train, TrainFlowConfig, ["--train.method", "sftt"])
    assert caught.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: argument --train.method: invalid choice: 'sftt'")


def run_cli(args: list[str], gym_home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GYM_HOME": str(gym_home), "PREFECT_HOME": str(gym_home / "prefect-home")}
    env.pop("PREFECT_API_URL", None)
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_flow_script_reports_an_unknown_model_in_a_line(gym_home):
    proc = run_cli([sys.executable, "flows/sft_then_dpo.py", "--model", "llama-99b"], gym_home)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: model: unknown model 'llama-99b'")
    assert "Traceback" not in proc.stderr + proc.stdout


def test_a_broken_record_fails_the_run_at_ingest_without_tracebacks(gym_home, tmp_path):
    bad = truncated_jsonl(tmp_path / "bad.jsonl")
    proc = run_cli([GYM, "train", "--dataset", str(bad)], gym_home)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: file {bad}, record 2: line 2 is not valid JSON"), last
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (gym_home / "models").exists(), "the model is resolved only after the data is read"


def test_prefect_run_logs_carry_the_message_not_a_traceback(gym_home, tmp_path, prefect_server):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    bad = truncated_jsonl(tmp_path / "bad.jsonl")
    state = train(config=TrainFlowConfig(dataset=str(bad)), return_state=True)
    assert state.is_failed()
    assert "record 2" in str(state.message) and "bad.jsonl" in str(state.message)
    APILogWorker.drain_all(timeout=10)
    EventsWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        flow_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id]))
        logs = client.read_logs(log_filter=flow_filter)
    text = "\n".join(log.message for log in logs)
    assert "line 2 is not valid JSON" in text
    assert "Traceback" not in text
    assert not (gym_home / "models").exists()
    # the flow's failure hook closed the MLflow run it had opened
    from mlflow import MlflowClient

    from gym import tracking

    client = MlflowClient(tracking.tracking_uri())
    flow_run_id = str(state.state_details.flow_run_id)
    (parent,) = client.search_runs(
        [tracking.experiment_id()], filter_string=f"tags.prefect_flow_run_id = '{flow_run_id}'"
    )
    assert parent.info.status == "FAILED"


def test_ctrl_c_a_library_turned_into_its_own_error_is_an_interrupt(gym_home, monkeypatch, capsys):
    """MLflow answers an interrupt inside its database write with its own exception: that is still the
    user's Ctrl-C, so the run ends with status 130 and the one line, not a traceback and status 1."""
    import flows.runner as runner

    def interrupted_in_a_write(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")  # noqa: B904

    monkeypatch.setattr(runner, "run_flow", interrupted_in_a_write)
    assert main(train, TrainFlowConfig, ["--max-steps", "1"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == runner.INTERRUPTED

    def failed(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(runner, "run_flow", failed)
    with pytest.raises(RuntimeError, match="a bug"):  # any other error keeps its traceback
        main(train, TrainFlowConfig, ["--max-steps", "1"])


def test_only_user_errors_lose_their_traceback():
    def record(exc: BaseException) -> logging.LogRecord:
        try:
            raise exc
        except BaseException:
            return logging.LogRecord(
                "prefect.task_runs", logging.ERROR, __file__, 1, "failed", None, sys.exc_info()
            )

    user, bug = record(DataError("bad record", file="x.jsonl", record=2)), record(KeyError("oops"))
    assert UserErrorFilter().filter(user) and UserErrorFilter().filter(bug)
    assert user.exc_info is None and user.exc_text is None
    assert bug.exc_info is not None and bug.exc_info[0] is KeyError
    assert any(isinstance(f, UserErrorFilter) for f in logging.getLogger("prefect.task_runs").filters)
    assert any(isinstance(f, UserErrorFilter) for f in logging.getLogger("prefect.flow_runs").filters)
    assert issubclass(DataError, GymError)


def test_a_user_error_many_tasks_share_is_printed_once_and_the_ui_keeps_every_record(
    prefect_server, monkeypatch
):
    """A TF-GRPO step's rollouts all refused by one endpoint printed the same error twice per rollout, then
    a line per task left NotReady (57 lines). The console shows the first failure and one line counting
    the rest; the run's logs in the API (what the UI shows) keep every record; a bug is always printed."""
    import io

    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker, PrefectConsoleHandler

    from tasks._logs import ConsoleDigest, quiet_run_logs

    @task
    def ask(i: int) -> int:
        if i == 3:
            raise KeyError("a bug")
        raise ConfigError("the endpoint refused the call")

    @task
    def score(answer: int) -> int:
        return answer

    @flow
    def rollouts() -> list[int]:
        answers = ask.map(range(5))
        score.map(answers).wait()
        return [a.result() for a in answers]

    monkeypatch.delenv("GYM_VERBOSE", raising=False)  # --verbose prints every record
    quiet_run_logs()
    console = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    assert console and all(any(isinstance(f, ConsoleDigest) for f in h.filters) for h in console)
    out = io.StringIO()
    monkeypatch.setattr(console[0].console, "file", out)  # the handler prints through its rich Console
    state = rollouts(return_state=True)
    assert state.is_failed()
    lines = out.getvalue().splitlines()
    failed = [line for line in lines if "Task run failed with exception: ConfigError" in line]
    assert len(failed) == 1, lines
    assert sum("KeyError" in line and "Task run 'ask" in line for line in lines) == 2, lines  # the bug
    assert not any("NotReady" in line for line in lines), lines
    (summary,) = [line for line in lines if "not printed here" in line]
    assert "3 more task runs failed" in summary and "5 task runs did not start" in summary
    assert lines.index(summary) < max(i for i, line in enumerate(lines) if "Finished in state Failed" in line)

    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        flow_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id]))
        logs = [log.message for log in client.read_logs(log_filter=flow_filter)]
    assert sum("Task run failed with exception: ConfigError" in m for m in logs) == 4
    assert sum(m.startswith("Finished in state NotReady(") for m in logs) == 5
    assert not any("not printed here" in m for m in logs)


def test_an_mlflow_store_that_cannot_be_created_is_caught_before_the_run(gym_home, tmp_path):
    """A SQLite tracking URI under a file, or where no folder can be made: the field, the reason, and
    nothing made while checking; a new nested folder is fine and is not left behind by the check."""
    from gym.pipeline import OutputSettings

    def config(uri: str) -> TrainFlowConfig:
        return TrainFlowConfig(output=OutputSettings(tracking_uri=uri))

    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match=r"output\.tracking_uri: .*a_file is not a folder"):
        preflight.check(config(f"sqlite:///{a_file}/mlflow.db"))
    if Path("/proc/self").is_dir():  # Linux: no folder can be made under /proc, even by root
        with pytest.raises(ConfigError, match=r"output\.tracking_uri: .*no such file or directory: /proc/"):
            preflight.check(config("sqlite:////proc/gym-nope/mlflow.db"))
    nested = tmp_path / "new" / "mlruns"
    preflight.check(config(f"sqlite:///{nested}/mlflow.db"))
    assert not (tmp_path / "new").exists(), "the check leaves nothing behind"
    assert not (gym_home / "models").exists()


def test_an_output_dir_gym_may_not_write_is_caught_before_the_run(gym_home, tmp_path):
    """A folder of the user's or a file as output_dir failed only at export, after training and
    registration; now before anything runs. New, empty and gym's own exports pass."""
    from gym.pipeline import OutputSettings

    def config(output_dir: Path) -> TrainFlowConfig:
        return TrainFlowConfig(output=OutputSettings(output_dir=str(output_dir)))

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match=r"^output\.output_dir: .*mine exists and was not written by gym"):
        preflight.check(config(mine))
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match=r"^output\.output_dir: .*a_file is a file, not a directory"):
        preflight.check(config(a_file))
    assert (mine / "notes.txt").read_text() == "keep me" and a_file.read_text() == "x"
    (tmp_path / "empty").mkdir()
    trained = tmp_path / "trained"  # a training stage's model folder (or a copy): gym_model.json, no export
    trained.mkdir()
    (trained / "gym_model.json").write_text('{"base_model": "gym-tiny", "template": "chatml"}')
    with pytest.raises(
        ConfigError, match=r"^output\.output_dir: .*trained exists and was not written by gym"
    ):
        preflight.check(config(trained))
    gyms = tmp_path / "exported"
    gyms.mkdir()
    (gyms / "gym_model.json").write_text('{"base_model": "gym-tiny", "exported_by": "gym export"}')
    for fine in (tmp_path / "new", tmp_path / "empty", gyms):
        preflight.check(config(fine))
    assert not (tmp_path / "new").exists()


def test_a_file_store_or_a_server_nothing_answers_at_is_caught_before_the_run(
    gym_home, tmp_path, monkeypatch
):
    """MLflow refuses a file store (maintenance mode) deep inside the run, and retries a tracking server
    that isn't there for minutes: the check says so at once, naming the field."""
    import socket

    from gym.pipeline import OutputSettings
    from gym.promotion import promote

    def config(uri: str) -> TrainFlowConfig:
        return TrainFlowConfig(output=OutputSettings(tracking_uri=uri))

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    for uri in (str(tmp_path / "mlruns"), f"file://{tmp_path}/mlruns"):
        with pytest.raises(
            ConfigError, match=r"output\.tracking_uri: .*file store.*MLFLOW_ALLOW_FILE_STORE=true"
        ):
            preflight.check(config(uri))
    with pytest.raises(ConfigError, match=r"^--tracking-uri: .*file store"):
        promote("m", "exact_match_after", uri=str(tmp_path / "mlruns"))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's own opt-out: accepted
    preflight.check(config(str(tmp_path / "mlruns")))

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        preflight.check(config(f"http://127.0.0.1:{port}"))  # something answers there
    with pytest.raises(ConfigError, match=rf"output\.tracking_uri: .*nothing answers at 127\.0\.0\.1:{port}"):
        preflight.check(config(f"http://127.0.0.1:{port}"))  # closed now
    assert not (tmp_path / "mlruns").exists()


def test_a_prefect_api_url_nothing_answers_at_is_one_error_line(gym_home, capsys):
    """`eval "$(gym status --env)"`, then `gym down`: the exported URL used to end the run in Prefect's
    tracebacks."""
    import socket

    from prefect.settings import PREFECT_API_URL, temporary_settings

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
        assert main(train, TrainFlowConfig, ["--max_samples", "8", "--train.max_steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: PREFECT_API_URL=http://127.0.0.1:{port}/api: nothing answers at 127.0.0.1:"
    )
    assert "unset PREFECT_API_URL" in err and "Traceback" not in err
    assert not (gym_home / "models").exists(), "nothing trained"


def test_lora_targets_and_freeze_layers_the_model_lacks_fail_before_any_model_loads(gym_home):
    """They failed in the train task, after the data work and the held-out evaluation had loaded and run
    the model; the model's config (its architecture on the meta device) says it at once."""
    cases = [
        (
            TrainConfig(finetuning_type="lora", lora={"target_modules": ["nosuch_proj"]}),
            r"^train\.lora\.target_modules: gym-tiny has no module named 'nosuch_proj'; its linear layers",
        ),
        (  # a block of layers: PEFT's "Target module LlamaMLP(...) is not supported", after the load
            TrainConfig(finetuning_type="lora", lora={"target_modules": ["mlp"]}),
            r"^train\.lora\.target_modules: 'mlp' in gym-tiny is a LlamaMLP, not a layer LoRA adapts",
        ),
        (
            TrainConfig(finetuning_type="freeze", freeze={"layers": 99}),
            r"^train\.freeze\.layers=99, but gym-tiny has",
        ),
        (  # a module name the layers lack: it failed after the model loaded
            TrainConfig(finetuning_type="freeze", freeze={"modules": ["attn"]}),
            r"^train\.freeze\.modules: layer model\.layers\.\d has no submodule 'attn'; its parts: self_attn",
        ),
        (
            TrainConfig(finetuning_type="freeze", freeze={"layers": 0, "extra_modules": ["nosuch"]}),
            r"^train\.freeze\.extra_modules: no module named 'nosuch'",
        ),
    ]
    for stage, says in cases:
        with pytest.raises(ConfigError, match=says):
            preflight.check(TrainFlowConfig(train=stage))
    with pytest.raises(ConfigError, match=r"^sft\.lora\.target_modules: gym-tiny has no module named 'x'"):
        preflight.check(
            SftThenDpoConfig(sft=TrainConfig(finetuning_type="dora", lora={"target_modules": ["x"]}))
        )
    preflight.check(
        TrainFlowConfig(train=TrainConfig(finetuning_type="lora", lora={"target_modules": ["q_proj"]}))
    )
    preflight.check(TrainFlowConfig(train=TrainConfig(finetuning_type="freeze", freeze={"layers": -1})))
    preflight.check(TrainFlowConfig(train=TrainConfig(finetuning_type="freeze", freeze={"modules": ["mlp"]})))
    assert not list(gym_home.glob("models/sft-*")), "no stage started"


def test_a_methods_own_setting_checks_run_in_preflight(gym_home):
    """KTO's batch of one (LLaMA-Factory's example sets it) failed in the train task, after ingest and
    tokenization; a DPO-variant name and a loss that contradicts it likewise."""

    def kto(stage: TrainConfig) -> TrainFlowConfig:
        return TrainFlowConfig(dataset="demo_kto", eval_dataset=None, train=stage)

    with pytest.raises(ConfigError, match=r"^train: kto needs per_device_train_batch_size >= 2.*set it to 2"):
        preflight.check(kto(TrainConfig(method="kto", per_device_train_batch_size=1)))
    with pytest.raises(ConfigError, match=r"^train: method 'ipo' is the ipo loss, but loss_type is 'hinge'"):
        preflight.check(
            TrainFlowConfig(dataset="demo_dpo", train=TrainConfig(method="ipo", loss_type="hinge"))
        )
    preflight.check(kto(TrainConfig(method="kto", per_device_train_batch_size=2)))
    assert not (gym_home / "datasets").exists(), "nothing ingested"
