"""Tracking that goes wrong the way it does for people: credentials in a tracking URI, a tracking server
nothing answers at, one that stops in the middle of a run, a store the run's preflight refused.

Real components: `mlflow server` subprocesses on free ports (killed to stop answering), Prefect's test
API and gym's flows.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows.runner import main
from flows.train import train
from gym import preflight, secrets, tracking
from gym.errors import ConfigError
from gym.pipeline import OutputSettings, TrainFlowConfig

REPO = Path(__file__).resolve().parents[1]
SECRET = "hf_fake123"
SMALL_RUN = ["--max_samples", "8", "--train.max_steps", "1", "--eval_limit", "2"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`mlflow server` on a free port over a SQLite store in `root`, in its own process group (killed
    at the end, whatever happened)."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'm.db'}"]
    command += ["--artifacts-destination", str(root / "artifacts")]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    break
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(0.3)
        yield url, proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the server's process group (SIGKILL: it stops answering at once, as a crash would)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def with_login(url: str) -> str:
    return url.replace("http://", f"http://qa:{SECRET}@")


def flow_run_artifacts(flow_run_id: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    flow_filter = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=flow_filter)


def flow_run_logs(flow_run_id: Any) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        return [log.message for log in client.read_logs(log_filter=log_filter)]


# -- 1. credentials in the tracking URI --------------------------------------------------------------


def test_links_and_url_helpers_never_carry_the_login():
    url = f"http://qa:{SECRET}@127.0.0.1:5300/"
    assert secrets.link_url(url) == "http://127.0.0.1:5300/"
    assert secrets.link_url("https://h/x?api_key=k&b=1") == "https://h/x?api_key=***&b=1"
    assert secrets.link_url("http://127.0.0.1:5300") == "http://127.0.0.1:5300"
    assert tracking.ui_url(url) == "http://127.0.0.1:5300"
    assert tracking.model_version_url("m", "1", url) == "http://127.0.0.1:5300/#/models/m/versions/1"
    link = tracking.artifact_url("r1", "loss.png", url)
    assert link == "http://127.0.0.1:5300/get-artifact?path=loss.png&run_uuid=r1"


def test_a_tracking_uri_with_credentials_as_a_setting_is_refused_before_prefect_starts(gym_home, capsys):
    """The URI went into Prefect's flow-run parameters as it was given (login and all)."""
    uri = f"http://qa:{SECRET}@127.0.0.1:5300"
    with pytest.raises(ConfigError) as caught:
        preflight.check(TrainFlowConfig(output=OutputSettings(tracking_uri=uri)))
    message = str(caught.value)
    assert message.startswith("output.tracking_uri: the tracking URI carries credentials")
    assert "(http://127.0.0.1:5300)" in message and "MLFLOW_TRACKING_USERNAME" in message
    assert "MLFLOW_TRACKING_PASSWORD" in message and SECRET not in message
    # a token in the query: the URI to give has none (it read `(http://127.0.0.1:5300/?token=***`, its `)`
    # taken for the token's end when the message was scrubbed)
    with pytest.raises(ConfigError) as caught:
        preflight.check(
            TrainFlowConfig(output=OutputSettings(tracking_uri=f"http://127.0.0.1:5300/?token={SECRET}"))
        )
    assert "give it without them (http://127.0.0.1:5300/) and set" in str(caught.value)
    assert (
        secrets.scrub(f"(http://h/?token={SECRET}), http://h/x?key={SECRET}.")
        == "(http://h/?token=***), http://h/x?key=***."
    )
    assert secrets.scrub(f"{{http://h/?token={SECRET}}}") == "{http://h/?token=***}"

    started = time.monotonic()
    assert main(train, TrainFlowConfig, [*SMALL_RUN, "--output.tracking_uri", uri]) == 2
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: output.tracking_uri: the tracking URI carries")
    assert SECRET not in err
    assert not (gym_home / "models").exists(), "nothing ran"

    database = "postgresql://gym:pw@db.example/mlflow"  # no variable of MLflow's holds a database login
    with pytest.raises(ConfigError, match=r"give the whole URI in MLFLOW_TRACKING_URI") as db_error:
        preflight.check(TrainFlowConfig(output=OutputSettings(tracking_uri=database)))
    assert ":pw@" not in str(db_error.value)


