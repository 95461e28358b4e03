"""Flow runs keep sending heartbeats, and a finished flow no longer waits for the heartbeat thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from prefect import flow, flow_engine
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from tasks import _heartbeats


@dataclass
class Heartbeats:
    sent_for: list[str] = field(default_factory=list)  # flow run ids, one per heartbeat
    threads: list[threading.Thread] = field(default_factory=list)  # the threads that sent them
    joined: list[threading.Thread] = field(default_factory=list)  # heartbeat threads someone waited for


@pytest.fixture
def beats(monkeypatch: pytest.MonkeyPatch) -> Iterator[Heartbeats]:
    """Heartbeats on (Prefect's minimum interval), with a record of who sent them and who waited."""
    seen = Heartbeats()
    emit = flow_engine.FlowRunEngine._emit_flow_run_heartbeat
    join = threading.Thread.join

    def emit_spy(self: Any, *args: Any, **kwargs: Any) -> None:
        seen.sent_for.append(str(self.flow_run.id))
        seen.threads.append(threading.current_thread())
        emit(self, *args, **kwargs)

    def join_spy(self: threading.Thread, timeout: float | None = None) -> None:
        if self in seen.threads:
            seen.joined.append(self)
        join(self, timeout)

    monkeypatch.setattr(flow_engine.FlowRunEngine, "_emit_flow_run_heartbeat", emit_spy)
    monkeypatch.setattr(threading.Thread, "join", join_spy)
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
        yield seen


@flow
def quick() -> str:
    from prefect.runtime import flow_run

    return str(flow_run.get_id())


def test_the_shim_is_installed_on_this_prefect() -> None:
    """If Prefect's engine loses its hook, this says so (and the shim should go, or be redone)."""
    assert _heartbeats.install() is True
    assert getattr(flow_engine._send_heartbeats, "_gym_unjoined", False)
    assert _heartbeats.install() is True  # idempotent: never wrapped twice
    assert not getattr(flow_engine._send_heartbeats.__wrapped__, "_gym_unjoined", False)


def test_a_finished_flow_does_not_wait_for_its_heartbeat_thread(prefect_server, beats: Heartbeats) -> None:
    _heartbeats.install()
    run_id = quick()
    assert beats.sent_for == [run_id]  # heartbeats are still sent
    (thread,) = beats.threads
    assert beats.joined == [], "the flow waited for its heartbeat thread"
    thread.join(timeout=10)  # it stops by itself, without another heartbeat
    assert not thread.is_alive()
    assert beats.sent_for == [run_id]


def test_control_prefects_own_engine_waits_for_the_thread(
    prefect_server, beats: Heartbeats, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the shim the flow's end waits for the thread: what the test above tells apart."""
    monkeypatch.setattr(flow_engine, "_send_heartbeats", flow_engine._send_heartbeats.__wrapped__)
    run_id = quick()
    assert beats.sent_for == [run_id]
    assert beats.joined == beats.threads and len(beats.threads) == 1
