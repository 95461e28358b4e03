"""Evaluation as a pipeline stage, through Prefect and MLflow for real: flows/evaluate.py, and the
training flow scoring benchmarks before and after training; bad benchmark data stops a flow before
its MLflow run exists."""

from __future__ import annotations

import json
import re

import pytest
from mlflow import MlflowClient

from flows.runner import main
from gym import tracking
from tests.eval_fixtures import write_benchmark

pytest.importorskip("lm_eval")


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def child_runs(parent: str) -> dict:
    client = MlflowClient(tracking.tracking_uri())
    experiment = client.get_run(parent).info.experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    return {r.data.tags["mlflow.runName"]: r for r in runs}


def table_artifacts(key: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


def test_evaluate_flow_tracks_benchmarks_and_generation_metrics(prefect_server, tmp_path, capsys):
    from flows.evaluate import EvaluateConfig, evaluate

    mmlu = write_benchmark("mmlu", tmp_path / "mmlu")
    cmmlu = write_benchmark("cmmlu", tmp_path / "cmmlu", as_zip=True)
    argv = ["--model", "gym-tiny", "--benchmarks", f"mmlu={mmlu}", f"cmmlu={cmmlu}"]
    argv += ["--eval_limit", "4", "--eval_metrics", "exact_match", "bleu"]  # every benchmark question
    assert main(evaluate, EvaluateConfig, [*argv, "--json"]) == 0
    summary = last_json(capsys.readouterr().out)
    assert 0 <= summary["mmlu"] <= 1 and 0 <= summary["cmmlu"] <= 1
    assert {"mmlu/STEM", "cmmlu/Other", "exact_match", "bleu"} <= set(summary)

    client = MlflowClient(tracking.tracking_uri())
    runs = child_runs(summary["mlflow_run_id"])
    assert {"mmlu-eval", "cmmlu-eval", "eval-eval"} <= set(runs)
    mmlu_run = runs["mmlu-eval"]
    assert mmlu_run.data.metrics["mmlu/overall"] == summary["mmlu"]
    assert mmlu_run.data.metrics["n_questions"] == 12  # all 6 per subject, two subjects
    assert mmlu_run.data.params["shots"] == "5" and mmlu_run.data.params["limit"] == "None"  # as scored
    assert {"mmlu/STEM", "mmlu/subject/abstract_algebra"} <= set(mmlu_run.data.metrics)
    files = {a.path for a in client.list_artifacts(mmlu_run.info.run_id)}
    assert files == {"mmlu-eval.json", "mmlu-eval.csv", "mmlu-eval-categories.png"}
    rows = table_artifacts("mmlu-eval")[0].data
    assert {r["subject"] for r in (json.loads(rows) if isinstance(rows, str) else rows)} == {
        "abstract_algebra",
        "high_school_biology",
    }
    # the held-out score's artifact: an evaluation run trains nothing ("... eval training", it said)
    assert {a.description for a in table_artifacts("exact-match-eval")} == {"Held-out exact match"}


def test_training_flow_scores_benchmarks_before_and_after(prefect_server, tmp_path, capsys):
    from flows.train import train
    from gym.pipeline import TrainFlowConfig

    mmlu = write_benchmark("mmlu", tmp_path / "mmlu")
    argv = ["--train.method", "sft", "--dataset", "demo_sft", "--max_steps", "20", "--eval_limit", "4"]
    argv += [
        "--benchmarks",
        f"mmlu={mmlu}",
        "--benchmark_options.limit",
        "3",
        "--benchmark_options.shots",
        "1",
    ]
    assert main(train, TrainFlowConfig, [*argv, "--json"]) == 0
    summary = last_json(capsys.readouterr().out)
    assert summary["mmlu_before"] is not None and summary["mmlu_after"] is not None
    runs = child_runs(summary["mlflow_run_id"])
    before, after = runs["mmlu-before"], runs["mmlu-after"]
    assert before.data.params["model_digest"] != after.data.params["model_digest"]  # the trained model
    assert after.data.metrics["mmlu/overall"] == summary["mmlu_after"]
    assert before.data.params["limit"] == "3" and before.data.params["shots"] == "1"
    client = MlflowClient(tracking.tracking_uri())
    assert "mmlu-after-categories.png" in {a.path for a in client.list_artifacts(after.info.run_id)}
    # The registered version carries both benchmark scores (overall and per category), for promotion.
    tags = client.get_model_version(summary["model_name"], summary["model_version"]).tags
    assert float(tags["score.mmlu_after"]) == summary["mmlu_after"]
    assert float(tags["score.mmlu_before"]) == summary["mmlu_before"]
    assert float(tags["score.mmlu_after.stem"]) == after.data.metrics["mmlu/STEM"]
    # Before and after asked the same questions.
    assert tags["score_setup.mmlu_after"] == tags["score_setup.mmlu_before"]
    assert re.fullmatch(r"gym, 1-shot, 6 questions \(set [0-9a-f]{12}\)", tags["score_setup.mmlu_after"])


def test_bad_benchmark_data_stops_the_flow_before_anything_is_tracked(prefect_server, tmp_path, capsys):
    from flows.train import train
    from gym.pipeline import TrainFlowConfig

    mmlu = write_benchmark("mmlu", tmp_path / "mmlu")
    (mmlu / "data/dev/abstract_algebra_dev.csv").unlink()
    argv = ["--benchmarks", f"mmlu={mmlu}", "--max_steps", "5"]
    assert main(train, TrainFlowConfig, argv) == 2
    assert "missing data/dev/abstract_algebra_dev.csv" in capsys.readouterr().err
    client = MlflowClient(tracking.tracking_uri())
    experiment = client.get_experiment_by_name("gym")
    assert experiment is None or not client.search_runs([experiment.experiment_id])


def test_evaluate_flow_scores_only_named_held_out_data_on_a_model_not_from_gym_tiny(
    prefect_server, tmp_path, capsys, caplog
):
    """auto held-out data is the demo's for gym-tiny's line only: another model gets benchmarks alone,
    and the log says how to add generation metrics; named held-out data is scored as before."""
    import shutil

    from flows.evaluate import EvaluateConfig, evaluate
    from gym.models import resolve

    folder = tmp_path / "my-model"
    shutil.copytree(resolve("gym-tiny").path, folder)
    (folder / "gym_model.json").unlink(missing_ok=True)  # a model from elsewhere: no gym lineage
    mmlu = write_benchmark("mmlu", tmp_path / "mmlu")
    argv = ["--model", str(folder), "--template", "chatml", "--benchmarks", f"mmlu={mmlu}"]
    argv += ["--benchmark_options.limit", "2", "--json"]
    assert main(evaluate, EvaluateConfig, argv) == 0
    summary = last_json(capsys.readouterr().out)
    assert "mmlu" in summary and "exact_match" not in summary
    assert "eval-eval" not in child_runs(summary["mlflow_run_id"])
    assert "no generation metrics" in caplog.text and "--eval_dataset" in caplog.text

    named = ["--eval_dataset", "demo_sft_eval", "--eval_limit", "4"]
    assert main(evaluate, EvaluateConfig, [*argv, *named]) == 0
    assert "exact_match" in last_json(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--max-steps", "5"], "--max-steps: this flow trains no weights"),
        (["--finetuning_type", "lora"], "--finetuning_type: this flow trains no weights"),
        (["--num_train_epochs", "2"], "--num_train_epochs: this flow trains no weights"),
        (["--output_dir", "out"], "--output_dir: this flow writes no model to copy"),
        (["--dataset", "demo_sft"], "--dataset: this flow trains on no dataset"),
    ],
)
def test_the_evaluate_flow_refuses_training_flags_and_does_not_list_them(argv, says, capsys):
    """Listed in its --help, these were ignored (a run said nothing) or failed naming inner fields
    (`sft_dataset: Extra inputs are not permitted`)."""
    from flows.evaluate import EvaluateConfig, evaluate
    from flows.runner import build_parser

    assert main(evaluate, EvaluateConfig, argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {says}") and "\n" not in err
    assert argv[0] not in build_parser(EvaluateConfig).format_help()


def test_a_benchmark_rerun_follows_what_it_reads_beside_its_name(tmp_path):
    """The flow's benchmark cache key: a zip's mapping.json beside it (its names enter the prompts) and
    an lm-eval task's include_path folder (its YAML and data) were left out, so an edit to either gave
    back the old score."""
    import time

    from gym.eval.suite import BenchmarkOptions
    from tasks.evaluate import _data_identity

    zipped = write_benchmark("mmlu", tmp_path / "zipped", as_zip=True)
    entry = f"mmlu={zipped}"
    before = _data_identity(entry)
    time.sleep(0.01)
    mapping = zipped.parent / "mapping.json"
    table = json.loads(mapping.read_text())
    mapping.write_text(
        json.dumps({s: {**info, "name": info["name"] + " (renamed)"} for s, info in table.items()})
    )
    assert _data_identity(entry) != before, "mapping.json beside the zip"

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "data.jsonl").write_text('{"label": 0}\n')
    options = BenchmarkOptions(include_path=str(tasks))
    before = _data_identity("lm-eval:my_task", options)
    time.sleep(0.01)
    (tasks / "data.jsonl").write_text('{"label": 2}\n')
    assert _data_identity("lm-eval:my_task", options) != before, "a file in include_path"
    assert _data_identity("lm-eval:my_task") is None  # no folder of its own: the task's name says it
