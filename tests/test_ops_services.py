"""`gym up` / `gym status` / `gym down`: real servers on loopback, found by runs, and gone afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prefect import task

from gym import services
from tests.ops_servers import gym_up, services_state

pytestmark = pytest.mark.xdist_group("services")


def test_up_status_down_and_runs_find_the_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path / "gym_home"
    with gym_up(home, "--worker") as stack:
        status = json.loads(stack.sh("gym status --json").stdout)
        assert {"prefect", "mlflow", "worker"} <= set(status)
        assert status["prefect"]["answering"] and status["mlflow"]["answering"] and status["worker"]["alive"]
        before = services_state(home)
        again = json.loads(stack.sh("gym up --json").stdout.splitlines()[-1])
        assert again["prefect"] == stack.prefect and again["worker"] is True  # it said the worker was not
        assert services_state(home) == before, "a second `gym up` finds the running servers, starts nothing"
        text = stack.sh("gym up --prefect-port 4301").stdout  # it said nothing of the servers found
        assert f"note: prefect was already running at {stack.prefect}; `gym down` first to move it" in text
        assert f"note: mlflow was already running at {stack.mlflow}\n" in text and "worker running" in text

        # A run in this workspace uses these servers: no temporary API, and the run shows in the UI.
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from flows.runner import workspace_servers

        monkeypatch.setenv("GYM_HOME", str(home))
        with (
            temporary_settings(restore_defaults={PREFECT_API_URL}),
            workspace_servers(),
        ):  # as a fresh process
            assert PREFECT_API_URL.value() == stack.api
        from gym import tracking

        assert tracking.ui_url() == stack.mlflow

        image_pools_deploy(stack)

        groups = {name: s["pid"] for name, s in services_state(home).items()}
        # Every process each server started (uvicorn, huey consumers, the worker's children) is in its group.
        members = {name: services.group_members(pgid) for name, pgid in groups.items()}
        assert all(members.values()), members

        down = stack.sh("gym down")
        assert set(down.stdout.removeprefix("stopped: ").strip().split(", ")) == {
            "worker",
            "mlflow",
            "prefect",
        }
        left = {name: services.group_members(pgid) for name, pgid in groups.items()}
        assert not any(left.values()), left
        assert not (home / "services" / "services.json").exists()
        assert stack.sh("gym status", check=False).returncode == 3
        with temporary_settings(restore_defaults={PREFECT_API_URL}), workspace_servers():
            assert PREFECT_API_URL.value() is None, "with the servers gone, runs start their own API again"


def image_pools_deploy(stack) -> None:
    """deployments/work-pools/README.md's commands: the job templates are valid pools, and the Python entry
    deploys from an image (no local pull step or workspace) onto them."""
    pools = "deployments/work-pools"
    stack.sh(
        'eval "$(gym status --env)"'
        f" && prefect work-pool create gym-docker --type docker --base-job-template {pools}/docker.json"
        f" && prefect work-pool create gym-k8s --type kubernetes --base-job-template {pools}/kubernetes.json"
        " && python deployments/deploy.py --pool gym-docker --image gym:latest"
    )
    with stack.client() as client:
        k8s = client.read_work_pool("gym-k8s").base_job_template
        train = client.read_deployment_by_name("train/train")
        weekly = client.read_deployment_by_name("sft-then-dpo/retrain-weekly")
    assert k8s["variables"]["properties"]["gpu_count"]["default"] == 1
    container = k8s["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpu_count }}"
    for dep in (train, weekly):
        assert dep.work_pool_name == "gym-docker" and dep.job_variables == {"image": "gym:latest"}
        assert not dep.pull_steps and dep.entrypoint.startswith("flows/")
    assert weekly.schedules[0].schedule.cron == "0 3 * * 1"


def test_a_port_out_of_range_stops_gym_up_before_anything_starts(gym_home, monkeypatch, capsys):
    """Both were tracebacks (OverflowError from bind, ValueError from int)."""
    from flows.cli import main

    for flag, bad in (("--prefect-port", "99999"), ("--mlflow-port", "x"), ("--prefect-port", "-1")):
        with pytest.raises(SystemExit):
            main(["up", flag, bad])
        assert f"argument {flag}: a port from 0 to 65535 (got '{bad}')" in capsys.readouterr().err
    monkeypatch.setenv("GYM_MLFLOW_PORT", "5000x")
    assert main(["up"]) == 2
    assert "error: $GYM_MLFLOW_PORT: a port from 0 to 65535 (got '5000x')" in capsys.readouterr().err
    assert not (gym_home / "services").exists()  # nothing started


def test_a_port_whose_connections_linger_in_time_wait_is_still_the_preferred_one():
    """`gym up` right after `gym down` moved Prefect and MLflow to random ports: the test bind of the
    usual port failed on connections in TIME_WAIT, which the servers themselves bind over."""
    import socket

    from gym.services import free_port

    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server's side closes first: its end of the connection waits in TIME_WAIT
    client.close()
    assert free_port(port) != port, "someone listens there: another port"
    server.close()
    assert free_port(port) == port


def test_a_server_that_exits_while_starting_quotes_its_own_start_not_older_ones(gym_home):
    """The log gathers every start: the error quoted an old run's lines above the real one."""
    import sys

    from gym import services
    from gym.errors import GymError

    quits = [sys.executable, "-c", "import sys; print('{}'); sys.exit(1)"]
    for said in ("an old failure: database is locked", "Port 4200 is already in use"):
        command = [*quits[:2], quits[2].format(said)]
        service = services.spawn("prefect", command, {}, "http://127.0.0.1:9")
        with pytest.raises(GymError, match="exited while starting") as err:
            services.wait_healthy([service], deadline_s=30)
    assert "Port 4200 is already in use" in str(err.value) and "database is locked" not in str(err.value)
    assert "database is locked" in Path(service.log).read_text(), "the log keeps every start"


