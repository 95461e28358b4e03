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


# For a task served from Prefect's cache whose artifact was since deleted from the workspace.
REFRESH_HINT = "deleted from the workspace after its task was cached? re-run with --refresh-cache"


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
