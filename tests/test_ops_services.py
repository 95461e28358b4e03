"""`gym up` / `gym status` / `gym down`: real servers on loopback, found by runs, and gone afterwards."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gym import services
from tests.ops_servers import gym_up, services_state

pytestmark = pytest.mark.xdist_group("services")


def test_up_status_down_and_runs_find_the_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path / "gym_home"
    with gym_up(home, "--worker") as stack:
        status = json.loads(stack.sh("gym status --json").stdout)
        assert {"prefect", "mlflow", "worker"} <= set(status)
        assert status["prefect"]["answering"] and status["mlflow"]["answering"] and status["worker"]["alive"]
        again = time.monotonic()
        assert json.loads(stack.sh("gym up --json").stdout.splitlines()[-1])["prefect"] == stack.prefect
        assert time.monotonic() - again < 30, "a second `gym up` finds the running servers"

        # A run in this workspace uses these servers: no temporary API, and the run shows in the UI.
        from prefect.settings import PREFECT_API_URL

        from flows.runner import workspace_servers

        monkeypatch.setenv("GYM_HOME", str(home))
        with workspace_servers():
            assert PREFECT_API_URL.value() == stack.api
        from gym import tracking

        assert tracking.ui_url() == stack.mlflow

        groups = {name: s["pid"] for name, s in services_state(home).items()}
        # Every process each server started (uvicorn, huey consumers, the worker's children) is in its group.
        members = {name: services.group_members(pgid) for name, pgid in groups.items()}
        assert all(members.values()), members

        down = stack.sh("gym down")
        assert set(down.stdout.removeprefix("stopped: ").strip().split(", ")) == {
            "worker",
            "mlflow",
            "prefect",
        }
        left = {name: services.group_members(pgid) for name, pgid in groups.items()}
        assert not any(left.values()), left
        assert not (home / "services" / "services.json").exists()
        assert stack.sh("gym status", check=False).returncode == 3
        with workspace_servers():
            assert PREFECT_API_URL.value() is None, "with the servers gone, runs start their own API again"
