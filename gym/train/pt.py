"""Continued pretraining on raw text (LLaMA-Factory's `stage: pt`) through TRL's SFTTrainer.

The tokenized artifact (gym.data.tokenize, record kind text) already holds the texts joined with
eos and cut into blocks of cutoff_len tokens, `labels` = `input_ids`: every token is trained on and
no chat template is involved. SFTTrainer takes such pre-tokenized language-modeling data as it is
(TRL's path for causal LM training on plain text), with gym's batching, Liger and token counting;
the blocks are packed already, so `speed.packing` adds nothing here. Every adaptation type applies.

Held-out data (val_size or method_eval_dataset) gives the signal, the held-out loss, and its
perplexity (`eval_perplexity` = exp(eval_loss), as LLaMA-Factory's pt stage reports it); without it
the signal is the training loss.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from gym.errors import DataError
from gym.train import signals, speed
from gym.train.common import trl_args
from gym.train.config import TrainConfig
from gym.train.sft import flash_only_warnings_dropped

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
            f"pt needs tokenized text data with columns {REQUIRED_COLUMNS}, missing {missing}",
            hint='tokenize a text-format dataset ({"text": ...} records)',
        )

    class PretrainingTrainer(SFTTrainer):  # type: ignore[misc]
        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if "eval_loss" in logs:  # in place: evaluate() returns this dict too
                logs["eval_perplexity"] = math.exp(min(logs["eval_loss"], 700.0))
            super().log(logs, start_time)

    resolved = dataclasses.replace(speed.resolve(config), packing=False)  # the blocks are packed already
    args = SFTConfig(
        **trl_args(config, output_dir, held_out=eval_data is not None), **speed.sft_args(resolved, max_length)
    )
    with flash_only_warnings_dropped(model):
        return PretrainingTrainer(
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
