"""Prefect's temporary API for a run that has no Prefect server: Prefect's own server command, started early.

Used by flows/runner.py (`gym train`, `python flows/<name>.py`); not a command itself.

With no API configured, Prefect's client starts a temporary API on its first call: it imports Prefect's
server package into the run's process (~2 s of CPU here, only to build a command line) and starts
`uvicorn ... prefect.server.api.server:create_app` in a subprocess, once the flow begins. gym starts
that same command, with the same environment, itself: as soon as the run's inputs are checked, so the
API boots in its own process while this one imports the flow and connects to MLflow, and without the
server import (its garbage collector tuned as in gym's own process: gym/process.py). The run then
talks to it through PREFECT_API_URL, as to any Prefect server; it has no UI (as Prefect's temporary
API), so no UI links are made. It stops when the run ends.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import prefect
from prefect.logging import get_logger
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    PREFECT_SERVER_EPHEMERAL_ENABLED,
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    PREFECT_UI_URL,
    get_current_settings,
    temporary_settings,
)

from gym.errors import GymError
from gym.process import FULL_COLLECTION_THRESHOLD

# uvicorn's exit status when it could not start: its port was taken meanwhile (start again on another),
# or the app's start-up failed (e.g. its database cannot be opened; retrying will not help).
STARTUP_FAILURE = 3
STARTS = 3
# `python -m uvicorn`, with the collector tuned as in gym's own process (gym/process.py): the server's
# start-up is mostly imports (~2.5 s of CPU here; ~0.35 s less this way). It ends with the run's process
# even when that is killed (SIGKILL, OOM) and cannot stop it: it watches for its parent to change.
UVICORN = f"""
import gc, os, runpy, sys, threading, time
gc.set_threshold(*gc.get_threshold()[:2], {FULL_COLLECTION_THRESHOLD})
def exit_with_parent(parent=os.getppid()):
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)
threading.Thread(target=exit_with_parent, daemon=True).start()
sys.argv[0] = "uvicorn"
runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)
"""
logger = get_logger("gym")


def wanted() -> bool:
    """True when Prefect would start a temporary API: no API URL configured, and not turned off."""
    return not PREFECT_API_URL.value() and bool(PREFECT_SERVER_EPHEMERAL_ENABLED.value())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HeldBack:
    """A server's stderr, held back while it starts and passed through once it is up.

    A start that fails and is retried (its port taken meanwhile; two runs creating the same fresh
    database at once, where one's migration fails) then prints nothing; a start that fails for good
    shows the server's own error, once.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self.held: list[bytes] = []
        self.passing = False
        self.dropped = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self.thread.start()

    def _pump(self, stream: IO[bytes]) -> None:
        for line in iter(stream.readline, b""):
            with self.lock:
                if self.passing:
                    _write_stderr(line)
                elif not self.dropped:
                    self.held.append(line)
        stream.close()

    def pass_through(self) -> None:
        """From now on, the server's lines go to this process's stderr (those held so far first)."""
        with self.lock:
            for line in self.held:
                _write_stderr(line)
            self.held.clear()
            self.passing = True

    def hold(self) -> bool:
        """Hold the server's lines back from now on; whether they were being passed through."""
        with self.lock:
            passing, self.passing = self.passing, False
        return passing

    def drop(self) -> str:
        """Forget what the server said (it is being started again); returns its last line."""
        self.thread.join(timeout=5)  # the server has exited: its stream ends
        with self.lock:
            self.dropped = True
            last = self.held[-1].decode(errors="replace").strip() if self.held else ""
            self.held.clear()
        return last

    def finish(self) -> None:
        """The server has exited: show what it said, if it was still held back."""
        self.thread.join(timeout=5)
        self.pass_through()


def _write_stderr(line: bytes) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(line.decode(errors="replace"))
        sys.stderr.flush()


def _new_database() -> Path | None:
    """Prefect's SQLite database file when it does not exist yet (the API that starts first on this
    PREFECT_HOME creates and migrates it), else None."""
    url = get_current_settings().server.database.connection_url
    text = url.get_secret_value() if url is not None else ""
    prefix = "sqlite+aiosqlite:///"
    if not text.startswith(prefix) or ":memory:" in text:
        return None
    path = Path(text.removeprefix(prefix)).expanduser()
    return None if path.exists() else path


WAIT_NOTE_S = 3.0  # a run waiting this long for another's API to create the database says so


class FirstStart:
    """Runs started at once on a new Prefect database start their temporary APIs one after the other.

    Each API migrates the database as it starts; two migrating one new database at once fail (alembic's
    "expected to match one row", or "no such table" in the other), and a third start could collide
    again: all of them failed within the start-up timeout. The first holds a lock beside the database
    until its API answers (the database then made); the others wait for it, then find it made. Only a
    database that does not exist yet is locked: a run on one that does starts at once."""

    def __init__(self) -> None:
        self.fd: int | None = None

    def acquire(self) -> None:
        database = _new_database()
        if database is None or self.fd is not None:
            return

        try:
            database.parent.mkdir(parents=True, exist_ok=True)
            lock = database.with_name(f".{database.name}.gym-start.lock")
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:  # a home it cannot write: the server's own start says so
            return
        if not self._wait(fd, database):
            os.close(fd)  # the other run is stopped (Ctrl-Z) or slow: start anyway, as before the lock
            return
        self.fd = fd  # held until this API answers (or this process ends)
        if database.exists():  # another run's API made it while this one waited
            self.release()

    @staticmethod
    def _wait(fd: int, database: Path) -> bool:
        """Take the lock on `fd`: at once, or within the API start-up timeout (saying so after a few
        seconds); False when another run held it all that time."""
        import fcntl

        limit = float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
        began, said = time.monotonic(), False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                waited = time.monotonic() - began
                if waited >= limit:
                    print(
                        f"note: another run held Prefect's new database {database} for {limit:.0f} s: "
                        "starting this run's temporary API anyway",
                        file=sys.stderr,
                    )
                    return False
                if waited >= WAIT_NOTE_S and not said:
                    print(
                        f"note: waiting for another run's temporary API to create Prefect's database "
                        f"{database}",
                        file=sys.stderr,
                    )
                    said = True
                time.sleep(0.1)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # and the lock with it
            self.fd = None


class TemporaryApi:
    """One temporary API server process: `start` returns at once (on a new database, once no other
    run's API is creating it: FirstStart), `ready` waits for its health check."""

    def __init__(self) -> None:
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr: HeldBack | None = None
        self.first = FirstStart()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> TemporaryApi:
        # The command and environment Prefect's SubprocessASGIServer uses (settings made in this
        # process, such as the workspace's result storage, reach the server as variables).
        self.first.acquire()
        self.port = free_port()
        env = {
            **os.environ,
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
            **get_current_settings().to_environment_variables(exclude_unset=True),
        }
        command = [
            sys.executable,
            "-c",
            UVICORN,
            "--app-dir",
            str(prefect.__module_path__.parent),
            "--factory",
            "prefect.server.api.server:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "error",
            "--lifespan",
            "on",
        ]
        # Its own session: Ctrl-C in the terminal reaches the run, not the API. The run then records
        # its interruption and sends its last logs before it stops the API (`stop`); an API that died
        # with the run's Ctrl-C left the run's process hanging at exit, retrying to send them.
        self.process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, start_new_session=True)
        assert self.process.stderr is not None
        self.stderr = HeldBack(self.process.stderr)
        return self

    def ready(self, timeout_s: float | None = None) -> None:
        """Wait until the API answers its health check (a port taken meanwhile: start again elsewhere)."""
        try:
            self._ready(timeout_s)
        finally:
            self.first.release()

    def _ready(self, timeout_s: float | None = None) -> None:
        limit = timeout_s or float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
        deadline = time.monotonic() + limit
        starts = 1
        with httpx.Client() as client:
            while time.monotonic() < deadline:
                assert self.process is not None, "start() first"
                assert self.stderr is not None
                status = self.process.poll()
                if status == STARTUP_FAILURE and starts < STARTS:
                    said = self.stderr.drop()
                    logger.debug(f"Prefect's temporary API did not start ({said}); starting it again")
                    starts += 1
                    self.start()
                    deadline = time.monotonic() + limit  # each start has the whole time
                    continue
                if status is not None:
                    self.stderr.finish()
                    raise GymError(
                        f"Prefect's temporary API exited with status {status} while starting (its error "
                        "is above); or start a Prefect server with `gym up`, and runs use it"
                    )
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"{self.url}/health", timeout=2).status_code == 200:
                        self.stderr.pass_through()
                        logger.info(
                            f"Prefect's temporary API on {self.url} (no UI: `gym up` starts a Prefect "
                            "server with its UI, and runs then use it)"
                        )
                        return
                time.sleep(0.05)
        self.stop()  # and what the server said while it tried to start shows
        raise GymError(
            f"Prefect's temporary API did not answer within {limit:.0f} s; on a busy machine raise "
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or start a server with `gym up`"
        )

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """Prefect's clients talk to this API; an empty UI URL: it has none, so no links to it are made.

        No flow-run heartbeats: they let a server notice a run whose process died, and this API dies
        with the run's process.
        """
        settings = {PREFECT_API_URL: self.url, PREFECT_UI_URL: "", PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
        with temporary_settings(settings):
            yield

    def stop(self) -> None:
        """Send the run's last logs and events, then stop the server (at once, not at exit, so nothing
        Prefect prints follows the run's own last lines)."""
        self.first.release()
        if self.process is None:
            return
        stopped_while_serving = False
        if self.process.poll() is None:
            from prefect.events.worker import EventsWorker
            from prefect.logging.handlers import APILogWorker

            with self.in_use():
                APILogWorker.drain_all(timeout=5)
                EventsWorker.drain_all(timeout=5)
            # What a serving API says as it is stopped is its services cancelled mid-work ("Error
            # flushing 1 events ... CancelledError" tracebacks after a run that failed fast): not shown.
            stopped_while_serving = self.stderr is not None and self.stderr.hold()
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.stderr is not None:
            if stopped_while_serving:
                self.stderr.drop()
            else:  # it exited by itself, or never served: what it said may be why
                self.stderr.finish()
        self.process = self.stderr = None
