"""Fixed cost of a run: with no Prefect server, the run's process starts Prefect's temporary API as a
separate process (Prefect's own server command) without importing Prefect's server, uses it for the
whole run (task states, cache, logs), makes no links to a UI it doesn't have, sends it no heartbeats,
and stops it at the end (it stops itself if the run is killed, and Ctrl-C doesn't reach it); the
heavy imports of a run don't set off full garbage collections; and bitsandbytes, which peft imports
whenever it is installed, loads only when something uses it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gym.process import FULL_COLLECTION_THRESHOLD

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import gc, json, socket, sys
from gym.process import tune_process
tune_process()  # as the gym console does first
from pydantic import BaseModel
from prefect import flow, task
from prefect.settings import PREFECT_API_URL, get_current_settings
from tasks._common import gym_task
from tasks.tracking import flow_run_url
from prefect.runtime import flow_run
from flows.runner import run_flow

@gym_task(name="double")
def double(x: int) -> int:
    return 2 * x

@flow(name="tiny", persist_result=True)
def tiny(config: BaseModel) -> dict:
    link = flow_run_url(flow_run.get_id())
    heartbeat = get_current_settings().flows.heartbeat_frequency
    return {"values": [double(21), double(21)], "api": PREFECT_API_URL.value(), "ui_link": link,
            "heartbeat": heartbeat}

class Config(BaseModel):
    x: int = 1

summary = run_flow(tiny, Config())
port = int(summary["api"].split(":")[2].split("/")[0])
with socket.socket() as s:
    stopped = s.connect_ex(("127.0.0.1", port)) != 0
imported = "prefect.server.api.server" in sys.modules
full = gc.get_stats()[2]["collections"]
print(json.dumps({**summary, "stopped": stopped, "server_imported": imported, "full_collections": full}))
"""


def test_the_temporary_api_is_prefects_own_server_process_started_without_its_import(gym_home):
    env = {**os.environ, "GYM_HOME": str(gym_home), "PREFECT_HOME": str(gym_home / "prefect-home")}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["values"] == [42, 42]
    # The second call came from the cache: task states and results round-trip through the API process.
    assert out["cached_tasks"] == 1
    assert out["api"].startswith("http://127.0.0.1:") and out["api"].endswith("/api")
    assert out["ui_link"] is None, "the temporary API has no UI to link to"
    assert out["heartbeat"] is None, "no heartbeats to an API that ends with the run"
    assert out["stopped"], "the API process ends with the run"
    assert out["server_imported"] is False, "Prefect's server package stays out of the run's process"
    assert "Prefect's temporary API on http://127.0.0.1:" in proc.stderr
    # Importing Prefect and MLflow and running a flow: CPython's default thresholds would walk the whole
    # (growing) heap several times over; young objects are still collected.
    assert out["full_collections"] == 0


def test_the_gym_console_holds_back_full_collections():
    code = "import gc; from flows.cli import main; main(['registry', 'list']); print(*gc.get_threshold())"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    young, middle, full = map(int, proc.stdout.strip().splitlines()[-1].split())
    assert (young, middle) == (700, 10), "CPython's defaults for the young generations stay"
    assert full == FULL_COLLECTION_THRESHOLD == 1000


DEFERRED = """
import json, sys
from gym.process import tune_process
tune_process()
import peft, trl, transformers  # peft imports bitsandbytes when it is installed
before = "bitsandbytes.nn" in sys.modules
from gym.train.quant import require_bitsandbytes
require_bitsandbytes()  # what a QLoRA run checks first
import bitsandbytes as bnb
print(json.dumps({"loaded_by_imports": before, "loaded_for_qlora": "bitsandbytes.nn" in sys.modules,
                  "linear4bit": bnb.nn.Linear4bit.__module__,
                  "peft_sees": peft.import_utils.is_bnb_4bit_available()}))
"""


NO_BNB = importlib.util.find_spec("bitsandbytes") is None


