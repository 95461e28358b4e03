"""Registration tasks: register the final model in MLflow's registry (lineage tags, model card, alias)
and export it as a hub-style directory. Never cached: the registry, not Prefect's cache, knows which
version an alias points to now (registering unchanged content reuses its version instead of adding
one), and an export must exist on disk after the run whatever happened to it before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.cache_policies import NO_CACHE

from gym import tracking
from gym.export import export_model
from gym.lineage import Lineage, describe
from gym.models import ModelRef
from gym.registration import register
from tasks._common import gym_task
from tasks.tracking import link, publish, table


@gym_task(name="register-model", task_run_name="register {name}", cache_policy=NO_CACHE, persist_result=False)
def register_model(
    model: ModelRef,
    name: str,
    alias: str,
    lineage: dict[str, Any],
    parent_run_id: str | None = None,
    flow_run_id: str | None = None,
    tracking_uri: str | None = None,
    *,
    config: dict[str, Any] | None = None,
    stages: dict[str, Any] | None = None,
    before: Any | None = None,
    after: Any | None = None,
) -> dict[str, Any]:
    """Register `model` as a version of `name` with `alias`, tagged with its lineage and scores.

    `lineage` maps roles to digests (`sft_dataset`, `sft_stage`...); `config`, `stages` and the
    `before`/`after` evaluations add dataset names, hyperparameters, the config digest and scores.
    """
    facts = describe(model.base_model, model.template, lineage, config, stages, before, after, flow_run_id)
    params = {"registered_model": name, "alias": alias}
    # Registration logs the model into a run: a nested one under the flow's run, or its own.
    with tracking.span("register", params=params, parent_run_id=parent_run_id, uri=tracking_uri) as run_id:
        done = register(Path(model.path), name, facts, run_id, alias=alias, uri=tracking_uri)
        tags = {"gym.model_version": done.version, "gym.reused_version": done.reused}
        tracking.set_tags(run_id, tags, uri=tracking_uri)
    url = tracking.model_version_url(name, done.version, tracking_uri)
    note = (
        "identical content was already registered: that version is reused" if done.reused else "new version"
    )
    publish(
        "registered-version",
        f"## {link(url, f'{name} version {done.version}')} ({note})\n\n"
        f"{table({'alias': alias, 'content digest': done.content_digest, **facts.scores})}",
        f"Registration of {name}",
    )
    return {"name": name, "version": done.version, "alias": alias, "run_id": run_id, "reused": done.reused}


@gym_task(
    name="export-model", task_run_name="export to {output_dir}", cache_policy=NO_CACHE, persist_result=False
)
def export(
    model: ModelRef,
    output_dir: str,
    registered: dict[str, Any] | None = None,
    tracking_uri: str | None = None,
) -> str:
    """Write the hub-style directory; with `registered`, its card is the registered version's card."""
    lineage, name = None, None
    if registered is not None:
        name = registered["name"]
        tags = tracking.resolve_model_uri(f"models:/{name}/{registered['version']}", uri=tracking_uri)[3]
        lineage = Lineage.from_tags(tags)
    return str(export_model(model.path, Path(output_dir), lineage=lineage, name=name))
