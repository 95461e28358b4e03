"""Direct Preference Optimization and its variants through TRL's DPOTrainer: one file, four methods.

    dpo    sigmoid loss (Rafailov et al. 2023)
    ipo    squared loss on the log-ratio margin (Azar et al. 2023)
    cdpo   sigmoid loss with label smoothing: conservative DPO for noisy labels (Mitchell 2023; `loss_terms`)
    hinge  hinge loss on the log-ratio margin (SLiC-HF, Zhao et al. 2023)

Each method name sets `loss_type` / `label_smoothing` (gym.train.config.METHOD_PARAMS, the papers'
defaults); `--method dpo --train.loss_type ipo` is the same as `--method ipo`.

gym tokenizes preference data itself with the model's chat template (`prompt_ids`,
`chosen_ids`, `rejected_ids`; each completion ends with its end-of-turn token), the same way
it does for SFT. TRL 1.12's DPOTrainer always re-tokenizes text columns, so `_Pretokenized`
hands it gym's ids unchanged (a test checks they equal what TRL itself would produce from the
conversational form). The reference is the starting model, its log-probs precomputed or scored
live as gym.train.reference chose.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.errors import ConfigError
from gym.train import completion_logits, signals
from gym.train.common import trl_args
from gym.train.config import TrainConfig, filled
from gym.train.pair_metrics import pair_weighted
from gym.train.pairs import ID_COLUMNS, drop_answerless, require_ids


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
    from trl import DPOConfig, DPOTrainer

    class _Pretokenized(completion_logits.trainer(pair_weighted(DPOTrainer))):  # type: ignore[misc]
        """DPOTrainer over data gym already tokenized with the model's chat template."""

        def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
            # a pair whose prompt fills max_length has no answer token left: trained on, it teaches nothing
            return drop_answerless(dataset.select_columns(list(ID_COLUMNS)), max_length)

    require_ids(train_data, config.method)
    losses, weights = loss_terms(config)
    args = DPOConfig(
        **trl_args(config, output_dir, held_out=eval_data is not None),
        beta=filled(config.beta, "beta"),
        loss_type=losses,
        loss_weights=weights,
        label_smoothing=config.label_smoothing or 0.0,
        max_length=max_length,  # the collator cuts prompt+completion to the data's cutoff_len
        precompute_ref_log_probs=config.reference != "live",
    )
    return _Pretokenized(
        model=model,
        args=args,
        train_dataset=train_data,
        eval_dataset=eval_data,
        processing_class=tokenizer,
        peft_config=peft_config,
    )


def check(config: TrainConfig) -> None:
    """Settings the chosen loss can't honour, before any model loads."""
    loss_terms(config)


def loss_terms(config: TrainConfig) -> tuple[list[str], list[float] | None]:
    """TRL loss types and weights for the config's loss (and label smoothing).

    TRL 1.12's sigmoid loss ignores label_smoothing; conservative DPO is built from two losses it does
    ship. With x = beta * (chosen - rejected log-ratio) and logsigmoid(-x) = logsigmoid(x) - x:
        cDPO   -(1-e) logsigmoid(x) - e logsigmoid(-x)          = -logsigmoid(x) + e x
        robust (-(1-e) logsigmoid(x) + e logsigmoid(-x)) / (1-2e) = -logsigmoid(x) - e x / (1-2e)
    so (2 - 2e) sigmoid - (1 - 2e) robust = cDPO exactly (TRL adds weighted losses). `sft_loss_weight`
    adds TRL's sft loss (token cross-entropy of the chosen answers) with that weight.
    """
    loss: str = config.loss_type or "sigmoid"
    eps = config.label_smoothing or 0.0
    losses: list[str]
    if eps == 0:
        losses, weights = [loss], [1.0]
    elif loss != "sigmoid":
        raise ConfigError(
            f"label_smoothing applies to the sigmoid loss (conservative DPO); the {loss} loss ignores it: "
            "drop --train.label_smoothing, or use method cdpo"
        )
    else:
        losses, weights = ["sigmoid", "robust"], [2 - 2 * eps, -(1 - 2 * eps)]
    if config.sft_loss_weight:  # RPO / LLaMA-Factory's pref_ftx: TRL's sft loss on the chosen answers
        losses, weights = [*losses, "sft"], [*weights, config.sft_loss_weight]
    return losses, (weights if len(losses) > 1 else None)


def signal(
    eval_before: dict[str, float], eval_after: dict[str, float], log_history: list[dict[str, Any]]
) -> signals.Signal:
    """Reward margin (chosen - rejected implicit reward): 0 at the start, where policy = reference."""
    return signals.metric("reward_margin", "rewards/margins", eval_before, eval_after, log_history)
