"""Local Prefect and MLflow servers over the workspace, each in its own process group.

    gym up [--worker]      start both on 127.0.0.1, print their URLs, return once both answer
    gym status [--json]    what is running            gym down     stop everything, leaving no process

The Prefect server keeps its database in the workspace (`prefect/server.db`); the MLflow server
serves the UI and model registry over the workspace's store (`mlflow/mlflow.db`, artifacts beside
it), the same one every run writes to. What runs is recorded in `services/services.json` (with each
server's log beside it), so any process using the same workspace (`gym train`, `python flows/...`,
a worker's flow runs) finds them. Library only: starting a server is running its command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gym import workspace
from gym.errors import GymError

HOST = "127.0.0.1"
PREFERRED_PORTS = {"prefect": 4200, "mlflow": 5000}
HEALTH_PATHS = {"prefect": "/api/health", "mlflow": "/health"}
# Prefect's worker ignores SIGTERM; an interrupt stops it (and its flow runs) cleanly.
STOP_SIGNALS = {"worker": signal.SIGINT}
WORK_POOL = "gym-process"


class Service(BaseModel):
    """One server (or worker) gym started: its process group and where it answers."""

    name: str
    pid: int
    url: str | None = None
    log: str
    command: list[str]
    serves: str | None = None  # the MLflow server's store, as `store_digest` (its URI may hold a login)


def store_digest(uri: str) -> str:
    """What services.json records of the store an MLflow server serves: not the URI, which may hold a
    database's login."""
    import hashlib

    return hashlib.sha256(uri.encode()).hexdigest()[:16]


def state_file() -> Path:
    return workspace.path("services", "services.json")


def ports_file() -> Path:
    """The ports the servers last ran on (kept after `gym down`: links stored in Prefect and MLflow name
    them, so the next `gym up` takes them again when they are free)."""
    return workspace.path("services", "ports.json")


