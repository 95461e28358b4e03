"""`gym up` / `gym down` / `gym status`: the Prefect and MLflow UIs for this workspace, one command each.

    gym up                 Prefect server + MLflow server on 127.0.0.1; prints both URLs once they answer
    gym up --worker        ... and a process worker on the `gym-process` pool (runs deployments)
    gym status [--json]    what is running, where
    gym down               stops them all with their process groups; no process is left behind

While they run, `gym train` and `python flows/<flow>.py` in the same workspace (GYM_HOME, default
./.gym) run against this Prefect server (runs show in its UI; no temporary API per process) and
their MLflow runs show in this MLflow UI. Processes are managed by gym.services; this module adds
what needs Prefect's client: the work pool and the GPU concurrency limit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence

from gym import services, workspace
from gym.cli_options import ArgumentParser, port
from gym.errors import ConfigError


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def prepare_server(api_url: str, pool: str = services.WORK_POOL, fresh: bool = False) -> dict[str, int | str]:
    """Create gym's work pool (a process pool) and the tag concurrency limit that keeps training tasks
    one per GPU (as many slots as this machine has GPUs, at least one).

    `fresh`: the server was just started. Prefect keeps the leases on a limit's slots in memory, so a
    server that stopped while a task held a slot (`gym down` during a run) comes back with that slot
    taken and no lease to ever free it: every later training task would wait for it, silently. Right
    after a start no task can hold a slot, so the limit's taken slots are set back to none.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.workers.process import ProcessWorker

    from tasks._common import GPU_TAG

    slots = max(gpu_count(), 1)
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        with contextlib.suppress(ObjectAlreadyExists):
            client.create_work_pool(
                WorkPoolCreate(
                    name=pool,
                    type="process",
                    base_job_template=ProcessWorker.get_default_base_job_template(),
                    description="gym's deployments: flow runs as local processes",
                )
            )
        client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=slots)
        if fresh:
            from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

            limit = client.read_global_concurrency_limit_by_name(f"tag:{GPU_TAG}")
            if limit.active_slots:
                reset = GlobalConcurrencyLimitUpdate(active_slots=0)
                client.update_global_concurrency_limit(limit.name, reset)
    return {"work_pool": pool, "gpu_tag": GPU_TAG, "gpu_slots": slots}


