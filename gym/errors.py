"""Errors a user can act on: what was wrong, where (file, record, field), what to do."""

from __future__ import annotations

from collections.abc import Iterator

from gym.secrets import scrub


class GymError(Exception):
    """Base class for every error gym raises on purpose. A URL in its message loses its credentials
    (`user:key@`, `?token=`): messages reach the console, Prefect's run states and logs, and a value
    quoted back (a dataset or model URL with a login) would show the key there."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(scrub(a) if isinstance(a, str) else a for a in args))


class GymWarning(RuntimeWarning):
    """What a run should know but that does not stop it (a TF-GRPO step degraded...): a Python warning for
    the library's users; on gym's command line, one `gym: warning: ...` line (gym.cli.run_console)."""


class ConfigError(GymError, ValueError):
    """A configuration value (flow parameter, registry entry, CLI flag) is invalid."""


class RegistryError(ConfigError):
    """A registry entry is missing or malformed; the message names the entry and field."""


class DataError(GymError, ValueError):
    """Bad input data. Carries the file, the 1-based record number and the field at fault."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        record: int | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.file, self.record, self.field, self.hint = file, record, field, hint
        self.message = scrub(message)
        where = []
        if file is not None:
            where.append(f"file {file}")
        if record is not None:
            where.append(f"record {record}")
        if field is not None:
            where.append(f"field {field!r}")
        text = f"{', '.join(where)}: {message}" if where else message
        if hint:
            text += f" ({hint})"
        super().__init__(text)


# For an artifact gone from the workspace: right from Python (where no flow cached anything) and from a flow
# whose task Prefect served from its cache after the artifact was deleted.
REFRESH_HINT = (
    "if a flow's cached task made it and it was since deleted, re-run the flow with --refresh-cache"
)


class MissingExtraError(GymError, RuntimeError):
    """An optional feature was asked for where its extra (or hardware) is missing."""


def chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then the exception it was raised from or while handling, and so on."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def interrupted(exc: BaseException) -> bool:
    """Whether `exc` is a Ctrl-C (KeyboardInterrupt), or was raised from one or while handling one (a
    library that turned the interrupt into its own error, as MLflow does inside a database write)."""
    return any(isinstance(e, KeyboardInterrupt) for e in chain(exc))


# What a full disk (or an exhausted quota) says: OSError's errno; safetensors and SQLite only in words.
_FULL_ERRNOS = (28, 122)  # ENOSPC, EDQUOT
_FULL_WORDS = ("No space left on device", "database or disk is full", "Disk quota exceeded", "StorageFull")


def disk_full(exc: BaseException) -> BaseException | None:
    """The error in `exc`'s chain that says the disk (or the user's quota) is full, else None: an OSError
    with errno ENOSPC / EDQUOT, or a library's own error carrying the words (safetensors' SafetensorError,
    SQLite's "database or disk is full" under SQLAlchemy's and MLflow's errors)."""
    for e in chain(exc):
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return e
        if any(words in str(e) for words in _FULL_WORDS):
            return e
    return None


class DiskFullError(GymError):
    """Writing failed because the disk is full: the environment's problem, said in one line."""


def disk_full_error(exc: BaseException, where: object = None) -> DiskFullError:
    """The one-line error for a full disk met while writing `where` (a file or folder; by default the
    file the OSError names, else the workspace)."""
    full = disk_full(exc) or exc
    where = where or getattr(full, "filename", None) or "the workspace (GYM_HOME)"
    first = (str(full).strip().splitlines() or [type(full).__name__])[0]
    return DiskFullError(
        f"no space left on the disk holding {where} ({first}): free space there and run the same command "
        "again (nothing half-written was kept)"
    )
