"""Kahneman-Tversky Optimization (Ethayarajh et al. 2024) through TRL's KTOTrainer.

KTO learns from unpaired completions labelled desirable or undesirable (gym's `kto` record kind):
it raises the implied reward of desirable ones and lowers that of undesirable ones, relative to a
KL estimate from mismatched prompt/completion pairs of the same batch. Defaults from the paper:
beta 0.1, desirable and undesirable weights 1.0 (for balanced data).

As for DPO, gym's own tokenization (`prompt_ids`, `completion_ids`, end-of-turn token included)
goes to the trainer unchanged; `_Pretokenized` adds only the KL completions, built as TRL builds
them (each batch's completions rotated by one). The signal is the held-out gap between the mean
log-probability of desirable and undesirable completions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.errors import ConfigError, DataError
from gym.train import completion_logits, signals
from gym.train.common import trl_args
from gym.train.config import TrainConfig, filled
from gym.train.pair_metrics import example_weighted
from gym.train.pairs import drop_answerless

ID_COLUMNS = ("prompt_ids", "completion_ids", "label")


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
    from trl import KTOConfig, KTOTrainer

    class _Pretokenized(completion_logits.trainer(example_weighted(KTOTrainer))):  # type: ignore[misc]
        """KTOTrainer over data gym already tokenized with the model's chat template."""

        def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
            dataset = drop_answerless(dataset.select_columns(list(ID_COLUMNS)), max_length)

            def kl_completions(batch: dict[str, list]) -> dict[str, list]:
                done = batch["completion_ids"]
                return {"KL_completion_ids": [done[-1], *done[:-1]]}

            # The same pairing as TRL: within each batch of per_device_train_batch_size, in data order.
            return dataset.map(kl_completions, batched=True, batch_size=args.per_device_train_batch_size)

    missing = [c for c in ID_COLUMNS if c not in train_data.column_names]
    if missing:
        raise DataError(
            f"KTO needs tokenized kto data with columns {ID_COLUMNS}, missing {missing}",
            hint="use a kto dataset (prompt, completion, boolean label) for method kto",
        )
    args = KTOConfig(
        **trl_args(config, output_dir, held_out=eval_data is not None),
        beta=filled(config.beta, "beta"),
        desirable_weight=config.desirable_weight,
        undesirable_weight=config.undesirable_weight,
        max_length=max_length,
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
    """KTO estimates its KL term from the other completions of a batch: a batch needs two or more."""
    if config.per_device_train_batch_size is not None and config.per_device_train_batch_size < 2:
        raise ConfigError(
            "kto needs per_device_train_batch_size >= 2: its KL estimate pairs each prompt with another "
            "example's completion from the same batch (TRL's KTO; LLaMA-Factory builds those pairs in its "
            "data instead): set it to 2 or more, and lower gradient_accumulation_steps to keep the batch"
        )


def signal(
    eval_before: dict[str, float], eval_after: dict[str, float], log_history: list[dict[str, Any]]
) -> signals.Signal:
    """Mean log-probability of desirable minus undesirable completions: rises as KTO learns."""
    return signals.difference(
        "logp_gap", "logps/chosen", "logps/rejected", eval_before, eval_after, log_history
    )
