"""Tracking tasks: open the flow's parent MLflow run, and close it with the run's summary."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from gym import tracking


@task(name="start-tracking", cache_policy=NO_CACHE)
def start_tracking(
    flow_name: str, config: dict[str, Any], flow_run_id: str | None, tracking_uri: str | None
) -> str:
    """Create the parent run of this flow run (params = the flow's config, secrets redacted)."""
    tags = {"gym.flow": flow_name}
    if flow_run_id:
        tags["prefect_flow_run_id"] = flow_run_id
    return tracking.start_run(flow_name, params=config, tags=tags, uri=tracking_uri)


@task(name="finish-tracking", cache_policy=NO_CACHE)
def finish_tracking(run_id: str, summary: dict[str, Any], tracking_uri: str | None) -> None:
    """Log the summary numbers on the parent run, mark it finished, and publish it in the Prefect UI."""
    numbers = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    tracking.log_metrics(run_id, numbers, uri=tracking_uri)
    tracking.end_run(run_id, uri=tracking_uri)
    rows = "\n".join(f"| {k} | {_fmt(v)} |" for k, v in sorted(summary.items()))
    create_markdown_artifact(
        key="gym-summary",
        markdown=f"## gym run summary\n\n| field | value |\n|---|---|\n{rows}\n\nMLflow run: `{run_id}`",
        description="Losses, rewards, exact match and the registered model of this run",
    )


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
