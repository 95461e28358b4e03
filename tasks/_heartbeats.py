"""Flow-run heartbeats that don't hold a finished flow for up to a second.

Against a Prefect server, every flow run starts a heartbeat thread (every 180 s by default; a server
uses the heartbeats to notice runs whose process died). Prefect 3.9's thread sleeps in whole seconds
and the sync engine joins it when the flow ends, so every sync flow run returns up to a second late:
measured here against `prefect server`, a 0.3 s flow took 1.07 s, 0.40 s without the join. Prefect's
own async engine already leaves the thread unjoined (`join_on_exit=False`): the stopped thread wakes
within a second, sees the stop and exits without sending anything. gym's flows get that same mode;
heartbeats themselves are unchanged. Installed once, when `tasks` is imported (every gym flow imports
it, however it is launched: `gym`, `python flows/...`, a worker). A Prefect whose engine no longer has
this hook is left as it is (tests/test_heartbeats.py then fails, to say the shim should go).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

_MARK = "_gym_unjoined"


def install() -> bool:
    """Make Prefect's sync flow engine stop its heartbeat thread without waiting for it; True if done."""
    from prefect import flow_engine

    original: Callable[..., Any] | None = getattr(flow_engine, "_send_heartbeats", None)
    if original is None or getattr(original, _MARK, False):
        return original is not None
    if "join_on_exit" not in inspect.signature(original).parameters:
        return False

    @contextlib.contextmanager
    def unjoined(engine: Any, join_on_exit: bool = True) -> Iterator[None]:
        with original(engine, join_on_exit=False):
            yield

    setattr(unjoined, _MARK, True)
    unjoined.__wrapped__ = original  # type: ignore[attr-defined]
    flow_engine._send_heartbeats = unjoined
    return True
