"""Tracking tasks and what the Prefect UI shows of each stage.

- `start_tracking` / `finish_tracking`: the flow's parent MLflow run (tagged with the Prefect flow run,
  and its URL when the Prefect UI is known), closed with the run's summary.
- `stage_run`: a nested MLflow run that spans one stage's work (gym.tracking.span).
- `publish`: a markdown artifact on the task run (what the stage did, key numbers, links to MLflow).
- `end_failed_tracking`: flow hook that marks the MLflow runs of a failed or crashed flow run FAILED
  (`end_flow_run_tracking`: the same for a flow run `gym down` stopped, as KILLED).
- `run_logs`: the gym library's log lines (per-step training logs) in the Prefect run's logs.
- `quiet_libraries`: first in every flow: MLflow's info lines and libraries' progress bars kept off a
  deployment run's console, as the command line keeps them off its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext, TaskRunContext
from prefect.utilities.urls import url_for

from gym import secrets, tracking

FLOW_RUN_TAG = "prefect_flow_run_id"
FLOW_RUN_URL_TAG = "prefect_flow_run_url"


def flow_run_url(flow_run_id: str | None) -> str | None:
    """The flow run's page in the Prefect UI; None with Prefect's temporary API (it has no UI)."""
    return url_for("flow-run", obj_id=flow_run_id) if flow_run_id else None


def in_run() -> bool:
    return TaskRunContext.get() is not None or FlowRunContext.get() is not None


def artifact_key(text: str) -> str:
    """`text` (a dataset's, benchmark's or model's name, a path) as part of an artifact key: lower-case
    letters, digits and single dashes, as Prefect's keys take them."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[-60:].strip("-") or "unnamed"


def publish(key: str, markdown: str, description: str) -> None:
    """A markdown artifact on the current task run (no-op outside Prefect, e.g. `task.fn()` in tests)."""
    if in_run():
        create_markdown_artifact(key=key, markdown=markdown, description=description)


def link(url: str | None, text: str) -> str:
    return f"[{text}]({url})" if url else text


def table(rows: Mapping[str, Any]) -> str:
    body = "\n".join(f"| {k} | {fmt(v)} |" for k, v in rows.items() if v is not None)
    return f"| | |\n|---|---|\n{body}\n"


def fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def quiet_libraries() -> None:
    """Keep off this process's console what `gym train` and `python flows/<flow>.py` keep off theirs
    (gym.progress.console_defaults): MLflow's info lines and warnings ("Creating initial MLflow database
    tables", the transformers flavor's model card and license warnings) and libraries' progress bars.
    Called first in every flow, for the runs no gym command line starts: a deployment run (a worker's or
    `serve`'s flow-run process) or a flow called from Python. MLflow reads its level when it is imported;
    where it already is (a long-lived process), its loggers are set here. `--verbose` (GYM_VERBOSE=1) or
    MLFLOW_LOGGING_LEVEL set in the environment wins."""
    import sys

    from gym import progress

    progress.console_defaults(verbose=progress.verbose())
    level = os.environ.get("MLFLOW_LOGGING_LEVEL", "").upper()
    if not level or "mlflow" not in sys.modules:  # verbose, or mlflow reads the variable when imported
        return
    with contextlib.suppress(ValueError):  # a level logging doesn't know: mlflow's own import refused it
        logging.getLogger("mlflow").setLevel(level)
        if level in ("WARNING", "ERROR", "CRITICAL"):  # mlflow keeps these two at WARNING or above
            for name in ("alembic", "huey"):
                logging.getLogger(name).setLevel(level)


def cell(text: str, limit: int = 80) -> str:
    """Text for one markdown table cell: on one line, pipes escaped, at most `limit` characters."""
    shown = repr(text if len(text) <= limit else "…" + text[-limit:])
    return shown.replace("|", "\\|")


@contextlib.contextmanager
def stage_run(
    name: str, params: Mapping[str, Any], parent_run_id: str | None, uri: str | None
) -> Iterator[str | None]:
    """A nested MLflow run spanning the block (None, and nothing tracked, without a parent run)."""
    if parent_run_id is None:
        yield None
        return
    with tracking.span(name, params=params, parent_run_id=parent_run_id, uri=uri) as run_id:
        yield run_id


@contextlib.contextmanager
def run_logs(name: str = "gym") -> Iterator[None]:
    """Send the `name` logger's records (INFO and up) to the current Prefect run's logs for the block,
    and its warnings to the console too, as a line (`gym: warning: ...`)."""
    if not in_run():
        yield
        return
    import sys

    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger(name)
    handler, level, propagate = APILogHandler(), logger.level, logger.propagate
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.WARNING)
    console.setFormatter(logging.Formatter("gym: warning: %(message)s"))
    logger.addHandler(handler)
    logger.addHandler(console)
    if level == logging.NOTSET or level > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.propagate = False  # not Prefect's console handler on the root: its INFO lines would bury the bar
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.removeHandler(console)
        logger.setLevel(level)
        logger.propagate = propagate