@task(name="train sft")
def training_task() -> None:
    """What a deployment run's training task is, to the server."""


def test_gym_down_during_a_run_leaves_no_slot_taken_and_no_run_running(tmp_path: Path):
    """`gym down` while a deployment run trained left its flow run Running for ever and its slot of the
    gym-gpu limit taken (Prefect keeps the slots' leases in memory): every later training task waited,
    silently. Now the run is marked Crashed and the next `gym up` frees the orphaned slot."""
    from prefect.states import Running

    from tasks._common import GPU_TAG

    home = tmp_path / "gym_home"
    with gym_up(home, "--worker") as stack:
        stack.sh("python deployments/deploy.py")
        with stack.client() as client:
            deployment = client.read_deployment_by_name("train/train")
            run = client.create_flow_run_from_deployment(deployment.id, state=Running())
            training = client.create_task_run(training_task, run.id, "0", state=Running())
            client.increment_concurrency_slots_with_lease(
                names=[f"tag:{GPU_TAG}"], slots=1, mode="concurrency", lease_duration=600
            )  # what the run's training task holds
            assert client.read_global_concurrency_limit_by_name(f"tag:{GPU_TAG}").active_slots == 1
        down = stack.sh("gym down").stdout
        assert "note: 1 flow run(s) of the gym-process pool were running: marked Crashed" in down
        again = json.loads(stack.sh("gym up --json").stdout.strip().splitlines()[-1])
        stack.prefect = again["prefect"]
        with stack.client() as client:
            assert client.read_global_concurrency_limit_by_name(f"tag:{GPU_TAG}").active_slots == 0
            state = client.read_flow_run(run.id).state
            task_state = client.read_task_run(training.id).state
        assert state.is_crashed() and "gym down" in state.message
        assert task_state.is_crashed() and "gym down" in task_state.message  # it stayed Running for good


def test_gym_up_takes_the_ports_it_last_ran_on_and_refuses_a_busy_one(gym_home):
    """`gym down; gym up` moved the servers from the ports asked for before to 4200/5000 (or any), so the
    links stored in Prefect artifacts and MLflow tags stopped opening; a port asked for that something
    listens on was a dump of the server's log after it failed to start."""
    import socket

    from mlflow import MlflowClient

    from gym import tracking
    from gym.errors import GymError

    first = {"prefect": services.free_port(None), "mlflow": services.free_port(None)}
    MlflowClient(tracking.tracking_uri()).create_experiment("in-the-workspace-store")
    try:
        state = services.up(first["prefect"], first["mlflow"])
        assert {n: services._port_of(state[n].url) for n in first} == first
        # The store (a database URI may hold a login) is not on the command line `ps` shows to everyone,
        # and the server serves it.
        assert not any("mlflow.db" in part for part in state["mlflow"].command)
        served = MlflowClient(str(state["mlflow"].url)).search_experiments()
        assert "in-the-workspace-store" in {e.name for e in served}
        assert tracking.ui_url() == state["mlflow"].url, "runs of this workspace link to this server"
        services.down()
        notes: list[str] = []
        state = services.up(notes=notes)
        assert {n: services._port_of(state[n].url) for n in first} == first and not notes
        services.down()

        with socket.socket() as busy:
            busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the server's old connections linger
            busy.bind(("127.0.0.1", first["mlflow"]))
            busy.listen()
            refused = f"port {first['mlflow']} \\(mlflow\\) is in use on 127.0.0.1: "
            with pytest.raises(GymError, match=refused):
                services.up(None, first["mlflow"])
            assert not services.read_state(), "nothing started"
            state = services.up(notes=notes)
            moved = services._port_of(state["mlflow"].url)
            assert services._port_of(state["prefect"].url) == first["prefect"] and moved != first["mlflow"]
            last = first["mlflow"]
            assert notes == [
                f"mlflow now runs on port {moved}: its last port {last} is in use, so links to it stored in "
                f"earlier runs no longer open (`gym down`, free port {last}, and `gym up` to go back)"
            ]
    finally:
        services.down()
