"""A client session's egress port reaches the data path as a patch (``set_ports``: the ports
that changed, nothing else) instead of the whole port map at every table build, and the data
path patches its express plan and session table in place: the forwarding is the same as with
tables built whole. Sessions log in and out between publishes, and each subscriber gets
exactly its messages; the patched plan and session table equal ones built anew; over the
data-path process's link a login sends its one port, and a subscribe's snapshot its changed
rows."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.client import connect
from appliance.config import parse_config
from appliance.dataplane import express as _express
from appliance.node import Appliance
from bench import scale
from tests.appliance.helpers import free_port, wait_for

LIGHT = 60
"""Light sessions (hand-built LOGIN frames, as ``bench scale`` sends) logged in between
publishes."""
ROUNDS = 6


def _appliance(port: int, dataplane: str) -> Appliance:
    return Appliance(parse_config({
        "appliance": {"name": f"patch{port}", "dataplane": dataplane},
        "clients": {"udp": f"127.0.0.1:{port}", "max_sessions": LIGHT + 16,
                    "session_dead_ms": 600_000},
        "pm": {"require_passwords": False,
               "identities": {scale.IDENTITY: {"publish": ["scale/#"],
                                               "subscribe": ["scale/#"]}}}})).start()


def _record(app: Appliance) -> list[tuple[str, tuple]]:
    """Every command the control agent gives the data path from now on."""
    seen: list[tuple[str, tuple]] = []
    dp = app.control.dp
    command = dp.command

    def recorded(name: str, *args: object) -> None:
        seen.append((name, args))
        command(name, *args)

    dp.command = recorded
    return seen


def _login_light(clients: scale.Clients, first: int, count: int) -> None:
    """Send ``count`` LOGIN frames from new light sessions (answers read by ``_poll``)."""
    for k in range(count):
        clients.send(clients.add(1 << 16), scale._login_frame(first + k + 1))


def _poll(clients: scale.Clients, logged: set[int]) -> None:
    for index, _kind, doc in clients.poll(0.01):
        assert doc.get("accepted"), doc
        logged.add(index)


def _traffic(app: Appliance, port: int) -> tuple[list[bytes], list[bytes], int]:
    """Sessions come and go between publishes: subscriber A (there from the start) must get
    every message of ``scale/a/#`` in order and nothing else; B, logged in half way, every
    message of ``scale/b/#`` published after its subscribe was answered and nothing else; C
    logs out half way. Returns (A's payloads, B's payloads, the first b index B must get)."""
    url = f"udp://127.0.0.1:{port}"
    clients = scale.Clients(("127.0.0.1", port))
    a = connect(url, scale.IDENTITY, timeout_s=10)
    c = connect(url, scale.IDENTITY, timeout_s=10)
    pub = connect(url, scale.IDENTITY, timeout_s=10)
    b = None
    try:
        sub_a = a.subscribe("scale/a/#")
        c.subscribe("scale/c/#")
        logged: set[int] = set()
        sent = 0
        b_from = -1
        sub_b = None
        for r in range(ROUNDS):
            _login_light(clients, sent, LIGHT // ROUNDS)
            sent += LIGHT // ROUNDS
            for i in range(r * 50, (r + 1) * 50):
                pub.publish("scale/a/x", b"a%d" % i)
                pub.publish("scale/b/x", b"b%d" % i)
                pub.publish("scale/c/x", b"c%d" % i)
                if i % 10 == 0:
                    pub.flush()
                    _poll(clients, logged)
            pub.flush()
            if r == ROUNDS // 2:
                c.close()
                b = connect(url, scale.IDENTITY, timeout_s=10)
                sub_b = b.subscribe("scale/b/#")
                b_from = (r + 1) * 50
        wait_for(lambda: _poll(clients, logged) or len(logged) == sent, timeout_s=60,
                 what=f"{sent} light logins")
        total = ROUNDS * 50
        got_a = [sub_a.get(timeout=10).payload for _ in range(total)]
        assert sub_b is not None
        got_b = []
        while not got_b or got_b[-1] != b"b%d" % (total - 1):
            message = sub_b.get(timeout=10)
            assert message is not None, got_b[-3:]
            got_b.append(message.payload)
        assert sub_a.get(timeout=0.2) is None and sub_b.get(timeout=0.2) is None
        return got_a, got_b, b_from
    finally:
        for client in (a, b, c, pub):
            if client is not None:
                client.close()
        clients.close()


def _check_exact(got_a: list[bytes], got_b: list[bytes], b_from: int) -> None:
    total = ROUNDS * 50
    assert got_a == [b"a%d" % i for i in range(total)]
    assert all(p.startswith(b"b") for p in got_b), got_b[:5]
    numbers = [int(p[1:]) for p in got_b]
    assert numbers == list(range(numbers[0], total)) and numbers[0] <= b_from, numbers[:5]


def test_sessions_coming_and_going_keep_the_plan_equal_to_one_built_anew():
    port = free_port()
    app = _appliance(port, "thread")
    try:
        _check_exact(*_traffic(app, port))
        dp, control = app.dataplane, app.control
        # the ports of the sessions that ended are dropped at the build after the snapshot
        # without them is live (until then their rows stay): a subscribe makes one
        wait_for(lambda: control._pending_snapshot is None and not control._quarantine,
                 what="the snapshot without the ended sessions live")
        e = connect(f"udp://127.0.0.1:{port}", scale.IDENTITY, timeout_s=10)
        e.subscribe("scale/e/#")
        wait_for(lambda: dp.commands_pending() == 0, what="the commands applied")
        assert not control._port_changes
        # the data path's port map is what the tables built whole held
        whole = {s.port: ("client", sid) for sid, s in control.sessions.items()}
        whole.update({s.gport: ("gclient", sid) for sid, s in control.sessions.items()
                      if s.gport is not None})
        whole.update(control._retired)
        for (kind, node), (p, _) in control.dest_egress.items():
            whole[p] = ("node" if kind == "n" else "gnode", node)
        assert dp.tables.ports == whole and len(whole) >= LIGHT
        # the patched plan and session table: as built anew (run on the data path's thread)
        done: list = []

        def compare() -> None:
            snap, _ = dp.nic.burst_state()
            plan = dp.express._current_plan(snap)
            table = dp.express._current_sessions()
            fresh = _express.build_plan(dp, snap, dp.express.queues)
            rows = len(fresh.ports)
            assert (plan.ports[:rows] == fresh.ports).all() and not plan.ports[rows:].any()
            assert plan.owners[:rows] == fresh.owners and not any(plan.owners[rows:])
            built = _express.build_sessions(dp)
            for name in set(built.peers) | set(table.peers):
                for t in (built, table):
                    t.peers.setdefault(name, _express._NO_PEERS)
                have, at = table.peers[name]
                want, wat = built.peers[name]
                assert have.tolist() == want.tolist()
                assert [table.ids[r] for r in at] == [built.ids[r] for r in wat]
                assert [table.slots[r] for r in at] == [built.slots[r] for r in wat]
                for r, w in zip(at.tolist(), wat.tolist()):
                    mine = table.keys[table.bounds[r]:table.bounds[r + 1]]
                    assert np.array_equal(mine, built.keys[built.bounds[w]:built.bounds[w + 1]])
            assert len(table.rows) == len(built.rows)
            done.append(True)

        def run_compare() -> None:
            try:
                compare()
            except AssertionError as exc:
                done.append(exc)

        dp.commands.offer(run_compare)
        wait_for(lambda: done, what="the comparison on the data path's thread")
        assert done[-1] is True, done[-1]
        e.close()
    finally:
        app.stop()


def test_the_process_link_carries_a_login_as_its_port_alone():
    port = free_port()
    app = _appliance(port, "process")
    try:
        seen = _record(app)
        _check_exact(*_traffic(app, port))
        control = app.control
        wait_for(lambda: not control._tables_dirty, what="the table builds")
        # the subscribes' snapshots crossed as their changed rows (publish_snapshot_rows)
        names = [name for name, _ in seen]
        assert "publish_snapshot_rows" in names
        tables = [args[0] for name, args in seen if name == "set_tables"]
        assert all(what[0] in ("node", "gnode") for t in tables for what in t.ports.values())
        patches = [args[0] for name, args in seen if name == "set_ports"]
        installed = {p: w for patch in patches for p, w in patch.items() if w is not None}
        for sid, s in control.sessions.items():
            assert installed.get(s.port) == ("client", sid)
        # one more login, alone: the link carries its port and nothing else
        del seen[:]
        with connect(f"udp://127.0.0.1:{port}", scale.IDENTITY, timeout_s=10) as d:
            mine = control.sessions[d.session].port
            wait_for(lambda: any(name == "set_ports" and args[0].get(mine) is not None
                                 for name, args in seen), what="the login's set_ports")
            patches = [args[0] for name, args in seen if name == "set_ports"]
            # (and the ports of the sessions that ended before, free again)
            assert {p: w for patch in patches for p, w in patch.items() if w is not None} == {
                mine: ("client", d.session)}
            assert all(len(patch) <= 5 for patch in patches)
            assert len(control.sessions) > LIGHT
            assert not any(name == "set_tables" for name, _ in seen)
            d.subscribe("scale/d/#")  # (a few rows: they cross as rows, no array compared)
            assert not any(name == "publish_snapshot_delta" for name, _ in seen)
    finally:
        app.stop()


@pytest.mark.parametrize("removed_first", [False, True])
def test_a_port_freed_and_given_to_another_session_leads_to_the_new_one(removed_first):
    """The data path's map: a port dropped (None) and installed again for another session."""
    from appliance.dataplane.state import ForwardingTables

    class _Express:
        def __init__(self) -> None:
            self.patched: list = []

        def patch_ports(self, ports, before=None) -> None:
            self.patched.append(sorted(ports))

    class _Guaranteed:
        def on_tables(self, tables) -> None:
            pass

    from appliance.dataplane.agent import DataPlaneAgent

    dp = DataPlaneAgent.__new__(DataPlaneAgent)
    dp.tables = ForwardingTables(1)
    dp.session_ports, dp._client_port = {}, {}
    dp.express, dp.guaranteed = _Express(), _Guaranteed()
    dp.set_ports({5: ("client", 50), 6: ("gclient", 50)})
    dp.set_tables(ForwardingTables(1, ports={9: ("node", 2)}))
    assert dp.tables.ports == {5: ("client", 50), 6: ("gclient", 50), 9: ("node", 2)}
    if removed_first:
        dp.set_ports({5: None})
        dp.set_ports({5: ("client", 60)})
    else:
        dp.set_ports({5: ("client", 60)})
    assert dp.tables.ports[5] == ("client", 60)
    assert dp._client_port == {60: 5}
    dp.set_ports({6: None, 9: None})
    assert dp.tables.ports == {5: ("client", 60)}
    assert dp.express.patched[-1] == [6, 9]
