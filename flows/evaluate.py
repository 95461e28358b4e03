"""Evaluate a model: benchmarks (MMLU / C-Eval / CMMLU, any lm-eval task) and generation metrics on
held-out data, tracked in MLflow and published as Prefect table artifacts.

    python flows/evaluate.py --model gym-tiny --benchmarks mmlu=../shared/data/eval/mmlu \\
        --benchmark_options.limit 20 --json
    python flows/evaluate.py --model models:/gym-tiny-sft@challenger --benchmarks cmmlu lm-eval:arc_easy
    python flows/evaluate.py --model ./my-model --template chatml --eval_dataset demo_sft_eval \\
        --eval_metrics exact_match bleu rouge

`--model` is a registry name, a model folder or an MLflow model version (`models:/name@alias`);
a registered version gets the scores as tags (`score.mmlu`, `score.mmlu.stem`, `score.exact_match`)
and on its model card, so `gym promote --metric mmlu` can use an evaluation made after registration.
Every benchmark's data is read (and every lm-eval task found) before the MLflow run starts.
With no flags it scores gym-tiny's exact match on the demo held-out data (gym ships no benchmark
questions: MMLU, C-Eval and CMMLU come from your files or the hub); other models get generation
metrics only on held-out data you name (`--eval_dataset`: auto picks the demo's only for gym-tiny
and models trained from it).
For a quick score without Prefect or MLflow: `gym eval`.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from pydantic import BaseModel, ConfigDict, Field

from gym.data.registry import AUTO
from gym.eval.suite import BenchmarkOptions
from gym.models import ModelRef
from gym.pipeline import registry_choices
from gym.secrets import NO_LOGIN_ITEMS, NO_LOGIN_SCHEMA
from tasks.data import ingest_dataset
from tasks.evaluate import benchmark_eval, check_benchmarks_task, exact_match
from tasks.model import resolve_model
from tasks.preflight import check_inputs
from tasks.register import record_version_scores
from tasks.tracking import (
    end_cancelled_tracking,
    end_failed_tracking,
    finish_tracking,
    quiet_libraries,
    start_tracking,
)


class EvalOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    experiment: str = Field("gym", description="MLflow experiment name.")
    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI, without a login (MLFLOW_TRACKING_USERNAME / _PASSWORD hold it); "
        "default: $MLFLOW_TRACKING_URI or SQLite in the workspace.",
        json_schema_extra=NO_LOGIN_SCHEMA,
    )


class EvaluateConfig(BaseModel):
    """Score one model on benchmarks and, optionally, generation metrics on held-out data."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "gym-tiny",
        description="Registry name, model folder, hub id or MLflow version (models:/name@alias).",
        json_schema_extra=registry_choices("model", "folder, hub id or models:/name@alias"),
    )
    template: str | None = Field(
        None, description="Chat template; default: the model's.", json_schema_extra=NO_LOGIN_SCHEMA
    )
    trust_remote_code: bool = Field(False, description="Let transformers run the model repo's code.")
    benchmarks: list[str] = Field(
        [],
        description="mmlu, ceval, cmmlu (NAME=DIR for a folder, .zip or hub id; default: the hub) "
        "or lm-eval:TASK for any lm-eval task.",
        json_schema_extra=NO_LOGIN_ITEMS,
    )
    benchmark_options: BenchmarkOptions = Field(
        # Every question: an evaluation run scores whole benchmarks, as lm-eval does (the training flows
        # score 10 per subject before and after, to keep a short run short).
        default_factory=lambda: BenchmarkOptions(limit=None),
        description="Questions per subject (default: all), shots, batch size.",
    )
    eval_dataset: str | None = Field(
        AUTO,
        description="Held-out instruction data for generation metrics (None to skip); auto: demo_sft_eval "
        "for gym-tiny and models trained from it (the demo's model), none for other models.",
        json_schema_extra=NO_LOGIN_SCHEMA,
    )
    eval_limit: int | None = Field(None, description="Only the first N held-out records.")
    eval_metrics: list[str] = Field(
        ["exact_match"], description="exact_match, bleu, rouge, or your own metric as pkg.module:fn."
    )
    output: EvalOutput = Field(default_factory=EvalOutput, description="Where results are tracked.")

    def dataset_uses(self) -> dict[str, tuple[str, str]]:
        """For gym.preflight: named held-out data is read as instruction records (auto's is the demo's)."""
        named = self.eval_dataset not in (None, AUTO)
        return {"eval_dataset": (self.eval_dataset, "exact_match")} if named else {}

    def held_out_for(self, model: ModelRef) -> str | None:
        """The held-out data to score `model` on: as named, or for auto the demo's held-out split if the
        model is gym-tiny or descends from it (a model trained on other data would be scored on tasks it
        never saw, at the cost of generating every answer)."""
        from gym import tiny

        if self.eval_dataset != AUTO:
            return self.eval_dataset
        return "demo_sft_eval" if model.base_model == tiny.KIND else None


DEFAULTS = EvaluateConfig()


# As the training flows: results persisted, a failed or crashed run closes its MLflow runs as FAILED.
@flow(
    name="evaluate",
    persist_result=True,
    on_failure=[end_failed_tracking],
    on_crashed=[end_failed_tracking],
    on_cancellation=[end_cancelled_tracking],
)
def evaluate(config: EvaluateConfig = DEFAULTS) -> dict[str, Any]:
    quiet_libraries()  # the console of a deployment run too: no MLflow info lines, no progress bars
    check_inputs(config)  # model, template, held-out data: fails in a second, before any model
    uri, run_label, options = config.output.tracking_uri, flow_run.get_id(), config.benchmark_options
    benchmarks = check_benchmarks_task(config.benchmarks, options)
    parent = start_tracking("evaluate", config.model_dump(), run_label, uri, config.output.experiment)

    model = resolve_model(config.model, config.template, config.trust_remote_code)
    scores = {b.label: benchmark_eval(model, b.entry, options, "eval", parent, uri) for b in benchmarks}
    held_name = config.held_out_for(model)
    if held_name is None and config.eval_dataset == AUTO:
        get_run_logger().info(
            f"no generation metrics: {config.model} does not descend from gym-tiny, whose demo held-out "
            "data would score it on tasks it never trained for; name yours with --eval_dataset FILE_OR_NAME"
        )
    held_out = ingest_dataset(held_name) if held_name else None
    generated = (
        exact_match(model, held_out, "eval", config.eval_limit, parent, uri, config.eval_metrics)
        if held_out
        else None
    )

    summary: dict[str, Any] = {"model": config.model, "mlflow_run_id": parent, "flow_run_id": run_label}
    if config.model.startswith("models:/"):  # the registered version keeps its scores, for promotion
        recorded = record_version_scores(model, list(scores.values()), generated, run_label)
        summary["scored_version"] = recorded["version"]
    for label, result in scores.items():
        summary[label] = result.overall
        summary.update({f"{label}/{name}": value for name, value in result.categories.items()})
    if generated is not None:
        summary.update(generated.scores)
    finish_tracking(parent, summary, uri)
    return summary


if __name__ == "__main__":
    from flows.runner import run_script

    run_script(evaluate, EvaluateConfig)
