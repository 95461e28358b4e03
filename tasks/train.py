"""Training task: run one stage (any method in gym.train.METHODS) and track it in a nested MLflow run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym import tracking
from gym.models import ModelRef, derived
from gym.plots import loss_plot
from gym.train import TrainConfig, TrainResult, run
from tasks._common import gym_task


@gym_task(name="train", task_run_name="train {config.method}")
def train_stage(
    config: TrainConfig,
    model: ModelRef,
    train_data: Any,
    eval_data: Any | None = None,
    parent_run_id: str | None = None,
    tracking_uri: str | None = None,
) -> tuple[TrainResult, ModelRef]:
    """Train, then log params, the loss curve, eval metrics and a loss plot under the flow's run."""
    result = run(config, model, Path(train_data.path), Path(eval_data.path) if eval_data else None)
    if parent_run_id:
        _track(config, model, train_data, result, parent_run_id, tracking_uri)
    return result, derived(model, Path(result.model_dir), result.digest)


def _track(
    config: TrainConfig, model: ModelRef, data: Any, result: TrainResult, parent: str, uri: str | None
) -> None:
    params = {
        **config.model_dump(),
        "base_model": model.base_model,
        "start_model": model.path,
        "dataset_digest": data.digest,
    }
    run_id = tracking.start_run(
        config.method, params=params, parent_run_id=parent, uri=uri, tags={"gym.stage_digest": result.digest}
    )
    tracking.log_curve(run_id, "train_loss", result.losses, uri=uri)
    tracking.log_metrics(run_id, {f"before_{k}": v for k, v in result.eval_before.items()}, uri=uri)
    tracking.log_metrics(run_id, {f"after_{k}": v for k, v in result.eval_after.items()}, uri=uri)
    tracking.log_metrics(
        run_id,
        {
            "trainable_params": result.trainable_params,
            "total_params": result.total_params,
            "train_seconds": result.train_seconds,
            "train_tokens_per_second": result.tokens_per_second,
            "global_step": result.global_step,
        },
        uri=uri,
    )
    plot = loss_plot(
        {config.method: result.losses}, Path(result.stage_dir) / "loss.png", f"{config.method} loss"
    )
    tracking.log_artifact(run_id, plot, uri=uri)
    tracking.end_run(run_id, uri=uri)
