"""Operating gym through real servers on loopback, with the README's commands.

`gym up` starts Prefect and MLflow; `prefect deploy` registers deployments/prefect.yaml; each deployment
is triggered with parameters and run by a worker (`--run-once`); the runs complete, MLflow holds the
registered versions, links go both ways, a local run is served from the deployment run's cache, the
weekly schedule has the right next run, the evaluation deployment scores the trained version and records
its scores on it, and a browser finds both in the UIs. One server pair per module.
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.eval_fixtures import write_benchmark
from tests.ops_servers import REPO, Stack, gym_up, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("servers")]

# The README's commands, run as they are written there (test_readme_shows_the_commands checks that).
README_DEPLOY = [
    'eval "$(gym status --env)"',
    "prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml",
]
README_WORKER = "prefect worker start --pool gym-process --run-once"

TRAIN = {  # what `gym train --method sft` runs (its demo data and held-out split): LOCAL_TRAIN below
    "train": {"method": "sft", "max_steps": 8},
    "method_eval_dataset": "demo_sft_eval",
    "eval_limit": 4,
    "output": {"register_as": "deployed-sft"},
}
WEEKLY = {
    "sft": {"max_steps": 8},
    "dpo": {"max_steps": 4},
    "eval_limit": 4,
    "data": {"max_samples": 256},
    "output": {"register_as": "gym-tiny-sft-dpo", "alias": "challenger"},
}
# Evaluates the version the train deployment registered (so it runs after that run, with its own worker).
EVALUATE = {
    "model": "models:/deployed-sft@challenger",
    "benchmark_options": {"limit": 2, "shots": 1},
    "eval_limit": 4,
}
LOCAL_TRAIN = "gym train --method sft --max-steps 8 --eval_limit 4 --output.register_as deployed-sft --json"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    with gym_up(tmp_path_factory.mktemp("ops") / "gym_home") as s:
        yield s


@pytest.fixture(scope="module")
def deployed(stack: Stack) -> Stack:
    stack.sh(" && ".join(README_DEPLOY), timeout=240)
    return stack


def trigger(stack: Stack, deployment: str, config: dict) -> str:
    params = shlex.quote(json.dumps({"config": config}))
    out = stack.sh(f'eval "$(gym status --env)" && prefect deployment run {deployment} --params {params}')
    return re.findall(r"flow-run/([0-9a-f-]{36})", out.stdout)[-1]


@pytest.fixture(scope="module")
def runs(deployed: Stack) -> dict[str, str]:
    ids = {"train": trigger(deployed, "train/train", TRAIN)}
    ids["weekly"] = trigger(deployed, "sft-then-dpo/retrain-weekly", WEEKLY)
    deployed.sh(f'eval "$(gym status --env)" && {README_WORKER}', timeout=600)
    return ids


@pytest.fixture(scope="module")
def evaluation(runs: dict[str, str], deployed: Stack) -> str:
    mmlu = write_benchmark("mmlu", deployed.home.parent / "mmlu")
    run_id = trigger(deployed, "evaluate/evaluate", {**EVALUATE, "benchmarks": [f"mmlu={mmlu}"]})
    deployed.sh(f'eval "$(gym status --env)" && {README_WORKER}', timeout=600)
    return run_id


def test_readme_shows_the_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for command in [*README_DEPLOY, README_WORKER.removesuffix(" --run-once"), "gym up", "gym down"]:
        assert command in readme, command


def test_up_serves_both_uis_with_the_api_on_its_own_port(stack: Stack):
    import urllib.request

    with urllib.request.urlopen(f"{stack.prefect}/ui-settings", timeout=10) as resp:
        assert json.loads(resp.read())["api_url"] == stack.api, "the UI must call this server, not :4200"
    with urllib.request.urlopen(f"{stack.mlflow}/health", timeout=10) as resp:
        assert resp.status == 200
    assert stack.sh("gym status").stdout.count("answering") == 2
    with stack.client() as client:
        assert client.read_work_pool("gym-process").type == "process"
        assert client.read_concurrency_limit_by_tag("gym-gpu").concurrency_limit >= 1


def test_deployments_run_from_the_repo_in_this_workspace_with_forms(deployed: Stack):
    with deployed.client() as client:
        weekly = client.read_deployment_by_name("sft-then-dpo/retrain-weekly")
        train = client.read_deployment_by_name("train/train")
        evaluate = client.read_deployment_by_name("evaluate/evaluate")
    for dep in (weekly, train, evaluate):
        assert dep.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
        ]
        env = dep.job_variables["env"]
        assert env["GYM_HOME"] == str(deployed.home)
        assert env["PREFECT_LOCAL_STORAGE_PATH"] == str(deployed.home / "prefect" / "results")
    definitions = train.parameter_openapi_schema["definitions"]
    flow_form, stage = definitions["TrainFlowConfig"]["properties"], definitions["TrainConfig"]["properties"]
    assert {"gym-tiny", "qwen3-8b", "llama-3.1-8b-instruct"} <= set(flow_form["model"]["anyOf"][0]["enum"])
    assert {"demo_sft", "demo_dpo"} <= set(flow_form["dataset"]["anyOf"][0]["enum"])
    assert {"sft", "dpo"} <= set(stage["method"]["enum"])
    assert all(prop.get("description") for prop in stage.values()), "every hyperparameter is described"
    assert weekly.parameters["config"]["output"]["alias"] == "challenger"
    eval_form = evaluate.parameter_openapi_schema["definitions"]["EvaluateConfig"]["properties"]
    assert {"model", "benchmarks", "benchmark_options", "eval_dataset"} <= set(eval_form)


def test_a_login_in_the_tracking_uri_is_refused_before_prefect_stores_the_run(deployed: Stack):
    """A deployment run given `output.tracking_uri: http://user:password@host` was stored with it as a
    parameter (shown in the UI) before gym's own check refused it in the run's first task; the deployments'
    parameter schema now makes Prefect's server refuse the run."""
    secret = "hf_fake123"
    for deployment, config in (
        ("train/train", {"output": {"tracking_uri": f"http://qa:{secret}@127.0.0.1:5300"}}),
        (
            "evaluate/evaluate",
            {"model": "gym-tiny", "output": {"tracking_uri": f"postgresql://u:{secret}@h/db"}},
        ),
        ("train/train", {"output": {"tracking_uri": f"sqlite:////tmp/x.db?password={secret}"}}),
    ):
        params = shlex.quote(json.dumps({"config": config}))
        run = f'eval "$(gym status --env)" && prefect deployment run {deployment} --params {params}'
        refused = deployed.sh(run, check=False)
        assert refused.returncode != 0 and "does not match" in refused.stdout, refused
    with deployed.client() as client:
        stored = [r.parameters for r in client.read_flow_runs()]
    assert secret not in json.dumps(stored)
    allowed = {"output": {"tracking_uri": "http://127.0.0.1:5300"}}  # no login: the schema lets it through
    with deployed.client() as client:
        train = client.read_deployment_by_name("train/train")
        with pytest.raises(Exception, match="does not match"):  # the server's own check, not the CLI's
            login = {"output": {"tracking_uri": f"http://qa:{secret}@127.0.0.1:5300"}}
            client.create_flow_run_from_deployment(train.id, parameters={"config": login})
        run = client.create_flow_run_from_deployment(train.id, parameters={"config": allowed})
        client.delete_flow_run(run.id)  # no worker runs here: nothing to leave for the tests after


