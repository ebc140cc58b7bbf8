"""The control agent sleeps until it is handed work or a timer falls due: it does not poll.

An idle appliance's control thread runs a handful of duty cycles per status refresh (its
heartbeat and status timers), not one per millisecond; a management request and an admin
frame from a client each end its wait at once.
"""

from __future__ import annotations

import threading
import time

from appliance.client import connect
from appliance.config import parse_config
from appliance.node import Appliance
from datapath.agent import WakeableIdle
from tests.appliance.helpers import free_port, wait_for


def _appliance(**clients: object) -> Appliance:
    return Appliance(parse_config({
        "appliance": {"name": f"wake{free_port()}", "heartbeat_interval_ms": 100},
        "fabric": {"listen": f"127.0.0.1:{free_port()}", "key": "44" * 32},
        "clients": dict(clients), "pm": {"anonymous": True, "require_passwords": False}})).start()


def _uptime(app: Appliance) -> float:
    return app.status()["node"]["uptime_s"]


def test_an_idle_control_agent_runs_only_for_its_timers() -> None:
    app = _appliance()
    try:
        runner = app._cp_runner
        # from the first status refresh on: the start (the data path's first commands and
        # snapshot, waited for at CONTROL_PENDING_POLL_NS) is not idle
        first = wait_for(lambda: _uptime(app) if _uptime(app) >= 0.2 else None)
        cycles_before = runner.cycles
        # four status refreshes later (each one a snapshot the agent built: observed, not slept)
        wait_for(lambda: _uptime(app) >= first + 1.0, 10)
        elapsed_s = _uptime(app) - first
        cycles = runner.cycles - cycles_before
        # timers: a heartbeat every 100 ms and a status every 250 ms, a few cycles each;
        # polling at 1 kHz would be ~1,000 cycles a second
        assert cycles <= 60 * max(elapsed_s, 1.0), (cycles, elapsed_s)
    finally:
        app.stop()


def test_a_management_request_wakes_the_control_agent_at_once() -> None:
    app = _appliance()
    try:
        out = app.submit("disconnect_client", {"session": 12345})
        assert out["ok"] is False  # answered (no such session), not timed out
        assert "not applied within" not in out.get("error", "")
    finally:
        app.stop()


def test_a_client_login_is_answered_by_a_woken_control_agent() -> None:
    port = free_port()
    app = _appliance(udp=f"127.0.0.1:{port}")
    try:
        with connect(f"udp://127.0.0.1:{port}") as client:
            assert client.session
            assert client.request_retries == 0
    finally:
        app.stop()


def test_wakeable_idle_ends_on_a_wakeup_and_on_the_deadline() -> None:
    event = threading.Event()
    far = WakeableIdle(event, lambda now: now + 10_000_000_000)
    threading.Timer(0.05, event.set).start()
    started = time.monotonic()
    far.idle(0)
    assert time.monotonic() - started < 5.0  # the wake-up ended it, not the 10 s deadline
    assert not event.is_set()  # cleared for the next wait
    soon = WakeableIdle(threading.Event(), lambda now: now + 20_000_000)
    started = time.monotonic()
    soon.idle(0)
    assert time.monotonic() - started >= 0.015  # it waited for its deadline
    busy = WakeableIdle(threading.Event(), lambda now: now + 10_000_000_000)
    started = time.monotonic()
    busy.idle(3)  # work was done: no wait at all
    assert time.monotonic() - started < 1.0
