"""Training-Free GRPO: learn an experience library for a frozen model, step by step, as Prefect tasks.

    python flows/tf_grpo.py --endpoint http://127.0.0.1:8000/v1 --model gym-tiny --json
    gym train --method tf_grpo --endpoint URL --dataset D --group-size 5 --epochs 3 --json
    gym train --finetuning_type grpo --training_free_grpo --group_size 5 --num_train_epochs 3 --output_dir DIR

Each step: rollouts (mapped over questions x samples) -> reward -> summarize (informative groups
only) -> extract -> consolidate (once per batch, skipped when nothing was proposed) -> apply,
which writes the step's manifest and the new library version; then the version goes to MLflow and
its diff to a Prefect markdown artifact, beside the next step. Held-out Mean@k is measured before
and after each epoch (also beside the steps that follow);
`benchmarks` (MMLU, C-Eval, CMMLU, lm-eval tasks) score the model before training and the shipped
model (its library injected into every prompt) after, as the other training flows do.
A re-run of the same config resumes: finished steps are read back, and every LLM call already
made comes from gym's call cache. The final library ships with the model (experiences.json).
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import opaque, quote

from gym.eval.suite import benchmark_summary
from gym.pipeline import TfGrpoFlowConfig
from gym.progress import Progress
from gym.tfgrpo.data import Question, StepPlan
from gym.tfgrpo.engine import eval_tag
from gym.tfgrpo.library import LibraryRef
from gym.train.tf_grpo import TfGrpoRun, summary
from tasks.evaluate import benchmark_eval, check_benchmarks_task
from tasks.model import resolve_model
from tasks.preflight import check_inputs
from tasks.register import register_model
from tasks.tfgrpo import (
    apply_step,
    consolidate,
    evaluate_library,
    export_model_dir,
    extract,
    finish_run,
    prepare_run,
    publish_step,
    resume_step,
    reward,
    rollout,
    ship_model,
    start_library,
    start_stage_tracking,
    summarize,
)
from tasks.tracking import (
    end_cancelled_tracking,
    end_failed_tracking,
    finish_tracking,
    quiet_libraries,
    start_tracking,
)

DEFAULTS = TfGrpoFlowConfig()


def raise_first_failure(futures: list[PrefectFuture[Any]]) -> None:
    """A failed task stops the run with its own error (a spent budget says how to resume), not with
    Prefect's "upstream did not complete" from the tasks that waited on it."""
    for future in futures:
        future.wait()
        if future.state.is_failed():
            future.result()  # raises the task's exception


def run_step(
    run: TfGrpoRun,
    step: StepPlan,
    library: LibraryRef,
    questions: list[Question],
    tracked: str,
    uri: str | None,
) -> tuple[LibraryRef, PrefectFuture[None]]:
    """One step's task graph; each group moves on as soon as its own rollouts are back. Returns the new
    library and the step's publication to MLflow / Prefect, which runs on beside the next step.

    Prefect looks inside every task argument for futures to wait on, field by field: the references
    (run, step, question, library) hold none, so they are `quote`d; an upstream result is `opaque`
    (waited for, not searched). That search, over a step's many tasks, was most of the flow's cost.
    """
    batch = [questions[i] for i in step.questions]
    r, s, lib, qs = quote(run), quote(step), quote(library), {q.id: quote(q) for q in batch}
    chunks = {q.id: rollout.submit(r, s, qs[q.id], lib) for q in batch}
    rewards = {q.id: reward.submit(r, s, qs[q.id], opaque(chunks[q.id])) for q in batch}
    summaries = {
        q.id: summarize.submit(r, s, qs[q.id], opaque(chunks[q.id]), opaque(rewards[q.id]), lib)
        for q in batch
    }
    extractions = {
        q.id: extract.submit(r, s, qs[q.id], opaque(rewards[q.id]), opaque(summaries[q.id]), lib)
        for q in batch
    }
    consolidation = consolidate.submit(r, s, lib, [opaque(extractions[q.id]) for q in batch])
    raise_first_failure([*chunks.values(), *rewards.values(), *summaries.values(), *extractions.values()])
    raise_first_failure([consolidation])
    manifest, new_library = apply_step(
        r,
        s,
        lib,
        quote(batch),
        {k: opaque(v) for k, v in chunks.items()},
        {k: opaque(v) for k, v in rewards.items()},
        {k: opaque(v) for k, v in summaries.items()},
        {k: opaque(v) for k, v in extractions.items()},
        opaque(consolidation),
    )
    return new_library, publish_step.submit(r, quote(manifest), tracked, uri)