def test_an_image_pool_not_on_the_server_is_one_error_line(deployed: Stack):
    """It was a traceback (ValueError: Could not find work pool) after the deployments were built."""
    missing = deployed.sh("python deployments/deploy.py --pool gym-docker --image gym:latest", check=False)
    assert missing.returncode == 2, missing
    assert missing.stderr.startswith("error: --pool gym-docker: no such work pool on this server")
    assert "Traceback" not in missing.stderr


def test_weekly_schedule_has_the_right_next_run(deployed: Stack):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with deployed.client() as client:
        weekly = client.read_deployment_by_name("sft-then-dpo/retrain-weekly")
        (schedule,) = weekly.schedules
        only_weekly = DeploymentFilter(id=DeploymentFilterId(any_=[weekly.id]))

        def upcoming() -> list[datetime]:  # the server's scheduler creates them within a minute or so
            runs = client.read_flow_runs(deployment_filter=only_weekly)
            return sorted(r.expected_start_time for r in runs if r.auto_scheduled)

        scheduled = wait_for(upcoming, timeout=120, every=2)
    assert schedule.schedule.cron == "0 3 * * 1" and schedule.schedule.timezone == "UTC" and schedule.active
    now = datetime.now(UTC)
    monday = (now + timedelta(days=(-now.weekday()) % 7)).replace(hour=3, minute=0, second=0, microsecond=0)
    expected = monday if monday > now else monday + timedelta(days=7)
    assert scheduled and scheduled[0] == expected


