"""MLflow tracking: the only module of gym that talks to mlflow.

Default store: SQLite in the workspace (`$GYM_HOME/mlflow/mlflow.db`, artifacts beside it);
`MLFLOW_TRACKING_URI` (or the `uri` argument) points anywhere else. Runs are addressed by id
through `MlflowClient`, never through mlflow's thread-local "active run", so tasks running in
other threads (or processes) log to the right place. Parameters pass through `redact` first:
secrets never reach MLflow, and links to the MLflow UI never carry a login (`ui_url`).

A tracking server that stops answering is retried for about 30 s (`HTTP_RETRIES`), then every call
through `_client` says so in one line (`TrackingServerDown`); a `models:/` URI is resolved only once
the server answers.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import traceback
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gym import secrets, workspace
from gym.errors import GymError, chain, interrupted

# MLflow sends usage telemetry to its maintainers from a background thread unless told not to; gym runs
# offline-first and already turns Prefect's analytics off. Set before mlflow is first imported (only this
# module imports it); MLFLOW_DISABLE_TELEMETRY=false in the environment turns it back on.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# MLflow prints "View run ... at: <tracking URI>/#/..." each time a run ends: the URI as given, with the
# login a server URI may carry (MLFLOW_TRACKING_URI=http://user:password@host), on the console and in a
# worker's log, and one line per stage. gym's own links (its Prefect artifacts) leave the login out.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
# MLflow retries a request to a tracking server 7 times, 2 s, 4 s ... 128 s apart: a server that stopped
# was reported after about 4 minutes (and each later call waited as long again). gym's budget: 5 retries,
# 0, 2, 4, 8 and 16 s apart (about 30 s, plus up to 1 s of jitter each): a server that restarts (`gym up`
# takes ~6 s) is still waited for. MLflow's variables, set in the environment, win.
HTTP_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "5", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
for _name, _value in HTTP_RETRIES.items():
    os.environ.setdefault(_name, _value)

EXPERIMENT = "gym"
PROCESS_TAG = "gym.process"  # the process that made a run (gym.liveness): host|pid namespace|pid|start
# Logged with every model so `mlflow models serve` / a fresh env can rebuild it without torchvision.
MODEL_REQUIREMENTS = ["torch", "transformers==5.17.0", "accelerate==1.15.0", "safetensors"]


def tracking_uri(uri: str | None = None, create: bool = True) -> str:
    """`uri`, else $MLFLOW_TRACKING_URI, else the workspace's SQLite store (its folder made unless
    `create` is off)."""
    if uri:
        return uri
    if env := os.environ.get("MLFLOW_TRACKING_URI"):
        return env
    folder = workspace.path("mlflow") if create else workspace.home(create=False) / "mlflow"
    return f"sqlite:///{folder / 'mlflow.db'}"


def check_store(uri: str | None = None, field: str = "output.tracking_uri") -> None:
    """The tracking store a run will use is one it can use, checked before the run starts, without
    creating anything: a SQLite store somewhere this process can create it, no file store MLflow refuses,
    a tracking server that answers. `field` names where `uri` came from (else the environment).

    A `uri` given as a setting carries no credentials: it is stored as the flow run's parameters in
    Prefect, shown in its UI and in messages. MLflow reads them from its own variables instead (and
    MLFLOW_TRACKING_URI, which stays in the environment, may hold them)."""
    from gym.errors import ConfigError

    if uri and secrets.url_credentials(uri):
        raise ConfigError(f"{field}: {credentials_advice(uri)}")
    u = tracking_uri(uri)
    where = field if uri else "MLFLOW_TRACKING_URI"
    if not uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        where = "GYM_HOME (the workspace)"
    db = _sqlite_file(u)
    problem = _sqlite_problem(db) if db is not None else _other_store_problem(u)
    if problem:
        raise ConfigError(_store_message(where, u, problem))


def credentials_advice(uri: str) -> str:
    """What to do instead of giving tracking URI `uri`, which carries credentials, as a setting."""
    said = (
        "the tracking URI carries credentials, and a setting is stored and shown (a flow's in Prefect's "
        "flow-run parameters and UI)"
    )
    if uri.startswith(("http://", "https://")):
        return (
            f"{said}: give it without them ({secrets.without_credentials(uri)}) and set "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN), MLflow's own "
            "variables, instead"
        )
    # a database's login has no variable of MLflow's: the whole URI goes in the environment
    return f"{said}: give the whole URI in MLFLOW_TRACKING_URI instead (the environment is not stored)"


def _store_message(where: str, uri: str, problem: str) -> str:
    return (
        f"{where}: the MLflow store {secrets.link_url(uri)} can't be used ({problem}); point it at a "
        "writable place (sqlite:////abs/path/mlflow.db, gym's default kind) or at a tracking server that "
        "is running (http://host:port)"
    )


def check_server(uri: str | None = None, field: str = "output.tracking_uri") -> None:
    """The tracking server (if the store is one) answers, checked in a moment before MLflow is asked
    anything (a ConfigError naming where the URI came from, as `check_store`'s)."""
    from gym.errors import ConfigError

    u = tracking_uri(uri, create=False)
    if problem := _unreachable(u):
        raise ConfigError(_store_message(field if uri else "MLFLOW_TRACKING_URI", u, problem))


def _sqlite_problem(db: Path) -> str | None:
    """Why the folders of SQLite database `db` can't be made (made and removed again), else None."""
    folder = db.absolute().parent
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    existing = folder.parents[len(missing) - 1] if missing else folder
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    try:
        for p in reversed(missing):
            p.mkdir()
    except OSError as exc:
        return f"{exc.strerror.lower() if exc.strerror else exc}: {exc.filename}"
    finally:
        for p in missing:
            with contextlib.suppress(OSError):
                p.rmdir()
    return None


def _other_store_problem(uri: str, timeout: float = 5.0) -> str | None:
    """A file store MLflow refuses (in maintenance mode: the model registry needs MLFLOW_ALLOW_FILE_STORE),
    or a tracking server nothing answers at (MLflow would retry for minutes)."""
    return _file_store_refused(uri) or _unreachable(uri, timeout)


def _file_store_refused(uri: str) -> str | None:
    from urllib.parse import urlsplit

    if urlsplit(uri).scheme not in ("", "file") or uri.startswith("databricks"):
        return None
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("1", "true"):
        return None
    return "a file store, which MLflow refuses unless MLFLOW_ALLOW_FILE_STORE=true"


def _unreachable(uri: str, timeout: float = 5.0) -> str | None:
    """Why nothing answers at tracking server `uri` (None: it answers, or it is no server)."""
    from gym.services import unreachable

    return unreachable(uri, timeout)


class TrackingServerDown(GymError):
    """The MLflow tracking server stopped answering in the middle of a command or run."""


def _server_down_message(uri: str, problem: str) -> str:
    return (
        f"the MLflow server at {secrets.link_url(uri)} stopped answering ({problem}): start it again "
        "(`gym up` starts gym's own) and run the same command again; a flow run goes on from its cached "
        "tasks, and training from its last checkpoint"
    )


@contextlib.contextmanager
def answering(uri: str | None = None) -> Iterator[None]:
    """MLflow's failure to reach a tracking server that stopped answering, in the block, as one line
    (`TrackingServerDown`, a user's error: no traceback, no task retry) instead of MLflow's chain of
    ConnectionRefusedError, MaxRetryError and MlflowException, with credentials kept out of it. Any
    other failure (a server that answers with an error, a database store) is raised as it is."""
    try:
        yield
    except GymError:
        raise
    except Exception as exc:
        u = tracking_uri(uri, create=False)
        if interrupted(exc) or not u.startswith(("http://", "https://")):
            raise
        problem = _unreachable(u)
        if problem is None:
            raise
        raise TrackingServerDown(_server_down_message(u, problem)) from None


class _Answering:
    """An MlflowClient whose calls run inside `answering`."""

    def __init__(self, client: Any, uri: str) -> None:
        self._client, self._uri = client, uri

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            with answering(self._uri):
                return attr(*args, **kwargs)

        return call


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a `sqlite:///` tracking URI (None for any other store)."""
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0]) if uri.startswith("sqlite:///") else None


# SQLite stores this process has opened once: their tables exist from then on.
_OPENED: set[str] = set()


def _client(uri: str | None = None) -> Any:
    from mlflow import MlflowClient

    u = tracking_uri(uri)
    db = _sqlite_file(u)
    if u in _OPENED or db is None:
        return _Answering(MlflowClient(tracking_uri=u, registry_uri=u), u)
    with _creating(db):
        client = MlflowClient(tracking_uri=u, registry_uri=u)  # creates and migrates a new database
    _OPENED.add(u)
    return _Answering(client, u)


@contextlib.contextmanager
def _creating(db: Path) -> Iterator[None]:
    """One process at a time opens a SQLite store that may not exist yet.

    MLflow creates a new database's tables when its store first opens it, unguarded: two runs starting
    at once in a new workspace (a worker picking up two deployments, two `gym train` side by side) both
    ran the migrations and both failed ("table _alembic_tmp_latest_metrics already exists"). The lock
    sits beside the database; once the tables exist, opening the store only reads them.
    """
    from filelock import FileLock

    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(db) + ".lock"):
        yield


def redact(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested params to `a.b` keys, turning the values of secret-named settings into `***` and
    stripping credentials from URLs in the others (`http://user:***@host`)."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if secrets.secret_name(key):
            flat[name] = secrets.REDACTED
        elif isinstance(value, Mapping):
            flat.update(redact(value, prefix=f"{name}."))
        else:
            flat[name] = secrets.scrub(str(value))[:6000]
    return flat


def experiment_id(name: str = EXPERIMENT, uri: str | None = None) -> str:
    """The experiment's id, creating it on first use. Runs starting side by side in one workspace (a
    worker running two deployments) may both find it missing: the one whose create loses reads the
    winner's."""
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if tracking_uri(uri).startswith("sqlite:"):
        location = workspace.path("mlflow", "artifacts").as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def start_run(
    run_name: str,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    parent_run_id: str | None = None,
    uri: str | None = None,
    experiment: str | None = None,
) -> str:
    """Create a run in `experiment` (default: gym's), or nested under `parent_run_id` in its parent's
    experiment, and return its id. Its `gym.process` tag names the process that made it, so that a run
    the process could not end (killed) is ended by the next flow run on the machine
    (`end_orphaned_runs`)."""
    from gym import liveness

    client = _client(uri)
    all_tags = {"mlflow.runName": run_name, PROCESS_TAG: liveness.this_process(), **(tags or {})}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
        where = client.get_run(parent_run_id).info.experiment_id
    else:
        where = experiment_id(experiment or EXPERIMENT, uri=uri)
    run = client.create_run(where, tags=all_tags, run_name=run_name)
    if params:
        log_params(run.info.run_id, params, uri=uri)
    return run.info.run_id


