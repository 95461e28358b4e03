"""Questions for Training-Free GRPO and the deterministic plan of steps over them.

A question is a prompt (chat messages ending with a user turn) and its reference answer (None
without ground truth). Datasets are read through gym's ingest: any sft-format dataset (alpaca,
sharegpt, openai messages) gives prompt = every turn before the last assistant turn and answer =
that turn; a prompt-format dataset (online RL's: `prompt`, optional `answer`) gives its prompt and
answer; files with a `question` column (and optionally `answer`) are read as prompt-format data.

    questions = load_questions("demo_sft", limit=100)
    steps = plan_steps(len(questions), batch_size=8, epochs=3, seed=42)   # a new order every epoch
    steps = plan_steps(len(questions), batch_size=8, epochs=3, seed=42, max_steps=2)  # its first 2
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gym.errors import ConfigError, DataError
from gym.hashing import hash_obj
from gym.tfgrpo.injection import query_of

QA_COLUMNS = {"prompt": "question"}  # prompt-format data whose prompt column is `question`
# Math sets (MATH, AIME copies) name them problem/solution, as GRPOTrainer(train_dataset=records) reads.
PROBLEM_COLUMNS = {"prompt": "problem", "answer": "solution"}


class Question(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    prompt: list[dict[str, str]]
    answer: str | None = None
    source: tuple[str, int] | None = Field(None, exclude=True)
    """(the dataset it was read from, its record number there, from 1) when read from named datasets,
    for messages; not part of what a question is (excluded from dumps and so from hashes)."""

    @property
    def text(self) -> str:
        """The last user turn: what the optimizer prompts show as the problem."""
        return query_of(self.prompt)


class StepPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    epoch: int
    batch: int
    questions: tuple[int, ...]
    attempt: int = 0
    """0 the first time; a redo of a degraded step counts up (and gets fresh optimizer calls)."""


def derive_seed(*parts: object) -> int:
    """A 31-bit seed from any JSON-able parts (the same parts always give the same seed)."""
    return int(hash_obj(list(parts)), 16) % (2**31)


def steps_per_epoch(n_questions: int, batch_size: int) -> int:
    """Batches in one pass over the questions (the last may be smaller)."""
    return -(-n_questions // batch_size)


def plan_steps(
    n_questions: int, batch_size: int, epochs: int, seed: int, max_steps: int | None = None
) -> list[StepPlan]:
    """Every epoch is a fresh seeded permutation of the questions cut into batches (the last may be
    smaller); the plan depends on nothing but its arguments.

    `max_steps` (when set) decides the number of steps instead of `epochs`, as a training config's
    max_steps overrides its epochs: the plan stops inside an epoch or runs on into more. Epoch e's
    batches are the same whatever the number of epochs, so a capped plan is the start of a longer one.
    """
    if n_questions < 1:
        raise ConfigError("Training-Free GRPO needs at least one training question")
    if max_steps is not None:
        if max_steps < 1:
            raise ConfigError(f"max_steps must be 1 or more, got {max_steps} (unset: run the epochs)")
        epochs = -(-max_steps // steps_per_epoch(n_questions, batch_size))
    steps: list[StepPlan] = []
    for epoch in range(epochs):
        order = list(range(n_questions))
        random.Random(derive_seed(seed, "epoch", epoch)).shuffle(order)
        for batch, start in enumerate(range(0, n_questions, batch_size)):
            steps.append(
                StepPlan(
                    index=len(steps),
                    epoch=epoch,
                    batch=batch,
                    questions=tuple(order[start : start + batch_size]),
                )
            )
    return steps[:max_steps] if max_steps is not None else steps


def dataset_spec(dataset: str | Path) -> Any:
    """The DatasetSpec for `dataset`; files with a `question` column (optional `answer`), or `problem`
    (optional `solution`), read as prompts."""
    from gym.data.registry import resolve_dataset

    try:
        return resolve_dataset(dataset)
    except DataError as first:  # no format recognised: question(/answer), problem/solution columns?
        for columns in (QA_COLUMNS, PROBLEM_COLUMNS):
            try:  # the first record's columns, so mapped, must read as prompt data
                return resolve_dataset(dataset, columns=columns)
            except DataError:
                continue
        raise first from None  # the more helpful error


def questions_from(
    dataset_dir: str | Path,
    limit: int | None = None,
    name: str | None = None,
    setting: str = "max_train_questions",
) -> list[Question]:
    """The questions of an ingested dataset folder (the first `limit`, the value of `setting`: a note
    says so when there are more)."""
    from gym.data.ingest import load_meta, load_saved

    kind = load_meta(dataset_dir, "ingested")["kind"]
    if kind not in ("sft", "prompt"):
        raise ConfigError(
            "Training-Free GRPO needs questions (an sft dataset: alpaca, sharegpt, openai; or prompts: "
            f"prompt or question, answer for ground truth), but {name or dataset_dir!r} is {kind}"
        )
    records = load_saved(dataset_dir)
    n = len(records) if limit is None else min(limit, len(records))
    if limit is not None and len(records) > limit:
        print(
            f"note: TF-GRPO uses the first {limit} of the {len(records)} questions of {name or dataset_dir} "
            f"(--{setting.replace('_', '-')} {limit}: raise it to use more)",
            file=sys.stderr,
        )
    sources = _sources(load_meta(dataset_dir), name or str(dataset_dir))
    questions = []
    for i in range(n):
        if kind == "prompt":
            prompt, answer = records[i]["prompt"], records[i]["answer"]
        else:
            prompt, answer = records[i]["messages"][:-1], records[i]["messages"][-1]["content"]
        questions.append(Question(id=f"{i}", prompt=prompt, answer=answer, source=sources(i)))
    return questions


def _sources(meta: dict[str, Any], name: str) -> Any:
    """Record index -> (the dataset it came from, its record number there): a mix's own parts."""
    parts = [(str(p["dataset"]), int(p["num_records"])) for p in meta.get("mix_of") or []]

    def source(index: int) -> tuple[str, int]:
        for part, count in parts:
            if index < count:
                return part, index + 1
            index -= count
        return name, index + 1

    return source


