"""Evaluation tasks: generation metrics on held-out data, and benchmarks (MMLU / C-Eval / CMMLU with
gym's evaluator, any lm-eval task through the bridge), each tracked in a nested MLflow run with
its metrics, full table, per-category bar chart, and a Prefect table artifact."""

from __future__ import annotations

import csv
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from gym import tracking
from gym.eval.exact_match import ExactMatch, evaluate
from gym.eval.results import EvalResult
from gym.eval.suite import BenchmarkEntry, BenchmarkOptions, check_benchmarks, parse, run_benchmark
from gym.hashing import stamp
from gym.models import ModelRef
from gym.plots import category_bars
from tasks._common import CACHED_TAG, EVAL_TIMEOUT_S, gym_task
from tasks.tracking import artifact_key, cell, in_run, publish, stage_run, table


@gym_task(
    name="exact-match",
    task_run_name="exact match {label}",
    gpu=True,
    timeout_seconds=EVAL_TIMEOUT_S,
    record=lambda result, **call: _record_exact_match(result, **call),
)
def exact_match(
    model: ModelRef,
    dataset: Any,
    label: str,
    limit: int | None = None,
    parent_run_id: str | None = None,
    tracking_uri: str | None = None,
    metrics: Sequence[str] = ("exact_match",),
    system: str | None = None,
) -> ExactMatch:
    params = _exact_match_params(model, dataset, limit, metrics)
    with stage_run(f"eval-{label}", params, parent_run_id, tracking_uri) as run_id:
        result = evaluate(model, Path(dataset.path), limit=limit, metrics=metrics, system=system)
        if run_id:
            _log_exact_match(run_id, result, tracking_uri)
    _publish_exact_match(result, label)
    return result


def _exact_match_params(model: ModelRef, dataset: Any, limit: int | None, metrics: Sequence[str]) -> dict:
    return {"model": model.path, "dataset_digest": dataset.digest, "limit": limit, "metrics": list(metrics)}


def _log_exact_match(run_id: str, result: ExactMatch, uri: str | None, cached: bool = False) -> None:
    numbers = {**result.scores, "exact_match": result.exact_match, "n": result.n}
    tracking.log_metrics(run_id, numbers, uri=uri)
    tags = {f"experiences_{k}": v for k, v in (result.experiences or {}).items()}  # a TF-GRPO model's library
    if cached:
        tags[CACHED_TAG] = "true"
    if tags:
        tracking.set_tags(run_id, tags, uri=uri)


def _record_exact_match(
    result: ExactMatch,
    model: ModelRef,
    dataset: Any,
    label: str,
    limit: int | None = None,
    parent_run_id: str | None = None,
    tracking_uri: str | None = None,
    metrics: Sequence[str] = ("exact_match",),
    **_: Any,
) -> None:
    """A score served from cache, recorded in this flow run as `exact_match` records the one it computes."""
    params = _exact_match_params(model, dataset, limit, metrics)
    with stage_run(f"eval-{label}", params, parent_run_id, tracking_uri) as run_id:
        if run_id:
            _log_exact_match(run_id, result, tracking_uri, cached=True)
    _publish_exact_match(result, label)


def _publish_exact_match(result: ExactMatch, label: str) -> None:
    samples = "\n".join(
        f"| {cell(s['prompt'])} | {cell(s['reference'])} | {cell(s['prediction'])} |"
        for s in result.samples[:5]
    )
    scores = {"exact match": result.exact_match, **result.scores, "records": result.n}
    scores.pop("exact_match", None)
    publish(
        f"exact-match-{label}",
        f"## exact match {label}\n\n{table(scores)}\n"
        f"| prompt (end) | reference | prediction |\n|---|---|---|\n{samples}\n",
        f"Held-out exact match {label} training" if label in ("before", "after") else "Held-out exact match",
    )


@gym_task(
    name="check-benchmarks", task_run_name="check benchmarks", cache_policy=NO_CACHE, persist_result=False
)
def check_benchmarks_task(entries: list[str], options: BenchmarkOptions) -> list[BenchmarkEntry]:
    """Read every benchmark's files and find every lm-eval task before the flow does any work."""
    return check_benchmarks(entries, options)


def _options_key(entry: str, options: BenchmarkOptions | None) -> Any:
    """The options a benchmark's score depends on: include_path (a folder of lm-eval task YAMLs) only
    for lm-eval tasks; gym's own MMLU / C-Eval / CMMLU were scored again when it changed."""
    if options is None:
        return None
    key = options.model_dump()
    if parse(entry).engine != "lm-eval":
        key.pop("include_path", None)
    return key


