"""QA fixes for deployment runs: the image's build context, task run names, a quiet worker console, and
`gym down` ending the MLflow runs of the flow runs it stopped."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

# --- 1. .dockerignore ---------------------------------------------------------------------------


def _patterns(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _excluded(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `path` (relative to the context) out: a pattern matches it or a folder above
    it (`**` any number of folders, `*` within one name; no `!` exceptions are used here)."""

    def regex(pattern: str) -> re.Pattern[str]:
        out, i = "", 0
        pattern = pattern.strip("/")
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return re.compile(out + r"\Z")

    compiled = [regex(p) for p in patterns]
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    return any(r.match(prefix) for r in compiled for prefix in prefixes)


def test_the_image_leaves_out_what_git_ignores_and_keeps_what_its_install_needs():
    """`COPY . /opt/gym` copied a clone's .venv (GBs), its .gym workspace (the MLflow database, models,
    Prefect results) and caches into the image: there was no .dockerignore."""
    dockerfile = (REPO / "deployments" / "work-pools" / "Dockerfile").read_text()
    assert "COPY . /opt/gym" in dockerfile  # the whole context: what .dockerignore leaves is what it gets
    ignore = REPO / ".dockerignore"
    assert ignore.is_file(), "docker build reads .dockerignore at the root of the context only"
    patterns = _patterns(ignore)

    # Everything .gitignore ignores (a virtual environment, the workspace, caches, build output).
    for pattern in _patterns(REPO / ".gitignore"):
        name = pattern.strip("/").replace("*", "x")
        where = [name] if pattern.startswith("/") or "/" in pattern.strip("/") else [name, f"gym/{name}"]
        for path in where:
            assert _excluded(path, patterns), f"{path} (.gitignore: {pattern}) would be copied into the image"
    heavy_or_private = [
        ".venv/lib/python3.11/site-packages/torch/__init__.py",
        ".gym/mlflow/mlflow.db",
        ".gym/models/gym-tiny-sft/model.safetensors",
        ".gym/prefect/results/abc",
        ".git/objects/pack/x.pack",
        "gym/__pycache__/cli.cpython-311.pyc",
        ".mypy_cache/3.11/gym/cli.data.json",
        ".hypothesis/examples/x",
    ]
    for path in heavy_or_private:
        assert _excluded(path, patterns), f"{path} would be copied into the image"

    # What `pip install -e ".[eval,quant]"` with the constraints file, and the deployments, need.
    constraints = re.search(r"-c\s+(\S+)", dockerfile)
    assert constraints is not None
    needed = [constraints.group(1), "pyproject.toml", "README.md", "registry/models.json"]
    needed += [f"{package}/__init__.py" for package in ("gym", "tasks", "flows")]
    needed += ["flows/train.py", "deployments/deploy.py", "deployments/prefect.yaml"]
    for path in needed:
        assert (REPO / path).exists(), path
        assert not _excluded(path, patterns), f"{path} is needed in the image"
    # and nothing the repository tracks is left out
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    tracked = listed.stdout.splitlines() if listed.returncode == 0 else []
    assert not [path for path in tracked if _excluded(path, patterns)]


# --- 2. task run names ----------------------------------------------------------------------------

PREFECT_SUFFIX = re.compile(r"-[0-9a-f]{3}\Z")  # what Prefect appends to a task's name without task_run_name


def _task_run_names(flow_run_id: Any) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(run.name for run in runs)


def test_the_preflight_and_tracking_tasks_have_readable_run_names(prefect_server, tmp_path: Path):
    """check-inputs-180, start-tracking-807, finish-tracking-cc8, check-benchmarks-725 in the UI, where
    every other task run had a name that said what it did."""
    from prefect import flow

    from gym.pipeline import TrainFlowConfig
    from tasks.evaluate import check_benchmarks_task
    from tasks.preflight import check_inputs
    from tasks.tracking import finish_tracking, start_tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = TrainFlowConfig()

    @flow(name="qa-task-names")
    def names() -> None:
        check_inputs(config)
        check_benchmarks_task([], config.benchmark_options)
        run_id = start_tracking("train-sft", {}, None, uri)
        finish_tracking(run_id, {"loss": 1.0}, uri)

    state = names(return_state=True)
    assert state.is_completed(), state
    got = _task_run_names(state.state_details.flow_run_id)
    assert got == sorted(["check inputs", "check benchmarks", "start tracking train-sft", "finish tracking"])
    assert not [name for name in got if PREFECT_SUFFIX.search(name)], got


