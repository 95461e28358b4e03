"""Promotion task: move `champion` to the challenger only if it wins on the chosen score by the
margin, and publish the decision (why, with both scores) as a Prefect markdown artifact."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from gym.promotion import ModeChoice, promote
from tasks.tracking import artifact_key, publish


@task(name="promote-model", task_run_name="promote {name}", cache_policy=NO_CACHE)
def promote_model(
    name: str,
    metric: str,
    margin: float = 0.0,
    mode: ModeChoice = "auto",
    tracking_uri: str | None = None,
    challenger: str = "challenger",
) -> dict[str, Any]:
    """Judge the version `challenger` points to (the flow's `output.alias`: the version it registered)."""
    decision = promote(name, metric, margin, mode, challenger, uri=tracking_uri)
    publish(
        f"promotion-{artifact_key(name)}",
        decision.markdown(),
        f"Champion decision for {name} on {metric}",
    )
    return decision.model_dump()