def last_ports() -> dict[str, int]:
    try:
        raw = json.loads(ports_file().read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {name: int(port) for name, port in raw.items() if isinstance(port, int)}


def read_state() -> dict[str, Service]:
    """The services recorded for this workspace (running or not)."""
    try:
        raw = json.loads(state_file().read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {name: Service.model_validate(s) for name, s in raw.items()}


def write_state(services: dict[str, Service]) -> None:
    if services:
        workspace.atomic_write_json(state_file(), {n: s.model_dump() for n, s in services.items()})
    else:
        state_file().unlink(missing_ok=True)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    import psutil

    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.info["pid"]) == pgid:
                members.append(proc.info["pid"])
    return members


def alive(service: Service) -> bool:
    return bool(group_members(service.pid))


def healthy(url: str, name: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + HEALTH_PATHS[name], timeout=timeout) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def unreachable(url: str, timeout: float = 5.0) -> str | None:
    """Why nothing answers at an http(s) `url`'s host and port (connection refused, no such host, a
    timeout), else None; None too for other URLs and for hosts reached through a proxy."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if urllib.request.getproxies().get(parts.scheme) and not urllib.request.proxy_bypass(parts.hostname):
        return None  # reached through a proxy: the client's own requests will say
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return f"nothing answers at {parts.hostname}:{port}: {reason.lower()}"
    return None


def running(name: str) -> str | None:
    """The URL of this workspace's `name` server ("prefect" or "mlflow") if it is up and answering."""
    service = read_state().get(name)
    if service is None or service.url is None or not alive(service):
        return None
    return service.url if healthy(service.url, name, timeout=5.0) else None


def free_port(preferred: int | None = None) -> int:
    """`preferred` if nothing listens there, else a port the OS picks."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As the servers bind (uvicorn sets it too): a port whose last connections linger
            # in TIME_WAIT after `gym down` is free to them. Linux still refuses a port someone listens on.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise GymError("no free TCP port on 127.0.0.1")


def _bin(name: str) -> str:
    """A console script of this Python environment (prefect, mlflow)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def prefect_command(port: int) -> tuple[list[str], dict[str, str]]:
    """`prefect server start` on loopback, with the UI calling the API on this port (not 4200)."""
    api = f"http://{HOST}:{port}/api"
    database = workspace.path("prefect", "server.db")
    env = {
        "PREFECT_SERVER_API_HOST": HOST,
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_UI_API_URL": api,
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{database}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    return [_bin("prefect"), "server", "start", "--host", HOST, "--port", str(port)], env


def mlflow_command(port: int) -> tuple[list[str], dict[str, str]]:
    """`mlflow server` over the workspace's store: the UI and registry of the runs gym writes there.
    The store goes in the server's environment, not its command line, which every local user can read
    (`ps`) and services.json records: a database store's URI may hold its login."""
    from gym import tracking

    store = tracking.tracking_uri()
    artifacts = workspace.path("mlflow", "artifacts")
    artifacts.mkdir(parents=True, exist_ok=True)
    command = [
        _bin("mlflow"), "server", "--host", HOST, "--port", str(port), "--workers", "1",
        "--default-artifact-root", artifacts.as_uri(), "--no-serve-artifacts",
    ]  # fmt: skip
    return command, {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_BACKEND_STORE_URI": store}


def worker_command(api_url: str) -> tuple[list[str], dict[str, str]]:
    """A Prefect process worker on gym's pool, running deployments against this workspace."""
    env = {"PREFECT_API_URL": api_url, "GYM_HOME": str(workspace.home())}
    return [_bin("prefect"), "worker", "start", "--pool", WORK_POOL, "--type", "process"], env


START_MARK = "== gym: starting"  # the line spawn writes to a service's log before each start


def spawn(name: str, command: list[str], env: dict[str, str], url: str | None) -> Service:
    """Start `command` in a new session (its own process group), output to the workspace's log."""
    log = workspace.path("services", f"{name}.log")
    with open(log, "ab") as out:
        out.write(f"{START_MARK} {name} {time.strftime('%Y-%m-%d %H:%M:%S')} ==\n".encode())
        out.flush()
        proc = subprocess.Popen(
            command,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Service(name=name, pid=proc.pid, url=url, log=str(log), command=command)


def wait_healthy(services: list[Service], deadline_s: float = 120.0) -> None:
    """Return once every service answers its health check; raise (with its log's end) if one dies."""
    deadline = time.monotonic() + deadline_s
    waiting = [s for s in services if s.url]
    while waiting:
        for s in list(waiting):
            if healthy(str(s.url), s.name):
                waiting.remove(s)
            elif not alive(s):
                raise GymError(
                    f"the {s.name} server exited while starting; the end of {s.log}:\n{tail(s.log)}"
                )
        if waiting and time.monotonic() > deadline:
            names = ", ".join(s.name for s in waiting)
            raise GymError(
                f"{names} did not answer within {deadline_s:.0f} s (logs in {workspace.path('services')})"
            )
        time.sleep(0.2)


def tail(path: str, lines: int = 15) -> str:
    """The last `lines` lines the latest start wrote to log `path` (a log gathers every start)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    latest = text.rsplit(START_MARK, 1)[-1].split("\n", 1)[-1] if START_MARK in text else text
    return "\n".join(latest.splitlines()[-lines:])


def _port_of(url: str | None) -> int | None:
    from urllib.parse import urlsplit

    return urlsplit(url).port if url else None


def up(
    prefect_port: int | None = None,
    mlflow_port: int | None = None,
    deadline_s: float = 120.0,
    notes: list[str] | None = None,
) -> dict[str, Service]:
    """Start whichever of the two servers is not running yet; return both once they answer.

    A port asked for (not None, not 0: any free one) must be free: else GymError before anything starts.
    Without one, a server takes the port it last ran on (a link stored in a run names it), else its
    usual one, else any free port; a server that could not take its last port gets a line in `notes`.
    """
    recorded = read_state()
    state = {n: s for n, s in recorded.items() if alive(s)}
    asked = {"prefect": prefect_port, "mlflow": mlflow_port}
    for name, port in asked.items():
        if name not in state and port and free_port(port) != port:
            raise GymError(
                f"port {port} ({name}) is in use on {HOST}: choose another with --{name}-port (0: any free "
                "port), or stop what listens there"
            )
    previous = last_ports()
    started = []
    for name, build in (("prefect", prefect_command), ("mlflow", mlflow_command)):
        if name in state:
            continue
        port = asked[name]
        last = _port_of(recorded[name].url) if name in recorded else previous.get(name)
        chosen = port if port else free_port((last or PREFERRED_PORTS[name]) if port is None else None)
        if port is None and last is not None and chosen != last and notes is not None:
            notes.append(
                f"{name} now runs on port {chosen}: its last port {last} is in use, so links to it stored "
                f"in earlier runs no longer open (`gym down`, free port {last}, and `gym up` to go back)"
            )
        command, env = build(chosen)
        url = f"http://{HOST}:{chosen}"
        state[name] = spawn(name, command, env, url)
        if "MLFLOW_BACKEND_STORE_URI" in env:
            state[name].serves = store_digest(env["MLFLOW_BACKEND_STORE_URI"])
        started.append(state[name])
    write_state(state)
    try:
        wait_healthy([state["prefect"], state["mlflow"]], deadline_s)
    except GymError:
        for s in started:
            stop(s)
        write_state({n: s for n, s in state.items() if s not in started})
        raise
    ports = {name: _port_of(state[name].url) for name in ("prefect", "mlflow")}
    workspace.atomic_write_json(ports_file(), {n: p for n, p in ports.items() if p is not None})
    return state


def start_worker() -> Service:
    """Start (or find) a process worker on the `gym-process` pool of the running Prefect server."""
    state = read_state()
    if "worker" in state and alive(state["worker"]):
        return state["worker"]
    api = running("prefect")
    if api is None:
        raise GymError("the Prefect server is not running: `gym up` first")
    command, env = worker_command(f"{api}/api")
    state["worker"] = spawn("worker", command, env, None)
    write_state(state)
    return state["worker"]


def stop(service: Service, grace_s: float = 15.0) -> None:
    """Signal the service's whole process group, then kill what is left after `grace_s`."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(service.pid, STOP_SIGNALS.get(service.name, signal.SIGTERM))
    deadline = time.monotonic() + grace_s
    while group_members(service.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_members(service.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(service.pid, signal.SIGKILL)
        while group_members(service.pid) and time.monotonic() < deadline + 5:
            time.sleep(0.1)


def down(after_worker: Callable[[], None] | None = None) -> list[str]:
    """Stop every recorded service (worker first, then `after_worker()` while the servers still run);
    return the names stopped."""
    state = read_state()
    order = sorted(state, key=lambda n: n != "worker")
    stopped = []
    for name in order:
        if name != "worker" and after_worker is not None:
            after_worker()
            after_worker = None
        if alive(state[name]):
            stop(state[name])
            stopped.append(name)
    write_state({})
    return stopped


def status() -> dict[str, dict[str, Any]]:
    """Each recorded service: URL, process group, alive, answering."""
    out = {}
    for name, s in read_state().items():
        is_alive = alive(s)
        out[name] = {
            "url": s.url,
            "pid": s.pid,
            "alive": is_alive,
            "answering": bool(s.url and is_alive and healthy(s.url, name)),
            "log": s.log,
        }
    return out
