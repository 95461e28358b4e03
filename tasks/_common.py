"""Shared task settings: the cache policy, result persistence, operational policies (retries, timeouts,
GPU concurrency) and how a user's mistake shows in the logs (tasks/_logs.py).

Policies, by kind of task:
- I/O that can fail for a moment (hub downloads, HTTP endpoints, a remote tracking server): `IO_RETRIES`,
  three retries with exponential backoff and jitter, never for a user's mistake (a GymError).
- Training: no retries (a retry inside the same run would repeat the failure, or train twice; re-running
  the flow resumes the stage from its last checkpoint instead) and no timeout (a run can take days).
- Everything else: a timeout (`*_TIMEOUT_S`), so a stuck task fails instead of holding a worker.
- Tasks that put a model on the accelerator (`gym_task(gpu=True)`) carry the `GPU_TAG` tag when the
  Prefect API has a concurrency limit on it (`gym up` sets one slot per GPU): the limit keeps two of
  them off one GPU. Without a limit the tag is left off, because a tagged task asks the API for a slot
  before it starts (even when its result is cached), and that request opens a write transaction on the
  API's database. On Prefect's default SQLite database it collided with the API's own writes in about
  half the runs measured here, and Prefect's client retried it 2 s later: a 2 s stall for a slot of
  no limit.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import Task, tags, task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CacheKeyFnPolicy, CachePolicy
from prefect.context import FlowRunContext, TaskRunContext
from prefect.settings import (
    PREFECT_LOCAL_STORAGE_PATH,
    PREFECT_RESULTS_PERSIST_BY_DEFAULT,
    PREFECT_TASKS_REFRESH_CACHE,
    temporary_settings,
)
from prefect.tasks import exponential_backoff
from pydantic import BaseModel

from gym import workspace
from gym.errors import GymError
from gym.hashing import hash_obj, library_digest
from tasks import _heartbeats
from tasks._logs import quiet_run_logs

_heartbeats.install()  # a finished flow returns at once, not when its heartbeat thread next wakes

# Run labels and where a run is tracked never change a task's output, so they stay out of its cache key.
RUN_LABELS = ("parent_run_id", "flow_run_id", "tracking_uri")
# gym's own code and registry (templates, model entries) are inputs of every task too, and so is the
# workspace: results name its files by absolute path, so a copied or moved workspace (its
# prefect/results with it) must not be served results that point into the old one.
LIBRARY = CacheKeyFnPolicy(
    cache_key_fn=lambda _ctx, _inputs: hash_obj([library_digest(), str(workspace.home())])
)
_INPUTS = INPUTS
for _label in RUN_LABELS:
    _INPUTS = _INPUTS - _label
CACHE_POLICY = _INPUTS + TASK_SOURCE + LIBRARY


@dataclass
class PresentArtifacts(CachePolicy):
    """`inner`'s key; but a result cached under it that names workspace files that are gone (deleted by
    hand), or model folders whose weights can't be read (cut short: a cheap check of headers against
    sizes), is dropped first, so the task runs again, rebuilds them and records its result under the same
    key, instead of handing on paths to nothing or to damaged weights. Records in other result storage
    (a remote one) are served as Prefect would: `--refresh-cache` rebuilds there."""

    inner: CachePolicy | None = None

    def compute_key(
        self, task_ctx: TaskRunContext, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any
    ) -> str | None:
        assert self.inner is not None
        key = self.inner.compute_key(
            task_ctx=task_ctx, inputs=inputs, flow_parameters=flow_parameters, **kwargs
        )
        if key is not None and (stale := _stale_record(task_ctx.result_store, key)) is not None:
            stale.unlink(missing_ok=True)
        return key


def _stale_record(store: Any, key: str) -> Path | None:
    """The file of the result recorded under `key` in local result storage, if it names workspace
    artifacts that no longer exist or model weights that can't be read."""
    from prefect.results import ResultRecord

    basepath = getattr(store.result_storage, "basepath", None)
    if store.metadata_storage is not None or not basepath:
        return None
    record = Path(str(basepath)).expanduser() / key
    try:
        result = ResultRecord.deserialize(record.read_bytes()).result
    except Exception:  # none yet, or one Prefect itself will judge
        return None
    return record if unusable_files(result, workspace.home()) else None


