"""Supervised fine-tuning through TRL's SFTTrainer on gym's pre-tokenized data.

The tokenized artifact already holds `input_ids` and `labels` (-100 on masked tokens), which
SFTTrainer uses as they are; its collator pads each batch dynamically, or flattens it without
padding, or packs rows of cutoff_len tokens (gym.train.speed decides).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.errors import DataError
from gym.train import signals, speed
from gym.train.common import trl_args
from gym.train.config import TrainConfig

REQUIRED_COLUMNS = ("input_ids", "labels")


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
    from trl import SFTConfig, SFTTrainer

    missing = [c for c in REQUIRED_COLUMNS if c not in train_data.column_names]
    if missing:
        raise DataError(
            f"SFT needs tokenized sft data with columns {REQUIRED_COLUMNS}, missing {missing}",
            hint="tokenize an sft-format dataset (alpaca, sharegpt or openai messages)",
        )
    batching = speed.sft_args(speed.resolve(config), max_length)  # padded, padding-free or packed
    args = SFTConfig(**trl_args(config, output_dir), **batching)
    return SFTTrainer(
        model=model,
        args=args,
        train_dataset=train_data,
        eval_dataset=eval_data,
        processing_class=tokenizer,
        peft_config=peft_config,
    )


def signal(
    eval_before: dict[str, float], eval_after: dict[str, float], log_history: list[dict[str, Any]]
) -> signals.Signal | None:
    """Held-out loss when the stage has held-out data; otherwise the training loss (run's fallback)."""
    if "eval_loss" not in eval_after:
        return None
    return signals.Signal("eval_loss", eval_before.get("eval_loss"), eval_after["eval_loss"])
