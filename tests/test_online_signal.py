"""An online RL stage without held-out prompts reports its training reward as its signal."""

from __future__ import annotations

import math

from gym.train import _signal


def test_without_held_out_prompts_the_signal_is_the_first_and_last_logged_training_reward():
    """metric_first/last were null: no reward number appeared anywhere in the summary."""
    history = [
        {"loss": 0.1},
        {"reward": math.nan},
        {"reward": 0.25},
        {"reward": 0.5},
        {"reward": 0.75, "loss": 0},
    ]
    assert _signal("grpo", {}, {}, history) == {
        "metric_name": "train_mean_reward",
        "metric_first": 0.25,
        "metric_last": 0.75,
    }
    assert _signal("ppo", {}, {}, [])["metric_first"] is None  # nothing logged: nothing made up


def test_held_out_prompts_give_the_held_out_mean_reward():
    found = _signal("gspo", {"mean_reward": 0.3}, {"mean_reward": 0.6}, [{"reward": 0.1}])
    assert found == {"metric_name": "mean_reward", "metric_first": 0.3, "metric_last": 0.6}