def test_credentials_from_the_environment_work_and_stay_out_of_prefect(
    prefect_server, gym_home, tmp_path, monkeypatch, capsys
):
    """MLFLOW_TRACKING_URI with a login still tracks and registers; the links in every artifact of the
    flow run (and its parameters) are the server's without the login."""
    import json

    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client

    with mlflow_server(tmp_path / "mlflow") as (url, _):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", with_login(url))
        assert main(train, TrainFlowConfig, [*SMALL_RUN, "--json"]) == 0
        out, err = capsys.readouterr()
        summary = json.loads(out.strip().splitlines()[-1])
        # MLflow printed "View run ... at: http://qa:<secret>@..." each time a run ended
        assert SECRET not in out + err and "qa:" not in out + err
        name, version = summary["model_name"], summary["model_version"]
        assert MlflowClient(url, registry_uri=url).get_model_version(name, version).run_id

    artifacts = flow_run_artifacts(summary["flow_run_id"])
    shown = {a.key: str(a.data) for a in artifacts if a.key}
    assert {"mlflow-run", "registered-model", "registered-version", "stage-sft", "gym-summary"} <= set(shown)
    for key, text in shown.items():
        assert SECRET not in text and "qa:" not in text and "***@" not in text, (key, text)
    assert f"({url}/#/models/{name}/versions/{version})" in shown["registered-version"]
    assert f"{url}/#/experiments/" in shown["mlflow-run"]
    assert f"({url}/get-artifact?path=loss.png" in shown["stage-sft"]
    with get_client(sync_client=True) as client:
        parameters = client.read_flow_run(summary["flow_run_id"]).parameters
    assert SECRET not in json.dumps(parameters, default=str)


# -- 2. a models:/ URI against a server nothing answers at ---------------------------------------------


@pytest.mark.parametrize("command", ["export", "serve", "chat"])
def test_a_models_uri_where_nothing_answers_fails_at_once(gym_home, tmp_path, monkeypatch, capsys, command):
    """It hung for about 4 minutes in MLflow's retries, then said the model was "not found"."""
    from flows.cli import main as gym

    port = free_port()  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", with_login(f"http://127.0.0.1:{port}"))
    model = "models:/gym-tiny-sft-dpo@champion"
    started = time.monotonic()
    with pytest.raises(ConfigError, match=rf"nothing answers at 127\.0\.0\.1:{port}: connection refused"):
        tracking.resolve_model_uri(model)
    assert time.monotonic() - started < 1

    argv = {"export": [model, "--out", str(tmp_path / "out")], "serve": [model], "chat": [model]}[command]
    started = time.monotonic()
    assert gym([command, "--model", *argv]) == 2
    assert time.monotonic() - started < 15, "MLflow's retries take 30 s and more"
    err = capsys.readouterr().err
    assert err.startswith(f"error: MLFLOW_TRACKING_URI: the MLflow store http://127.0.0.1:{port} can't be")
    assert f"nothing answers at 127.0.0.1:{port}: connection refused" in err
    assert SECRET not in err and "not found" not in err and "Traceback" not in err


# -- 3. a tracking server that stops in the middle of a run --------------------------------------------


def test_mlflows_retry_budget_is_bounded_unless_the_user_sets_it():
    code = "import os, gym.tracking; print(os.environ['MLFLOW_HTTP_REQUEST_MAX_RETRIES'], "
    code += "os.environ['MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR'])"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True)
    assert out.stdout.split() == ["5", "1"], out.stderr
    env.update(MLFLOW_HTTP_REQUEST_MAX_RETRIES="7", MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="2")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True)
    assert out.stdout.split() == ["7", "2"], out.stderr


