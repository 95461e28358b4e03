"""Training-Free GRPO tasks: each one gym call on references (the prepared run, a library version,
a step plan, a question) returning small records.

Not cached by Prefect: every LLM call is already content-addressed in gym's call cache, which is
what makes a killed flow resume without paying twice; a Prefect cache on top would only store the
same answers again. Rollouts are mapped over questions (one task per group, its calls concurrent
inside it); the per-endpoint concurrency limit lives in the client, so it holds across every task
thread.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from gym import tracking
from gym.models import ModelRef
from gym.pipeline import TfGrpoFlowConfig
from gym.tfgrpo import engine, report, stages
from gym.tfgrpo.data import Question, StepPlan
from gym.tfgrpo.library import LibraryRef
from gym.tfgrpo.step import StepManifest, commit, library_path, load_manifest
from gym.train import tf_grpo
from gym.train.tf_grpo import TfGrpoRun, runtime

LLM_TASK: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False, "retries": 0}


@task(name="tfgrpo-prepare", task_run_name="prepare", **LLM_TASK)
def prepare_run(config: TfGrpoFlowConfig) -> TfGrpoRun:
    """Load the questions, check the settings, name the run directory by the config hash. With
    `--refresh-cache` (Prefect's refresh setting), every LLM call is asked again and every step redone."""
    from prefect.settings import PREFECT_TASKS_REFRESH_CACHE

    return tf_grpo.prepare_from_datasets(
        config.settings(),
        config.model,
        config.dataset,
        config.held_out_questions(),
        config.template,
        config.trust_remote_code,
        max_steps=config.steps,
        refresh=bool(PREFECT_TASKS_REFRESH_CACHE.value()),
    )


@task(name="tfgrpo-start-library", task_run_name="start library", **LLM_TASK)
def start_library(run: TfGrpoRun) -> LibraryRef:
    library, path = engine.start_library(runtime(run), run.start)
    return LibraryRef.of(library, path)


@task(name="tfgrpo-resume", task_run_name="resume? step {step.index}", **LLM_TASK)
def resume_step(run: TfGrpoRun, step: StepPlan, library: LibraryRef) -> tuple[StepPlan, LibraryRef | None]:
    """The step to run (attempt counted up for a degraded one), or the library it already produced."""
    step, done = engine.resumable(runtime(run), step, library.load())
    if done is None:
        return step, None
    return step, LibraryRef.of(done, library_path(Path(run.run_dir), done.version, done.content_hash()))


@task(name="tfgrpo-rollout", task_run_name="rollout s{step.index} q{question.id}", **LLM_TASK)
def rollout(
    run: TfGrpoRun, step: StepPlan, question: Question, library: LibraryRef
) -> list[stages.RolloutChunk]:
    """The group's G samples: its calls (G / n per call) run side by side."""
    return stages.rollout_group(runtime(run), step, question, library.load())


@task(name="tfgrpo-reward", task_run_name="reward s{step.index} q{question.id}", **LLM_TASK)
def reward(
    run: TfGrpoRun, step: StepPlan, question: Question, chunks: list[stages.RolloutChunk]
) -> stages.Rewarded:
    return stages.reward(runtime(run), question, [r for c in chunks for r in c.rollouts])


@task(name="tfgrpo-summarize", task_run_name="summarize s{step.index} q{question.id}", **LLM_TASK)
def summarize(
    run: TfGrpoRun,
    step: StepPlan,
    question: Question,
    chunks: list[stages.RolloutChunk],
    rewarded: stages.Rewarded,
    library: LibraryRef,
) -> list[stages.Summary]:
    """Stage 1 for each rollout of an informative group, concurrently (no call for another group)."""
    rollouts = [r for c in chunks for r in c.rollouts]
    return stages.summarize_group(runtime(run), step, question, rollouts, rewarded, library.load())


@task(name="tfgrpo-extract", task_run_name="extract s{step.index} q{question.id}", **LLM_TASK)
def extract(
    run: TfGrpoRun,
    step: StepPlan,
    question: Question,
    rewarded: stages.Rewarded,
    summaries: list[stages.Summary],
    library: LibraryRef,
) -> stages.StageOutput | None:
    """Stage 2 for an informative group (else None)."""
    if not rewarded.informative:
        return None
    values = [float(r or 0.0) for r in rewarded.rewards]
    return stages.extract(runtime(run), step, question, values, summaries, library.load())


@task(name="tfgrpo-consolidate", task_run_name="consolidate s{step.index}", **LLM_TASK)
def consolidate(
    run: TfGrpoRun, step: StepPlan, library: LibraryRef, extractions: list[stages.StageOutput | None]
) -> stages.StageOutput | None:
    """Stage 3 over the batch's proposals (None, no call, when nothing was proposed)."""
    proposals = [e.ops for e in extractions if e is not None]
    return stages.consolidate(runtime(run), step, library.load(), proposals)


@task(name="tfgrpo-apply", task_run_name="apply s{step.index}", **LLM_TASK)
def apply_step(
    run: TfGrpoRun,
    step: StepPlan,
    library: LibraryRef,
    batch: list[Question],
    chunks: dict[str, list[stages.RolloutChunk]],
    rewards: dict[str, stages.Rewarded],
    summaries: dict[str, list[stages.Summary]],
    extractions: dict[str, stages.StageOutput | None],
    consolidation: stages.StageOutput | None,
) -> tuple[StepManifest, LibraryRef]:
    """Apply the final operations, save the new version, write the step manifest (atomically)."""
    groups = [
        engine.group_record(q, chunks[q.id], rewards[q.id], summaries[q.id], extractions[q.id]) for q in batch
    ]
    rt = runtime(run)
    manifest, new = commit(rt.run_dir, step, rt.config_hash, library.load(), groups, consolidation)
    return manifest, LibraryRef.of(new, library_path(rt.run_dir, new.version, new.content_hash()))


@task(name="tfgrpo-publish", task_run_name="publish s{manifest.step}", **LLM_TASK)
def publish_step(
    run: TfGrpoRun, manifest: StepManifest, mlflow_run_id: str | None, tracking_uri: str | None
) -> None:
    """The step's numbers and new library version to MLflow; its library diff as a Prefect artifact."""
    markdown = (
        report.track_step(Path(run.run_dir), manifest, mlflow_run_id, tracking_uri)
        if mlflow_run_id
        else report.step_markdown(Path(run.run_dir), manifest)
    )
    create_markdown_artifact(
        key="tf-grpo-library-diff",
        markdown=markdown,
        description=f"Experience library diff of step {manifest.step}",
    )


@task(name="tfgrpo-evaluate", task_run_name="evaluate {tag}", **LLM_TASK)
def evaluate_library(run: TfGrpoRun, library: LibraryRef, tag: str) -> engine.EvalRecord:
    """Held-out Mean@k / Pass@k of the policy with this library injected."""
    return engine.evaluate_alone(runtime(run), run.eval_questions() or [], library.load(), tag)


@task(name="tfgrpo-start-tracking", task_run_name="start tracking", **LLM_TASK)
def start_stage_tracking(run: TfGrpoRun, parent_run_id: str, tracking_uri: str | None) -> str:
    """The nested MLflow run of the TF-GRPO stage (params = the settings, keys redacted)."""
    params = {**run.settings.model_dump(), "model": run.model, "config_hash": run.config_hash}
    return tracking.start_run("tf_grpo", params=params, parent_run_id=parent_run_id, uri=tracking_uri)


@task(name="tfgrpo-finish", task_run_name="finish", **LLM_TASK)
def finish_run(
    run: TfGrpoRun,
    library: LibraryRef,
    evals: list[engine.EvalRecord],
    mlflow_run_id: str | None,
    tracking_uri: str | None,
    started: float,
) -> engine.RunResult:
    """Totals of the run, its final library, and the close of its MLflow run."""
    manifests = [load_manifest(Path(run.run_dir), s.index) for s in run.steps]
    done = [m for m in manifests if m is not None]
    result = engine.finish(runtime(run), library.load(), done, evals, seconds=time.time() - started)
    if mlflow_run_id:
        report.track_run(result, mlflow_run_id, tracking_uri)
    return result


@task(name="tfgrpo-ship", task_run_name="ship model", **LLM_TASK)
def ship_model(run: TfGrpoRun, result: engine.RunResult) -> tuple[str, ModelRef | None]:
    """The final model directory (model files + experiences.json) and, for a local model, its ModelRef."""
    from gym.models import derived

    model = tf_grpo.local_model(run)
    model_dir = tf_grpo.ship(run, result, model)
    return str(model_dir), derived(model, model_dir, run.config_hash) if model is not None else None


@task(name="tfgrpo-export", task_run_name="export to {output_dir}", **LLM_TASK)
def export_model_dir(model_dir: str, output_dir: str) -> str:
    """Export the shipped model directory (experiences.json included) to `output_dir`."""
    return str(tf_grpo.export(Path(model_dir), Path(output_dir)))