@pytest.mark.skipif(NO_BNB, reason="bitsandbytes (gym[quant]) is absent")
def test_bitsandbytes_loads_on_first_use_not_when_peft_is_imported():
    proc = subprocess.run(
        [sys.executable, "-c", DEFERRED], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded_by_imports"] is False, "importing peft/trl/transformers ran bitsandbytes' code"
    assert out["loaded_for_qlora"] is True
    assert out["linear4bit"] == "bitsandbytes.nn.modules", "the deferred module is the real one once used"
    assert out["peft_sees"] is True


ORPHAN = """
import time
from flows.temporary_api import TemporaryApi
api = TemporaryApi().start()
api.ready()
print(api.process.pid, api.url, flush=True)
time.sleep(600)
"""


def test_the_temporary_api_ends_when_the_run_is_killed(gym_home):
    """A run killed outright (SIGKILL, the OOM killer) cannot stop its temporary API: the API stops itself."""
    import httpx
    import psutil

    (gym_home / "prefect-home").mkdir(parents=True)
    env = {**os.environ, "GYM_HOME": str(gym_home), "PREFECT_HOME": str(gym_home / "prefect-home")}
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-c", ORPHAN]
    run = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    api_pid = None
    try:
        assert run.stdout is not None
        pid, url = run.stdout.readline().split()
        api_pid = int(pid)
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        run.kill()
        run.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(psutil, api_pid):
            time.sleep(0.2)
        assert not _alive(psutil, api_pid), "the temporary API outlived the killed run"
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        run.kill()
        if api_pid is not None and _alive(psutil, api_pid):
            psutil.Process(api_pid).kill()


def _alive(psutil: Any, pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


CTRL_C = """
import signal, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, however pytest was started
from prefect import flow
from prefect.settings import PREFECT_API_URL
from flows.runner import main
from gym.cli import run_console
from gym.pipeline import TrainFlowConfig

@flow(name="waits")
def waits(config: TrainFlowConfig) -> dict:
    print(PREFECT_API_URL.value(), flush=True)
    time.sleep(600)
    return {}

run_console(lambda: main(waits, TrainFlowConfig, argv=[]))
"""


def test_ctrl_c_ends_the_run_at_once_with_a_line_saying_how_to_go_on(gym_home):
    """Ctrl-C reaches the terminal's whole process group. The temporary API used to stop with it, and
    the run's process then hung for over a minute at exit retrying to send it its logs, and ended with
    a traceback. Now the API is out of that group: the run records the interruption, stops its API,
    and ends with status 130 and one line."""
    import signal

    import httpx

    (gym_home / "prefect-home").mkdir(parents=True)
    env = {**os.environ, "GYM_HOME": str(gym_home), "PREFECT_HOME": str(gym_home / "prefect-home")}
    env.pop("PREFECT_API_URL", None)
    run = subprocess.Popen(
        [sys.executable, "-c", CTRL_C],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        assert run.stdout is not None
        url = run.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), run.communicate(timeout=60)
        os.killpg(run.pid, signal.SIGINT)
        _, err = run.communicate(timeout=60)  # before the fix: 70+ s, then a traceback
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("interrupted: run the same command again")
    assert "Traceback" not in err and "Crashed(" in err, "the run recorded its interruption"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2)  # the run stopped its API


# Each script below follows this one, which counts how many times its API is started.
COUNTING_STARTS = """
import json
from flows import temporary_api
from flows.temporary_api import TemporaryApi
from gym.errors import GymError
def counted(api):
    api.starts = 0
    start = api.start
    def counting():
        api.starts += 1
        return start()
    api.start = counting
    return api
"""


def counting_starts(script: str) -> list[str]:
    """The command that runs `script` after COUNTING_STARTS."""
    return [sys.executable, "-c", COUNTING_STARTS + script]


CANNOT_START = """
api = counted(TemporaryApi())
api.start()
try:
    api.ready(timeout_s=600)
    print(json.dumps({"error": None}))
except GymError as e:
    print(json.dumps({"error": str(e), "starts": api.starts, "allowed": temporary_api.STARTS}))
"""


def test_a_temporary_api_that_cannot_start_fails_the_run_at_once(tmp_path):
    """Its database cannot be opened (PREFECT_HOME under a file): an error, not retries until the timeout."""
    (tmp_path / "file").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "file" / "prefect")
    proc = subprocess.run(
        counting_starts(CANNOT_START), cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] is not None and "exited with status 3 while starting" in out["error"]
    assert out["starts"] == out["allowed"], "a start-up failure is retried only as a taken port would be"
    assert "unable to open database file" in proc.stderr, "the server's own error is shown"
    assert proc.stderr.count("Application startup failed") == 1, "once, not for every start"


RETRIED = """
import socket
taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen()
first = [taken.getsockname()[1]]  # the first start gets a port something else holds
free = temporary_api.free_port
temporary_api.free_port = lambda: first.pop() if first else free()
api = counted(TemporaryApi())
api.start()
api.ready(timeout_s=600)
print(json.dumps({"starts": api.starts, "port": api.port, "taken": taken.getsockname()[1]}))
api.stop()
"""


def test_a_temporary_api_start_that_is_retried_prints_nothing(tmp_path):
    """Its first port is taken (as when two runs start at once): it starts again on another, and the
    failed start's error stays off the console."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"  # no network here: its telemetry would log an error
    proc = subprocess.run(
        counting_starts(RETRIED), cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["starts"] == 2 and out["port"] != out["taken"]
    assert "address already in use" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr[-3000:]


AT_ONCE = """
api = counted(TemporaryApi())
api.start()
try:
    api.ready(timeout_s=120)
    print(json.dumps({"error": None, "starts": api.starts}))