def log_params(run_id: str, params: Mapping[str, Any], uri: str | None = None) -> None:
    """Log `params` on run `run_id`, flattened and with secrets redacted (`redact`), 100 per request."""
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in redact(params).items()]
    client = _client(uri)
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i : i + 100])


def log_metrics(
    run_id: str, metrics: Mapping[str, float | None], step: int | None = None, uri: str | None = None
) -> None:
    """Log `metrics` on run `run_id` at `step` (0 when None) in one request; None values are skipped and
    names MLflow refuses have their odd characters replaced by `_`."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(_safe(k), float(v), now, step or 0) for k, v in metrics.items() if v is not None]
    if items:
        _client(uri).log_batch(run_id, metrics=items)


def log_curve(run_id: str, key: str, points: Iterable[tuple[int, float]], uri: str | None = None) -> None:
    """Log a metric series, one value per step (e.g. the training loss)."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(_safe(key), float(v), now, int(s)) for s, v in points]
    client = _client(uri)
    for i in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[i : i + 1000])


def log_table(run_id: str, rows: list[dict[str, Any]], artifact_file: str, uri: str | None = None) -> None:
    """Log rows (dicts) as an MLflow table artifact, e.g. sample completions per training step."""
    if not rows:
        return
    columns = list(dict.fromkeys(k for row in rows for k in row))
    _client(uri).log_table(
        run_id, data={k: [row.get(k) for row in rows] for k in columns}, artifact_file=artifact_file
    )