# --- 3. a quiet console in every flow run -----------------------------------------------------------

QUIETED = ("mlflow", "alembic", "huey")


@pytest.fixture
def loud_process() -> Iterator[None]:
    """A process that no gym command line started (a worker's flow-run process, `serve`, a notebook):
    no MLFLOW_LOGGING_LEVEL, and mlflow already imported at its default level (INFO). Restored after."""
    import mlflow  # noqa: F401  # imported: its level is no longer read from the environment

    environ = dict(os.environ)
    levels = {name: logging.getLogger(name).level for name in QUIETED}
    for key in ("MLFLOW_LOGGING_LEVEL", "GYM_VERBOSE", "TQDM_DISABLE"):
        os.environ.pop(key, None)
    logging.getLogger("mlflow").setLevel(logging.INFO)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _flows() -> list[tuple[Any, Any]]:
    from flows.evaluate import EvaluateConfig, evaluate
    from flows.sft_then_dpo import sft_then_dpo
    from flows.tf_grpo import tf_grpo
    from flows.train import train
    from gym.pipeline import SftThenDpoConfig, TfGrpoFlowConfig, TrainFlowConfig

    return [
        (train, TrainFlowConfig),
        (sft_then_dpo, SftThenDpoConfig),
        (evaluate, EvaluateConfig),
        (tf_grpo, TfGrpoFlowConfig),
    ]


def test_every_task_names_its_runs():
    """A task without task_run_name shows in the UI as its name plus a random suffix (check-inputs-180,
    tfgrpo-prepare-3a1): every task of tasks/ gives its runs a readable name."""
    import importlib

    from prefect import Task

    unnamed = []
    for path in sorted((REPO / "tasks").glob("*.py")):
        module = importlib.import_module(f"tasks.{path.stem}")
        for name, value in vars(module).items():
            if isinstance(value, Task) and value.__module__ == module.__name__ and not value.task_run_name:
                unnamed.append(f"{path.stem}.{name}")
    assert unnamed == []


@pytest.mark.parametrize("index", range(4), ids=["train", "sft-then-dpo", "evaluate", "tf-grpo"])
def test_every_flow_quiets_mlflow_as_the_command_line_does(prefect_server, loud_process, index: int):
    """A deployment run's worker console had MLflow's lines that `gym train` hides ("WARNING
    mlflow.transformers: The model card could not be retrieved from the hub ...", "Unable to find
    license information", "Creating initial MLflow database tables"): only the command line set
    MLFLOW_LOGGING_LEVEL=ERROR. Now the flow does, first (here its run fails in its first task, on a
    model that doesn't exist: the quieting came before)."""
    flow_fn, config_cls = _flows()[index]
    config = config_cls(model="no-such-model-anywhere")
    assert logging.getLogger("mlflow.transformers").isEnabledFor(logging.WARNING)

    state = flow_fn(config=config, return_state=True)

    assert state.is_failed()
    assert os.environ.get("MLFLOW_LOGGING_LEVEL") == "ERROR"  # an mlflow imported later, or a subprocess
    assert os.environ.get("TQDM_DISABLE") == "1"  # the libraries' progress bars, as on the command line
    assert not logging.getLogger("mlflow.transformers").isEnabledFor(logging.WARNING)
    assert not logging.getLogger("mlflow.store.db.utils").isEnabledFor(logging.INFO)
    assert logging.getLogger("mlflow").isEnabledFor(logging.ERROR)  # errors still show
    assert not logging.getLogger("alembic").isEnabledFor(logging.WARNING)


def test_the_model_card_warning_no_longer_reaches_the_console(loud_process, capsys):
    """MLflow's records go to its own stderr handler: after the quieting, its warnings print nothing."""
    from tasks.tracking import quiet_libraries

    logging.getLogger("mlflow.transformers").warning("The model card could not be retrieved from the hub")
    assert "model card" in capsys.readouterr().err  # what a worker's console showed
    quiet_libraries()
    logging.getLogger("mlflow.transformers").warning("The model card could not be retrieved from the hub")
    logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
    assert capsys.readouterr().err == ""


