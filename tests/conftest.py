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


@pytest.fixture(scope="session")
def warm_tiny(tmp_path_factory: pytest.TempPathFactory):
    """gym-tiny after a short full SFT on the demo data, built once per test process: adapters and
    preference methods start from a model that already answers in the demo's format."""
    from gym import train
    from gym.models import derived
    from gym.train import TrainConfig
    from tests.helpers import tiny, tokenized

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GYM_HOME", str(tmp_path_factory.mktemp("warm") / "gym_home"))
        base = tiny()
        config = TrainConfig(method="sft", learning_rate=3e-3, max_steps=100, per_device_train_batch_size=16)
        warm = train.run(config, base, tokenized("demo_sft", base, max_samples=1600))
        return derived(base, Path(warm.model_dir), warm.digest)