@task(name="start-tracking", task_run_name="start tracking {flow_name}", cache_policy=NO_CACHE)
def start_tracking(
    flow_name: str,
    config: dict[str, Any],
    flow_run_id: str | None,
    tracking_uri: str | None,
    experiment: str | None = None,
) -> str:
    """Create the parent run of this flow run in `experiment` (params = the flow's config, secrets
    redacted), after ending the runs a killed process left RUNNING on this machine (best effort)."""
    try:
        tracking.end_orphaned_runs(uri=tracking_uri)
    except tracking.TrackingServerDown:
        raise  # the run would wait on it again, at once
    except Exception:  # best effort
        pass
    tags = {"gym.flow": flow_name}
    if flow_run_id:
        tags[FLOW_RUN_TAG] = flow_run_id
        if url := flow_run_url(flow_run_id):
            tags[FLOW_RUN_URL_TAG] = url
            tags["mlflow.note.content"] = f"Prefect flow run: {url}"
    run_id = tracking.start_run(flow_name, params=config, tags=tags, uri=tracking_uri, experiment=experiment)
    if in_run() and (url := tracking.run_url(run_id, tracking_uri)):
        create_link_artifact(
            key="mlflow-run", link=url, link_text=f"MLflow run {run_id}", description="MLflow run"
        )
    return run_id


@task(name="finish-tracking", task_run_name="finish tracking", cache_policy=NO_CACHE)
def finish_tracking(run_id: str, summary: dict[str, Any], tracking_uri: str | None) -> None:
    """Log the summary numbers on the parent run, mark it finished, and publish it in the Prefect UI."""
    numbers = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    tracking.log_metrics(run_id, numbers, uri=tracking_uri)
    tracking.end_run(run_id, uri=tracking_uri)
    name, version = summary.get("model_name"), summary.get("model_version")
    version_url = tracking.model_version_url(str(name), str(version), tracking_uri) if name else None
    if version_url and in_run():
        create_link_artifact(
            key="registered-model",
            link=version_url,
            link_text=f"{name} version {version}",
            description="Model",
        )
    links = [
        f"MLflow run: {link(tracking.run_url(run_id, tracking_uri), f'`{run_id}`')}",
        f"registered model: {link(version_url, f'{name} version {version}')}" if name else "",
    ]
    if tracking.ui_url(tracking_uri) is None:
        store = secrets.link_url(tracking.tracking_uri(tracking_uri))
        links.append(f"(`gym up` serves the MLflow UI over `{store}`)")
    publish(
        "gym-summary",
        f"## gym run summary\n\n{table(dict(sorted(summary.items())))}\n"
        + "  \n".join(p for p in links if p),
        "Losses, rewards, exact match and the registered model of this run",
    )


def end_failed_tracking(flow: Any, flow_run: Any, state: Any) -> None:
    """Flow hook (on_failure, on_crashed): end this flow run's open MLflow runs as FAILED.

    Best effort, and never a traceback in the run's logs: where tracking never started (the store was
    refused before the run's first task) it does nothing, and where the runs can't be ended (a tracking
    server that stopped answering, checked first so as not to wait out MLflow's retries) it logs one
    warning line."""
    _end_tracking(flow, flow_run, "FAILED")


def end_cancelled_tracking(flow: Any, flow_run: Any, state: Any) -> None:
    """Flow hook (on_cancellation): end this flow run's open MLflow runs as KILLED, as MLflow marks a run
    stopped from outside. A cancelled run's stage run ended FAILED in the process (the interrupt), but its
    parent stayed RUNNING until the next flow run on the machine ended it (never, on another machine)."""
    _end_tracking(flow, flow_run, "KILLED")


def _end_tracking(flow: Any, flow_run: Any, status: str) -> None:
    from prefect.logging.loggers import flow_run_logger

    if note := end_flow_run_tracking(flow_run.id, flow_run.parameters, status):
        flow_run_logger(flow_run, flow).warning(note)


def end_flow_run_tracking(flow_run_id: Any, parameters: Mapping[str, Any] | None, status: str) -> str | None:
    """End the open MLflow runs of a flow run (tagged with its id) as `status`, in the store its
    parameters name (`config.output.tracking_uri`, else the default store): from the flow run's own hooks,
    or from `gym down` for the runs it stopped (flows/services.py). Returns a line to show when runs may
    be left open (gym.tracking.end_failed_runs); never raises."""
    config = (parameters or {}).get("config") or {}
    output = config.get("output") if isinstance(config, dict) else getattr(config, "output", None)
    uri = output.get("tracking_uri") if isinstance(output, dict) else getattr(output, "tracking_uri", None)
    return tracking.end_failed_runs(FLOW_RUN_TAG, str(flow_run_id), status, uri=uri)
