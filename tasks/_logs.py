"""How a failed run reads: a user's mistake as its one line, and the console spared its echoes.

Two filters, installed by `quiet_run_logs` in every process that runs gym tasks (tasks/_common.py
calls it on import):

- `UserErrorFilter` on Prefect's run loggers (the console and the run's logs in the UI alike): a
  GymError is logged as its message, without the traceback; bugs keep theirs.
- `ConsoleDigest` on Prefect's console handler only (the API, and so the UI, keeps every record):
  when many tasks of one flow run fail with the same user error (a TF-GRPO step's rollouts against
  an endpoint that refuses every call), the first failure is printed and the others are counted, as
  are the tasks left NotReady because a task they needed failed; one line before the flow run's end
  says how many were not shown. `--verbose` (GYM_VERBOSE=1) prints them all.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from gym import progress
from gym.errors import GymError

FINISHED = "Finished in state "
NOT_READY = FINISHED + "NotReady("


class UserErrorFilter(logging.Filter):
    """Log a user's mistake (a GymError) as its one-line message, without the traceback.

    Prefect logs a failed task or flow run with its traceback (on the console and in the run's logs
    in the UI). For a GymError the message already says what and where; the traceback would only
    bury it. Bugs (any other exception) keep their traceback. The error stays on the record as
    `gym_error` (its type and message), for `ConsoleDigest`.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if _hook_bookkeeping(record.getMessage()):
            return False
        if record.exc_info and isinstance(record.exc_info[1], GymError):
            exc = record.exc_info[1]
            record.gym_error = f"{type(exc).__name__}: {exc}"
            record.exc_info = None
            record.exc_text = None
        return True


# The hook that records a cached result in the flow run (tasks/_common.recorded_when_cached) runs after
# every task of its kind; Prefect logs each call. Kept: that it ran for a result served from cache.
RECORD_HOOK = "record_cached_result"


def _hook_bookkeeping(message: str) -> bool:
    """Prefect's lines about the record hook that say nothing: it ran for a result computed here (where
    it does nothing), or it finished."""
    if f"'{RECORD_HOOK}'" not in message:
        return False
    return message.startswith(f"Hook '{RECORD_HOOK}' finished") or not message.endswith("state 'Cached'")


@dataclass
class _Run:
    """What one flow run's console has shown and held back."""

    errors: set[str] = field(default_factory=set)  # user errors already shown
    hidden: set[str] = field(default_factory=set)  # task runs whose failure was held back
    repeated: int = 0
    waiting: int = 0


class ConsoleDigest(logging.Filter):
    """On the console, one flow run's repeated user error is shown once and NotReady tasks not at all.

    Per flow run: a task run's failure with a user error already shown (same type and message) is
    held back, with its "Finished in state Failed" line; a task run that finished NotReady (an
    upstream task failed, and that failure is shown) is held back. Before the flow run's own
    "Finished in state" line, one line counts what was held back. Bugs are always shown.
    """

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self.handler = handler
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        flow_run = getattr(record, "flow_run_id", None)
        if flow_run is None or progress.verbose():
            return True
        task_run = getattr(record, "task_run_id", None)
        message = record.getMessage()
        with self._lock:
            if task_run is not None:
                run = self._runs.setdefault(flow_run, _Run())
                return self._show_task_record(run, task_run, record, message)
            if not message.startswith(FINISHED):
                return True
            ended = self._runs.pop(flow_run, None)
        if ended is not None and (ended.repeated or ended.waiting):
            self.handler.handle(self._summary(record, ended))
        return True

    @staticmethod
    def _show_task_record(run: _Run, task_run: str, record: logging.LogRecord, message: str) -> bool:
        if message.startswith(NOT_READY):
            run.waiting += 1
            return False
        error = getattr(record, "gym_error", None)
        if error is not None:
            if error not in run.errors:
                run.errors.add(error)
                return True
            run.repeated += 1
            run.hidden.add(task_run)
            return False
        if task_run in run.hidden and message.startswith(FINISHED):
            run.hidden.discard(task_run)
            return False
        return True

    @staticmethod
    def _summary(record: logging.LogRecord, run: _Run) -> logging.LogRecord:
        parts = []
        if run.repeated:
            plural = "s" * (run.repeated > 1)
            parts.append(f"{run.repeated} more task run{plural} failed with an error shown above")
        if run.waiting:
            parts.append(
                f"{run.waiting} task run{'s' * (run.waiting > 1)} did not start because a task "
                f"{'they' if run.waiting > 1 else 'it'} needed failed"
            )
        summary = logging.makeLogRecord(record.__dict__)
        kept = "not printed here; the flow run's logs in Prefect have each of them"
        summary.msg = f"{' and '.join(parts)} ({kept})"
        summary.args = None
        return summary


def quiet_run_logs() -> None:
    """Install the filters: `UserErrorFilter` on Prefect's run loggers (filters run before handlers),
    `ConsoleDigest` on the root logger's Prefect console handlers. Idempotent."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, UserErrorFilter) for f in logger.filters):
            logger.addFilter(UserErrorFilter())
    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not any(
            isinstance(f, ConsoleDigest) for f in handler.filters
        ):
            handler.addFilter(ConsoleDigest(handler))