def crash_pool_runs(api_url: str, pool: str = services.WORK_POOL, notes: list[str] | None = None) -> int:
    """Mark the flow runs of `pool` still running or starting as Crashed (`gym down` has just stopped
    the worker, and the flow-run processes with it: none will report again); return how many.

    Their MLflow runs are ended KILLED, as a cancelled run's are (MLflow's status for a run stopped from
    outside): the killed processes never ended them, and they showed RUNNING until the next flow run on
    this machine found them orphaned. Where that can't be done (a tracking server that doesn't answer),
    a line saying so is added to `notes`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterState,
        FlowRunFilterStateType,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
        WorkPoolFilter,
        WorkPoolFilterName,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Crashed

    live = [StateType.RUNNING, StateType.PENDING, StateType.CANCELLING]
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=live))),
            work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[pool])),
        )
        message = "stopped by `gym down` (the worker and its flow-run processes were stopped)"
        for run in runs:
            client.set_flow_run_state(run.id, Crashed(message=message), force=True)
        # and their task runs, which showed Running for good beside the run's later attempts
        tasks = (
            client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id for run in runs])),
                task_run_filter=TaskRunFilter(
                    state=TaskRunFilterState(type=TaskRunFilterStateType(any_=live))
                ),
            )
            if runs
            else []
        )
        for task_run in tasks:
            client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
    if runs:
        from tasks.tracking import end_flow_run_tracking

        for run in runs:
            try:
                note = end_flow_run_tracking(run.id, run.parameters, "KILLED")
            except Exception as exc:  # best effort: the flow runs are marked whatever happens here
                note = f"can't end its MLflow runs: {type(exc).__name__}"
            if note and notes is not None:
                notes.append(f"flow run {run.name}: {note}")
    return len(runs)


def _port(env: str) -> int | None:
    value = os.environ.get(env)
    if not value:
        return None
    try:
        return port(any_free=True)(value)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"${env}: {exc}") from None


def cmd_up(argv: Sequence[str]) -> int:
    parser = ArgumentParser(
        prog="gym up", description="Start the Prefect and MLflow servers for this workspace."
    )
    parser.add_argument(
        "--prefect-port",
        type=port(any_free=True),
        default=_port("GYM_PREFECT_PORT"),
        help="Default: $GYM_PREFECT_PORT, else 4200 if free, else any (0: any).",
    )
    parser.add_argument(
        "--mlflow-port",
        type=port(any_free=True),
        default=_port("GYM_MLFLOW_PORT"),
        help="Default: $GYM_MLFLOW_PORT, else 5000 if free, else any (0: any).",
    )
    parser.add_argument("--worker", action="store_true", help="Also start a worker on the gym-process pool.")
    parser.add_argument("--json", action="store_true", help="Print JSON.")
    args = parser.parse_args(argv)
    before = {name for name, s in services.read_state().items() if services.alive(s)}
    notes: list[str] = []
    state = services.up(args.prefect_port, args.mlflow_port, notes=notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    prefect_url, mlflow_url = str(state["prefect"].url), str(state["mlflow"].url)
    prepared = prepare_server(f"{prefect_url}/api", fresh="prefect" not in before)
    if args.worker:
        services.start_worker()
    worker_running = args.worker or "worker" in before
    if args.json:
        print(
            json.dumps({"prefect": prefect_url, "mlflow": mlflow_url, **prepared, "worker": worker_running})
        )
        return 0
    for name, asked in (("prefect", args.prefect_port), ("mlflow", args.mlflow_port)):
        if name in before:  # found running: the port asked for (if any) was not used
            url = str(state[name].url)
            moved = (
                f"; `gym down` first to move it to port {asked}"
                if asked and not url.endswith(f":{asked}")
                else ""
            )
            print(f"note: {name} was already running at {url}{moved}")
    print(f"Prefect UI  {prefect_url}   (prefect CLI: export PREFECT_API_URL={prefect_url}/api)")
    print(f"MLflow UI   {mlflow_url}")
    worker = (
        "running"
        if worker_running
        else "not started: `gym up --worker` or `prefect worker start --pool gym-process`"
    )
    print(f"work pool   {prepared['work_pool']}, worker {worker}")
    print(
        f"workspace   {workspace.home()}  (runs of `gym train` / `python flows/...` here use these servers)"
    )
    print("stop with   gym down")
    return 0


def cmd_down(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="gym down", description="Stop the servers (and worker) `gym up` started.")
    parser.parse_args(argv)
    api = services.running("prefect")
    crashed = 0
    notes: list[str] = []

    def crash_runs() -> None:
        nonlocal crashed
        if api is not None and "worker" in services.read_state():
            with contextlib.suppress(Exception):  # best effort: stopping must not fail on it
                crashed = crash_pool_runs(f"{api}/api", notes=notes)

    stopped = services.down(after_worker=crash_runs)
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    if crashed:
        print(f"note: {crashed} flow run(s) of the {services.WORK_POOL} pool were running: marked Crashed")
    for note in notes:
        print(f"note: {note}")
    return 0


def cmd_status(argv: Sequence[str]) -> int:
    parser = ArgumentParser(
        prog="gym status",
        description="Say what `gym up` started and whether it answers.",
        epilog="Exit status: 0 when everything `gym up` started is running; 3 when something is not, or "
        "nothing was started (with --env: when the Prefect server does not answer).",
    )
    parser.add_argument("--json", action="store_true", help="Print JSON.")
    parser.add_argument(
        "--env",
        action="store_true",
        help='Print `export PREFECT_API_URL=...` (for `eval "$(gym status --env)"`).',
    )
    args = parser.parse_args(argv)
    state = services.status()
    if args.env:
        prefect = state.get("prefect")
        if not prefect or not prefect["answering"]:
            print("error: the Prefect server is not running: `gym up` first", file=sys.stderr)
            return 3
        print(f"export PREFECT_API_URL={prefect['url']}/api")
        return 0
    if args.json:
        print(json.dumps(state, indent=2))
    elif not state:
        print("nothing running (start with `gym up`)")
    for name, s in state.items() if not args.json else ():
        health = "answering" if s["answering"] else ("running" if s["alive"] else "stopped")
        print(f"{name:8s} {health:10s} {s['url'] or '':28s} log {s['log']}")
    return 0 if state and all(s["alive"] for s in state.values()) else 3
