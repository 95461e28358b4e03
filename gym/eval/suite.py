"""Benchmarks as a pipeline stage: what a flow's `benchmarks` parameter names, checked up front.

    benchmarks = ["mmlu=../shared/data/eval/mmlu", "cmmlu", "lm-eval:arc_easy"]

Each entry is `mmlu`, `ceval` or `cmmlu` (gym's evaluator; `=DATA` names a folder, .zip or hub
dataset id, default the hub) or `lm-eval:TASK` (any lm-eval task or group, through the bridge).
`BenchmarkOptions` applies to all of them: a per-subject question limit for quick runs, shots,
batch size, prompt style. `check_benchmarks` reads every data file and resolves every name before
a flow starts its MLflow run or loads a model; `run_benchmark` runs one entry.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gym.errors import ConfigError
from gym.eval.benchmarks import BENCHMARKS
from gym.eval.lm_eval_bridge import LmEvalSettings
from gym.eval.results import EvalResult
from gym.models import ModelRef

LM_EVAL = "lm-eval:"


class BenchmarkOptions(BaseModel):
    """How the flow's benchmarks run (the same for before and after training)."""

    model_config = ConfigDict(extra="forbid")

    limit: int | None = Field(
        10, ge=1, description="Questions per subject (per task for lm-eval); None scores them all."
    )
    shots: int | None = Field(
        None, ge=0, le=5, description="Few-shot examples (default 5; lm-eval: the task's)."
    )
    batch_size: int = Field(16, ge=1, description="Questions per forward pass.")
    style: Literal["lm-eval", "chat"] = Field("lm-eval", description="lm-eval's prompt or the chat template.")
    include_path: str | None = Field(None, description="Folder of your own lm-eval task YAMLs.")


class BenchmarkEntry(BaseModel):
    """One parsed `benchmarks` entry."""

    entry: str
    name: str  # mmlu / ceval / cmmlu, or the lm-eval task name
    engine: Literal["gym", "lm-eval"]
    data_dir: str | None = None

    @property
    def label(self) -> str:
        """A metric- and artifact-safe name (`mmlu`, `arc_easy`)."""
        return re.sub(r"[^a-z0-9_]+", "_", self.name.lower()).strip("_")


def parse(entry: str) -> BenchmarkEntry:
    if entry.startswith(LM_EVAL):
        task = entry[len(LM_EVAL) :].strip()
        if not task:
            raise ConfigError(f"benchmarks entry {entry!r}: name the lm-eval task after 'lm-eval:'")
        return BenchmarkEntry(entry=entry, name=task, engine="lm-eval")
    name, _, data = entry.partition("=")
    if name not in BENCHMARKS:
        raise ConfigError(
            f"benchmarks entry {entry!r}: use {', '.join(BENCHMARKS)} (optionally NAME=DATA_DIR) "
            f"or lm-eval:TASK"
        )
    return BenchmarkEntry(entry=entry, name=name, engine="gym", data_dir=data or None)


def check_benchmarks(entries: Sequence[str], options: BenchmarkOptions) -> list[BenchmarkEntry]:
    """Parse every entry and read its data (or find its lm-eval task) now, before any model work."""
    from gym.eval.mc_data import load_benchmark

    specs = [parse(e) for e in entries]
    seen: dict[str, str] = {}
    for spec in specs:  # one score, run, tag and artifact per label: a second would replace the first
        if spec.label in seen:
            raise ConfigError(
                f"benchmarks entries {seen[spec.label]!r} and {spec.entry!r} would both be reported as "
                f"{spec.label!r}: score them in separate runs"
            )
        seen[spec.label] = spec.entry
    for spec in specs:
        if spec.engine == "gym":
            shots = 5 if options.shots is None else options.shots
            load_benchmark(spec.name, spec.data_dir, limit=options.limit, shots=shots)
    tasks = [s.name for s in specs if s.engine == "lm-eval"]
    if tasks:
        from gym.eval.lm_eval_bridge import task_manager

        task_manager(_bridge_settings(tasks, options))
    return specs


def run_benchmark(model: ModelRef, spec: BenchmarkEntry, options: BenchmarkOptions) -> EvalResult:
    if spec.engine == "lm-eval":
        from gym.eval.lm_eval_bridge import run_lm_eval

        return run_lm_eval(model, _bridge_settings([spec.name], options))
    from gym.eval.multiple_choice import MCSettings, evaluate_benchmark

    settings = MCSettings(
        benchmark=spec.name,  # type: ignore[arg-type]  # parse() admits only BENCHMARKS names
        data_dir=spec.data_dir,
        shots=5 if options.shots is None else options.shots,
        limit=options.limit,
        batch_size=options.batch_size,
        style=options.style,
        progress=False,
    )
    return evaluate_benchmark(model, settings)


def _bridge_settings(tasks: list[str], options: BenchmarkOptions) -> LmEvalSettings:
    return LmEvalSettings(
        tasks=tasks,
        shots=options.shots,
        limit=options.limit,
        batch_size=options.batch_size,
        include_path=options.include_path,
        chat=options.style == "chat",
    )


def benchmark_summary(
    before: Sequence[EvalResult | None], after: Sequence[EvalResult | None], specs: Sequence[str]
) -> dict[str, float | None]:
    """Flow-summary numbers: `<benchmark>_before` / `<benchmark>_after` (overall scores)."""
    out: dict[str, float | None] = {}
    for entry, b, a in zip(specs, before, after, strict=True):
        label = parse(entry).label
        out[f"{label}_before"] = b.overall if b else None
        out[f"{label}_after"] = a.overall if a else None
    return out
