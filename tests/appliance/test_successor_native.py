"""Successor delivery for native clients (seed 004): a real appliance, native clients, and an
ancestor in a process of its own killed with SIGKILL. The successor gets the ancestor's
guaranteed messages once its session ended improperly (counted by id), a clean close routes
nothing, a vendor mismatch or another identity is refused, and the ancestor's return takes
its traffic back."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

from appliance.client import LoginError, connect
from appliance.client.successor import SuccessorRefusedError
from appliance.config import parse_config
from appliance.node import Appliance
from tests.appliance.helpers import ROOT, free_port, wait_for

DEADLINE_S = 60.0
IDENTITIES = {"app": {"publish": ["#"], "subscribe": ["#"]},
              "other": {"publish": ["#"], "subscribe": ["#"]}}

ANCESTOR = """
import sys, time
from appliance.client import LoginError, connect
c = connect(sys.argv[1], "app", client_id="anc")
sub = c.subscribe("orders/#", qos="guaranteed")
assert c.successor_candidates("acme") == ["succ"], c.successor_candidates("acme")
c.set_successor("succ", "acme")
print("ready", flush=True)
while True:
    m = sub.get(timeout=1.0)
    if m is not None:
        print("got", m.payload.decode(), flush=True)
"""


@pytest.fixture
def appliance():
    app = Appliance(parse_config({
        "appliance": {"name": f"succ{os.getpid()}", "heartbeat_interval_ms": 100},
        "clients": {"udp": f"127.0.0.1:{free_port()}", "session_dead_ms": 3_000},
        "pm": {"require_passwords": False, "identities": IDENTITIES}})).start()
    try:
        yield app, f"udp://127.0.0.1:{app.config.clients_udp[1]}"
    finally:
        app.stop()


def _counter(app, name: str) -> int:
    """A control counter as counted now (the status is rebuilt on its own pace)."""
    return int(app.control.counters.get(name, 0))


class _Lines(threading.Thread):
    """The ancestor process's stdout lines, in a queue."""

    def __init__(self, proc: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.proc, self.lines = proc, queue.Queue()
        self.start()

    def run(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait(self, text: str) -> None:
        while True:
            line = self.lines.get(timeout=DEADLINE_S)
            if line == text:
                return


def test_a_killed_ancestor_s_guaranteed_messages_go_to_its_successor_then_back(appliance):
    app, url = appliance
    succ = connect(url, "app", client_id="succ")
    pub = connect(url, "app")
    proc = subprocess.Popen([sys.executable, "-c", ANCESTOR, url], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    anc = None
    try:
        got = succ.announce_successor("acme")
        lines = _Lines(proc)
        lines.wait("ready")
        # the ancestor receives while alive
        wait_for(lambda: pub.publish("orders/1", b"warmup", qos="guaranteed", flush=True)
                 or _got_from(lines, "warmup"), DEADLINE_S, what="the ancestor's delivery")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(DEADLINE_S)
        # published while the appliance still holds the dead session: its fate is stated in
        # docs/appliance.md (lost, or delivered to the dead session), not checked here
        try:
            wait_for(lambda: succ.successor_of() == ["anc"], DEADLINE_S,
                     what="the route notice after the ancestor's session went silent")
        except AssertionError:
            raise AssertionError(_debug(app)) from None
        assert _counter(app, "successor_improper_ends") == 1
        wait_for(lambda: app.status().get("successors", {}).get("routed") == 1, DEADLINE_S,
                 what="/status showing the route")
        # from the route notice on, nothing published to the ancestor's patterns is lost
        sent = [f"m{i}" for i in range(200)]
        for ident in sent:
            pub.publish(f"orders/{ident}", ident.encode(), qos="guaranteed")
        pub.flush()
        received = set()
        while not set(sent) <= received:
            item = got.get(timeout=DEADLINE_S)
            assert item is not None, f"missing {sorted(set(sent) - received)[:5]}"
            assert item.ancestor == "anc" and item.message.guaranteed
            received.add(item.message.payload.decode())
        assert received == set(sent)
        # the ancestor returns with its client id: until its first subscription its
        # messages still go to the successor (no gap), then they are its own again
        anc = connect(url, "app", client_id="anc")
        assert _counter(app, "successor_returns") == 1
        held = [f"h{i}" for i in range(20)]
        for ident in held:
            pub.publish(f"orders/{ident}", ident.encode(), qos="guaranteed")
        pub.flush()
        assert {got.get(timeout=DEADLINE_S).message.payload.decode() for _ in held} \
            == set(held)
        back = anc.subscribe("orders/#", qos="guaranteed")
        wait_for(lambda: succ.successor_of() == [], DEADLINE_S, what="the unroute notice")
        assert _counter(app, "successor_unrouted") == 1
        after = [f"a{i}" for i in range(50)]
        for ident in after:
            pub.publish(f"orders/{ident}", ident.encode(), qos="guaranteed")
        pub.flush()
        mine = {back.get(timeout=DEADLINE_S).payload.decode() for _ in after}
        assert mine == set(after)
        # the successor got none of them (a marker on its own subscription comes after)
        own = succ.subscribe("marker/#", qos="guaranteed")
        pub.publish("marker/x", b"end", qos="guaranteed", flush=True)
        assert own.get(timeout=DEADLINE_S).payload == b"end"
        leftover = got.get(timeout=0)
        assert leftover is None or not leftover.message.payload.startswith(b"a"), leftover
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for c in (anc, succ, pub):
            if c is not None:
                c.close()


def _debug(app) -> str:
    """The appliance's successor records and routes (a failure's message)."""
    s = app.control.successors
    return f"nodes {s.nodes} table {s.successor_of} routes {s.routes}"


def _got_from(lines: _Lines, text: str) -> bool:
    try:
        while True:
            if lines.lines.get(timeout=0.2) == f"got {text}":
                return True
    except queue.Empty:
        return False


def test_a_clean_close_routes_nothing_and_the_records_go(appliance):
    app, url = appliance
    with connect(url, "app", client_id="succ2") as succ:
        succ.announce_successor("acme")
        anc = connect(url, "app", client_id="anc2")
        anc.subscribe("orders/#", qos="guaranteed")
        anc.set_successor("succ2", "acme")
        assert app.control.successors.successor_of == {"anc2": "succ2"}
        anc.close()  # LOGOUT: a clean end
        wait_for(lambda: "anc2" not in app.control.successors.nodes, DEADLINE_S,
                 what="the clean end forgetting the ancestor's record")
        assert app.control.successors.successor_of == {}
        assert _counter(app, "successor_improper_ends") == 0
        assert _counter(app, "successor_routed") == 0
        assert succ.successor_of() == []


def test_vendor_mismatch_other_identity_self_and_no_client_id_are_refused(appliance):
    app, url = appliance
    with connect(url, "app", client_id="b") as b, connect(url, "app", client_id="a") as a, \
            connect(url, "other", client_id="o") as o, connect(url, "app") as anon:
        b.announce_successor("acme")
        o.announce_successor("acme")
        assert a.successor_candidates("acme") == ["b"]  # not o: another identity
        assert a.successor_candidates("globex") == []
        with pytest.raises(SuccessorRefusedError) as err:
            a.set_successor("b", "globex")
        assert err.value.why == "vendor_mismatch"
        with pytest.raises(SuccessorRefusedError) as err:
            a.set_successor("o", "acme")
        assert err.value.why == "other_identity"
        with pytest.raises(SuccessorRefusedError) as err:
            b.set_successor("b", "acme")
        assert err.value.why == "self"
        with pytest.raises(SuccessorRefusedError) as err:
            a.set_successor("nobody", "acme")
        assert err.value.why == "unknown_client"
        with pytest.raises(Exception, match="client id"):
            anon.announce_successor("acme")
        a.set_successor("b", "acme")  # the right one is taken
        # another identity may not take a client id held by this one (nor end its session)
        with pytest.raises(LoginError, match="client id 'a' belongs to a client of another"):
            connect(url, "other", client_id="a", timeout_s=10)
        assert a.successor_candidates("acme") == ["b"]  # a's session still answers
        # a login of the same identity with a's client id takes over: the records stay
        sessions = len(app.control.sessions)
        with connect(url, "app", client_id="a"):
            assert len(app.control.sessions) == sessions  # a's old session ended
            assert app.control.successors.successor_of == {"a": "b"}
            assert _counter(app, "successor_improper_ends") == 0
