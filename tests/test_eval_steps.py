"""Held-out evaluation during training (eval_steps / eval_strategy), as LLaMA-Factory and transformers do it:
the Trainer's setting, and the metrics of each evaluation reaching the stage's MLflow run and loss plot."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
from mlflow import MlflowClient

from gym import tracking
from gym.data.tokenize import TokenizeSettings
from gym.train import TrainConfig
from gym.train.common import evals_from, trl_args
from tasks.data import ingest_dataset, split_dataset, tokenize_dataset
from tasks.model import resolve_model
from tasks.train import train_stage

BATCH = {"per_device_train_batch_size": 4}


def args(tmp_path: Path, held_out: bool = True, **fields) -> dict:
    return trl_args(TrainConfig(**BATCH, **fields), tmp_path, held_out=held_out)


def test_eval_steps_evaluate_every_n_steps_only_where_there_is_held_out_data(tmp_path, caplog):
    assert args(tmp_path)["eval_strategy"] == "no", "unset: before and after training only, as before"
    assert args(tmp_path, eval_steps=3).items() >= {"eval_strategy": "steps", "eval_steps": 3}.items()
    assert args(tmp_path, eval_strategy="epoch")["eval_strategy"] == "epoch"
    no = args(tmp_path, eval_strategy="no", eval_steps=3)
    assert no["eval_strategy"] == "no", "no wins, as in transformers"
    assert args(tmp_path)["per_device_eval_batch_size"] == 4, "default: the training batch"
    assert args(tmp_path, per_device_eval_batch_size=1)["per_device_eval_batch_size"] == 1
    assert not caplog.records

    with caplog.at_level(logging.WARNING, logger="gym.train"):
        assert args(tmp_path, held_out=False, eval_steps=3)["eval_strategy"] == "no"
        assert args(tmp_path, method="grpo", eval_strategy="epoch")["eval_strategy"] == "no"
    first, second = (r.getMessage() for r in caplog.records)
    assert "eval_steps 3 ignored: the stage has no held-out data" in first
    assert "grpo: eval_strategy epoch ignored: online RL methods" in second


def test_steps_without_eval_steps_follow_logging_steps_as_in_transformers(tmp_path):
    from transformers import TrainingArguments

    given = args(tmp_path, eval_strategy="steps", logging_steps=7)
    assert TrainingArguments(**given).eval_steps == 7


def test_each_evaluation_during_training_becomes_a_curve_without_timings():
    history = [
        {"loss": 2.0, "step": 1},
        {"eval_loss": 1.9, "eval_runtime": 0.1, "eval_rewards/margins": 0.0, "epoch": 0.5, "step": 2},
        {"loss": 1.5, "step": 3},
        {"eval_loss": 1.4, "eval_samples_per_second": 9.0, "eval_rewards/margins": 0.2, "step": 4},
        {"train_runtime": 1.0, "step": 4},
    ]
    assert evals_from(history) == {
        "eval_loss": [(2, 1.9), (4, 1.4)],
        "eval_rewards/margins": [(2, 0.0), (4, 0.2)],
    }


def test_held_out_loss_every_two_steps_reaches_the_stages_mlflow_run(gym_home):
    """val_size holds out 32 records; eval_steps 2 over 6 steps evaluates them at steps 2, 4 and 6."""
    parent = tracking.start_run("flow")
    model = resolve_model.fn("gym-tiny")
    train_raw, held_raw = split_dataset.fn(ingest_dataset.fn("demo_sft"), 32, 42, "demo_sft")
    data = tokenize_dataset.fn(train_raw, model, TokenizeSettings(max_samples=256))
    held_out = tokenize_dataset.fn(held_raw, model, TokenizeSettings())
    config = TrainConfig(
        method="sft",
        learning_rate=3e-3,
        max_steps=6,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=8,
        logging_steps=1,
        eval_steps=2,
    )
    result, _ = train_stage.fn(config, model, data, held_out, parent)

    steps = [step for step, _ in result.evals["eval_loss"]]
    assert steps == [2, 4, 6]
    losses = [loss for _, loss in result.evals["eval_loss"]]
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] < result.eval_before["eval_loss"], "the held-out loss falls as it trains"
    assert losses[-1] == pytest.approx(result.eval_after["eval_loss"]), "the last is the final model's"
    assert "eval_runtime" not in result.evals and "eval_mean_token_accuracy" in result.evals

    client = MlflowClient(tracking.tracking_uri())
    (run,) = client.search_runs(
        [client.get_run(parent).info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'"
    )
    curve = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval_loss"))
    assert [step for step, _ in curve] == [2, 4, 6]
    assert [value for _, value in curve] == pytest.approx(losses)
    assert len(client.get_metric_history(run.info.run_id, "train_loss")) == 6
