"""Registration tasks: log the final model to MLflow's registry (alias + lineage tags) and export it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym import tracking
from gym.export import export_model
from gym.models import ModelRef
from tasks._common import gym_task


@gym_task(name="register-model", task_run_name="register {name}")
def register_model(
    model: ModelRef,
    name: str,
    alias: str,
    lineage: dict[str, Any],
    parent_run_id: str | None = None,
    flow_run_id: str | None = None,
    tracking_uri: str | None = None,
) -> dict[str, str]:
    """Register `model` as a new version of `name` with `alias`, tagged with its lineage."""
    tags = {**lineage, "base_model": model.base_model, "template": model.template}
    if flow_run_id:
        tags["prefect_flow_run_id"] = flow_run_id
    run_id = tracking.start_run(
        "register",
        params={"registered_model": name, "alias": alias},
        parent_run_id=parent_run_id,
        uri=tracking_uri,
    )
    version = tracking.register_model(run_id, Path(model.path), name, tags, alias=alias, uri=tracking_uri)
    tracking.end_run(run_id, uri=tracking_uri)
    return {"name": name, "version": version, "alias": alias, "run_id": run_id}


@gym_task(name="export-model", task_run_name="export to {output_dir}")
def export(model: ModelRef, output_dir: str) -> str:
    return str(export_model(Path(model.path), Path(output_dir)))
