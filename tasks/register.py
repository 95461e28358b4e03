"""Registration tasks: register the final model in MLflow's registry (lineage tags, model card, alias)
and export it as a hub-style directory. Never cached: the registry, not Prefect's cache, knows which
version an alias points to now (registering unchanged content reuses its version instead of adding
one), and an export must exist on disk after the run whatever happened to it before. `record_scores`
puts a later evaluation's scores on the registered version that was evaluated."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect.cache_policies import NO_CACHE

from gym import secrets, tracking, workspace
from gym.errors import GymError, disk_full, disk_full_error
from gym.eval.exact_match import ExactMatch
from gym.eval.results import EvalResult
from gym.export import export_model
from gym.lineage import Lineage, benchmark_scores, describe, heldout_scores, heldout_setups
from gym.models import ModelRef, remake_advice
from gym.registration import evaluated_version, record_scores, register
from tasks._common import gym_task
from tasks.tracking import FLOW_RUN_URL_TAG, flow_run_url, link, publish, table


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
    benchmarks: dict[str, list[EvalResult]] | None = None,
) -> dict[str, Any]:
    """Register `model` as a version of `name` with `alias`, tagged with its lineage and scores.

    `lineage` maps roles to digests (`sft_dataset`, `sft_stage`...); `config`, `stages`, the
    `before`/`after` held-out evaluations and the `benchmarks` results by phase (`before`, `after`)
    add dataset names, hyperparameters, the config digest and scores.
    """
    facts = describe(
        model.base_model,
        model.template,
        lineage,
        config,
        stages,
        before,
        after,
        flow_run_id,
        benchmarks,
        default_system=model.default_system,
    )
    if url := flow_run_url(
        flow_run_id
    ):  # the flow run's page, beside its id (a server's UI; not the temporary API)
        facts = facts.model_copy(update={"extra": {**facts.extra, FLOW_RUN_URL_TAG: url}})
    params = {"registered_model": name, "alias": alias}
    whole(model)
    # Registration logs the model into a run: a nested one under the flow's run, or its own.
    with (
        disk_full_as_error(tracking.tracking_uri(tracking_uri)),
        tracking.span("register", params=params, parent_run_id=parent_run_id, uri=tracking_uri) as run_id,
    ):
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


def whole(model: ModelRef) -> None:
    """Refuse a model folder whose weights can't be read (a file cut short by a full disk or a copy, a
    stage served from Prefect's cache after its weights were damaged): registered or exported, it would
    become a version or a copy nothing can load, and move the alias to it."""
    if Path(model.path).is_dir() and (problem := workspace.weights_problem(Path(model.path))):
        raise GymError(f"model folder {model.path} can't be read ({problem}): {remake_advice(model.path)}")


@contextlib.contextmanager
def disk_full_as_error(where: str | Path) -> Iterator[None]:
    """A full disk under MLflow's store or an export (SQLite's "database or disk is full", OSError 28,
    safetensors' "No space left on device") as one line naming where, not the library's traceback."""
    try:
        yield
    except GymError:
        raise
    except Exception as exc:
        if disk_full(exc) is None:
            raise
        raise disk_full_error(exc, secrets.strip_url(str(where))) from exc


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
    whole(model)
    with disk_full_as_error(output_dir):
        return str(export_model(model.path, Path(output_dir), lineage=lineage, name=name))


@gym_task(
    name="record-scores",
    task_run_name="record scores on {model.name}",
    cache_policy=NO_CACHE,
    persist_result=False,
)
def record_version_scores(
    model: ModelRef,
    benchmarks: list[EvalResult],
    held_out: ExactMatch | None = None,
    flow_run_id: str | None = None,
) -> dict[str, Any]:
    """Record an evaluation of a registered version (`model` resolved from `models:/name@alias`) on that
    version: scores named without a phase suffix (`mmlu`, `mmlu.stem`, `exact_match`)."""
    name, version = evaluated_version(model.name, model.digest)
    scores = heldout_scores(held_out, "") if held_out is not None else {}
    setups: dict[str, str] = heldout_setups(held_out, "") if held_out is not None else {}
    for result in benchmarks:
        named, setup = benchmark_scores(result, "")
        scores.update(named)
        setups.update(setup)
    record_scores(name, version, scores, setups, evaluated_by=flow_run_id)
    url = tracking.model_version_url(name, version)
    publish(
        "recorded-scores",
        f"## Scores recorded on {link(url, f'{name} version {version}')}\n\n{table(scores)}",
        f"Evaluation of {name} version {version}",
    )
    return {"name": name, "version": version, "scores": scores}
