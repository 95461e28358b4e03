"""MLflow tracking on the workspace's SQLite store: nesting, curves, redaction."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from gym import tracking

REPO = Path(__file__).resolve().parents[1]


def test_default_store_is_sqlite_in_the_workspace(gym_home):
    uri = tracking.tracking_uri()
    assert uri.startswith("sqlite:///") and str(gym_home) in uri


def test_redact_hides_secrets_at_any_depth():
    flat = tracking.redact(
        {
            "hf_token": "hf_abc",
            "lr": 0.1,
            "client": {"api_key": "sk-1", "OPENAI_API_KEY": "x"},
            "auth": {"password": "p"},
            "name": "ok",
        }
    )
    assert (
        flat["hf_token"] == "***"
        and flat["client.api_key"] == "***"
        and flat["client.OPENAI_API_KEY"] == "***"
    )
    assert flat["auth.password"] == "***"
    assert flat["lr"] == "0.1" and flat["name"] == "ok"
    assert "hf_abc" not in str(flat) and "sk-1" not in str(flat)


def test_nested_runs_params_and_curve(gym_home):
    parent = tracking.start_run("flow", params={"model": "gym-tiny", "hub_token": "secret-value"})
    child = tracking.start_run("sft", params={"lr": 0.01}, parent_run_id=parent)
    tracking.log_curve(child, "train_loss", [(1, 3.0), (2, 2.5), (3, 2.0)])
    tracking.end_run(child)
    tracking.end_run(parent)

    client = MlflowClient(tracking.tracking_uri())
    p, c = client.get_run(parent), client.get_run(child)
    assert c.data.tags["mlflow.parentRunId"] == parent
    assert p.data.params["hub_token"] == "***"
    assert "secret-value" not in str(p.data.params)
    history = client.get_metric_history(child, "train_loss")
    assert [(m.step, m.value) for m in history] == [(1, 3.0), (2, 2.5), (3, 2.0)]
    assert p.info.status == "FINISHED"


def test_using_uri_leaves_no_process_wide_setting_behind(gym_home, monkeypatch, tmp_path):
    import os

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    with tracking.using_uri(f"sqlite:///{tmp_path / 'other.db'}"):
        assert "other.db" in os.environ["MLFLOW_TRACKING_URI"]
    assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_REGISTRY_URI" not in os.environ
    assert str(gym_home) in tracking.tracking_uri()


def test_an_experiment_another_run_creates_first_is_reused(gym_home, monkeypatch):
    """Two runs starting side by side in one workspace both find the experiment missing; the one whose
    create loses uses the winner's experiment instead of failing."""
    created = tracking.experiment_id()
    real = MlflowClient.get_experiment_by_name
    reads: list[str] = []

    def read_before_the_other_run_created_it(self, name):
        reads.append(name)
        return None if len(reads) == 1 else real(self, name)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", read_before_the_other_run_created_it)
    assert tracking.experiment_id() == created
    assert len(reads) == 2


def test_other_experiment_errors_still_raise(gym_home, monkeypatch):
    from mlflow.exceptions import MlflowException

    def refuse(self, name, artifact_location=None):
        raise MlflowException("no write access", error_code="PERMISSION_DENIED")

    monkeypatch.setattr(MlflowClient, "create_experiment", refuse)
    with pytest.raises(MlflowException, match="no write access"):
        tracking.experiment_id()


OPEN_AT_ONCE = """
import sys, time, pathlib
from gym import tracking
import mlflow.tracking  # imported before the start: the processes then open the store together
print("ready", flush=True)
go = pathlib.Path(sys.argv[1])
while not go.exists():
    time.sleep(0.002)
print(tracking.experiment_id(), flush=True)
"""


def test_runs_starting_together_in_a_new_workspace_share_one_new_store(tmp_path):
    """Three processes open the same new SQLite store at the same moment, twice over: MLflow creates
    its tables unguarded, so without gym's lock they collided (one failed about every third time)."""
    for attempt in range(2):
        home = tmp_path / f"home{attempt}"
        go = tmp_path / f"go{attempt}"
        env = {**os.environ, "GYM_HOME": str(home)}
        env.pop("MLFLOW_TRACKING_URI", None)
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", OPEN_AT_ONCE, str(go)],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        go.write_text("")
        outputs = [p.communicate(timeout=300) for p in procs]
        for p, (_out, err) in zip(procs, outputs, strict=True):
            assert p.returncode == 0, err[-3000:]
        ids = {out.strip().splitlines()[-1] for out, _ in outputs}
        assert len(ids) == 1, ids


TELEMETRY = """
import gym.tracking, mlflow
from mlflow.telemetry import get_telemetry_client
print(get_telemetry_client() is not None)
"""
# Variables under which MLflow turns its telemetry off by itself (CI, pytest): a gym run has none of them.
MLFLOW_CI_MARKERS = ("PYTEST_CURRENT_TEST", "GITHUB_ACTIONS", "CI", "GITLAB_CI", "JENKINS_URL", "BUILDKITE")


@pytest.mark.parametrize(("setting", "sent"), [(None, False), ("false", True)])
def test_mlflow_telemetry_is_off_unless_the_user_turns_it_on(setting: str | None, sent: bool):
    drop = {*MLFLOW_CI_MARKERS, "MLFLOW_DISABLE_TELEMETRY"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if setting is not None:
        env["MLFLOW_DISABLE_TELEMETRY"] = setting
    out = subprocess.run(
        [sys.executable, "-c", TELEMETRY], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(sent)
