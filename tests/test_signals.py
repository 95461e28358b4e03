"""A method's signal (metric_name/first/last) says whether it is held-out or read from training logs."""

from __future__ import annotations

from gym.train import dpo, kto
from gym.train.signals import Signal

LOGS = [
    {"loss": 0.69, "rewards/margins": 0.01, "logps/chosen": -10.0, "logps/rejected": -11.0},
    {"loss": 0.50, "rewards/margins": 0.20, "logps/chosen": -9.0, "logps/rejected": -12.0},
]


def test_a_held_out_signal_keeps_its_name():
    before, after = {"eval_rewards/margins": 0.0}, {"eval_rewards/margins": 0.3}
    assert dpo.signal(before, after, LOGS) == Signal("reward_margin", 0.0, 0.3)
    before = {"eval_logps/chosen": -10.0, "eval_logps/rejected": -10.5}
    after = {"eval_logps/chosen": -9.0, "eval_logps/rejected": -11.0}
    assert kto.signal(before, after, LOGS) == Signal("logp_gap", 0.5, 2.0)


def test_without_held_out_data_the_signal_is_named_for_the_training_batches_it_compares():
    # It kept the held-out name: a user could not tell noise between two batches from a held-out rise
    assert dpo.signal({}, {}, LOGS) == Signal("train_reward_margin", 0.01, 0.20)
    assert kto.signal({}, {}, LOGS) == Signal("train_logp_gap", 1.0, 3.0)