def test_each_deployment_run_completes_and_registers_in_mlflow(runs: dict[str, str], deployed: Stack):
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with deployed.client() as client:
        states = {name: client.read_flow_run(run_id).state for name, run_id in runs.items()}
        artifacts = client.read_artifacts()
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[runs["weekly"]])))
    assert all(s is not None and s.is_completed() for s in states.values()), states
    step_logs = [log.message for log in logs if log.message.startswith(("sft step", "dpo step"))]
    assert len(step_logs) >= 3, "the per-step training log is in the run's logs"
    mlflow = deployed.mlflow_client()
    version = mlflow.get_model_version_by_alias("gym-tiny-sft-dpo", "challenger")
    assert version.tags["prefect_flow_run_id"] == runs["weekly"]
    assert (
        mlflow.get_model_version_by_alias("deployed-sft", "challenger").tags["prefect_flow_run_id"]
        == runs["train"]
    )
    # links both ways: the MLflow run names the Prefect flow run's page; Prefect's artifacts link MLflow
    parent = mlflow.get_run(version.run_id)
    parent = mlflow.get_run(parent.data.tags.get("mlflow.parentRunId", version.run_id))
    page = f"{deployed.prefect}/runs/flow-run/{runs['weekly']}"
    assert parent.data.tags["prefect_flow_run_url"] == page
    assert version.tags["prefect_flow_run_url"] == page, "the version links back too (README)"
    assert f"[`{runs['weekly']}`]({page})" in version.description  # its model card
    weekly_artifacts = {a.key: a for a in artifacts if str(a.flow_run_id) == runs["weekly"]}
    assert {"gym-summary", "stage-sft", "stage-dpo", "mlflow-run", "registered-model"} <= set(
        weekly_artifacts
    )
    assert f"{deployed.mlflow}/#/models/gym-tiny-sft-dpo/versions/{version.version}" in str(
        weekly_artifacts["gym-summary"].data
    )
    assert "/get-artifact?path=loss.png" in str(weekly_artifacts["stage-sft"].data)
    # one key per dataset (all four shared `ingest`: the Artifacts page showed the last one only)
    assert {"ingest-demo-sft", "ingest-demo-dpo"} <= {a.key for a in artifacts}


def test_a_local_run_is_served_from_the_deployment_runs_cache(runs: dict[str, str], deployed: Stack):
    local = json.loads(deployed.sh(LOCAL_TRAIN, timeout=300).stdout.strip().splitlines()[-1])
    # Registration is never cached (NO_CACHE): it finds the version by content digest and reuses it.
    assert local["cached_tasks"] >= 6, "ingest, tokenize, evaluate before/after and train come from cache"
    assert local["model_reused"] is True
    with deployed.client() as client:  # it ran against `gym up`'s server: the UI shows it
        assert client.read_flow_run(local["flow_run_id"]).state.is_completed()


