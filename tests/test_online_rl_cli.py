"""`gym train` for the online RL methods: the --reward / --reward-weight / --group-size flags, the
papers' `--finetuning_type grpo`, and one end-to-end run through Prefect and MLflow (warm start,
GRPO, mean_reward in the JSON line, reward curves and a sample table in MLflow).

Run: .venv/bin/pytest -q tests/test_online_rl_cli.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.online_rl import rl_args
from gym.errors import ConfigError
from tests.test_flows import run_script


def test_reward_flags_become_flow_parameters():
    argv = [
        "--reward",
        "exact_match",
        "--reward",
        "my_pkg.rewards:fn",
        "--reward-weight",
        "0.5",
        "--group-size",
        "4",
    ]
    assert rl_args(argv, demo=False) == [
        "--train.rl.group_size",
        "4",
        "--train.rl.rewards",
        "exact_match",
        "my_pkg.rewards:fn",
        "--train.rl.reward_weights",
        "1.0",
        "0.5",
    ]
    assert rl_args(["--reward=regex:\\d+", "--grpo_group_size=2", "--max-steps", "3"], demo=False) == [
        "--train.rl.group_size",
        "2",
        "--max-steps",
        "3",
        "--train.rl.rewards",
        "regex:\\d+",
    ]


def test_demo_defaults_only_fill_what_is_not_given():
    demo = rl_args([], demo=True)
    assert demo[:4] == ["--warm_start.dataset", "demo_format_sft", "--eval_dataset", "none"]
    assert demo[4:] == [
        "--train.rl.rewards",
        "final_answer",
        "answer_format",
        "--train.rl.reward_weights",
        "1.0",
        "0.5",
    ]
    mine = rl_args(["--reward", "exact_match", "--eval_dataset", "demo_sft_eval"], demo=True)
    assert mine[-2:] == ["--train.rl.rewards", "exact_match"] and "final_answer" not in mine
    assert mine.index("demo_sft_eval") > mine.index("none"), "the user's flag comes later, so it wins"
    # The user's rewards by their other spellings: the demo's were appended after them, and won.
    for given in (
        ["--train.rl.rewards", "exact_match"],
        ["--train.rl.rewards=exact_match"],
        ["--reward_model", "./rm"],
    ):
        assert "final_answer" not in rl_args(given, demo=True), given
    weighed = rl_args(["--train.rl.reward_weights", "5", "5"], demo=True)  # weights for the demo's rewards
    assert weighed.count("--train.rl.reward_weights") == 1 and "final_answer" in weighed


def test_reward_weights_are_finite():
    from pydantic import ValidationError

    from gym.train.rl_config import RLSettings

    with pytest.raises(ValidationError, match="reward_weights must be finite numbers"):
        RLSettings(rewards=["exact_match"], reward_weights=[float("nan")])


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--reward-weight", "0.5"], "right after the --reward"),
        (["--reward", "a", "--reward-weight", "0.5", "--reward-weight", "2"], "right after the --reward"),
        (["--reward", "a", "--reward-weight", "half"], "not a number"),
        (["--reward", "a", "--reward-weight", "nan"], "not a finite number"),  # was accepted: NaN rewards
        (["--reward", "a", "--reward-weight=inf"], "not a finite number"),
        (["--reward"], "needs a value"),
    ],
)
def test_bad_reward_flags(argv: list[str], words: str):
    with pytest.raises(ConfigError, match=words):
        rl_args(argv, demo=False)


@pytest.mark.slow
def test_gym_train_grpo_in_the_papers_form_end_to_end(gym_home: Path):
    out = run_script(
        [
            str(Path(sys.executable).parent / "gym"),
            "train",
            "--finetuning_type",
            "grpo",
            "--reward",
            "final_answer",
            "--reward",
            "answer_format",
            "--reward-weight",
            "0.5",
            "--group-size",
            "4",
            "--max-steps",
            "6",
            "--train.logging_steps",
            "3",
            "--warm_start.train.max_steps",
            "150",
            "--train.per_device_train_batch_size",
            "32",
            "--train.rl.eval_samples",
            "2",
            "--json",
        ],
        gym_home,
    )
    assert out["metric_name"] == "mean_reward" and out["model_name"] == "gym-tiny-grpo"
    assert isinstance(out["metric_first"], float) and isinstance(out["metric_last"], float)
    assert out["sft_loss_first"] > out["sft_loss_last"], "the warm start ran and learned"
    client = MlflowClient(f"sqlite:///{gym_home / 'mlflow' / 'mlflow.db'}")
    parent = client.get_run(out["mlflow_run_id"])
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    grpo = next(c for c in children if c.data.tags["mlflow.runName"] == "grpo")
    assert grpo.data.params["rl.group_size"] == "4" and grpo.data.params["rl.reward_weights"] == "[1.0, 0.5]"
    warm_start = next(c for c in children if c.data.tags["mlflow.runName"] == "sft")
    assert "learning_rate" in warm_start.data.params
    assert not [k for k in warm_start.data.params if k.startswith("rl.")], "the settings it never read"
    for key in ("train/reward", "train/reward_min", "train/reward_max", "train/rewards/final_answer/mean"):
        assert [m.step for m in client.get_metric_history(grpo.info.run_id, key)] == [1, 3, 6], (
            key
        )  # logging_first_step, then every 3
    assert client.get_metric_history(grpo.info.run_id, "train/completions/mean_length")
    assert client.get_metric_history(grpo.info.run_id, "train/clip_ratio/region_mean")
    assert grpo.data.metrics["after_mean_reward"] == pytest.approx(out["metric_last"])
    table = json.loads(
        Path(client.download_artifacts(grpo.info.run_id, "samples.json", str(gym_home))).read_text()
    )
    assert {"step", "prompt", "completion", "reward", "final_answer"} <= set(table["columns"])
    assert len(table["data"]) >= 2


@pytest.mark.parametrize("method", ["ppo", "dpo", "gspo"])
def test_training_free_grpo_with_a_method_that_has_no_such_form_is_refused(method):
    """It was dropped silently, and the method trained as asked."""
    from flows.commands import method_of

    with pytest.raises(ConfigError, match=f"method '{method}' has no training-free form"):
        method_of(["--method", method, "--training_free_grpo"])
    assert method_of(["--method", "grpo", "--training_free_grpo"])[0] == "tf_grpo"
