"""Evaluation task: exact match of a model on a held-out instruction split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym import tracking
from gym.eval.exact_match import ExactMatch, evaluate
from gym.models import ModelRef
from tasks._common import EVAL_TIMEOUT_S, GPU_TAG, gym_task
from tasks.tracking import cell, publish, stage_run, table


@gym_task(
    name="exact-match", task_run_name="exact match {label}", tags=[GPU_TAG], timeout_seconds=EVAL_TIMEOUT_S
)
def exact_match(
    model: ModelRef,
    dataset: Any,
    label: str,
    limit: int | None = None,
    parent_run_id: str | None = None,
    tracking_uri: str | None = None,
) -> ExactMatch:
    params = {"model": model.path, "dataset_digest": dataset.digest, "limit": limit}
    with stage_run(f"eval-{label}", params, parent_run_id, tracking_uri) as run_id:
        result = evaluate(model, Path(dataset.path), limit=limit)
        if run_id:
            tracking.log_metrics(run_id, {"exact_match": result.exact_match, "n": result.n}, uri=tracking_uri)
    samples = "\n".join(
        f"| {cell(s['prompt'])} | {cell(s['reference'])} | {cell(s['prediction'])} |"
        for s in result.samples[:5]
    )
    publish(
        f"exact-match-{label}",
        f"## exact match {label}\n\n{table({'exact match': result.exact_match, 'records': result.n})}\n"
        f"| prompt (end) | reference | prediction |\n|---|---|---|\n{samples}\n",
        f"Held-out exact match {label} training",
    )
    return result
