"""One appliance holds more client sessions than a 9-bit port space has ports: 600 light
sessions (one UDP socket each, hand-built LOGIN frames, as ``bench scale`` logs in) and then a
client-API subscriber whose egress port is past 511 gets what a publisher sends; the control
plane's port pool hands ports out lowest first, takes them back, and says when none is left."""

from __future__ import annotations

import pytest

from appliance.client import connect
from appliance.config import parse_config
from appliance.control.port_pool import PortPool
from appliance.node import Appliance
from bench import scale
from nic_offload.model import CPU_PORT, MAX_EGRESS_PORT
from tests.appliance.helpers import free_port, wait_for

RAW_SESSIONS = 600


def test_the_pool_hands_out_lowest_first_skips_the_cpu_port_and_reuses_given_back_ports():
    pool = PortPool(1, MAX_EGRESS_PORT, CPU_PORT)
    assert len(pool) == MAX_EGRESS_PORT - 1  # 1..65535 without 255
    got = [pool.pop() for _ in range(300)]
    assert got == [p for p in range(1, 302) if p != CPU_PORT]
    pool.append(17)
    assert len(pool) == MAX_EGRESS_PORT - 1 - 299 and pool.pop() == 17
    assert pool.pop() == 302
    small = PortPool(1, 3, CPU_PORT)
    assert [small.pop() for _ in range(3)] == [1, 2, 3] and not small
    with pytest.raises(IndexError, match="no egress port is free"):
        small.pop()


def test_a_subscriber_on_a_port_past_511_gets_the_published_message():
    port = free_port()
    app = Appliance(parse_config({
        "appliance": {"name": f"wide{port}", "dataplane": "thread"},
        "clients": {"udp": f"127.0.0.1:{port}", "max_sessions": RAW_SESSIONS + 8,
                    "max_guaranteed_sessions": 0, "session_dead_ms": 600_000},
        "pm": {"require_passwords": False,
               "identities": {scale.IDENTITY: {"publish": ["scale/#"],
                                               "subscribe": ["scale/#"]}}}})).start()
    clients = scale.Clients(("127.0.0.1", port))
    sub = pub = None
    try:
        indexes = [clients.add(1 << 16) for _ in range(RAW_SESSIONS)]
        logged: set[int] = set()
        sent = 0

        def logins() -> bool:
            nonlocal sent
            while sent < len(indexes) and sent - len(logged) < scale.LOGIN_WINDOW:
                clients.send(indexes[sent], scale._login_frame(sent + 1))
                sent += 1
            for index, _kind, doc in clients.poll(0.05):
                assert doc.get("accepted"), doc
                logged.add(index)
            return len(logged) == RAW_SESSIONS

        wait_for(logins, timeout_s=60, what=f"{RAW_SESSIONS} logins")
        sub = connect(f"udp://127.0.0.1:{port}", scale.IDENTITY, timeout_s=10)
        subscription = sub.subscribe("scale/wide/#")
        session = app.control.sessions[sub.session]
        assert session.port > 511, session.port
        assert len(app.control.sessions) == RAW_SESSIONS + 1
        pub = connect(f"udp://127.0.0.1:{port}", scale.IDENTITY, timeout_s=10)
        pub.publish("scale/wide/x", b"past 511", flush=True)
        got = subscription.get(timeout=10)
        assert got is not None and got.payload == b"past 511"
    finally:
        for client in (sub, pub):
            if client is not None:
                client.close()
        clients.close()
        app.stop()


def test_session_keys_grow_as_sessions_come_and_keep_their_rows():
    """The data path's session keys and replay windows start small and double up to their
    bound (one row per egress port at most) instead of holding 65,536 rows (13.6 MB)."""
    from types import SimpleNamespace

    from appliance.dataplane.frame_auth import SESSION_AUTH_ROW_BYTES, SessionAuth

    assert SESSION_AUTH_ROW_BYTES * (MAX_EGRESS_PORT + 1) > 13_000_000
    auth = SessionAuth(7, rows=5, initial_rows=2)
    sessions = [SimpleNamespace(key=bytes([i + 1]) * 32, channel="udp", dest=100 + i,
                                auth_slot=-1) for i in range(6)]
    versions = []
    for s in sessions:
        auth.attach(s)
        versions.append(auth.version)
    assert [s.auth_slot for s in sessions] == [0, 1, 2, 3, 4, -1]  # the sixth: past the bound
    assert versions == [0, 0, 1, 1, 2, 2] and len(auth.keys) == len(auth.windows) == 5
    for s in sessions[:5]:  # every key where it was put, after two copies
        row = auth.keys[s.auth_slot]
        assert bytes(row[8:8 + row[0]]) == s.key
    auth.detach(sessions[1])
    auth.attach(sessions[5])
    assert sessions[5].auth_slot == 1
