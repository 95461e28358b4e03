"""SFT then DPO: check inputs → ingest → resolve model → template/tokenize → SFT → DPO → evaluate → register.

Run it with no set-up on the embedded gym-tiny model and the demo data:

    python flows/sft_then_dpo.py                 # prints a summary
    python flows/sft_then_dpo.py --json          # ... ending with one line of JSON
    python flows/sft_then_dpo.py --help          # every flow parameter as a flag

A second run with nothing changed is served from cache. Tasks live in tasks/, ML in gym/.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from gym.eval.suite import benchmark_summary
from gym.pipeline import SftThenDpoConfig
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

DEFAULTS = SftThenDpoConfig()


# Results persisted (a deployment run's result can be read; a retried run reuses finished tasks); a failed
# or crashed run closes its MLflow runs as FAILED.
@flow(
    name="sft-then-dpo",
    persist_result=True,
    on_failure=[end_failed_tracking],
    on_crashed=[end_failed_tracking],
    on_cancellation=[end_cancelled_tracking],
)
def sft_then_dpo(config: SftThenDpoConfig = DEFAULTS) -> dict[str, Any]:
    quiet_libraries()  # the console of a deployment run too: no MLflow info lines, no progress bars
    check_inputs(config)  # names, files, method/data pairing: fails in a second, before any model
    uri, run_label = config.output.tracking_uri, flow_run.get_id()
    options = config.benchmark_options  # benchmarks: data and names checked before anything runs
    benchmarks = check_benchmarks_task(config.benchmarks, options) if config.benchmarks else []
    parent = start_tracking("sft-then-dpo", config.model_dump(), run_label, uri, config.output.experiment)

    sft_raw = ingest_dataset(config.sft_dataset)
    dpo_raw = ingest_dataset(config.dpo_dataset)
    dpo_eval_raw = ingest_dataset(pairs) if (pairs := config.dpo_held_out()) else None
    held_out = ingest_dataset(held) if (held := config.exact_match_dataset()) else None

    sft_train_raw, sft_eval_raw, dpo_train_raw = sft_raw, None, dpo_raw
    if config.val_size:  # each stage without held-out data holds out part of its own
        cap = config.data.max_samples
        sft_train_raw, sft_eval_raw = split_dataset(
            sft_raw, config.val_size, config.sft.seed, config.sft_dataset, cap
        )
        if dpo_eval_raw is None:
            dpo_train_raw, dpo_eval_raw = split_dataset(
                dpo_raw, config.val_size, config.dpo.seed, config.dpo_dataset, cap
            )

    model = resolve_model(config.model, config.template, config.trust_remote_code, config.new_special_tokens)
    sft_data = tokenize_dataset(sft_train_raw, model, config.data)
    sft_eval = tokenize_dataset(sft_eval_raw, model, config.data) if sft_eval_raw else None
    dpo_data = tokenize_dataset(dpo_train_raw, model, config.data)
    dpo_eval = tokenize_dataset(dpo_eval_raw, model, config.data) if dpo_eval_raw else None

    # both held-out evaluations: limit, tracking, metrics, and the training data's system message
    how = (config.eval_limit, parent, uri, config.eval_metrics, config.data.default_system)
    before = exact_match(model, held_out, "before", *how) if held_out else None
    scores_before = [benchmark_eval(model, b.entry, options, "before", parent, uri) for b in benchmarks]
    sft, sft_model = train_stage(config.sft, model, sft_data, sft_eval, parent, uri)
    dpo, final_model = train_stage(config.dpo, sft_model, dpo_data, dpo_eval, parent, uri)
    after = exact_match(final_model, held_out, "after", *how) if held_out else None
    scores_after = [
        benchmark_eval(final_model, b.entry, options, "after", parent, uri, baseline=score)
        for b, score in zip(benchmarks, scores_before, strict=True)
    ]

    name = config.output.register_as or f"{config.model.rsplit('/', 1)[-1]}-sft-dpo"
    stages = {"sft": sft, "dpo": dpo}
    lineage = {
        "sft_dataset": sft_raw.digest,
        "dpo_dataset": dpo_raw.digest,
        "sft_stage": sft.digest,
        "dpo_stage": dpo.digest,
    }
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

    run_script(sft_then_dpo, SftThenDpoConfig)
