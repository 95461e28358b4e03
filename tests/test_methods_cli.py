"""`gym train` for the methods and adaptation types: the summary's signal, the tracked choices, and
what an unknown method or type says."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.commands import cmd_train
from gym.train import METHODS
from gym.train.config import FINETUNING_TYPES
from tests.test_flows import KEYS, run_script


@pytest.mark.slow
def test_gym_train_runs_a_preference_method_with_an_adapter_variant(gym_home):
    out = run_script(
        [
            str(Path(sys.executable).parent / "gym"),
            "train",
            "--method",
            "hinge",
            "--finetuning_type",
            "dora",
            "--max-steps",
            "4",
            "--eval_dataset",
            "None",
            "--json",
        ],
        gym_home,
    )
    assert set(out) >= KEYS | {"metric_name", "metric_first", "metric_last"}
    assert out["model_name"] == "gym-tiny-hinge"
    # The method's held-out signal, on the demo pairs' held-out split; 0 where policy = reference.
    assert out["metric_name"] == "reward_margin" and out["metric_first"] == pytest.approx(0, abs=1e-6)
    assert out["metric_last"] == out["hinge_reward_margin"]
    client = MlflowClient(f"sqlite:///{gym_home / 'mlflow' / 'mlflow.db'}")
    parent = client.get_run(out["mlflow_run_id"])
    stage = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.mlflow.runName = 'hinge'",
    )[0]
    # gym chose the reference itself: 4 steps x 16 pairs live beat precomputing 800 pairs.
    assert stage.data.tags["gym.reference"].startswith("live:")
    assert stage.data.params["finetuning_type"] == "dora"
    assert "reward_margin_last" in stage.data.metrics


def test_unknown_method_or_adaptation_type_lists_the_valid_ones(capsys):
    assert cmd_train(["--method", "dpoo"]) == 2
    err = capsys.readouterr().err
    assert "'dpoo'" in err and all(m in err for m in METHODS) and "sft_then_dpo" in err
    listed = err.strip().rsplit("available: ", 1)[1].split(", ")
    assert len(listed) == len(set(listed)), listed  # each name once
    assert cmd_train(["--finetuning_type", "qlora4"]) == 2
    err = capsys.readouterr().err
    assert "'qlora4'" in err and all(t in err for t in FINETUNING_TYPES)