except GymError as e:
    print(json.dumps({"error": str(e), "starts": api.starts}))
finally:
    api.stop()
"""


def test_temporary_apis_started_at_once_on_a_new_database_all_start(tmp_path):
    """Three runs started at once as the first on a PREFECT_HOME: their APIs each migrated the new
    database, collided, and all three failed within the start-up timeout (restarts shared it). Now one
    creates it while the others wait, and each starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    # the waiters wait as long as the first API takes on a loaded machine (past it they start anyway)
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
    procs = [
        subprocess.Popen(counting_starts(AT_ONCE), cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        # each started once: none collided with another's migration (which restarts it, and could again)
        assert json.loads(out.strip().splitlines()[-1]) == {"error": None, "starts": 1}, err[-3000:]
        assert "Traceback" not in err and "CommandError" not in err, err[-3000:]
    assert (tmp_path / "prefect" / "prefect.db").is_file()


WAITS = """
import json, threading, time
from flows.temporary_api import FirstStart, TemporaryApi
other = FirstStart()
other.acquire()  # another run's API, creating the new database
threading.Timer(3, other.release).start()
began = time.monotonic()
api = TemporaryApi().start()
waited = time.monotonic() - began
api.ready(timeout_s=120)
api.stop()
again = time.monotonic()
TemporaryApi().start().stop()  # the database exists now: no waiting on anyone
print(json.dumps({"waited": waited, "then": time.monotonic() - again}))
"""


def test_a_temporary_api_on_a_new_database_waits_for_the_one_creating_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    proc = subprocess.run(
        [sys.executable, "-c", WAITS], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["waited"] >= 2.9 and out["then"] < 2.5, out


HELD = """
import json, time
from flows.temporary_api import FirstStart, TemporaryApi
other = FirstStart()
other.acquire()  # another run, stopped (Ctrl-Z) while its API creates the database: never released
began = time.monotonic()
api = TemporaryApi().start()
waited = time.monotonic() - began
api.ready(timeout_s=120)
api.stop()
print(json.dumps({"waited": waited}))
"""


def test_a_run_holding_the_new_database_too_long_does_not_stop_another(tmp_path):
    """A run stopped (Ctrl-Z) while its API created the database kept another run waiting, silently,
    for as long as it was stopped. Now the other waits the API start-up timeout at most, saying so."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "4"
    proc = subprocess.run(
        [sys.executable, "-c", HELD], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["waited"] >= 3.9
    assert "waiting for another run's temporary API to create Prefect's database" in proc.stderr
    assert (
        "held Prefect's new database" in proc.stderr
        and "starting this run's temporary API anyway" in proc.stderr
    )


SERVER_STUB = """
import signal, sys, time
def stopped(*args):
    sys.stderr.write("Error flushing 1 events (1 to retry, 0 dropped)\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
sys.stderr.write(sys.argv[1] + "\\n")
sys.stderr.flush()
time.sleep(60)
"""


@pytest.mark.parametrize("serving", [True, False])
def test_what_a_serving_api_says_as_it_is_stopped_is_not_shown(serving, capsys):
    """A run that failed fast stopped the API while its services were still recording the failures: two
    "Error flushing events ... CancelledError" tracebacks followed the run's error line. An API stopped
    before it served (it never answered) still shows everything it said: that is why it failed."""
    from flows.temporary_api import HeldBack, TemporaryApi

    api = TemporaryApi()
    said = "serving" if serving else "still starting"
    api.process = subprocess.Popen([sys.executable, "-c", SERVER_STUB, said], stderr=subprocess.PIPE)
    api.stderr = held = HeldBack(api.process.stderr)  # type: ignore[arg-type]
    while not held.held:
        time.sleep(0.01)
    if serving:
        held.pass_through()
    api.stop()
    err = capsys.readouterr().err
    assert said in err
    assert ("Error flushing" in err) is not serving


TEARDOWN = """
import sys
{tune}
import torch._dynamo  # imports Triton wherever it is installed (as torch itself does)
assert "triton._C.libtriton" in sys.modules
print("run finished", file=sys.stderr)
from gym.cli import exit_process
exit_process(0)
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed here")
def test_a_finished_command_ends_without_tritons_teardown_report():
    def stderr(tune: str) -> str:
        code = TEARDOWN.format(tune=tune)
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stderr

    quiet = stderr("from gym.process import tune_process; tune_process()")
    assert "run finished" in quiet and "nanobind" not in quiet and "leaked" not in quiet
    # The control: the skipped final collection makes Triton's module report its objects as leaked.
    assert "leaked" in stderr("")


INDEX = """
import importlib.metadata, json
calls = []
scan = importlib.metadata.packages_distributions
def counted():
    calls.append(1)
    return scan()
importlib.metadata.packages_distributions = counted
from gym.process import tune_process
tune_process()
import transformers, trl  # each builds the index as it is imported
from transformers import AutoModelForCausalLM
first, second = importlib.metadata.packages_distributions(), importlib.metadata.packages_distributions()
first["torch"].append("changed by a caller")
print(json.dumps({"scans": len(calls), "torch": importlib.metadata.packages_distributions()["torch"],
                  "equal": scan() == second, "separate": first is not second}))
"""


def test_the_installed_distributions_are_indexed_once_per_process():
    proc = subprocess.run(
        [sys.executable, "-c", INDEX], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["scans"] == 1, "transformers and TRL each read every installed distribution's file list"
    assert out["equal"], "the kept index is what a fresh scan finds"
    assert out["separate"] and out["torch"] == ["torch"], "each caller gets its own copy"


REGISTER_INDEX = """
import importlib.metadata, json, sys
from pathlib import Path
import importlib_metadata  # MLflow's copy of importlib.metadata: counted too
calls = {"stdlib": 0, "backport": 0}
def counting(name, scan):
    def counted():
        calls[name] += 1
        return scan()
    return counted
importlib.metadata.packages_distributions = counting("stdlib", importlib.metadata.packages_distributions)
importlib_metadata.packages_distributions = counting("backport", importlib_metadata.packages_distributions)
from gym.process import tune_process
tune_process()
import transformers  # builds the index as it is imported
from gym import tracking
from gym.models import resolve
tracking.register_model(tracking.start_run("index"), Path(resolve("gym-tiny").path), "tiny-index", {})
from mlflow.utils import requirements_utils
known = requirements_utils._MODULES_TO_PACKAGES
print(json.dumps({**calls, "torch": known.get("torch"), "mlflow": known.get("mlflow")}))
"""


def test_logging_a_model_to_mlflow_reuses_the_index_of_installed_distributions(gym_home):
    """MLflow checks a logged model's requirements against the installed packages through the
    importlib_metadata backport's index: the one the process already built, not a second scan."""
    env = {**os.environ, "GYM_HOME": str(gym_home)}
    proc = subprocess.run(
        [sys.executable, "-c", REGISTER_INDEX], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["backport"] == 0, "MLflow read every installed distribution's file list again"
    assert out["stdlib"] == 1
    assert out["torch"] == ["torch"] and "mlflow" in out["mlflow"], "MLflow's map is the real one"


SKLEARN = """
import json, sys
{tune}
from transformers import AutoModelForCausalLM, Trainer
import transformers.generation.candidate_generator as assisted
from transformers.utils import import_utils
loaded = "sklearn" in sys.modules
from sklearn.metrics import roc_curve  # anyone else who needs it still gets it
import inspect
print(json.dumps({"loaded": loaded, "available": assisted.is_sklearn_available(),
                  "source": "def is_sklearn_available" in inspect.getsource(import_utils),
                  "roc_curve": roc_curve.__module__}))
"""


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="scikit-learn is not installed here")
def test_transformers_does_not_import_scikit_learn_into_a_gym_process():
    def run(tune: str) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-c", SKLEARN.replace("{tune}", tune)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    tuned = run("from gym.process import tune_process; tune_process()")
    assert not tuned["loaded"] and tuned["available"] is False
    assert tuned["source"], "transformers' module reads as before (its loader is only wrapped)"
    assert tuned["roc_curve"].startswith("sklearn.metrics")
    # The control: without it, loading a model's code imports scikit-learn's metrics.
    plain = run("")
    assert plain["loaded"] and plain["available"] is True


LIBRARY = """
import importlib.metadata, json
from pathlib import Path
import importlib_metadata
before = (importlib.metadata.packages_distributions, importlib_metadata.packages_distributions)
from gym import tracking
from gym.models import resolve
tracking.register_model(tracking.start_run("library"), Path(resolve("gym-tiny").path), "tiny-library", {})
after = (importlib.metadata.packages_distributions, importlib_metadata.packages_distributions)
print(json.dumps({"unchanged": after == before}))
"""


def test_gym_as_a_library_registers_a_model_without_changing_the_import_machinery(gym_home):
    """Outside gym's own processes (no tune_process), registering a model changes no one's index."""
    env = {**os.environ, "GYM_HOME": str(gym_home)}
    proc = subprocess.run(
        [sys.executable, "-c", LIBRARY], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"unchanged": True}
