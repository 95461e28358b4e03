"""Flow runs keep sending heartbeats, and a finished flow no longer waits for the heartbeat thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from prefect import flow, flow_engine
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from tasks import _heartbeats


def heartbeat_threads() -> list[threading.Thread]:
    """Prefect's heartbeat threads still running (the thread runs `heartbeat_loop` in a copied context)."""

    def runs_heartbeat_loop(t: threading.Thread) -> bool:
        args = getattr(t, "_args", ()) or (None,)
        return getattr(args[0], "__name__", "") == "heartbeat_loop"

    return [t for t in threading.enumerate() if t.is_alive() and runs_heartbeat_loop(t)]


@pytest.fixture
def beats(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Heartbeats on (Prefect's minimum interval); yields the ids of the flow runs they were sent for."""
    sent: list[str] = []
    emit = flow_engine.FlowRunEngine._emit_flow_run_heartbeat

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        sent.append(str(self.flow_run.id))
        emit(self, *args, **kwargs)

    monkeypatch.setattr(flow_engine.FlowRunEngine, "_emit_flow_run_heartbeat", spy)
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
        yield sent


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


def test_a_finished_flow_returns_before_its_heartbeat_thread_wakes(prefect_server, beats) -> None:
    _heartbeats.install()
    before = set(heartbeat_threads())
    run_id = quick()
    assert beats == [run_id]  # heartbeats are still sent
    left = [t for t in heartbeat_threads() if t not in before]
    assert left, "the flow waited for its heartbeat thread"
    for t in left:  # and the thread stops by itself, without another heartbeat
        t.join(timeout=10)
        assert not t.is_alive()
    assert beats == [run_id]


def test_control_prefects_own_engine_waits_for_the_thread(
    prefect_server, beats, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the shim the same flow returns only once the thread has ended: what the test above tells
    apart."""
    monkeypatch.setattr(flow_engine, "_send_heartbeats", flow_engine._send_heartbeats.__wrapped__)
    before = set(heartbeat_threads())
    run_id = quick()
    assert beats == [run_id]
    assert [t for t in heartbeat_threads() if t not in before] == []