# Like the other training flows: results persisted, a failed or crashed run closes its MLflow runs as FAILED.
@flow(
    name="tf-grpo",
    task_runner=ThreadPoolTaskRunner(max_workers=64),
    persist_result=True,
    on_failure=[end_failed_tracking],
    on_crashed=[end_failed_tracking],
    on_cancellation=[end_cancelled_tracking],
)
def tf_grpo(config: TfGrpoFlowConfig = DEFAULTS) -> dict[str, Any]:
    quiet_libraries()  # the console of a deployment run too: no MLflow info lines, no progress bars
    check_inputs(config)  # model name (unless it lives behind an endpoint), template: in a second
    options = config.benchmark_options  # benchmark files and names, checked before any LLM call
    benchmarks = check_benchmarks_task(config.benchmarks, options) if config.benchmarks else []
    started, uri, run_label = time.time(), config.output.tracking_uri, flow_run.get_id()
    parent = start_tracking("tf-grpo", config.model_dump(), run_label, uri, config.output.experiment)

    run = prepare_run(config)
    tracked = start_stage_tracking(run, parent, uri)
    questions, held_out = run.questions(), run.eval_questions()
    library = start_library(run)
    base = resolve_model(config.model, config.template, config.trust_remote_code) if benchmarks else None
    scores_before = [benchmark_eval(base, b.entry, options, "before", parent, uri) for b in benchmarks]
    # Held-out evaluations and each step's publication depend on a library version only: they run beside
    # the steps that follow (the endpoint's concurrency limit still holds), and the run waits for them here.
    evals = [evaluate_library.submit(quote(run), quote(library), "before")] if held_out else []
    published, bar = [], None
    for planned in run.steps:
        step, done = resume_step(run, planned, library)
        if done is None:  # the console's progress counts the steps this run makes (resumed ones are read)
            bar = bar or Progress("tf_grpo", len(run.steps), start=step.index)
            library, publication = run_step(run, step, library, questions, tracked, uri)
            published.append(publication)
            bar.update(step.index + 1, note=f"library {library.size} items")
        else:
            library = done
        tag = eval_tag(run.steps, step.index, len(questions), run.settings.batch_size)
        if held_out and tag is not None:  # each epoch's end (and a --max-steps run's last step)
            evals.append(evaluate_library.submit(quote(run), quote(library), tag))
    stepped = time.monotonic()  # the steps' time, which the closing line shows
    raise_first_failure([*published, *evals])
    result = finish_run(run, library, [opaque(e) for e in evals], tracked, uri, started)
    if bar is not None:  # once the run is known to have learned (else its error, not "done", ends it)
        bar.done(now=stepped)

    model_dir, model = ship_model(run, result)
    scores_after = [  # the shipped model: its experiences.json is injected into every prompt
        benchmark_eval(model, b.entry, options, "after", parent, uri, baseline=score)
        for b, score in zip(benchmarks, scores_before, strict=True)
    ]
    registered = {"name": None, "version": None}
    if model is not None:
        name = config.output.register_as or f"{config.model.rsplit('/', 1)[-1]}-tf-grpo"
        lineage = {
            "dataset": run.dataset_digest,
            "tf_grpo_run": run.config_hash,
            "library": result.library_hash,
        }
        registered = register_model(
            model,
            name,
            config.output.alias,
            lineage,
            parent,
            run_label,
            uri,
            benchmarks={"before": scores_before, "after": scores_after},
        )
    if config.output.output_dir:
        export_model_dir(model_dir, config.output.output_dir)

    out = summary(run, result, model_dir, registered, parent, run_label)
    out |= benchmark_summary(scores_before, scores_after, config.benchmarks)
    finish_tracking(parent, out, uri)
    return out


if __name__ == "__main__":
    from flows.runner import run_script

    run_script(tf_grpo, TfGrpoFlowConfig)