# Fields of results that name a workspace artifact (datasets, tokenized data, training stages, runs).
ARTIFACT_FIELDS = ("path", "stage_dir", "model_dir", "adapter_dir", "run_dir")
# Those of them that name a folder of weights.
WEIGHTS_FIELDS = ("model_dir", "adapter_dir")


def unusable_files(value: Any, root: Path) -> list[Path]:
    """The artifacts under workspace `root` that a task's result names (`ARTIFACT_FIELDS` of the models in
    it, at any depth) and that do not exist, or are weights folders whose weights can't be read."""
    if isinstance(value, BaseModel):
        found = []
        for name, field in dict(value).items():
            if name in ARTIFACT_FIELDS and isinstance(field, str | Path) and os.path.isabs(field):
                path = Path(field)
                if path.is_relative_to(root) and (
                    not path.exists()
                    or (name in WEIGHTS_FIELDS and path.is_dir() and workspace.weights_problem(path))
                ):
                    found.append(path)
            else:
                found += unusable_files(field, root)
        return found
    if isinstance(value, dict):
        return [p for v in value.values() for p in unusable_files(v, root)]
    if isinstance(value, list | tuple):
        return [p for v in value for p in unusable_files(v, root)]
    return []


# Tag of every task that loads a model onto the accelerator (training, evaluation).
GPU_TAG = "gym-gpu"
HOUR = 3600
# Timeouts: a task stuck on a dead connection or file share fails, instead of holding a worker (and a
# GPU slot) forever. Generous: a 70B download or a hub dataset of millions of records fits.
MODEL_TIMEOUT_S = 4 * HOUR
DATA_TIMEOUT_S = 4 * HOUR
EVAL_TIMEOUT_S = 8 * HOUR


def transient(_task: Any, _task_run: Any, state: Any) -> bool:
    """Retry condition: worth another try unless the failure is the user's mistake (a GymError)."""
    return not isinstance(state.result(raise_on_failure=False), GymError)


# Flaky I/O: retried after ~10, 20 and 40 s (each +-50%), unless the error is the user's.
IO_RETRIES: dict[str, Any] = {
    "retries": 3,
    "retry_delay_seconds": exponential_backoff(backoff_factor=10),
    "retry_jitter_factor": 0.5,
    "retry_condition_fn": transient,
}


def gym_task(
    identity: Callable[..., Any] | None = None,
    gpu: bool = False,
    record: Callable[..., None] | None = None,
    exclude: tuple[str, ...] = (),
    **kwargs: Any,
) -> Callable[..., Any]:
    """`@task` with gym's cache policy and persisted results (override any option by keyword).

    `identity`, called with the task's arguments, returns what else the output depends on that the
    arguments don't show (a file's size and mtime behind a dataset name): it joins the cache key.
    `gpu`: the task puts a model on the accelerator (tagged `GPU_TAG` where the API limits it).
    `record(result, **arguments)`: what the task does with its result in this flow run (its MLflow run,
    its Prefect artifact), done again when the result is served from cache (`recorded_when_cached`).
    `exclude`: arguments left out of the key as they are (`identity` keys the part of them that counts).
    """
    policy: CachePolicy = CACHE_POLICY
    if exclude:
        inputs = _INPUTS
        for name in exclude:
            inputs = inputs - name
        policy = inputs + TASK_SOURCE + LIBRARY
    if identity is not None:
        policy = policy + CacheKeyFnPolicy(cache_key_fn=lambda _ctx, inputs: hash_obj(identity(**inputs)))
    options: dict[str, Any] = {
        "cache_policy": PresentArtifacts(inner=policy),
        "persist_result": True,
        "retries": 0,
    }
    if record is not None:
        options["on_completion"] = [recorded_when_cached(record)]
    options.update(kwargs)
    if gpu:
        return lambda fn: GpuTask(fn=fn, **options)
    return task(**options)


