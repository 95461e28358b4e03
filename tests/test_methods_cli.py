"""`gym train` for the methods and adaptation types: the summary's signal, the tracked choices, and
what an unknown method or type says."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.commands import DEMO_WARM_START, cmd_train, demo_args
from gym.train import METHODS
from gym.train.config import FINETUNING_TYPES
from tests.test_flows import KEYS, run_script

# The held-out signal each preference method reports in the summary (metric_name).
PREFERENCE_SIGNALS = {
    "dpo": "reward_margin",
    "ipo": "reward_margin",
    "cdpo": "reward_margin",
    "hinge": "reward_margin",
    "kto": "logp_gap",
    "orpo": "reward_margin",
    "simpo": "reward_margin",
}


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(PREFERENCE_SIGNALS))
def test_each_preference_method_with_no_other_flags_moves_its_signal_the_right_way(gym_home, method):
    """`gym train --method M --json` exactly as the README gives it: M's demo data, gym-tiny's defaults."""
    gym = str(Path(sys.executable).parent / "gym")
    logs: list[str] = []
    out = run_script([gym, "train", "--method", method, "--json"], gym_home, logs=logs)
    assert out["metric_name"] == PREFERENCE_SIGNALS[method]
    # The console is gym's lines: no library warnings (TRL's experimental import, its collator note)
    assert "TRLExperimentalWarning" not in logs[0] and "DataCollator" not in logs[0], logs[0][-3000:]
    # Held-out evaluation is deterministic on CPU: a rise beyond float noise is the training's doing.
    assert out["metric_last"] > out["metric_first"] + 1e-4, (out["metric_first"], out["metric_last"])
    assert out[f"{method}_reward_margin"] > out[f"{method}_reward_margin_before"]
    if method in DEMO_WARM_START:  # SFT ran first, and the method started from its result
        assert out["sft_loss_last"] < 0.5 * out["sft_loss_first"]
    else:
        assert out["sft_loss_first"] is None


def test_demo_data_and_warm_start_fill_only_what_is_not_given():
    assert demo_args("kto", []) == [
        "--train.method",
        "kto",
        "--dataset",
        "demo_kto",
        "--method_eval_dataset",
        "demo_kto_eval",
        "--warm_start.dataset",
        "demo_sft",
    ]
    assert "--warm_start.dataset" not in demo_args("dpo", [])
    # SFT's demo holds data out too: its signal is the held-out eval_loss, not one batch's training loss
    assert demo_args("sft", []) == [
        "--train.method",
        "sft",
        "--dataset",
        "demo_sft",
        "--method_eval_dataset",
        "demo_sft_eval",
    ]
    # The user's data: no demo data, no warm start; the user's own held-out data is kept.
    assert demo_args("kto", ["--dataset", "mine.jsonl"]) == ["--train.method", "kto"]
    assert "demo_kto_eval" not in demo_args("kto", ["--method_eval_dataset=held.jsonl"])


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


def test_a_method_as_finetuning_type_that_disagrees_with_the_method_is_refused(capsys):
    """`--method kto --finetuning_type dpo` trained DPO and registered it, saying nothing."""
    from flows.commands import method_of

    assert cmd_train(["--method", "kto", "--finetuning_type", "dpo"]) == 2
    assert "--finetuning_type dpo (a method, in the papers' form) and method kto" in capsys.readouterr().err
    assert cmd_train(["--stage", "sft", "--finetuning_type", "dpo"]) == 2
    assert method_of(["--method", "dpo", "--finetuning_type", "dpo"])[0] == "dpo"  # agreeing: fine
    assert method_of(["--finetuning_type", "orpo"])[0] == "orpo"  # the papers' form alone


def test_unknown_method_or_adaptation_type_lists_the_valid_ones(capsys):
    assert cmd_train(["--method", "dpoo"]) == 2
    err = capsys.readouterr().err
    assert "'dpoo'" in err and all(m in err for m in METHODS) and "sft_then_dpo" in err
    listed = err.strip().rsplit("available: ", 1)[1].split(", ")
    assert len(listed) == len(set(listed)), listed  # each name once
    assert cmd_train(["--finetuning_type", "qlora4"]) == 2
    err = capsys.readouterr().err
    assert "'qlora4'" in err and all(t in err for t in FINETUNING_TYPES)