def _safe(key: str) -> str:
    """MLflow metric names allow alphanumerics, _ - . / and spaces; map anything else to _."""
    return re.sub(r"[^\w\-./ ]", "_", key)


def set_tags(run_id: str, tags: Mapping[str, Any], uri: str | None = None) -> None:
    """Set `tags` on run `run_id`, each value as its str."""
    client = _client(uri)
    for k, v in tags.items():
        client.set_tag(run_id, k, str(v))


def log_artifact(run_id: str, path: Path, artifact_path: str | None = None, uri: str | None = None) -> None:
    """Upload the file at `path` to run `run_id`'s artifacts (under the folder `artifact_path`, if given)."""
    _client(uri).log_artifact(run_id, str(path), artifact_path)


def end_run(run_id: str, status: str = "FINISHED", uri: str | None = None) -> None:
    """Mark run `run_id` ended with `status` (FINISHED, FAILED or KILLED)."""
    _client(uri).set_terminated(run_id, status)


@contextlib.contextmanager
def span(
    run_name: str,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    parent_run_id: str | None = None,
    uri: str | None = None,
) -> Iterator[str]:
    """An MLflow run that spans a block of work: created before it (so MLflow's start time and duration
    are the work's), FINISHED after it, FAILED if the block raises (KILLED if interrupted).

    A tracking server that stopped answering in the block ends nothing (that would wait out MLflow's
    retries again); one that stops while the run is ended after another failure leaves that failure
    as the error."""
    run_id = start_run(run_name, params=params, tags=tags, parent_run_id=parent_run_id, uri=uri)
    try:
        yield run_id
    except TrackingServerDown:
        raise
    except BaseException as exc:
        if interrupted(exc):
            release_interrupted(exc)
        with contextlib.suppress(TrackingServerDown):
            end_run(run_id, "KILLED" if interrupted(exc) else "FAILED", uri=uri)
        raise
    end_run(run_id, uri=uri)