CACHED_TAG = "gym.from_cache"  # on an MLflow run that records a result served from cache


def recorded_when_cached(record: Callable[..., None]) -> Callable[..., None]:
    """An on_completion hook: a result served from cache is recorded in this flow run as the run that
    computed it recorded it (a nested MLflow run under this flow run's, tagged `CACHED_TAG`, and the
    Prefect artifact), by `record(result, **the call's arguments)`. Without it a re-run's MLflow run held
    only the summary: the per-stage and per-benchmark numbers stayed with the first run. Best effort: the
    cached result stands whatever happens here."""

    def record_cached_result(task: Any, task_run: Any, state: Any) -> None:  # _logs.RECORD_HOOK
        if state.name != "Cached":
            return
        ctx = TaskRunContext.get()
        if ctx is None:
            return
        try:
            record(state.result(), **ctx.parameters)
        except Exception as exc:
            import logging

            logging.getLogger("gym").warning(
                "%s: couldn't record its cached result in this run (%s: %s)",
                task_run.name,
                type(exc).__name__,
                str(exc).strip().splitlines()[0] if str(exc).strip() else "",
            )

    return record_cached_result


class GpuTask(Task[Any, Any]):
    """A task that puts a model on the accelerator: called or submitted with the `GPU_TAG` tag when the
    API this run talks to has a concurrency limit on that tag, without it otherwise."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with tags(*gpu_tags()):
            return super().__call__(*args, **kwargs)

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        with tags(*gpu_tags()):
            return super().submit(*args, **kwargs)


# (flow run id, whether the API has a limit on GPU_TAG): asked once per flow run.
_LIMIT_SEEN: list[tuple[str, bool]] = []


def gpu_tags() -> tuple[str, ...]:
    """(GPU_TAG,) when the Prefect API has a concurrency limit on it, else ()."""
    ctx = FlowRunContext.get()
    run_id = str(ctx.flow_run.id) if ctx is not None and ctx.flow_run is not None else None
    if run_id is not None and _LIMIT_SEEN and _LIMIT_SEEN[0][0] == run_id:
        return (GPU_TAG,) if _LIMIT_SEEN[0][1] else ()
    limited = _has_gpu_limit()
    if run_id is not None:
        _LIMIT_SEEN[:] = [(run_id, limited)]
    return (GPU_TAG,) if limited else ()


def _has_gpu_limit() -> bool:
    """A read of the API (no write transaction); when it can't answer, the tag stays on and Prefect
    handles the limit as it would."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            client.read_global_concurrency_limit_by_name(f"tag:{GPU_TAG}")
    except ObjectNotFound:
        return False
    except Exception:  # any other failure: keep Prefect's own behaviour
        return True
    return True


# Every process that runs gym tasks (a CLI run, a worker's flow run, `flow.serve`) imports this module.
quiet_run_logs()


@contextlib.contextmanager
def workspace_settings(refresh_cache: bool = False) -> Iterator[None]:
    """Point Prefect's result storage at the workspace (`$GYM_HOME/prefect/results`) for a run.

    `refresh_cache` runs every task instead of reading the cache (and records the new results).
    """
    updates: dict[Any, Any] = {
        PREFECT_LOCAL_STORAGE_PATH: workspace.path("prefect", "results"),
        PREFECT_RESULTS_PERSIST_BY_DEFAULT: True,
    }
    if refresh_cache:
        updates[PREFECT_TASKS_REFRESH_CACHE] = True
    with temporary_settings(updates=updates):
        yield
