"""Held-out pair metrics are means over the held-out pairs, whatever the evaluation's batch size: TRL
averaged each batch's mean, so a last, smaller batch weighed as much as a full one (on 100 pairs in
batches of 8, `reward_accuracy` was no share of the 100 pairs, and promotion compared such numbers)."""

from __future__ import annotations

import pytest

from gym import train
from gym.train import TrainConfig
from tests.helpers import tiny, tokenized


@pytest.mark.parametrize(("method", "lr"), [("dpo", 3e-3), ("simpo", 3e-3)])
def test_held_out_pair_metrics_do_not_depend_on_the_evaluation_batch_size(gym_home, method, lr):
    model = tiny()
    pairs, held_out = (
        tokenized("demo_dpo", model, max_samples=64),
        tokenized("demo_dpo_eval", model, max_samples=10),
    )
    results = {}
    for batch in (1, 3):  # 10 pairs in batches of 3: 3, 3, 3 and 1
        config = TrainConfig(
            method=method,
            learning_rate=lr,
            max_steps=12,
            per_device_train_batch_size=8,
            per_device_eval_batch_size=batch,
            seed=7,
        )
        results[batch] = train.run(config, model, pairs, held_out).eval_after
    one, three = results[1], results[3]
    accuracy = one["eval_rewards/accuracies"]
    assert 0 < accuracy < 1, "a share that can tell the weightings apart"
    assert accuracy * 10 == pytest.approx(round(accuracy * 10)), "a share of the 10 pairs"
    assert three["eval_rewards/accuracies"] == pytest.approx(accuracy, abs=1e-6)
    assert three["eval_rewards/margins"] == pytest.approx(one["eval_rewards/margins"], rel=1e-4, abs=1e-5)
