"""Preference pairs as gym tokenized them, for the TRL trainers that tokenize row by row (ORPO, CPO/SimPO).

gym renders every pair with the model's chat template once (`prompt_ids`, `chosen_ids`,
`rejected_ids`; each answer ends with its end-of-turn token), the same ids DPO trains on. TRL's
ORPOTrainer and CPOTrainer tokenize text in a `tokenize_row` method mapped over the dataset; the
trainers in gym.train.orpo and gym.train.simpo are built by `row_trainer`, whose subclass overrides that
method with `row_from_ids`, which lays
gym's ids out as those trainers' collator expects: each answer after its prompt, labels -100 on the
prompt. Answers are cut so that prompt + answer fits `max_length`; pairs whose prompt alone fills it
are dropped beforehand (`fitting`), as gym's DPO and KTO do (`drop_answerless`; `answer_room` says how
many before any model loads, and refuses data where none is left). The subclass also counts the tokens it
trains on (`count_pair_tokens`), for tokens/s: transformers' Trainer counts a batch's `input_ids`,
which these batches don't have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.errors import DataError
from gym.train.pair_metrics import pair_weighted

ID_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")
IGNORE_INDEX = -100


def answer_room(
    method: str, kind: str, train_data: Path, eval_data: Path | None, cutoff: int | None
) -> list[str]:
    """Before any model loads: a pair or KTO record whose prompt alone is cutoff_len tokens or more has no
    room left for an answer token, so the trainers leave it out. When every training (or held-out) record
    is such, training can't run (TRL failed with a traceback, or DPO trained on nothing and said nothing):
    a DataError saying what to change. Else the notes to print (how many are left out). The reward model
    (rm) scores whole pairs and checks its own."""
    if kind not in ("preference", "kto") or method == "rm" or not cutoff:
        return []
    import pyarrow.compute as pc

    from gym.data.ingest import load_saved

    unit = "pair" if kind == "preference" else "record"
    notes = []
    for role, path in (("training", train_data), ("held-out", eval_data)):
        if path is None:
            continue
        lengths = pc.list_value_length(load_saved(path).data.column("prompt_ids"))
        total, over = len(lengths), int(pc.sum(pc.greater_equal(lengths, cutoff)).as_py() or 0)
        if total and over == total:
            raise DataError(
                f"{method}: every {role} {unit}'s prompt alone is cutoff_len={cutoff} tokens or more (the "
                f"longest has {pc.max(lengths).as_py()}), which leaves no room for an answer token",
                hint="raise --cutoff_len above the prompts' length, or shorten the prompts",
            )
        if over:
            notes.append(
                f"{over} of {total} {role} {unit}(s) have a prompt of cutoff_len={cutoff} tokens or more: no "
                "answer token fits, so they are left out (raise cutoff_len to keep them)"
            )
    return notes


def drop_answerless(data: Any, max_length: int | None) -> Any:
    """The pairs or KTO records with room for at least one answer token after the prompt."""
    if max_length is None:
        return data
    return data.filter(lambda row: len(row["prompt_ids"]) < max_length, desc="drop prompts over max_length")


def require_ids(data: Any, method: str) -> None:
    missing = [c for c in ID_COLUMNS if c not in data.column_names]
    if missing:
        raise DataError(
            f"{method} needs tokenized preference data with columns {ID_COLUMNS}, missing {missing}",
            hint=f"use a preference dataset (prompt with chosen/rejected answers) for method {method}",
        )


def fitting(data: Any, max_length: int | None) -> Any:
    """The pairs with room for at least one answer token after the prompt, ids columns only."""
    return drop_answerless(data.select_columns(list(ID_COLUMNS)), max_length)


def row_from_ids(feature: dict[str, Any], max_length: int | None) -> dict[str, list[int]]:
    """One pair as ORPO/CPO's collator reads it: prompt, and each answer after the prompt with labels."""
    prompt = list(feature["prompt_ids"])
    room = None if max_length is None else max_length - len(prompt)
    row: dict[str, list[int]] = {"prompt_input_ids": prompt, "prompt_attention_mask": [1] * len(prompt)}
    for name in ("chosen", "rejected"):
        answer = list(feature[f"{name}_ids"])[:room]
        ids = prompt + answer
        row[f"{name}_input_ids"] = ids
        row[f"{name}_attention_mask"] = [1] * len(ids)
        row[f"{name}_labels"] = [IGNORE_INDEX] * len(prompt) + answer
    return row


def row_trainer(
    trainer_class: type,
    args: Any,
    *,
    model: Any,
    tokenizer: Any,
    train_data: Any,
    eval_data: Any | None,
    peft_config: Any | None,
    max_length: int | None,
) -> Any:
    """A TRL trainer that tokenizes row by row (ORPO, CPO), fed the ids gym already made instead."""

    class Pretokenized(pair_weighted(trainer_class)):  # type: ignore[misc]
        """The trainer over pairs gym already tokenized with the model's chat template."""

        def tokenize_row(self, feature: dict[str, Any], model: Any = None) -> dict[str, list[int]]:
            return row_from_ids(feature, max_length)

        def _track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
            count_pair_tokens(self, inputs)

    return Pretokenized(
        model=model,
        args=args,
        train_dataset=fitting(train_data, max_length),
        eval_dataset=fitting(eval_data, max_length) if eval_data is not None else None,
        processing_class=tokenizer,
        peft_config=peft_config,
    )


def count_pair_tokens(trainer: Any, inputs: dict[str, Any]) -> None:
    """Add a batch of pairs to `trainer.state.num_input_tokens_seen`, as the Trainer does for `input_ids`.

    What the model reads: each answer after its prompt (`chosen_input_ids`, `rejected_input_ids`),
    padding excluded under "non_padding" (the attention masks), all of it under "all".
    """
    import torch

    mode = trainer.args.include_num_input_tokens_seen
    if mode in ("no", False, None):
        return
    answers = ("chosen", "rejected")
    if mode == "non_padding":
        count = sum(int(inputs[f"{a}_attention_mask"].sum()) for a in answers)
    else:
        count = sum(inputs[f"{a}_input_ids"].numel() for a in answers)
    total = trainer.accelerator.gather(torch.tensor(count, device=trainer.args.device, dtype=torch.int64))
    trainer.state.num_input_tokens_seen += int(total.sum().item())
