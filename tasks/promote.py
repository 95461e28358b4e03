"""Promotion task: move `champion` to the challenger only if it wins on the chosen score by the
margin, and publish the decision (why, with both scores) as a Prefect markdown artifact."""

from __future__ import annotations

import re
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from gym.promotion import Mode, promote
from tasks.tracking import publish


@task(name="promote-model", task_run_name="promote {name}", cache_policy=NO_CACHE)
def promote_model(
    name: str, metric: str, margin: float = 0.0, mode: Mode = "max", tracking_uri: str | None = None
) -> dict[str, Any]:
    decision = promote(name, metric, margin, mode, uri=tracking_uri)
    publish(
        f"promotion-{re.sub(r'[^a-z0-9-]+', '-', name.lower()).strip('-')}",
        decision.markdown(),
        f"Champion decision for {name} on {metric}",
    )
    return decision.model_dump()
