"""`--output.experiment` puts a flow run's MLflow runs in the experiment it names (it was accepted and
ignored: every run landed in `gym`), with its stage runs nested beside their parent; the runs a failed or
killed flow left open are ended in whatever experiment they are."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from flows.runner import main
from gym import liveness, tracking
from tests.eval_fixtures import write_benchmark

pytest.importorskip("lm_eval")


def test_the_evaluate_flow_tracks_into_the_experiment_it_is_given(gym_home, prefect_server, tmp_path, capsys):
    from flows.evaluate import EvaluateConfig, evaluate

    mmlu = write_benchmark("mmlu", tmp_path / "mmlu")
    argv = ["--model", "gym-tiny", "--benchmarks", f"mmlu={mmlu}", "--benchmark_options.limit", "2"]
    argv += ["--eval_dataset", "none", "--output.experiment", "qa-exp", "--json"]
    assert main(evaluate, EvaluateConfig, argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    client = MlflowClient(tracking.tracking_uri())
    exp = client.get_experiment_by_name("qa-exp")
    assert exp is not None
    parent = client.get_run(summary["mlflow_run_id"])
    assert parent.info.experiment_id == exp.experiment_id
    children = client.search_runs(
        [exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert [c.data.tags["mlflow.runName"] for c in children] == ["mmlu-eval"]
    default = client.get_experiment_by_name(tracking.EXPERIMENT)
    assert default is None or not client.search_runs([default.experiment_id])


def test_open_runs_are_ended_in_any_experiment(gym_home, monkeypatch):
    client = MlflowClient(tracking.tracking_uri())
    parent = tracking.start_run("flow", tags={"flow_run": "abc"}, experiment="elsewhere")
    child = tracking.start_run("sft", parent_run_id=parent)
    elsewhere = client.get_experiment_by_name("elsewhere").experiment_id
    assert client.get_run(child).info.experiment_id == elsewhere
    assert set(tracking.end_open_runs("flow_run", "abc")) == {parent, child}
    assert {client.get_run(r).info.status for r in (parent, child)} == {"FAILED"}

    monkeypatch.setattr(liveness, "gone", lambda owner: True)  # the process that made it was killed
    orphan = tracking.start_run("flow", experiment="third")
    assert tracking.end_orphaned_runs() == [orphan]
    assert client.get_run(orphan).info.status == "KILLED"
