"""Run the API under uvicorn: in the foreground until SIGINT/SIGTERM (`gym serve`), or in a
background thread for in-process use and tests (`serve_in_thread`).

The listening socket is bound here, before uvicorn starts, so port 0 works: the OS picks a free
port and the real address is known (and printed) before the first request. The log blanks the values
of a request's query string (HideQueryValues): a key sent as `?api_key=...` is never logged.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from gym.errors import ConfigError


def bind(host: str, port: int, hint: str = "choose another --port, or 0") -> socket.socket:
    """A listening TCP socket on (host, port); port 0 takes any free port. `hint`: what to do instead."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not left 0: asyncio turns Nagle off (TCP_NODELAY) only on connections whose
    # socket says TCP, and with Nagle on every response waited ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror} ({hint})") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


class HideQueryValues(logging.Filter):
    """Blanks every value of a logged request path's query string: `/v1/models?api_key=sk-1` is logged
    as `/v1/models?api_key=***`. A client may send its key (or any secret) as a query parameter, and
    uvicorn's access log (and its WebSocket lines) print the path with the query string as sent."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(hide_query_values(a) if isinstance(a, str) else a for a in record.args)
        return True


def hide_query_values(text: str) -> str:
    """`text` with the values of its query string blanked, if it is a request path (`/...?...`); a part
    with no `=` is blanked whole (it may be the secret itself)."""
    path, sep, query = text.partition("?")
    if not sep or not path.startswith("/"):
        return text
    parts = (p.partition("=") for p in query.split("&"))
    return path + "?" + "&".join(f"{name}=***" if eq else "***" for name, eq, _ in parts)


def _log_config() -> dict[str, Any]:
    """uvicorn's logging setup, with HideQueryValues on its handlers (set up anew with each server)."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["hide_query_values"] = {"()": HideQueryValues}
    for handler in config["handlers"].values():
        handler["filters"] = [*handler.get("filters", []), "hide_query_values"]
    return config


def _config(app: Any, log_level: str, shutdown_timeout: float | None) -> uvicorn.Config:
    # The access log shows method, path and status only: never headers, so never a bearer key; a key
    # sent in the query string instead is blanked (HideQueryValues), so it is never logged either.
    # Stopping, uvicorn waits `shutdown_timeout` seconds (None: as long as it takes) for the requests in
    # flight, then cancels them; a second SIGINT stops at once. (uvicorn types it int; asyncio.wait_for
    # takes any number of seconds.)
    wait: Any = shutdown_timeout
    return uvicorn.Config(app, log_level=log_level, log_config=_log_config(), timeout_graceful_shutdown=wait)


def run(
    app: Any,
    sock: socket.socket,
    on_ready: Callable[[str], None] | None = None,
    log_level: str = "info",
    shutdown_timeout: float | None = None,
) -> None:
    """Serve `app` on the bound `sock` in the foreground until SIGINT or SIGTERM, then finish the requests
    in flight (for up to `shutdown_timeout` seconds; None: as long as they take) and return (closing the
    socket)."""
    server = uvicorn.Server(_config(app, log_level, shutdown_timeout))
    # uvicorn re-raises the signal that stopped it once it has shut down; with these handlers in
    # place that is a no-op, so the caller gets control back and the process exits with status 0.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if on_ready is not None:
            on_ready(url_of(sock))
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()


@contextlib.contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> Iterator[str]:
    """Serve `app` from a background thread; yields its base URL (http://host:port) and stops on exit."""
    sock = bind(host, port)
    server = uvicorn.Server(_config(app, "warning", shutdown_timeout=10))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="gym-serve-http", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError("the HTTP server did not start")
        time.sleep(0.01)
    try:
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()
