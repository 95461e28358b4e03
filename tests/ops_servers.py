"""Real Prefect and MLflow servers for tests, started the way a person starts them (`gym up`).

CI-safe: free ports (GYM_PREFECT_PORT / GYM_MLFLOW_PORT = 0), a temporary GYM_HOME and PREFECT_HOME,
each server in its own process group, health polled with a deadline (gym.services), and at teardown
`gym down` plus a kill of any process group that is still there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@dataclass
class Stack:
    """`gym up` over one workspace: URLs, and the environment a user's shell would have."""

    home: Path
    env: dict[str, str]
    prefect: str
    mlflow: str
    groups: list[int] = field(default_factory=list)

    @property
    def api(self) -> str:
        return f"{self.prefect}/api"

    def sh(self, command: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command line as a user would in a shell (venv's bin first on PATH) at the repo root."""
        proc = subprocess.run(
            ["bash", "-c", command], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check:
            assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    def client(self) -> Any:
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        @contextlib.contextmanager
        def opened() -> Iterator[Any]:
            with temporary_settings({PREFECT_API_URL: self.api}), get_client(sync_client=True) as c:
                yield c

        return opened()

    def mlflow_client(self) -> Any:
        from mlflow import MlflowClient

        uri = f"sqlite:///{self.home / 'mlflow' / 'mlflow.db'}"
        return MlflowClient(tracking_uri=uri, registry_uri=uri)


def user_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_TRACKING"))}
    env.update(
        GYM_HOME=str(home),
        PREFECT_HOME=str(home / "prefect-home"),
        GYM_PREFECT_PORT="0",
        GYM_MLFLOW_PORT="0",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        HF_DATASETS_DISABLE_PROGRESS_BARS="1",
    )
    return env


def services_state(home: Path) -> dict[str, Any]:
    path = home / "services" / "services.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def kill_groups(pgids: list[int]) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def gym_up(home: Path, *flags: str) -> Iterator[Stack]:
    """`gym up` in a temporary workspace; `gym down` (and a group kill of anything left) afterwards."""
    env = user_env(home)
    stack = Stack(home=home, env=env, prefect="", mlflow="")
    try:
        out = stack.sh(shlex.join(["gym", "up", "--json", *flags]), timeout=240)
        urls = json.loads(out.stdout.strip().splitlines()[-1])
        stack.prefect, stack.mlflow = urls["prefect"], urls["mlflow"]
        stack.groups = [s["pid"] for s in services_state(home).values()]
        yield stack
    finally:
        groups = [s["pid"] for s in services_state(home).values()] or stack.groups
        stack.sh("gym down", timeout=120, check=False)
        kill_groups(groups)


def wait_for(predicate: Any, timeout: float, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)
