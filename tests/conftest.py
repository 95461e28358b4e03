"""Test set-up: no network, a fresh workspace per test, one Prefect test server per session."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.pop("MLFLOW_TRACKING_URI", None)

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def gym_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own workspace (datasets, models, MLflow, Prefect results)."""
    home = tmp_path / "gym_home"
    monkeypatch.setenv("GYM_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def prefect_server():
    """A throwaway Prefect API (temp database) for flow tests."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