def test_a_tracking_server_that_stops_mid_run_is_one_error_line(
    prefect_server, gym_home, tmp_path, monkeypatch, capfd, caplog
):
    """The server killed while the model trains: MLflow's retries (bounded to about 30 s), then one
    `error:` line naming the server (without its login) and what to do; the stage's run is not ended
    against the dead server (another wait), nor is the flow's by the failure hook, which says so in
    one line. It was 4 minutes of retries, a chained traceback, and 4 more minutes in the hook."""
    from mlflow import MlflowClient

    import tasks.train

    monkeypatch.delenv("GYM_VERBOSE", raising=False)
    with mlflow_server(tmp_path / "mlflow") as (url, proc):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", with_login(url))
        trained = tasks.train.run
        killed: list[float] = []

        def train_then_the_server_dies(*args: Any, **kwargs: Any) -> Any:
            result = trained(*args, **kwargs)
            stop(proc)
            killed.append(time.monotonic())
            return result

        monkeypatch.setattr(tasks.train, "run", train_then_the_server_dies)
        assert main(train, TrainFlowConfig, SMALL_RUN) == 2
        after_kill = time.monotonic() - killed[0]

    err = capfd.readouterr().err
    assert 25 < after_kill < 55, f"one bounded wait of about 30 s (not two, not MLflow's 4 min): {after_kill}"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [err.strip().splitlines()[-1]], err[-3000:]
    assert errors[0].startswith(f"error: the MLflow server at {url} stopped answering (nothing answers at")
    assert "gym up" in errors[0] and "run the same command again" in errors[0]
    assert "Traceback" not in err and "MaxRetryError" not in err and SECRET not in err
    # the run's logs: the task's error and the hook's one line, without a traceback or the login
    hook = [r for r in caplog.records if "can't end this flow run's MLflow runs" in r.getMessage()]
    assert len(hook) == 1 and f"the MLflow server at {url} doesn't answer" in hook[0].getMessage()
    assert not any(r.exc_info or r.exc_text for r in caplog.records if r.name.startswith("prefect"))
    assert "An error was encountered while running hook" not in caplog.text and SECRET not in caplog.text

    # what the hook left: the runs stay RUNNING in the store, for the next run to end as KILLED
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("gym").experiment_id])
    assert {r.info.status for r in runs} >= {"RUNNING"}


def test_the_failure_hook_skips_a_server_that_does_not_answer_at_once(gym_home, monkeypatch):
    port = free_port()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", with_login(f"http://127.0.0.1:{port}"))  # a login: env only
    started = time.monotonic()
    note = tracking.end_failed_runs("prefect_flow_run_id", "x")
    assert time.monotonic() - started < 3
    assert note is not None and note.startswith("can't end this flow run's MLflow runs: the MLflow server at")
    assert f"http://127.0.0.1:{port} doesn't answer" in note and SECRET not in note


def test_the_failure_hook_leaves_alone_a_store_refused_for_its_login(gym_home):
    """A deployment run given `tracking_uri` with a login fails its first task (check_store); the hook
    then tried that server and warned it "doesn't answer", as if runs were left open there."""
    port = free_port()
    assert (
        tracking.end_failed_runs("prefect_flow_run_id", "x", uri=with_login(f"http://127.0.0.1:{port}"))
        is None
    )


# -- 4. the failure hook after a store the preflight refused -------------------------------------------


@pytest.mark.parametrize("store", ["file", "server"])
def test_the_failure_hook_after_a_refused_store_logs_no_traceback(
    prefect_server, gym_home, tmp_path, monkeypatch, store
):
    """A deployment run (the flow called with its parameters) whose preflight task refuses the store:
    the hook opened the same store and logged MLflow's 40-line traceback (file store: maintenance
    mode), or waited out MLflow's retries first (a server nothing answers at)."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    uri = "./mlruns" if store == "file" else f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    state = train(config=TrainFlowConfig(output=OutputSettings(tracking_uri=uri)), return_state=True)
    assert state.is_failed() and time.monotonic() - started < 30
    logs = flow_run_logs(state.state_details.flow_run_id)
    text = "\n".join(logs)
    assert "Traceback" not in text and "An error was encountered while running hook" not in text, text
    assert any("Hook 'end_failed_tracking' finished running successfully" in m for m in logs), text
    assert any("output.tracking_uri: the MLflow store" in m for m in logs), text
    hook_lines = [m for m in logs if "can't end this flow run's MLflow runs" in m]
    assert len(hook_lines) == (0 if store == "file" else 1), hook_lines
    assert not (tmp_path / "mlruns").exists()


def test_the_failure_hook_does_not_make_a_store_that_was_never_opened(gym_home, tmp_path):
    db = tmp_path / "never" / "mlflow.db"
    assert tracking.end_failed_runs("prefect_flow_run_id", "x", uri=f"sqlite:///{db}") is None
    assert not db.parent.exists()


def test_the_failure_hook_still_ends_the_runs_of_a_failed_flow_run(gym_home):
    parent = tracking.start_run("flow", tags={"prefect_flow_run_id": "fr-1"})
    child = tracking.start_run("sft", parent_run_id=parent)
    assert tracking.end_failed_runs("prefect_flow_run_id", "fr-1") is None
    client = tracking._client()
    assert [client.get_run(r).info.status for r in (parent, child)] == ["FAILED", "FAILED"]
