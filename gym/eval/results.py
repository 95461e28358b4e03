"""One result format for every benchmark gym runs: its own MMLU / C-Eval / CMMLU evaluator and
any lm-eval task through the bridge. `gym eval --json`, the flows' MLflow metrics and artifacts,
and the Prefect table artifact are all made from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field


class EvalResult(BaseModel):
    benchmark: str = Field(description="mmlu, ceval, cmmlu, or the lm-eval task name.")
    model: str = Field(description="The model as the user named it.")
    metric: str = Field("acc", description="What the numbers are (accuracy for multiple choice).")
    overall: float = Field(description="Over all questions (weighted by question count).")
    categories: dict[str, float] = Field(
        default_factory=dict, description="Category (or lm-eval group) -> score."
    )
    subjects: dict[str, float] = Field(
        default_factory=dict, description="Subject (or lm-eval subtask) -> score."
    )
    sizes: dict[str, int] = Field(default_factory=dict, description="Questions scored per subject.")
    subject_categories: dict[str, str] = Field(default_factory=dict, description="Subject -> its category.")
    n_questions: int
    seconds: float = Field(
        description="Wall time of the evaluation, reading data and loading the model included."
    )
    shots: int | None = None
    questions_digest: str | None = Field(
        None,
        description="Digest of what was asked (subjects, few-shot examples, questions and answers): scores "
        "compare only when it is equal (None: not recorded).",
    )
    engine: str = Field("gym", description="gym (its own evaluator) or lm-eval.")
    style: str = Field(
        "lm-eval", description="The prompt: lm-eval's plain few-shot text, or chat (the chat template)."
    )
    notes: list[str] = Field(default_factory=list, description="What a reader should know (truncation, ...).")
    predictions: dict[str, list[int]] = Field(
        default_factory=dict, description="Per subject, the chosen answer (0-3) of each question, in order."
    )
    answers: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Per subject, the correct answer (0-3) of each question, in the order of predictions.",
    )
    experiences: dict[str, Any] | None = Field(
        None,
        description="The TF-GRPO experience library the model ships, injected into every prompt: its "
        "content hash, version and size (None: the model ships none).",
    )

    def summary(self) -> dict[str, object]:
        """The fields `gym eval --json` prints."""
        return {
            "benchmark": self.benchmark,
            "model": self.model,
            "overall": self.overall,
            "categories": self.categories,
            "subjects": self.subjects,
            "n_questions": self.n_questions,
            "seconds": round(self.seconds, 3),
            "shots": self.shots,
            "questions_digest": self.questions_digest,
            "engine": self.engine,
            "style": self.style,
            "notes": self.notes,
            "experiences": self.experiences,
        }

    def rows(self) -> list[dict[str, object]]:
        """One row per subject, for tables (CSV artifact, Prefect table)."""
        return [
            {
                "subject": key,
                "category": self.subject_categories.get(key, ""),
                "questions": self.sizes.get(key, 0),
                self.metric: round(score, 4),
            }
            for key, score in self.subjects.items()
        ]

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """Flat metric names for MLflow: overall, per category and per subject."""
        out = {f"{prefix}{self.benchmark}/overall": self.overall}
        out.update({f"{prefix}{self.benchmark}/{name}": v for name, v in self.categories.items()})
        out.update({f"{prefix}{self.benchmark}/subject/{name}": v for name, v in self.subjects.items()})
        return out


def weighted(
    correct: Mapping[str, int], sizes: Mapping[str, int], groups: Mapping[str, str]
) -> dict[str, float]:
    """Accuracy per group over all its questions (lm-eval's `weight_by_size` group aggregate)."""
    totals: dict[str, list[int]] = {}
    for key, n in sizes.items():
        slot = totals.setdefault(groups[key], [0, 0])
        slot[0] += correct[key]
        slot[1] += n
    return {name: right / n for name, (right, n) in sorted(totals.items()) if n}