def load_questions(
    dataset: str | Path, limit: int | None = None, setting: str = "max_train_questions"
) -> tuple[list[Question], str]:
    """Ingest `dataset` (registry name, file, folder or hub id, or a comma-separated list of them); its
    questions (the first `limit`, the value of `setting`) and its digest."""
    from gym.data.mix import ingest_named

    result = ingest_named(str(dataset), resolve=dataset_spec)
    return questions_from(result.path, limit, name=str(dataset), setting=setting), result.digest


def check_answers(reward: str, questions: list[Question], eval_questions: list[Question] | None) -> None:
    """Refuse, before any call, questions without the reference answers their use needs: the training
    questions for a verifier reward (auto, exact, numeric), the held-out ones always (Mean@k and Pass@k
    grade answers against references: without one every answer would score 0)."""
    need = [("training", "--dataset", questions)] if reward not in ("majority", "judge") else []
    for label, flag, group in [*need, ("held-out", "--eval-dataset", eval_questions or [])]:
        missing = [q for q in group if q.answer is None]
        if not missing:
            continue
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        first = missing[0]
        where = (
            f"record {first.source[1]}{more} of {flag} {first.source[0]}"
            if first.source
            else f"record {int(first.id) + 1}{more} of {flag}"
        )
        what = f"reward {reward!r}" if label == "training" else "the held-out evaluation (Mean@k, Pass@k)"
        fix = (
            "use --reward majority (no ground truth) or judge"
            if label == "training"
            else "give held-out data with answers, or leave out --eval-dataset"
        )
        raise ConfigError(
            f"{what} grades answers against references, but {label} {where} has no answer (an `answer` "
            f"field, or a last assistant turn): add them, or {fix}"
        )
