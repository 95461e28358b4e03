"""The three multiple-choice benchmarks gym scores itself: MMLU, C-Eval and CMMLU.

Each `BenchmarkSpec` says what lm-eval 0.4's task YAMLs say (splits, description, question
format, the lm-eval task names) and how the original files are laid out, so that the reader
(gym/eval/mc_data.py) and the prompt builder (gym/eval/mc_prompt.py) need no per-benchmark code.
The subject names and categories ship in gym/assets/eval/<benchmark>.json (a `mapping.json`
beside the data overrides them); the questions never ship with gym.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym.errors import ConfigError
from gym.paths import assets_dir

CATEGORIES = ("STEM", "Social Sciences", "Humanities", "Other")
LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class BenchmarkSpec:
    name: str
    hub_id: str
    scored_split: str  # the split lm-eval scores (C-Eval's test split has no answers)
    description: str  # format string with {name}: the subject's display name
    answer_cue: str  # ends each question; the answer letter follows after one space
    lm_eval_group: str
    lm_eval_prefix: str  # lm-eval's task for subject S is f"{prefix}{S}"
    # Original CSV layout: file name per (subject, split); the header (None: no header row) and
    # which columns hold the question, the four choices and the answer letter.
    file_pattern: str
    header: tuple[str, ...] | None
    question_col: str
    choice_cols: tuple[str, str, str, str]
    answer_col: str
    fewshot_split: str = "dev"

    @property
    def splits(self) -> tuple[str, str]:
        return (self.fewshot_split, self.scored_split)

    def file_name(self, subject: str, split: str) -> str:
        return self.file_pattern.format(subject=subject, split=split)

    def lm_eval_task(self, subject: str) -> str:
        return f"{self.lm_eval_prefix}{subject}"


BENCHMARKS: dict[str, BenchmarkSpec] = {
    "mmlu": BenchmarkSpec(
        name="mmlu",
        hub_id="cais/mmlu",
        scored_split="test",
        description="The following are multiple choice questions (with answers) about {name}.\n\n",
        answer_cue="Answer:",
        lm_eval_group="mmlu",
        lm_eval_prefix="mmlu_",
        file_pattern="{split}/{subject}_{split}.csv",
        header=None,
        question_col="question",
        choice_cols=("A", "B", "C", "D"),
        answer_col="answer",
    ),
    "ceval": BenchmarkSpec(
        name="ceval",
        hub_id="ceval/ceval-exam",
        scored_split="val",
        description="以下是中国关于{name}的单项选择题，请选出其中的正确答案。\n\n",
        answer_cue="答案：",
        lm_eval_group="ceval-valid",
        lm_eval_prefix="ceval-valid_",
        file_pattern="{split}/{subject}_{split}.csv",
        header=("id", "question", "A", "B", "C", "D", "answer"),  # + an optional `explanation`
        question_col="question",
        choice_cols=("A", "B", "C", "D"),
        answer_col="answer",
    ),
    "cmmlu": BenchmarkSpec(
        name="cmmlu",
        hub_id="haonan-li/cmmlu",
        scored_split="test",
        description="以下是关于{name}的单项选择题，请直接给出正确答案的选项。\n\n",
        answer_cue="答案：",
        lm_eval_group="cmmlu",
        lm_eval_prefix="cmmlu_",
        file_pattern="{split}/{subject}.csv",
        header=("", "Question", "A", "B", "C", "D", "Answer"),
        question_col="Question",
        choice_cols=("A", "B", "C", "D"),
        answer_col="Answer",
    ),
}


def get_spec(name: str) -> BenchmarkSpec:
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise ConfigError(
            f"unknown benchmark {name!r}: choose one of {', '.join(BENCHMARKS)} "
            "(any other lm-eval task runs through --lm-eval-task)"
        ) from None


@dataclass(frozen=True)
class SubjectInfo:
    key: str
    name: str  # display name used in the description (Chinese for C-Eval and CMMLU)
    category: str


def load_mapping(spec: BenchmarkSpec, path: Path | None = None) -> dict[str, SubjectInfo]:
    """Subjects of a benchmark from a mapping.json; without `path`, the copy shipped with gym."""
    source = path if path is not None else assets_dir() / "eval" / f"{spec.name}.json"
    return parse_mapping(source.read_text(encoding="utf-8"), str(source))


def parse_mapping(text: str, source: str) -> dict[str, SubjectInfo]:
    """`{key: {"name": display name, "category": one of CATEGORIES}}`, checked entry by entry."""
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"file {source}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"file {source}: expected an object {{subject: {{name, category}}}}")
    subjects: dict[str, SubjectInfo] = {}
    for key, entry in raw.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ConfigError(f"file {source}, subject {key!r}: expected {{'name': str, 'category': str}}")
        category = entry.get("category")
        if category not in CATEGORIES:
            raise ConfigError(
                f"file {source}, subject {key!r}: category {category!r} is not one of {', '.join(CATEGORIES)}"
            )
        subjects[key] = SubjectInfo(key=key, name=entry["name"], category=category)
    return subjects
