"""Supervised fine-tuning through TRL's SFTTrainer on gym's pre-tokenized data.

The tokenized artifact already holds `input_ids` and `labels` (-100 on masked tokens), which
SFTTrainer uses as they are; its collator pads each batch dynamically, or flattens it without
padding, or packs rows of cutoff_len tokens (gym.train.speed decides). Its loss projects only the
trained-on positions to the vocabulary, without TRL's checkpointed chunks where they fit (gym.train.lm_loss).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gym.errors import DataError
from gym.train import adapters, lm_loss, signals, speed, varlen
from gym.train.common import trl_args
from gym.train.config import TrainConfig

REQUIRED_COLUMNS = ("input_ids", "labels")
# The openings of TRL 1.12's warnings about padding-free/packed batches without a flash-attn kernel.
FLASH_ONLY_WARNINGS = (
    "Padding-free training is enabled, but the attention implementation",
    "You are using packing, but the attention implementation",
)


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
    from trl import SFTTrainer

    require_columns(
        train_data,
        "SFT needs tokenized sft data",
        "an sft-format dataset (alpaca, sharegpt or openai messages)",
    )
    batching = speed.sft_args(speed.resolve(config), max_length)  # padded, padding-free or packed
    return sft_trainer(
        SFTTrainer, model, tokenizer, config, train_data, eval_data, output_dir, peft_config, batching
    )


def require_columns(train_data: Any, need: str, dataset: str) -> None:
    """A DataError unless the tokenized data has `input_ids` and `labels` (`need`: who needs them)."""
    missing = [c for c in REQUIRED_COLUMNS if c not in train_data.column_names]
    if missing:
        raise DataError(
            f"{need} with columns {REQUIRED_COLUMNS}, missing {missing}", hint=f"tokenize {dataset}"
        )


def sft_trainer(
    trainer_cls: Any,
    model: Any,
    tokenizer: Any,
    config: TrainConfig,
    train_data: Any,
    eval_data: Any | None,
    output_dir: Path,
    peft_config: Any | None,
    batching: dict[str, Any],
) -> Any:
    """`trainer_cls` (SFTTrainer or a subclass) on gym's pre-tokenized data, batched as `batching` says."""
    from trl import SFTConfig

    fields = {**trl_args(config, output_dir, held_out=eval_data is not None), **batching}
    if adapters.output_layer_wrapped(model) or adapters.adapts_output_layer(model, peft_config):
        # PEFT's trainable token rows in the output layer (gym.vocab), or a LoRA adapter on it
        # (lora_target lm_head): TRL's chunked loss and Liger's fused one read the layer's weight directly,
        # so they would skip the new rows or the adapter (and TRL refuses the adapter)
        fields |= {"loss_type": "nll", "use_liger_kernel": False}
    args = SFTConfig(**fields)
    with flash_only_warnings_dropped(model):
        return lm_loss.trainer(trainer_cls)(
            model=model,
            args=args,
            train_dataset=train_data,
            eval_dataset=eval_data,
            processing_class=tokenizer,
            peft_config=peft_config,
        )


@contextlib.contextmanager
def flash_only_warnings_dropped(model: Any) -> Iterator[None]:
    """SFTTrainer warns that padding-free or packed batches may mix sequences unless attention is a
    flash-attn variant; gym's varlen SDPA keeps them apart (tests/test_varlen.py), so the warning
    would be false for it. Only those two messages are dropped, only for such a model."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) != varlen.NAME:
        yield
        return
    logger = logging.getLogger("trl.trainer.sft_trainer")

    def keep(record: logging.LogRecord) -> bool:
        return not any(start in str(record.msg) for start in FLASH_ONLY_WARNINGS)

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def signal(
    eval_before: dict[str, float], eval_after: dict[str, float], log_history: list[dict[str, Any]]
) -> signals.Signal | None:
    """Held-out loss when the stage has held-out data; otherwise the training loss (run's fallback)."""
    if "eval_loss" not in eval_after:
        return None
    return signals.Signal("eval_loss", eval_before.get("eval_loss"), eval_after["eval_loss"])
