"""Held-out pair metrics are means over the held-out pairs, whatever the evaluation's batch size: TRL
averaged each batch's mean, so a last, smaller batch weighed as much as a full one (on 100 pairs in
batches of 8, `reward_accuracy` was no share of the 100 pairs, and promotion compared such numbers)."""

from __future__ import annotations

import pytest
from datasets import load_from_disk

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
    # 10 pairs in batches of 3: 3, 3, 3 and 1
    one, three = (held_out_after(method, lr, 12, batch, model, pairs, held_out) for batch in (1, 3))
    accuracy = one["eval_rewards/accuracies"]
    assert 0 < accuracy < 1, "a share that can tell the weightings apart"
    assert accuracy * 10 == pytest.approx(round(accuracy * 10)), "a share of the 10 pairs"
    assert three["eval_rewards/accuracies"] == pytest.approx(accuracy, abs=1e-6)
    assert three["eval_rewards/margins"] == pytest.approx(one["eval_rewards/margins"], rel=1e-4, abs=1e-5)


def test_kto_held_out_metrics_are_means_over_examples_whatever_the_batch_size(gym_home):
    # KTO's batches mix desirable and undesirable examples: TRL averaged each batch's means, so a batch
    # holding one desirable example weighed as much as one holding eight
    model = tiny()
    examples = tokenized("demo_kto", model, max_samples=64)
    held_out = tokenized("demo_kto_eval", model, max_samples=11)
    desirable = sum(bool(x) for x in load_from_disk(str(held_out))["label"])
    assert 0 < desirable < 11
    # 11 examples in batches of 4: 4, 4 and 3, each with its own mix
    one, four = (held_out_after("kto", 3e-3, 6, batch, model, examples, held_out) for batch in (1, 4))
    for key in ("eval_logps/chosen", "eval_logps/rejected", "eval_rewards/chosen", "eval_rewards/rejected"):
        assert four[key] == pytest.approx(one[key], rel=1e-4, abs=1e-5), key
    margin = one["eval_rewards/chosen"] - one["eval_rewards/rejected"]
    assert four["eval_rewards/margins"] == pytest.approx(margin, rel=1e-4, abs=1e-5)
    assert one["eval_rewards/margins"] == pytest.approx(margin, rel=1e-4, abs=1e-5)


def held_out_after(method, lr, steps, eval_batch, model, data, held_out):
    """The held-out metrics after `steps` of `method`, evaluated in batches of `eval_batch`."""
    config = TrainConfig(
        method=method,
        learning_rate=lr,
        max_steps=steps,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=eval_batch,
        seed=7,
    )
    return train.run(config, model, data, held_out).eval_after
