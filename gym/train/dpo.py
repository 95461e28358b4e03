"""Direct Preference Optimization (and its IPO / cDPO variants) through TRL's DPOTrainer.

gym tokenizes preference data itself with the model's chat template (`prompt_ids`,
`chosen_ids`, `rejected_ids`; each completion ends with its end-of-turn token), the same way
it does for SFT. TRL 1.12's DPOTrainer always re-tokenizes text columns, so `_Pretokenized`
hands it gym's ids unchanged (a test checks they equal what TRL itself would produce from the
conversational form). The reference model is the starting model: a frozen copy for full
fine-tuning, the adapter switched off for LoRA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.errors import DataError
from gym.train.common import trl_args
from gym.train.config import TrainConfig

ID_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")


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

    class _Pretokenized(DPOTrainer):
        """DPOTrainer over data gym already tokenized with the model's chat template."""

        def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
            return dataset.select_columns(list(ID_COLUMNS))

    missing = [c for c in ID_COLUMNS if c not in train_data.column_names]
    if missing:
        raise DataError(
            f"DPO needs tokenized preference data with columns {ID_COLUMNS}, missing {missing}",
            hint="use a preference dataset (prompt with chosen/rejected answers) for method dpo",
        )
    args = DPOConfig(
        **trl_args(config, output_dir),
        beta=config.beta,
        loss_type=[config.loss_type],
        label_smoothing=config.label_smoothing,
        max_length=max_length,  # the collator cuts prompt+completion to the data's cutoff_len
        precompute_ref_log_probs=True,  # the reference is frozen: score it once, not every step
    )
    return _Pretokenized(
        model=model,
        args=args,
        train_dataset=train_data,
        eval_dataset=eval_data,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
