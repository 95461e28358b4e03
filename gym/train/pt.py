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

import math
from pathlib import Path
from typing import Any

from gym.train import sft, speed
from gym.train.config import TrainConfig


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

    sft.require_columns(
        train_data, "pt needs tokenized text data", 'a text-format dataset ({"text": ...} records)'
    )

    class PretrainingTrainer(SFTTrainer):  # type: ignore[misc]
        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if "eval_loss" in logs:  # in place: evaluate() returns this dict too
                logs["eval_perplexity"] = math.exp(min(logs["eval_loss"], 700.0))
            super().log(logs, start_time)

    batching = speed.sft_args(speed.resolve(config), max_length)  # packing: off for pt, its blocks are packed
    return sft.sft_trainer(
        PretrainingTrainer, model, tokenizer, config, train_data, eval_data, output_dir, peft_config, batching
    )


# Held-out loss when the stage has held-out data; otherwise the training loss (run's fallback).
signal = sft.signal
