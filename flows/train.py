"""One training method: check inputs → ingest → resolve model → tokenize → train → evaluate → register.

    python flows/train.py --train.method sft --dataset demo_sft
    python flows/train.py --train.method dpo --dataset demo_dpo --method_eval_dataset demo_dpo_eval
    python flows/train.py --train.method grpo --dataset demo_prompts --method_eval_dataset demo_prompts_eval \
        --warm_start.dataset demo_format_sft      # SFT first, then GRPO from the result
    gym train --method dpo --dataset demo_dpo --json          # the same flow through the CLI

Defaults: SFT of the embedded gym-tiny on the demo data.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from gym.data.formats import METHOD_KIND
from gym.eval.suite import benchmark_summary
from gym.pipeline import TfGrpoFlowConfig, TrainFlowConfig
from gym.summary import summarize
from tasks.data import ingest_dataset, split_dataset, tokenize_dataset
from tasks.evaluate import benchmark_eval, check_benchmarks_task, exact_match
from tasks.model import resolve_model
from tasks.preflight import check_inputs
from tasks.promote import promote_model
from tasks.register import export, register_model
from tasks.tracking import (
    end_cancelled_tracking,
    end_failed_tracking,
    finish_tracking,
    quiet_libraries,
    start_tracking,
)
from tasks.train import train_stage

DEFAULTS = TrainFlowConfig()


# Results persisted (a deployment run's result can be read; a retried run reuses finished tasks); a failed
# or crashed run closes its MLflow runs as FAILED.
@flow(
    name="train",
    persist_result=True,
    on_failure=[end_failed_tracking],
    on_crashed=[end_failed_tracking],
    on_cancellation=[end_cancelled_tracking],
)
def train(config: TrainFlowConfig = DEFAULTS) -> dict[str, Any]:
    quiet_libraries()  # the console of a deployment run too: no MLflow info lines, no progress bars
    check_inputs(config)  # names, files, method/data pairing: fails in a second, before any model
    uri, run_label, method = config.output.tracking_uri, flow_run.get_id(), config.train.method
    if method == "tf_grpo":  # learns an experience library for the frozen model: its own flow
        from flows.tf_grpo import tf_grpo

        return tf_grpo(TfGrpoFlowConfig.from_train_flow(config))
    options = config.benchmark_options  # benchmarks: data and names checked before anything runs
    benchmarks = check_benchmarks_task(config.benchmarks, options) if config.benchmarks else []
    parent = start_tracking(f"train-{method}", config.model_dump(), run_label, uri, config.output.experiment)

    raw = ingest_dataset(config.dataset)
    method_eval_raw = ingest_dataset(config.method_eval_dataset) if config.method_eval_dataset else None
    train_raw = raw
    if config.val_size:  # the held-out part of the data is the method's held-out data
        train_raw, method_eval_raw = split_dataset(
            raw, config.val_size, config.train.seed, config.dataset, config.data.max_samples
        )
    held_out = ingest_dataset(held) if (held := config.exact_match_dataset()) else None
    warm_raw = ingest_dataset(config.warm_start.dataset) if config.warm_start else None

    model = resolve_model(config.model, config.template, config.trust_remote_code, config.new_special_tokens)
    warm = None
    if config.warm_start and warm_raw:  # SFT first; the method starts from its result
        warm_data = tokenize_dataset(warm_raw, model, config.data)
        warm, model = train_stage(config.warm_start.train, model, warm_data, None, parent, uri)
    prompts = METHOD_KIND.get(method) == "prompt"  # online RL: sft data's prompts, its answers as answer
    data = tokenize_dataset(train_raw, model, config.data, prompts)
    method_eval = tokenize_dataset(method_eval_raw, model, config.data, prompts) if method_eval_raw else None

    # both held-out evaluations: limit, tracking, metrics, and the training data's system message
    how = (config.eval_limit, parent, uri, config.eval_metrics, config.data.default_system)
    before = exact_match(model, held_out, "before", *how) if held_out else None
    scores_before = [benchmark_eval(model, b.entry, options, "before", parent, uri) for b in benchmarks]
    result, final_model = train_stage(config.train, model, data, method_eval, parent, uri)
    after = exact_match(final_model, held_out, "after", *how) if held_out else None
    scores_after = [
        benchmark_eval(final_model, b.entry, options, "after", parent, uri, baseline=score)
        for b, score in zip(benchmarks, scores_before, strict=True)
    ]

    name = config.output.register_as or f"{config.model.rsplit('/', 1)[-1]}-{method}"
    lineage = {"dataset": raw.digest, f"{method}_stage": result.digest}
    if warm:
        lineage["warm_start_stage"] = warm.digest
    stages = {"sft": warm, method: result} if warm else {method: result}
    registered = register_model(
        final_model,
        name,
        config.output.alias,
        lineage,
        parent,
        run_label,
        uri,
        config=config.model_dump(),
        stages=stages,
        before=before,
        after=after,
        benchmarks={"before": scores_before, "after": scores_after},
    )
    out = config.output
    promotion = (
        promote_model(name, out.promote_metric, out.promote_margin, out.promote_mode, uri, out.alias)
        if out.promote_metric
        else None
    )
    if config.output.output_dir:
        export(final_model, config.output.output_dir, registered, uri)

    summary = summarize(stages, before, after, registered, parent, final_model.path, run_label, promotion)
    summary |= benchmark_summary(scores_before, scores_after, config.benchmarks)
    finish_tracking(parent, summary, uri)
    return summary


if __name__ == "__main__":
    from flows.runner import run_script

    run_script(train, TrainFlowConfig)
