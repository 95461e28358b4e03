"""Odds Ratio Preference Optimization (Hong et al. 2024) through TRL's ORPOTrainer.

One stage, no reference model: the SFT loss on the chosen answer plus lambda (TRL's `beta`, paper:
0.1) times the log odds-ratio loss that pushes the chosen answer's odds above the rejected one's.
(TRL 1.12 computes that SFT loss over the prompt and the answer.)
Rewards are beta x the length-normalised log-probability of each answer, so the held-out reward
margin and accuracy are meaningful from the first step (they are not 0 as for DPO).

TRL's ORPOTrainer (trl.experimental in TRL 1.12) tokenizes row by row; gym feeds it
gym's own chat-template ids (gym.train.pairs.row_trainer), and its LM head projects the rejected
answers' positions alone to the vocabulary (gym.train.completion_logits.pair_trainer; the chosen rows
stay whole for the SFT term): the same loss and metrics.
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
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    require_ids(train_data, config.method)
    args = ORPOConfig(
        **trl_args(config, output_dir, held_out=eval_data is not None),
        beta=filled(config.beta, "beta"),
        max_length=max_length,
        remove_unused_columns=False,  # TRL sets it for its pair collator, with a warning
    )
    return row_trainer(
        completion_logits.pair_trainer(ORPOTrainer),
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