def _data_identity(entry: str, options: BenchmarkOptions | None = None) -> Any:
    """What a benchmark's result depends on that its name doesn't show: its local files (a zip's
    mapping.json beside it, whose names enter the prompts), and for an lm-eval task the folder of
    task YAMLs (and the data files they name beside them) given as include_path."""
    spec = parse(entry)
    if spec.engine == "lm-eval":
        folder = options.include_path if options is not None else None
        return stamp(Path(folder)) if folder else None
    data = spec.data_dir
    if not data or not Path(data).exists():
        return data
    if Path(data).is_file():
        return [stamp(Path(data)), stamp(Path(data).parent / "mapping.json")]
    return stamp(Path(data))


@gym_task(
    identity=lambda entry, options=None, **_: [_data_identity(entry, options), _options_key(entry, options)],
    exclude=("options",),
    record=lambda result, **call: _record_benchmark(result, cached=True, **call),
    name="benchmark",
    task_run_name="{entry} {label}",
    gpu=True,
    timeout_seconds=EVAL_TIMEOUT_S,
)
def benchmark_eval(
    model: ModelRef,
    entry: str,
    options: BenchmarkOptions,
    label: str,
    parent_run_id: str | None = None,
    tracking_uri: str | None = None,
    baseline: EvalResult | None = None,
) -> EvalResult:
    """Score `model` on one benchmark; its MLflow run opens once the score is complete (a failed
    evaluation leaves nothing in MLflow).

    `baseline` (e.g. the score before training) joins the bar chart as a second series.
    """
    result = run_benchmark(model, parse(entry), options)
    _record_benchmark(result, model, entry, options, label, parent_run_id, tracking_uri, baseline)
    return result


def _record_benchmark(
    result: EvalResult,
    model: ModelRef,
    entry: str,
    options: BenchmarkOptions,
    label: str,
    parent_run_id: str | None = None,
    tracking_uri: str | None = None,
    baseline: EvalResult | None = None,
    cached: bool = False,
) -> None:
    """The score's nested MLflow run and its Prefect table artifact (again for a score served from cache)."""
    if parent_run_id:
        _track(result, entry, options, label, model, parent_run_id, tracking_uri, baseline, cached)
    if in_run():  # not under `task.fn()`
        headline = f"{result.metric} {result.overall:.4f} over {result.n_questions} questions"
        create_table_artifact(
            key=artifact_key(f"{result.benchmark}-{label}"),
            table=[{"label": label, **row} for row in result.rows()],
            description=f"{result.benchmark} {label} ({model.name}): {headline}",
        )


def _track(
    result: EvalResult,
    entry: str,
    options: BenchmarkOptions,
    label: str,
    model: ModelRef,
    parent: str,
    uri: str | None,
    baseline: EvalResult | None,
    cached: bool = False,
) -> None:
    params = {"benchmark": entry, "model": model.name, "model_digest": model.digest, **options.model_dump()}
    if options.shots is None and result.shots is not None:  # the default it ran with, not "None"
        params["shots"] = result.shots
    with stage_run(f"{parse(entry).label}-{label}", params, parent, uri) as run_id:
        if run_id:
            if cached:
                tracking.set_tags(run_id, {CACHED_TAG: "true"}, uri=uri)
            _log(run_id, result, label, uri, baseline)
            if result.experiences:  # a TF-GRPO model: the library injected into every prompt
                tags = {f"experiences_{k}": v for k, v in result.experiences.items()}
                tracking.set_tags(run_id, tags, uri=uri)


def _log(run_id: str, result: EvalResult, label: str, uri: str | None, baseline: EvalResult | None) -> None:
    tracking.log_metrics(
        run_id, {**result.metrics(), "n_questions": result.n_questions, "seconds": result.seconds}, uri=uri
    )
    with tempfile.TemporaryDirectory(prefix="gym-eval-") as tmp:
        folder = Path(tmp)
        full = folder / f"{result.benchmark}-{label}.json"
        full.write_text(json.dumps({**result.summary(), "rows": result.rows()}, indent=1, ensure_ascii=False))
        rows = folder / f"{result.benchmark}-{label}.csv"
        with rows.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=["subject", "category", "questions", result.metric])
            writer.writeheader()
            writer.writerows(result.rows())
        for path in (full, rows):
            tracking.log_artifact(run_id, path, uri=uri)
        series = {label: result.categories or {"overall": result.overall}}
        if baseline is not None:
            series = {"before": baseline.categories or {"overall": baseline.overall}, label: series[label]}
        plot = category_bars(
            series, folder / f"{result.benchmark}-{label}-categories.png", f"{result.benchmark}"
        )
        tracking.log_artifact(run_id, plot, uri=uri)
