"""Shared task settings: the cache policy, result persistence and the workspace-bound Prefect settings."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE
from prefect.settings import (
    PREFECT_LOCAL_STORAGE_PATH,
    PREFECT_RESULTS_PERSIST_BY_DEFAULT,
    temporary_settings,
)

from gym import workspace

# Run labels never change a task's output, so they stay out of its cache key.
RUN_LABELS = ("parent_run_id", "flow_run_id")
CACHE_POLICY = (INPUTS - RUN_LABELS[0] - RUN_LABELS[1]) + TASK_SOURCE


def gym_task(**kwargs: Any) -> Callable[..., Any]:
    """`@task` with gym's cache policy and persisted results (override any option by keyword)."""
    options: dict[str, Any] = {"cache_policy": CACHE_POLICY, "persist_result": True, "retries": 0}
    options.update(kwargs)
    return task(**options)


@contextlib.contextmanager
def workspace_settings() -> Iterator[None]:
    """Point Prefect's result storage at the workspace (`$GYM_HOME/prefect/results`) for a run."""
    updates = {
        PREFECT_LOCAL_STORAGE_PATH: workspace.path("prefect", "results"),
        PREFECT_RESULTS_PERSIST_BY_DEFAULT: True,
    }
    with temporary_settings(updates=updates):
        yield
