"""Evaluation task: exact match of a model on a held-out instruction split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym import tracking
from gym.eval.exact_match import ExactMatch, evaluate
from gym.models import ModelRef
from tasks._common import gym_task


@gym_task(name="exact-match", task_run_name="exact match {label}")
def exact_match(
    model: ModelRef,
    dataset: Any,
    label: str,
    limit: int | None = None,
    parent_run_id: str | None = None,
    tracking_uri: str | None = None,
) -> ExactMatch:
    result = evaluate(model, Path(dataset.path), limit=limit)
    if parent_run_id:
        run_id = tracking.start_run(
            f"eval-{label}",
            params={"model": model.path, "dataset_digest": dataset.digest, "limit": limit},
            parent_run_id=parent_run_id,
            uri=tracking_uri,
        )
        tracking.log_metrics(run_id, {"exact_match": result.exact_match, "n": result.n}, uri=tracking_uri)
        tracking.end_run(run_id, uri=tracking_uri)
    return result
