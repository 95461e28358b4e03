"""Preflight task: the first task of every flow checks its inputs before any work starts.

Model and template names, dataset names and files, and which method trains on which data are
checked in about a second (gym.preflight), so a deployment run with a mistyped parameter fails at
once with the reason as its state message, before any model is built or loaded.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from gym import preflight


# Never cached: it must see the registry, files and MLflow models as they are now.
@task(name="check-inputs", task_run_name="check inputs", cache_policy=NO_CACHE, persist_result=False)
def check_inputs(config: Any) -> None:
    """Raise a GymError naming the flow parameter at fault, else log what `auto` held-out data left out."""
    preflight.check(config)
    for note in config.held_out_notes() if hasattr(config, "held_out_notes") else []:
        get_run_logger().info(note)
