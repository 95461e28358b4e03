"""Training task: run one stage (any method in gym.train.METHODS) inside a nested MLflow run that spans it.

No retries (re-running the flow resumes the stage from its last checkpoint instead) and no timeout;
tagged `gym-gpu` where the Prefect API limits that tag, so two training tasks stay off one GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym import tracking
from gym.models import ModelRef, derived
from gym.plots import loss_plot
from gym.rewards.base import code_identity
from gym.rewards.base import identity as reward_identity
from gym.train import TrainConfig, TrainResult, rl_common, run
from gym.train.config import unread
from gym.train.rl_config import ONLINE_METHODS
from tasks._common import CACHED_TAG, gym_task
from tasks.tracking import fmt, link, publish, run_logs, stage_run, table

# Held-out numbers the stage's artifact shows (the Trainer reports many more; MLflow has them all).
HELD_OUT = ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins", "eval_mean_token_accuracy")


def _rewards(config: TrainConfig, **_: Any) -> Any:
    """What an online stage's reward functions and multi-turn environment compute (their code), which
    the config names only."""
    if config.method not in ONLINE_METHODS:
        return None
    rewards, environment = reward_identity(config.rl.rewards), config.rl.environment
    return {"rewards": rewards, "environment": code_identity(environment)} if environment else rewards


@gym_task(
    name="train",
    task_run_name="train {config.method}",
    gpu=True,
    identity=_rewards,
    record=lambda output, **call: _record_cached(output[0], **call),
)
def train_stage(
    config: TrainConfig,
    model: ModelRef,
    train_data: Any,
    eval_data: Any | None = None,
    parent_run_id: str | None = None,
    tracking_uri: str | None = None,
) -> tuple[TrainResult, ModelRef]:
    """Train; log params, the loss curve, eval metrics (curves for those during training) and a loss plot
    in a run under the flow's run."""
    given = _given(config, model, train_data)
    with stage_run(config.method, given, parent_run_id, tracking_uri) as run_id, run_logs():
        result = run(config, model, Path(train_data.path), Path(eval_data.path) if eval_data else None)
        if run_id:
            _track(config, result, given, run_id, tracking_uri)
    _publish(config, result, run_id, tracking_uri)
    return result, derived(model, Path(result.model_dir), result.digest)


def _given(config: TrainConfig, model: ModelRef, train_data: Any) -> dict[str, str]:
    """The stage run's params as the user gave them. What the user left unset is logged once training
    has made it concrete (the model's and the method's defaults, gym's choices): a param once logged
    can't change, and "None" was all it said."""
    params = {
        **config.model_dump(exclude=unread(config)),  # not the settings its method doesn't read
        "base_model": model.base_model,
        "start_model": model.path,
        "dataset_digest": train_data.digest,
    }
    return {k: v for k, v in tracking.redact(params).items() if v != "None"}


def _record_cached(
    result: TrainResult,
    config: TrainConfig,
    model: ModelRef,
    train_data: Any,
    parent_run_id: str | None = None,
    tracking_uri: str | None = None,
    **_: Any,
) -> None:
    """A stage served from cache, recorded in this flow run as `train_stage` records the one it trains."""
    given = _given(config, model, train_data)
    with stage_run(config.method, given, parent_run_id, tracking_uri) as run_id:
        if run_id:
            _track(config, result, given, run_id, tracking_uri, cached=True)
    _publish(config, result, run_id, tracking_uri)


def _track(
    config: TrainConfig,
    result: TrainResult,
    given: dict[str, str],
    run_id: str,
    uri: str | None,
    cached: bool = False,
) -> None:
    concrete = tracking.redact(result.hyperparameters)
    tracking.log_params(run_id, {k: v for k, v in concrete.items() if k not in given}, uri=uri)
    # The choices gym made itself (QLoRA bit width, reference mode...) as tags: visible beside the params.
    tags = {"gym.stage_digest": result.digest, **{f"gym.{k}": v for k, v in result.choices.items()}}
    if cached:
        tags[CACHED_TAG] = "true"
    tracking.set_tags(run_id, tags, uri=uri)
    tracking.log_curve(run_id, "train_loss", result.losses, uri=uri)
    for key, points in result.evals.items():  # held-out metrics at each evaluation during training
        tracking.log_curve(run_id, key, points, uri=uri)
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
            **{
                f"{result.metric_name}_{k}": v
                for k, v in (("first", result.metric_first), ("last", result.metric_last))
                if v is not None
            },
        },
        uri=uri,
    )
    curves = {config.method: result.losses}
    if result.evals.get("eval_loss"):
        curves["held-out"] = result.evals["eval_loss"]
    plot = loss_plot(curves, Path(result.stage_dir) / "loss.png", f"{config.method} loss")
    tracking.log_artifact(run_id, plot, uri=uri)
    if config.method in ONLINE_METHODS:  # reward curves, KL, clip fraction, sample completions
        rl_common.track(run_id, result.stage_dir, uri=uri)


def _publish(config: TrainConfig, result: TrainResult, run_id: str | None, uri: str | None) -> None:
    """The stage's markdown artifact: what it did, its numbers, and its MLflow run and loss plot."""
    evals = {
        f"held-out {k.removeprefix('eval_')}": f"{fmt(result.eval_before.get(k, float('nan')))} → {fmt(v)}"
        for k, v in result.eval_after.items()
        if k in HELD_OUT
    }
    first, last = result.metric_first, result.metric_last
    rows = {
        "method": f"{config.method} ({config.finetuning_type})",
        "steps": result.global_step,
        "resumed from": Path(result.resumed_from).name if result.resumed_from else None,
        "training loss": f"{fmt(result.loss_first)} → {fmt(result.loss_last)}",
        result.metric_name: f"{fmt(first)} → {fmt(last)}" if result.metric_name != "loss" else None,
        "training time": f"{result.train_seconds:.1f} s",
        "trainable / total parameters": f"{result.trainable_params:,} / {result.total_params:,}",
        **{what.replace("_", " "): choice for what, choice in result.choices.items()},
        **evals,
        "model": f"`{result.model_dir}`",
    }
    plot = Path(result.stage_dir) / "loss.png"
    plot_url = tracking.artifact_url(run_id, "loss.png", uri) if run_id else None
    lines = [f"## {config.method} stage\n", table(rows)]
    if run_id:
        lines.append(f"MLflow run: {link(tracking.run_url(run_id, uri), f'`{run_id}`')}  ")
    lines.append(f"![{config.method} loss]({plot_url})" if plot_url else f"loss plot: `{plot}`")
    publish(
        f"stage-{config.method.replace('_', '-')}",
        "\n".join(lines),
        f"{config.method} stage: what it did and its numbers",
    )
