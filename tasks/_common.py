"""Shared task settings: the cache policy, result persistence and the workspace-bound Prefect settings."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CacheKeyFnPolicy, CachePolicy
from prefect.settings import (
    PREFECT_LOCAL_STORAGE_PATH,
    PREFECT_RESULTS_PERSIST_BY_DEFAULT,
    PREFECT_TASKS_REFRESH_CACHE,
    temporary_settings,
)

from gym import workspace
from gym.hashing import hash_obj, library_digest

# Run labels never change a task's output, so they stay out of its cache key.
RUN_LABELS = ("parent_run_id", "flow_run_id")
# gym's own code and registry (templates, model entries) are inputs of every task too.
LIBRARY = CacheKeyFnPolicy(cache_key_fn=lambda _ctx, _inputs: library_digest())
CACHE_POLICY = (INPUTS - RUN_LABELS[0] - RUN_LABELS[1]) + TASK_SOURCE + LIBRARY


def gym_task(identity: Callable[..., Any] | None = None, **kwargs: Any) -> Callable[..., Any]:
    """`@task` with gym's cache policy and persisted results (override any option by keyword).

    `identity`, called with the task's arguments, returns what else the output depends on that the
    arguments don't show (a file's size and mtime behind a dataset name): it joins the cache key.
    """
    policy: CachePolicy = CACHE_POLICY
    if identity is not None:
        policy = policy + CacheKeyFnPolicy(cache_key_fn=lambda _ctx, inputs: hash_obj(identity(**inputs)))
    options: dict[str, Any] = {"cache_policy": policy, "persist_result": True, "retries": 0}
    options.update(kwargs)
    return task(**options)


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