def test_verbose_or_a_level_set_by_the_user_wins(loud_process):
    from tasks.tracking import quiet_libraries

    os.environ["GYM_VERBOSE"] = "1"
    quiet_libraries()
    assert logging.getLogger("mlflow").isEnabledFor(logging.INFO) and "MLFLOW_LOGGING_LEVEL" not in os.environ
    del os.environ["GYM_VERBOSE"]
    os.environ["MLFLOW_LOGGING_LEVEL"] = "warning"
    quiet_libraries()
    assert logging.getLogger("mlflow").getEffectiveLevel() == logging.WARNING


# --- 4. `gym down` ends the MLflow runs of the flow runs it stopped -------------------------------------


def _pool_run(client: Any, pool: str, parameters: dict[str, Any]) -> Any:
    """A flow run of a deployment on `pool`, Running, as a worker's process left it."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.states import Running

    with contextlib.suppress(ObjectAlreadyExists):
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
    flow_id = client.create_flow_from_name("train")
    deployment_id = client.create_deployment(
        flow_id=flow_id, name=f"train-{pool}", work_pool_name=pool, entrypoint="flows/train.py:train"
    )
    return client.create_flow_run_from_deployment(deployment_id, parameters=parameters, state=Running())


def test_gym_down_ends_the_mlflow_runs_of_the_flow_runs_it_crashed(prefect_server, tmp_path: Path):
    """`gym down` during a deployment run marked the flow run Crashed but left its MLflow runs (the
    parent and the stage that was training) RUNNING until the next flow run on the machine started."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    from flows.services import crash_pool_runs
    from gym import tracking
    from tasks.tracking import FLOW_RUN_TAG

    pool = "qa-down-pool"
    elsewhere = f"sqlite:///{tmp_path / 'elsewhere' / 'mlflow.db'}"
    with get_client(sync_client=True) as client:
        default_store = _pool_run(client, pool, {})  # the workspace's store
        own_store = _pool_run(client, pool, {"config": {"output": {"tracking_uri": elsewhere}}})
    opened: dict[str, list[str]] = {}
    for run, uri in ((default_store, None), (own_store, elsewhere)):
        parent = tracking.start_run("train-sft", tags={FLOW_RUN_TAG: str(run.id)}, uri=uri)
        stage = tracking.start_run("sft", parent_run_id=parent, uri=uri)
        opened[str(run.id)] = [parent, stage]
    other_flow_run = tracking.start_run("train-sft", tags={FLOW_RUN_TAG: "not-one-of-the-pool"})

    notes: list[str] = []
    assert crash_pool_runs(str(PREFECT_API_URL.value()), pool=pool, notes=notes) == 2
    assert notes == []

    for run, uri in ((default_store, None), (own_store, elsewhere)):
        mlflow = tracking._client(uri)
        assert [mlflow.get_run(r).info.status for r in opened[str(run.id)]] == ["KILLED", "KILLED"]
    assert tracking._client().get_run(other_flow_run).info.status == "RUNNING"  # not a run `gym down` stopped


def test_gym_down_with_no_mlflow_store_makes_none(prefect_server, gym_home):
    """A run stopped before it tracked anything: no store is created to end nothing in."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    from flows.services import crash_pool_runs

    with get_client(sync_client=True) as client:
        _pool_run(client, "qa-down-empty", {})
    notes: list[str] = []
    assert crash_pool_runs(str(PREFECT_API_URL.value()), pool="qa-down-empty", notes=notes) == 1
    assert notes == [] and not (gym_home / "mlflow" / "mlflow.db").exists()


@pytest.mark.parametrize("level", ["ERROR", "INFO"])
def test_registering_prints_nothing_where_mlflow_is_quieted(gym_home, capfd, monkeypatch, level):
    """ "Successfully registered model" and "Created version" went straight to stderr in every run: MLflow
    prints them to its logging stream, which no log level reaches. Still there when MLflow's level is
    INFO (--verbose)."""
    from gym import tracking
    from gym.models import resolve

    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", level)
    base = resolve("gym-tiny")
    capfd.readouterr()
    tracking.register_model(tracking.start_run("register"), Path(base.path), f"tiny-{level.lower()}", {})
    err = capfd.readouterr().err
    assert ("Successfully registered model" in err) == (level == "INFO")
    from mlflow.utils.logging_utils import MLFLOW_LOGGING_STREAM

    assert MLFLOW_LOGGING_STREAM.enabled  # left as it was
