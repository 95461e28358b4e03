"""Which reference model a DPO-style stage uses: log-probs precomputed once, or scored live each step.

dpo, ipo, cdpo, hinge and kto compare the policy with the starting model. Either way the reference
only runs forward passes; what differs is how many sequences it must score:

- precomputed: every training example once, and every held-out example once (TRL stores the numbers
  in the dataset and no reference model stays in memory);
- live: each example of each step's batch, i.e. steps x batch x accumulation, plus the held-out set at
  each of the two evaluations (before and after). For an adapter (the LoRA family) it costs no memory:
  TRL scores with the adapter switched to a frozen copy of its initial state, which is the base for
  LoRA's zero-initialised B and the original weights for PiSSA. Full and freeze would need a second
  copy of the model in memory.

`auto` picks live for adapters when it scores fewer sequences (short runs over large datasets), and
precomputed otherwise, always for full and freeze (no second copy of the model). The choice is printed
and logged with the stage.
"""

from __future__ import annotations

import math

from gym.train.config import TrainConfig, family

# Methods whose loss compares the policy with a reference model (ORPO and SimPO have none).
NEEDS_REFERENCE = ("dpo", "ipo", "cdpo", "hinge", "kto")


def planned_steps(config: TrainConfig, n_train: int) -> int:
    """Optimiser steps the stage will run (max_steps, or epochs over the data)."""
    if config.max_steps > 0:
        return config.max_steps
    per_step = (config.per_device_train_batch_size or 1) * config.gradient_accumulation_steps
    return math.ceil(math.ceil(n_train / per_step) * (config.num_train_epochs or 1))


def choose(config: TrainConfig, n_train: int, n_eval: int) -> tuple[TrainConfig, dict[str, str]]:
    """`config` with `reference` made concrete for methods that need one, and the choice in words."""
    if config.method not in NEEDS_REFERENCE:
        return config, {}
    if config.reference != "auto":
        return config, {"reference": f"{config.reference} (given)"}
    precomputed = n_train + n_eval
    live = planned_steps(config, n_train) * (config.per_device_train_batch_size or 1)
    live = live * config.gradient_accumulation_steps + 2 * n_eval
    if family(config.finetuning_type) == "full":
        mode, why = "precomputed", "full weights train: a live reference would be a second copy of the model"
    elif live < precomputed:
        mode, why = "live", f"the initial adapter scores {live} sequences live vs {precomputed} precomputed"
    else:
        mode, why = "precomputed", f"{precomputed} sequences precomputed vs {live} scored live"
    return config.model_copy(update={"reference": mode}), {"reference": f"{mode}: {why}"}
