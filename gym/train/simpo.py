"""Simple Preference Optimization (Meng et al. 2024) through TRL's CPOTrainer with loss_type "simpo".

Reference-free and length-normalised: the implicit reward is beta x the mean log-probability of an
answer, and the loss asks the chosen reward to beat the rejected one by a target margin gamma.
Paper defaults: beta 2.0-2.5 with gamma / beta = 0.5 (gym: beta 2.0, gamma 1.0). `cpo_alpha=0`
leaves out CPO's behaviour-cloning term, so this is SimPO itself, not CPO-SimPO; `sft_loss_weight`
(LLaMA-Factory's pref_ftx) sets that term's weight.

TRL's CPOTrainer (trl.experimental in TRL 1.12) tokenizes row by row; gym feeds it
gym's own chat-template ids (gym.train.pairs.row_trainer), and its LM head projects only the answers'
positions to the vocabulary (gym.train.completion_logits.pair_trainer): the same loss and metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.train import completion_logits, signals
from gym.train.common import trl_args
from gym.train.config import TrainConfig, filled
from gym.train.pairs import require_ids, row_trainer


def build_trainer(
    *,
    model: Any,
    tokenizer: Any,
    config: TrainConfig,
    train_data: Any,
    eval_data: Any | None,
    output_dir: Path,
    peft_config: Any | None,
    max_length: int | None = None,
) -> Any:
    from trl.experimental.cpo import CPOConfig, CPOTrainer

    require_ids(train_data, config.method)
    args = CPOConfig(
        **trl_args(config, output_dir, held_out=eval_data is not None),
        loss_type="simpo",
        cpo_alpha=config.sft_loss_weight,  # SimPO: none unless asked (CPO's NLL term = an added SFT loss)
        beta=filled(config.beta, "beta"),
        simpo_gamma=filled(config.simpo_gamma, "simpo_gamma"),
        max_length=max_length,
        remove_unused_columns=False,  # TRL sets it for its pair collator, with a warning
    )
    return row_trainer(
        completion_logits.pair_trainer(CPOTrainer),
        args,
        model=model,
        tokenizer=tokenizer,
        train_data=train_data,
        eval_data=eval_data,
        peft_config=peft_config,
        max_length=max_length,
    )


def signal(
    eval_before: dict[str, float], eval_after: dict[str, float], log_history: list[dict[str, Any]]
) -> signals.Signal:
    """Reward margin: beta x (mean log-prob of the chosen answer - of the rejected one)."""
    return signals.metric("reward_margin", "rewards/margins", eval_before, eval_after, log_history)
