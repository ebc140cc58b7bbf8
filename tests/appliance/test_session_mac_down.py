"""Frames from an appliance to a client session with a password carry the session's MAC, and
the client library takes no other (appliance/dataplane/frame_auth.py, docs/security.md).

A real appliance in this process (loopback UDP and shared memory), real clients, and a relay
between one client and the appliance (a host on the path) that records what the appliance
sent, to send it again, and forges frames from the address the client talks to. (A forger
at an address of its own does not reach a client at all: its UDP socket is connected to its
appliance, tests/appliance/test_hostile_input.py.)
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time

import pytest

from appliance.client import connect
from appliance.config import parse_config
from appliance.control import credentials as cr
from appliance.node import Appliance
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.codec import encode_admin, encode_data_frame
from datapath.topics.registry import KeyRegistry
from tests.appliance.helpers import counter as _counter
from tests.appliance.helpers import free_port, wait_for
from tests.appliance.helpers import udp_url as _url

PASSWORD = "correct horse battery staple"
CHEAP = {"n": 1 << 10, "r": 8, "p": 1}  # scrypt cost of the tests' credentials


@pytest.fixture
def appliance():
    port = free_port()
    identities = {"alice": {"publish": ["a/#"], "subscribe": ["a/#"],
                            "password": cr.hash_password(PASSWORD, **CHEAP)},
                  "bob": {"publish": ["a/#"], "subscribe": ["a/#"]}}
    app = Appliance(parse_config({"appliance": {"name": f"down{port}"},
                                  "clients": {"udp": f"127.0.0.1:{port}",
                                              "shm": f"down{port}"},
                                  # bob: the anonymous mode (no password)
                                  "pm": {"identities": identities,
                                         "require_passwords": False}})).start()
    try:
        yield app
    finally:
        app.stop()


class Relay:
    """A UDP relay between one client and the appliance that keeps every datagram the
    appliance sent the client (what a host on the path captures)."""

    def __init__(self, to: tuple[str, int]) -> None:
        self.to = to
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", 0))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.bind(("127.0.0.1", 0))
        self.client: tuple[str, int] | None = None
        self.captured: list[bytes] = []
        self.hold = threading.Event()
        """While set, the client's datagrams wait here (sent on when it is cleared)."""
        self._held: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"udp://127.0.0.1:{self.front.getsockname()[1]}"

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.front, self.back], [], [], 0.05)
            for sock in ready:
                data, addr = sock.recvfrom(70_000)
                if sock is self.front:
                    self.client = addr
                    self._held.append(data)
                elif self.client is not None:
                    self.captured.append(data)
                    self.front.sendto(data, self.client)
            if not self.hold.is_set():
                for data in self._held:
                    self.back.sendto(data, self.to)
                self._held.clear()

    def data_frames(self) -> list[bytes]:
        return [f for f in list(self.captured) if f[fl.TYPE_OFFSET] == int(fl.FrameType.DATA)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.front.close()
        self.back.close()


def _address(client) -> tuple[str, int]:
    return client.channel.local_address


def _forge(frame: bytes, to: tuple[str, int]) -> None:
    """Send ``frame`` to ``to`` from a socket of a host of its own."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(frame, to)


def _forge_on_path(relay: Relay, frame: bytes) -> None:
    """Send ``frame`` to the relay's client from the address it talks to (the path)."""
    assert relay.client is not None
    relay.front.sendto(frame, relay.client)


def _forged_data(sid: int, topic: str, payload: bytes) -> bytes:
    key = KeyRegistry().key_of(topic, 0)
    return encode_data_frame([{"topic_key": key, "sequence": 99, "payload": payload}],
                             source_session=sid, dest_session=sid, stream_id=sid)


def _forged_control(kind: al.ControlKind, doc: dict, node_id: int, sid: int) -> bytes:
    return bytes(encode_admin(fl.FrameType.CONTROL, [al.Control(kind, json.dumps(doc))],
                              source_session=node_id, dest_session=sid,
                              send_ts_ns=time.time_ns()))


def test_frames_forged_on_the_path_are_refused_counted_and_not_delivered(appliance):
    """A host on the path sends alice's client, from the appliance's address as the client
    sees it, a DATA frame on a topic she is subscribed to, a LOGIN_RESULT that would end her
    session and a REQUEST_RESULT that would refuse her next subscription: the client refuses
    each (no MAC), counts it, and none is delivered or read; her session goes on, and the
    appliance's own frames (a request's result, deliveries) pass."""
    relay = Relay(appliance.config.clients_udp)
    forger = relay.front
    with connect(relay.url, "alice", password=PASSWORD, timeout_s=10) as a:
        sub = a.subscribe("a/#")
        a.publish("a/x", b"genuine", flush=True)
        assert sub.get(timeout=10).payload == b"genuine"
        received, refused = a.received, a.refused_frames
        assert a.authenticated_frames >= 2  # the subscription's result, the delivery
        to = relay.client
        assert to == _address(a)
        forger.sendto(_forged_data(a.session, "a/x", b"forged"), to)
        forger.sendto(_forged_control(al.ControlKind.LOGIN_RESULT, {
            "accepted": False, "reason": "forged", "node": a.node}, a.node_id, a.session), to)
        next_sub = 1 + max(s.sub_id for s in a._subs)
        forger.sendto(_forged_control(al.ControlKind.REQUEST_RESULT, {
            "request": "subscribe", "sub_id": next_sub, "accepted": False,
            "reason": "forged"}, a.node_id, a.session), to)
        wait_for(lambda: a.refused_frames == refused + 3, 10, what="3 frames refused")
        assert a.refused_by_reason["no_trailer"] == 3
        assert a.received == received and sub.get(timeout=0.2) is None
        assert a.state == "connected"
        other = a.subscribe("a/y/#")  # its result is the appliance's, not the forged one
        assert other.sub_id == next_sub
        a.publish("a/y/1", b"after", flush=True)
        assert sub.get(timeout=10).payload == b"after"
        assert other.get(timeout=10).payload == b"after"
    relay.close()
    # the appliance signed every frame to alice, left none unsigned
    wait_for(lambda: _counter(appliance, "client_mac_signed") >= 7, 10)
    assert _counter(appliance, "client_mac_unsigned") == 0


def test_a_captured_frame_sent_again_or_changed_is_refused(appliance):
    """Through a relay that records the appliance's datagrams: a delivery sent to the
    client again is refused as a replay, one with a byte changed as a bad MAC; neither is
    delivered."""
    relay = Relay(appliance.config.clients_udp)
    try:
        with connect(relay.url, "alice", password=PASSWORD, timeout_s=10) as a:
            sub = a.subscribe("a/#")
            a.publish("a/x", b"once", flush=True)
            assert sub.get(timeout=10).payload == b"once"
            frame = wait_for(lambda: relay.data_frames(), 10)[-1]
            assert frame[5] & int(fl.FrameFlags.AUTH_TRAILER)
            received = a.received
            relay.front.sendto(frame, relay.client)
            changed = bytearray(frame)
            changed[fl.FRAME_HEADER_BYTES + 45] ^= 1  # in the payload
            relay.front.sendto(bytes(changed), relay.client)
            wait_for(lambda: a.refused_by_reason["replay"] == 1
                     and a.refused_by_reason["bad_mac"] == 1, 10,
                     what="the replay and the changed frame refused")
            assert a.received == received and sub.get(timeout=0.2) is None
            a.publish("a/x", b"twice", flush=True)  # the session goes on
            assert sub.get(timeout=10).payload == b"twice"
            # a subscription waits for its result (the request held on the path) when a
            # forged REQUEST_RESULT refusing it comes: refused; the appliance's answer counts
            relay.hold.set()
            sub_id = 1 + max(s.sub_id for s in a._subs)
            done: list = []
            waiting = threading.Thread(target=lambda: done.append(a.subscribe("a/z/#")))
            waiting.start()
            wait_for(lambda: a._waiters.get(("subscribe", sub_id)), 10, what="the request")
            refused = a.refused_frames
            _forge_on_path(relay, _forged_control(al.ControlKind.REQUEST_RESULT, {
                "request": "subscribe", "sub_id": sub_id, "accepted": False,
                "reason": "forged"}, a.node_id, a.session))
            wait_for(lambda: a.refused_frames == refused + 1, 10, what="the forgery refused")
            assert not done and waiting.is_alive()
            relay.hold.clear()
            waiting.join(10)
            assert done and done[0].sub_id == sub_id
    finally:
        relay.close()


@pytest.mark.parametrize("scheme", ["udp", "shm"])
def test_guaranteed_streams_and_results_of_a_session_with_a_key_work(appliance, scheme):
    """Guaranteed publishing (acknowledged) and a guaranteed subscription over a session
    with a key, on UDP and on shared memory: every message once, in order, nothing refused."""
    url = _url(appliance) if scheme == "udp" else f"shm://{appliance.config.clients_shm}"
    with connect(url, "alice", password=PASSWORD, timeout_s=10) as a:
        sub = a.subscribe("a/#", qos="guaranteed")
        outcomes = [a.publish("a/g", b"%d" % i, qos="guaranteed") for i in range(300)]
        a.flush(timeout=20)
        assert all(o.state == "acknowledged" for o in outcomes)
        got = [sub.get(timeout=10) for _ in range(300)]
        assert [m.payload for m in got] == [b"%d" % i for i in range(300)]
        assert a.refused_frames == 0 and a.authenticated_frames > 0


def test_a_session_without_a_password_stays_unsigned(appliance):
    """bob has no password: the appliance signs nothing to him and his client takes his
    frames as they come from its appliance's address."""
    relay = Relay(appliance.config.clients_udp)
    try:
        with connect(relay.url, "bob", timeout_s=10) as b:
            sub = b.subscribe("a/#")
            b.publish("a/x", b"plain", flush=True)
            assert sub.get(timeout=10).payload == b"plain"
            assert b.refused_frames == 0 and b.authenticated_frames == 0
            refusal = _forged_control(al.ControlKind.LOGIN_RESULT, {
                "accepted": False, "reason": "forged", "node": b.node}, b.node_id, b.session)
            # from an address of its own a forger does not reach the client (its socket is
            # connected): the round trip after it passes and the session stays
            _forge(refusal, _address(b))
            b.publish("a/x", b"still", flush=True)
            assert sub.get(timeout=10).payload == b"still"
            assert b.losses_of_connection == 0
            # on the path it does: a forged refusal of its session (the frame the password
            # client refused above) ends it here
            _forge_on_path(relay, refusal)
            wait_for(lambda: b.losses_of_connection == 1, 10, what="the forged refusal taken")
    finally:
        relay.close()
    assert _counter(appliance, "client_mac_signed") == 0


def test_a_password_session_disconnected_by_management_hears_its_signed_logout(appliance):
    """The LOGOUT queued for a session the appliance ends leaves with the session's MAC
    (sent before its key is dropped): the client takes it and knows why."""
    with connect(_url(appliance), "alice", password=PASSWORD, timeout_s=10) as a:
        assert appliance.submit("disconnect_client", {"session": a.session}) == {"ok": True}
        wait_for(lambda: a.logged_out_reason, 10, what="the LOGOUT taken")
        assert a.logged_out_reason == "disconnected by management"
        assert a.refused_frames == 0
