"""A flow run whose tasks are served from cache records their results as the run that computed them
did: its MLflow parent run gets the stage and evaluation runs (tagged `gym.from_cache`, same numbers,
same files) and its Prefect flow run the artifacts. Before, a re-run's MLflow run held only the summary:
the per-stage curves and the per-subject scores stayed with the first run."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from flows.runner import main
from gym import tracking
from tasks._common import CACHED_TAG
from tests.eval_fixtures import write_benchmark

pytest.importorskip("lm_eval")


def _children(client: MlflowClient, parent: str) -> dict:
    experiment = client.get_run(parent).info.experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    return {r.data.tags["mlflow.runName"]: r for r in runs}


def _artifact_keys(flow_run_id: str) -> set[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key for a in found if a.key}


def test_a_rerun_from_cache_records_each_stage_and_score_in_its_own_runs(
    gym_home, prefect_server, tmp_path, capsys
):
    from flows.train import TrainFlowConfig, train

    mmlu = write_benchmark("mmlu", tmp_path / "mmlu")
    argv = ["--train.method", "sft", "--dataset", "demo_sft", "--max_steps", "6", "--eval_limit", "4"]
    argv += ["--benchmarks", f"mmlu={mmlu}", "--benchmark_options.limit", "2", "--json"]
    summaries = []
    for _ in range(2):
        assert main(train, TrainFlowConfig, argv) == 0
        summaries.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    first, second = summaries
    assert first["cached_tasks"] == 0 and second["cached_tasks"] >= 5

    client = MlflowClient(tracking.tracking_uri())
    computed, replayed = (_children(client, s["mlflow_run_id"]) for s in summaries)
    stages = {"sft", "eval-before", "eval-after", "mmlu-before", "mmlu-after"}
    assert stages <= set(computed) and stages <= set(replayed)
    for name in stages:
        was, now = computed[name], replayed[name]
        assert CACHED_TAG not in was.data.tags and now.data.tags[CACHED_TAG] == "true", name
        assert now.data.metrics == was.data.metrics, name
        assert now.data.params == was.data.params, name
        files = {a.path for a in client.list_artifacts(was.info.run_id)}
        assert {a.path for a in client.list_artifacts(now.info.run_id)} == files, name
    assert {a.path for a in client.list_artifacts(replayed["sft"].info.run_id)} >= {"loss.png"}
    curve = client.get_metric_history(replayed["sft"].info.run_id, "train_loss")
    assert len(curve) == len(client.get_metric_history(computed["sft"].info.run_id, "train_loss")) >= 2
    assert replayed["mmlu-after"].data.metrics["mmlu/overall"] == second["mmlu_after"] == first["mmlu_after"]

    keys = _artifact_keys(second["flow_run_id"])
    assert {"stage-sft", "exact-match-before", "exact-match-after", "mmlu-before", "mmlu-after"} <= keys, keys


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("Running hook 'record_cached_result' in response to entering state 'Cached'", True),
        ("Running hook 'record_cached_result' in response to entering state 'Completed'", False),
        ("Hook 'record_cached_result' finished running successfully", False),
        ("Running hook 'end_failed_tracking' in response to entering state 'Failed'", True),
        ("Finished in state Cached(type=COMPLETED)", True),
    ],
)
def test_the_record_hooks_bookkeeping_lines_are_left_out_of_the_logs(message, shown):
    import logging

    from tasks._logs import UserErrorFilter

    record = logging.LogRecord("prefect.task_runs", logging.INFO, __file__, 1, message, None, None)
    assert UserErrorFilter().filter(record) is shown


def test_a_setting_only_lm_eval_tasks_read_does_not_score_gyms_own_benchmarks_again(
    gym_home, prefect_server, tmp_path
):
    from prefect import flow

    from gym.eval.suite import BenchmarkOptions
    from gym.models import resolve
    from tasks.evaluate import benchmark_eval

    model, entry = resolve("gym-tiny"), f"mmlu={write_benchmark('mmlu', tmp_path / 'mmlu')}"
    base = BenchmarkOptions(limit=1, shots=0)

    @flow
    def scores(*options: BenchmarkOptions) -> list[str]:
        return [benchmark_eval(model, entry, o, "x", return_state=True).name for o in options]

    other_yamls = base.model_copy(update={"include_path": str(tmp_path)})
    more = base.model_copy(update={"limit": 2})
    assert scores(base, other_yamls, more) == ["Completed", "Cached", "Completed"]