def test_the_evaluation_deployment_records_scores_on_the_version_it_evaluated(
    evaluation: str, runs: dict[str, str], deployed: Stack
):
    with deployed.client() as client:
        state = client.read_flow_run(evaluation).state
    assert state is not None and state.is_completed(), state
    mlflow = deployed.mlflow_client()
    version = mlflow.get_model_version_by_alias("deployed-sft", "challenger")
    assert version.tags["gym.last_evaluated_by"] == evaluation
    assert 0 <= float(version.tags["score.mmlu"]) <= 1 and "score.mmlu.stem" in version.tags
    assert re.fullmatch(r"gym, 1-shot, 4 questions \(set [0-9a-f]{12}\)", version.tags["score_setup.mmlu"])
    assert "score.exact_match" in version.tags and "| mmlu |" in version.description


def test_browser_finds_the_deployment_and_the_registered_model(
    runs: dict[str, str], deployed: Stack, tmp_path: Path
):
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("needs /usr/bin/chromium (apt-get install -y chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run",
    ]  # fmt: skip
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=flags)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{deployed.prefect}/deployments")
            page.get_by_text("retrain-weekly").first.wait_for(timeout=60_000)
            page.screenshot(path=str(tmp_path / "prefect-deployments.png"), full_page=True)
            page.goto(f"{deployed.mlflow}/#/models")
            page.get_by_text("gym-tiny-sft-dpo").first.wait_for(timeout=60_000)
            page.keyboard.press("Escape")  # MLflow greets a new browser with a dialog
            page.screenshot(path=str(tmp_path / "mlflow-models.png"), full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "prefect-deployments.png").stat().st_size > 10_000
    assert (tmp_path / "mlflow-models.png").stat().st_size > 10_000


def test_a_cancelled_run_ends_its_mlflow_runs_and_keeps_its_checkpoints(
    runs: dict[str, str], deployed: Stack
):
    """Cancelled from the UI (here `prefect flow-run cancel`) while training: the process stops, the
    checkpoints stay for a retry to resume from, and the flow run's MLflow runs end KILLED. The parent
    run stayed RUNNING until the next flow run on the machine ended it (never, on another machine)."""
    import contextlib
    import os
    import signal
    import subprocess

    config = {
        "train": {"method": "sft", "max_steps": 20000, "save_steps": 20},
        "eval_limit": 2,
        "output": {"register_as": "cancelled-sft"},
    }
    models = deployed.home / "models"
    before = set(models.glob("*/checkpoints/checkpoint-*"))  # the earlier runs' stages left theirs
    run_id = trigger(deployed, "train/train", config)
    worker = subprocess.Popen(
        ["bash", "-c", f'eval "$(gym status --env)" && {README_WORKER}'],
        cwd=REPO,
        env=deployed.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    mlflow = deployed.mlflow_client()

    def parent() -> Any:
        found = mlflow.search_runs(
            [e.experiment_id for e in mlflow.search_experiments()],
            filter_string=f"tags.prefect_flow_run_id = '{run_id}'",
        )
        return next((r for r in found if "mlflow.parentRunId" not in r.data.tags), None)

    def stages(run: Any) -> list[Any]:
        where = f"tags.mlflow.parentRunId = '{run.info.run_id}'"
        return mlflow.search_runs([run.info.experiment_id], filter_string=where)

    def training() -> bool:
        run = parent()
        sft = [r for r in stages(run) if r.data.tags["mlflow.runName"] == "sft"] if run else []
        new = set(models.glob("*/checkpoints/checkpoint-*")) - before
        return bool(sft and sft[0].info.status == "RUNNING" and new)

    try:
        assert wait_for(training, timeout=300), "training never started"
        deployed.sh(f'eval "$(gym status --env)" && prefect flow-run cancel {run_id}')
        with deployed.client() as client:
            state = wait_for(
                lambda: (s := client.read_flow_run(run_id).state) is not None and s.is_cancelled() and s,
                timeout=120,
            )
        assert state, "the flow run never ended Cancelled"
        run = parent()
        assert wait_for(lambda: mlflow.get_run(run.info.run_id).info.status == "KILLED", timeout=60), (
            mlflow.get_run(run.info.run_id).info.status
        )
        assert all(r.info.status != "RUNNING" for r in stages(run)), [r.info.status for r in stages(run)]
        assert set(models.glob("*/checkpoints/checkpoint-*")) - before, "a retry resumes from them"
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