def release_interrupted(exc: BaseException) -> None:
    """Ctrl-C inside one of MLflow's writes to a SQLite store stops a statement that keeps its lock for as
    long as the frames the interrupt passed through are alive, which is as long as the exception: every
    later write of the process (ending the runs as KILLED, the flow's failure hook) waited out SQLite's
    20 s busy timeout and failed with "database is locked". Clearing those frames' locals (the
    traceback's lines stay) closes the statement."""
    for link in chain(exc):
        traceback.clear_frames(link.__traceback__)


def end_open_runs(tag: str, value: str, status: str = "FAILED", uri: str | None = None) -> list[str]:
    """End every still-running run tagged `tag=value` (and their nested runs) with `status`: for a flow
    run that failed or crashed before it could close its MLflow runs."""
    client = _client(uri)
    exps = _experiment_ids(client)
    if not exps:  # nothing was ever tracked here
        return []
    open_runs = client.search_runs(
        exps, filter_string=f"tags.`{tag}` = '{value}' and attributes.status = 'RUNNING'"
    )
    ended = []
    for run in open_runs:
        children = client.search_runs(
            [run.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{run.info.run_id}' and attributes.status = 'RUNNING'",
        )
        for child in [*children, run]:
            client.set_terminated(child.info.run_id, status)
            ended.append(child.info.run_id)
    return ended


def end_failed_runs(tag: str, value: str, status: str = "FAILED", uri: str | None = None) -> str | None:
    """`end_open_runs` for a flow run that failed, where tracking may never have started: nothing is
    opened or made when the flow's store could not be used (no SQLite database yet, a file store MLflow
    refuses: the run's preflight said so) and nothing waits on a tracking server that doesn't answer.
    Returns a line to log when runs may be left open, else None; never raises. A `uri` with a login was
    refused before the flow's first task (check_store): no run was made there, and it is not contacted."""
    if uri and secrets.url_credentials(uri):
        return None
    u = tracking_uri(uri, create=False)
    db = _sqlite_file(u)
    if (db is not None and not db.is_file()) or (db is None and _file_store_refused(u)):
        return None
    why = "can't end this flow run's MLflow runs"
    if problem := _unreachable(u, timeout=2.0):
        return (
            f"{why}: the MLflow server at {secrets.link_url(u)} doesn't answer ({problem}); the next gym "
            "run on this machine ends them once it answers again"
        )
    try:
        end_open_runs(tag, value, status, uri=uri)
    except Exception as exc:  # best effort: the flow run's own error is the one to read
        if interrupted(exc):
            release_interrupted(exc)
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return f"{why} in {secrets.link_url(u)}: {secrets.scrub(f'{type(exc).__name__}: {first}')}"
    return None


def end_orphaned_runs(uri: str | None = None) -> list[str]:
    """End as KILLED every RUNNING run of the store whose process is certainly gone (killed with
    SIGKILL, out of memory, the machine's power: nothing ended its runs, so MLflow showed them running
    for good). Only runs made on this machine are judged (gym.liveness); others are left as they are."""
    from gym import liveness

    client = _client(uri)
    exps = _experiment_ids(client)
    if not exps:
        return []
    running = client.search_runs(exps, filter_string="attributes.status = 'RUNNING'", max_results=1000)
    ended = []
    for run in running:
        owner = run.data.tags.get(PROCESS_TAG)
        if owner and liveness.gone(owner):
            client.set_terminated(run.info.run_id, "KILLED")
            ended.append(run.info.run_id)
    return ended


def ui_url(uri: str | None = None) -> str | None:
    """Where a browser finds the MLflow UI of this store: the tracking server itself, or the MLflow
    server `gym up` runs over the workspace store; None when no server serves it."""
    u = tracking_uri(uri)
    if u.startswith(("http://", "https://")):
        return secrets.link_url(u).rstrip("/")  # a link in Prefect's UI: never the login
    from gym import services

    server = services.read_state().get("mlflow")
    serves = server is not None and (server.serves == services.store_digest(u) or u in server.command)
    if not serves:  # no server, or one over another store (a server started before `serves`: its command)
        return None
    return services.running("mlflow")


def run_url(run_id: str, uri: str | None = None) -> str | None:
    """The run's page in the MLflow UI (None without a server, see `ui_url`)."""
    base = ui_url(uri)
    if not base:
        return None
    return f"{base}/#/experiments/{_client(uri).get_run(run_id).info.experiment_id}/runs/{run_id}"


def _experiment_ids(client: Any) -> list[str]:
    """Every active experiment of the store: gym's runs may be in any (`--output.experiment`)."""
    return [e.experiment_id for e in client.search_experiments()]


def model_version_url(name: str, version: str, uri: str | None = None) -> str | None:
    """The page of registered model `name`'s `version` in the MLflow UI (None without a server)."""
    base = ui_url(uri)
    return f"{base}/#/models/{quote(name)}/versions/{version}" if base else None


def artifact_url(run_id: str, path: str, uri: str | None = None) -> str | None:
    """A direct link to one logged artifact (e.g. the loss plot) through the MLflow server."""
    base = ui_url(uri)
    return f"{base}/get-artifact?path={quote(path)}&run_uuid={run_id}" if base else None


@contextlib.contextmanager
def using_uri(uri: str) -> Iterator[None]:
    """Point mlflow's process-wide ("fluent") tracking and registry URIs at `uri` for a block.

    Flavor APIs such as `mlflow.transformers.log_model` only use the fluent URIs; setting them
    also sets MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI, so restore what was there afterwards.
    """
    import mlflow

    saved = {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(saved["MLFLOW_TRACKING_URI"])  # type: ignore[arg-type]  # None unsets
        mlflow.set_registry_uri(saved["MLFLOW_REGISTRY_URI"])  # type: ignore[arg-type]
        if saved["MLFLOW_REGISTRY_URI"] is None:
            os.environ.pop("MLFLOW_REGISTRY_URI", None)


def register_model(
    run_id: str,
    model_dir: Path,
    name: str,
    tags: Mapping[str, Any],
    alias: str = "challenger",
    uri: str | None = None,
) -> str:
    """Log a merged model directory (transformers flavor) and register it as a new version of `name`.

    The version gets `tags` (lineage) and `alias`. The tags are written with the version, in one
    transaction, so a process killed while registering leaves no version without them: the next
    registration finds it by its content tag. Only full (merged) weights are logged:
    MLflow reloads a PEFT adapter over a local base model with wrong weights. A reward model (a
    sequence-classification model, method rm) is logged as the text-classification task it is.
    """
    import mlflow

    from gym.models import is_reward_model
    from gym.process import share_distribution_index

    share_distribution_index()  # mlflow's importlib_metadata: the index a gym process already built
    task = "text-classification" if is_reward_model(model_dir) else "text-generation"
    with answering(uri), using_uri(tracking_uri(uri)), mlflow.start_run(run_id=run_id):
        info = mlflow.transformers.log_model(
            transformers_model=str(model_dir),
            name="model",
            task=task,
            pip_requirements=MODEL_REQUIREMENTS,
        )
        with _quiet_prints():
            registered = mlflow.register_model(
                info.model_uri, name, tags={k: str(v) for k, v in tags.items()}
            )
        version = str(registered.version)
    _client(uri).set_registered_model_alias(name, alias, version)
    return version


@contextlib.contextmanager
def _quiet_prints() -> Iterator[None]:
    """MLflow's own prints ("Successfully registered model ...", "Created version ...") silenced where its
    logging is quieted to errors (gym's console default, gym.progress.console_defaults): they go to its
    logging stream directly, which no log level reaches. Errors still raise."""
    from mlflow.utils.logging_utils import MLFLOW_LOGGING_STREAM

    quiet = os.environ.get("MLFLOW_LOGGING_LEVEL", "").upper() in ("ERROR", "CRITICAL")
    before = MLFLOW_LOGGING_STREAM.enabled
    MLFLOW_LOGGING_STREAM.enabled = before and not quiet
    try:
        yield
    finally:
        MLFLOW_LOGGING_STREAM.enabled = before


def registered_uri_hint(name: str, uri: str | None = None) -> str | None:
    """`models:/name@alias` (or `/version`) when `name` is a model registered in the local SQLite store:
    a hint for an error that was given the bare name. None otherwise; only a store that already
    exists is read (no network, nothing created)."""
    uri = tracking_uri(uri, create=False)
    db = _sqlite_file(uri)
    if db is None or not db.is_file():
        return None
    try:
        model = _client(uri).get_registered_model(name)
    except Exception:  # not registered, or a store this hint can't read: no hint
        return None
    aliases = sorted(model.aliases or {})
    if aliases:
        return f"models:/{name}@{aliases[0]}" + (
            f" (its aliases: {', '.join(aliases)})" if len(aliases) > 1 else ""
        )
    versions = [int(v.version) for v in model.latest_versions or []]
    return f"models:/{name}/{max(versions)}" if versions else None


def resolve_model_uri(model_uri: str, uri: str | None = None) -> tuple[str, str, str, dict[str, str]]:
    """`models:/name@alias`, `models:/name/version` or `models:/name/latest` (its newest version, as in
    MLflow) -> (name, version, its run id, its tags).

    A tracking server nothing answers at is said at once (MLflow would retry for minutes, then the
    model would be "not found")."""
    check_server(uri)  # before mlflow is imported (a second)
    from mlflow.exceptions import MlflowException

    from gym.errors import ConfigError

    client = _client(uri)
    body = model_uri.removeprefix("models:/")
    name = body.split("@", 1)[0] if "@" in body else body.partition("/")[0]
    try:
        if "@" in body:
            mv = client.get_model_version_by_alias(name, body.split("@", 1)[1])
        elif (number := body.partition("/")[2]).lower() == "latest":
            newest = max(
                (int(v.version) for v in client.search_model_versions(f"name = '{_quote(name)}'")), default=0
            )
            mv = client.get_model_version(name, str(newest))  # none: not found, as below
        else:
            mv = client.get_model_version(name, number)
    except MlflowException as exc:
        if "@" not in body and "/" not in body and (hint := registered_uri_hint(body, uri)):
            raise ConfigError(
                f"{model_uri!r} names a registered model, not one of its versions: give it as {hint} "
                "(models:/NAME@ALIAS or models:/NAME/VERSION)"
            ) from None
        if held := _held_versions(client, name):  # the model is there; its alias or version is not
            raise ConfigError(f"MLflow model {model_uri!r} not found: {name!r} has {held}") from None
        raise ConfigError(
            f"MLflow model {model_uri!r} not found in {secrets.link_url(tracking_uri(uri))} "
            "(name@alias or name/version; `mlflow ui` lists the registered models)"
        ) from exc
    return str(mv.name), str(mv.version), str(mv.run_id), dict(mv.tags)


def _held_versions(client: Any, name: str) -> str | None:
    """What registered model `name` holds, in words (`aliases challenger -> 2, champion -> 1; versions 1,
    2`), for a URI naming an alias or version it lacks; None when it isn't registered."""
    try:
        model = client.get_registered_model(name)
        versions = sorted(int(v.version) for v in client.search_model_versions(f"name = '{_quote(name)}'"))
    except Exception:  # not registered (or a store that can't say): the plain message
        return None
    aliases = ", ".join(f"{a} -> {v}" for a, v in sorted((model.aliases or {}).items()))
    numbers = ", ".join(map(str, versions)) or "none"
    return (f"aliases {aliases}; " if aliases else "no aliases; ") + f"versions {numbers}"


def download_model_version(model_uri: str, target: Path, uri: str | None = None) -> Path:
    """Download a registered version's logged files into `target` (atomically); return the folder
    holding its from_pretrained weights and tokenizer (`<target>/model`)."""
    import mlflow

    if not (target / "model" / "config.json").is_file():
        with answering(uri), workspace.atomic_dir(target) as tmp, using_uri(tracking_uri(uri)):
            mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(tmp))
    return target / "model"


def find_version_by_tag(name: str, key: str, value: str, uri: str | None = None) -> str | None:
    """The newest version of registered model `name` whose tag `key` equals `value` (None if none)."""
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    try:
        versions = client.search_model_versions(f"name = '{_quote(name)}'")
    except MlflowException:
        return None
    matches = [int(v.version) for v in versions if v.tags.get(key) == value]
    return str(max(matches)) if matches else None


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def version_by_alias(name: str, alias: str, uri: str | None = None) -> tuple[str, dict[str, str]] | None:
    """(version, tags) that `name@alias` points to, or None when the model or alias doesn't exist."""
    from mlflow.exceptions import MlflowException

    try:
        mv = _client(uri).get_model_version_by_alias(name, alias)
    except MlflowException:
        return None
    return str(mv.version), dict(mv.tags)


def set_alias(name: str, alias: str, version: str, uri: str | None = None) -> None:
    """Point `name@alias` at `version` of registered model `name` (moving it from any other version)."""
    _client(uri).set_registered_model_alias(name, alias, version)


def set_version_tags(name: str, version: str, tags: Mapping[str, Any], uri: str | None = None) -> None:
    """Set `tags` on `version` of registered model `name`, each value as its str."""
    client = _client(uri)
    for k, v in tags.items():
        client.set_model_version_tag(name, version, k, str(v))


def version_description(name: str, version: str, uri: str | None = None) -> str:
    """The description of `version` of registered model `name` ("" when it has none)."""
    return _client(uri).get_model_version(name, version).description or ""


@contextlib.contextmanager
def registering(name: str, uri: str | None = None) -> Iterator[None]:
    """One process at a time looks model `name`'s content up and registers it, in a SQLite store: two
    runs registering the same model at once each found no version and both added one. Other models
    register meanwhile. (A tracking server shared across machines is not locked here.)"""
    from filelock import FileLock

    db = _sqlite_file(tracking_uri(uri))
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{db}.register-{hashlib.sha256(name.encode()).hexdigest()[:16]}.lock"):
        yield


def set_version_description(name: str, version: str, text: str, uri: str | None = None) -> None:
    """The version's description: gym puts its model card here."""
    _client(uri).update_model_version(name, version, description=text)


def list_versions(name: str, uri: str | None = None) -> list[tuple[str, str, dict[str, str]]]:
    """(version, run id, tags) of every version of registered model `name` (empty if it doesn't exist)."""
    from mlflow.exceptions import MlflowException

    try:
        versions = _client(uri).search_model_versions(f"name = '{_quote(name)}'")
    except MlflowException:
        return []
    return [(str(v.version), str(v.run_id), dict(v.tags)) for v in versions]
