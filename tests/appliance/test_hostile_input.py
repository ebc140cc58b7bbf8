"""Nothing a peer sends ends an appliance, and exhaustion is a refusal.

Real appliances (in this process) and hostile peers on loopback: raw UDP sockets that build
their frames with the project's own codec. They send every CONTROL kind with documents of the
wrong shape (lists, strings, numbers, null, nested deeply, huge, fields of the wrong type,
unknown keys, random JSON), from an anonymous client, from a logged-in session and, signed
with the fabric key, from a configured neighbour; random bytes and truncated frames at the
client and fabric ports; logins and requests past every limit; floods of denials and of bad
frames from many sources. Afterwards the appliance still runs, still serves a real client, its
counters account for every refused frame, and its status stays small.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time

import pytest

from appliance.client import EntitlementError, LoginError, connect
from appliance.config import (
    DENIALS_KEPT,
    EGRESS_PORTS,
    LOG_SOURCES_KEPT,
    ConfigError,
    parse_config,
)
from appliance.control import agent as control_module
from appliance.control import documents
from appliance.control.auth import FabricAuth, hello_link_id
from appliance.node import Appliance
from datapath.protocol import admin_layout as al
from datapath.protocol.admin_layout import ControlKind
from datapath.protocol.codec import decode_frame, encode_admin, encode_data_frame
from datapath.protocol.frame_layout import FrameType
from datapath.topics.registry import KeyRegistry
from nic_offload.model import CPU_PORT, MAX_EGRESS_PORT
from tests.appliance.helpers import FABRIC_KEY, free_port, wait_for
from tests.appliance.test_documents import GOOD

IDENTITIES = {"feed": {"publish": ["#"], "subscribe": ["#"]},
              "narrow": {"publish": ["mine/#"], "subscribe": ["#"]}}
EVIL_NODE = 4242
"""The node id the hostile neighbour claims."""
CHUNK_FRAMES = 48
CHUNK_BYTES = 192 * 1024
"""A flood is sent in chunks the appliance's socket buffer holds (4 MiB); the next chunk goes
once the counters show the last one handled, so the accounting is exact."""


# --- frames --------------------------------------------------------------------------------------
def _frame(entries: list, ftype: FrameType = FrameType.CONTROL, session: int = 0,
           auth: FabricAuth | None = None, body_header: dict | None = None,
           dest: int = 0) -> bytes:
    frame = encode_admin(ftype, entries, source_session=session, body_header=body_header,
                         send_ts_ns=time.time_ns(), dest_session=dest,
                         auth=auth.next_auth() if auth is not None else None)
    return bytes(auth.sign(frame) if auth is not None else frame)


def _control(kind: ControlKind, text: str) -> al.Control:
    return al.Control(kind, text)


def _random_json(rng: random.Random, depth: int = 0) -> object:
    r = rng.random()
    if depth > 3 or r < 0.4:
        return rng.choice([None, True, False, rng.randint(-2**70, 2**70), rng.random() * 1e6,
                           "".join(rng.choice("ab/#+\u20ac\x00 ") for _ in range(rng.randint(
                               0, 8)))])
    if r < 0.7:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["origin", "identity", "keys", "ts", "x", "accepted", "patterns", "links", "reason",
            "request", "session", "ring", "token", "version"]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


SHAPES = ["[]", "[1, 2]", '"x"', '""', "1", "-1", "1.5", "null", "true", "false", "{}", "{",
          "", "\x00", "NaN", '{"ts": NaN}', "[" * 30_000, '{"a":' * 5_000 + "1" + "}" * 5_000,
          '"' + "x" * 60_000 + '"', json.dumps({"pad": "x" * 60_000}),
          json.dumps(list(range(9_000))), '{"identity": "\\ud800"}', "\u20ac" * 3_000]
"""Documents of the wrong shape for every kind: not objects, not JSON, nested past any
schema, huge."""


def hostile_documents(kind: ControlKind, sender: str, rng: random.Random) -> list[str]:
    """Documents of ``kind`` that ``sender`` may not send: wrong shapes, every field of the
    kind's good document replaced by a wrong type or nested deeply, unknown keys, random
    JSON. Each is refused by the schema (checked here, so the accounting is exact)."""
    good = GOOD[kind]
    docs = list(SHAPES)
    docs.append(json.dumps({**good, "unknown": 1}))
    for key, value in good.items():
        for wrong in ([value], "text", 1.5, None, {"nested": value}, -1):
            docs.append(json.dumps({**good, key: wrong}))
        docs.append(json.dumps({**good, key: json.loads("[" * 300 + "]" * 300)}))
    docs += [json.dumps(_random_json(rng)) for _ in range(12)]
    if kind not in documents.ACCEPTED[sender]:
        docs.append(json.dumps(good))
    out = []
    for text in docs:
        try:
            documents.validate(kind, text, sender)
        except documents.DocumentError:
            out.append(text)
    assert len(out) > 20
    return out


def _truncated(frames: list[bytes], rng: random.Random, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        frame = rng.choice(frames)
        out.append(frame[:rng.randrange(1, len(frame))])
    return out


# --- the appliance and its status ----------------------------------------------------------------
class Target:
    def __init__(self, app: Appliance, client_port: int, fabric_port: int,
                 evil: socket.socket) -> None:
        self.app = app
        self.client = ("127.0.0.1", client_port)
        self.fabric = ("127.0.0.1", fabric_port)
        self.evil = evil
        self.url = f"udp://127.0.0.1:{client_port}"

    def counters(self) -> dict:
        return self.app.status()["counters"]

    def counter(self, name: str) -> int:
        return int(self.counters().get(name, 0))


def _appliance(clients: dict | None = None, pm: dict | None = None) -> Target:
    client_port, fabric_port = free_port(), free_port()
    evil = _udp()
    cfg = parse_config({
        "appliance": {"name": f"hostile{client_port}", "dataplane": "thread"},
        "fabric": {"listen": f"127.0.0.1:{fabric_port}", "key": FABRIC_KEY},
        "neighbours": [{"name": "evil", "address": f"127.0.0.1:{evil.getsockname()[1]}"}],
        "clients": {"udp": f"127.0.0.1:{client_port}", "session_dead_ms": 120_000,
                    **(clients or {})},
        "pm": {"require_passwords": False, **(pm or {"identities": IDENTITIES})}})
    return Target(Appliance(cfg).start(), client_port, fabric_port, evil)


@pytest.fixture
def target():
    t = _appliance()
    try:
        yield t
    finally:
        t.app.stop()
        t.evil.close()


def _udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(10.0)
    return s


def refused(status: dict) -> int:
    """Every counter that counts a refused or dropped frame or entry, once each."""
    c = status["counters"]
    names = ("control_bad_document", "control_client_malformed", "control_client_no_session",
             "control_client_unexpected", "unknown_client_frames", "unknown_peer",
             "control_unexpected_admin", "control_bad_admin", "bad_admin")
    return (sum(int(c.get(n, 0)) for n in names) + sum(status["auth"]["rejected"].values())
            + sum(status["offload"]["malformed"].values()))


def flood(t: Target, sends: list[tuple[socket.socket, tuple, bytes, int]]) -> int:
    """Send ``(socket, address, frame, refusals it counts)`` in chunks, each once the last
    one is accounted for; returns the refusals counted. Fails when a chunk is not accounted
    for exactly."""
    start = refused(t.app.status())
    expected = start
    i = 0
    while i < len(sends):
        size = 0
        chunk = []
        while i < len(sends) and len(chunk) < CHUNK_FRAMES and size < CHUNK_BYTES:
            chunk.append(sends[i])
            size += len(sends[i][2])
            i += 1
        for sock, address, frame, counts in chunk:
            sock.sendto(frame, address)
            expected += counts
        wait_for(lambda e=expected: refused(t.app.status()) == e, timeout_s=30)
        assert t.app.failure() is None
    return expected - start


def _documents_of(sock: socket.socket, kind: ControlKind, n: int = 1,
                  timeout_s: float = 10.0) -> list[dict]:
    """The next ``n`` documents of ``kind`` that arrive at ``sock``."""
    out: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(70_000)
        except TimeoutError:
            raise AssertionError(f"{len(out)} of {n} {kind.name} documents arrived") from None
        frame = decode_frame(data)
        if frame.is_message_frame or frame.header.frame_type is not FrameType.CONTROL:
            continue
        out += [json.loads(e.document) for e in frame.admin()[1] if e.kind is kind]
    return out


def meet(t: Target, auth: FabricAuth) -> int:
    """The hostile neighbour's discovery HELLO: the target learns its node id (EVIL_NODE) and
    takes its frames bound to the target from then on; the target's node id."""
    hello = al.Hello(EVIL_NODE, 1, 100, al.NodeRole.CORE, 0, "evil")
    t.evil.sendto(_frame([hello], FrameType.HELLO, session=EVIL_NODE, auth=auth,
                         dest=hello_link_id(t.app.config.name)), t.fabric)
    assert wait_for(lambda: t.app.status()["neighbours"][0]["id"] == EVIL_NODE)
    return t.app.status()["node"]["id"]


def raw_login(t: Target, sock: socket.socket, identity: str = "feed") -> dict:
    sock.sendto(_frame([_control(ControlKind.LOGIN, json.dumps(
        {"identity": identity, "ring": None, "token": random.getrandbits(63)}))]), t.client)
    return _documents_of(sock, ControlKind.LOGIN_RESULT)[0]


def round_trip(t: Target, topic: str = "rt/x") -> None:
    """A real client's publish reaches a real client's subscription through the appliance."""
    with connect(t.url, "feed", timeout_s=10) as sub_client, \
            connect(t.url, "feed", timeout_s=10) as pub_client:
        sub = sub_client.subscribe(topic.split("/")[0] + "/#")
        pub_client.publish(topic, b"still serving", flush=True)
        got = sub.get(timeout=10)
        assert got is not None and got.payload == b"still serving"


# --- (a) hostile frames --------------------------------------------------------------------------
def test_a_flood_of_hostile_frames_is_refused_counted_and_survived(target):
    t = target
    rng = random.Random(20240607)
    anon, other, evil = _udp(), _udp(), t.evil
    session_sock = _udp()
    login = raw_login(t, session_sock)
    assert login["accepted"]
    sid = login["session"]
    auth = FabricAuth(bytes.fromhex(FABRIC_KEY), 1, 77)
    # the neighbour says who it is (a discovery HELLO): its frames are bound to the target
    node = meet(t, auth)
    sends: list[tuple[socket.socket, tuple, bytes, int]] = []
    valid: list[bytes] = []
    for kind in ControlKind:
        # an anonymous client: a LOGIN is checked; anything else needs a session first
        for text in hostile_documents(kind, "client", rng):
            frame = _frame([_control(kind, text)])
            sends.append((anon, t.client, frame, 1))
        # a logged-in session: every kind checked (LOGIN as a first entry is a login)
        for text in hostile_documents(kind, "client", rng):
            sends.append((session_sock, t.client, _frame([_control(kind, text)], session=sid),
                          1))
        # a configured neighbour with the fabric key: every kind checked
        for text in hostile_documents(kind, "neighbour", rng):
            sends.append((evil, t.fabric, _frame([_control(kind, text)], session=EVIL_NODE,
                                                 auth=auth, dest=node), 1))
        valid.append(_frame([_control(kind, json.dumps(GOOD[kind]))]))
    # several entries in one frame: each checked on its own, the good one applied
    sends.append((evil, t.fabric, _frame([_control(ControlKind.LSA, "[]"),
                                          _control(ControlKind.INTEREST, '"x"'),
                                          _control(ControlKind.ECHO, json.dumps(
                                              {"ts": time.time_ns()}))],
                                         session=EVIL_NODE, auth=auth, dest=node), 2))
    # frames the fabric's authentication refuses
    signed = _frame([_control(ControlKind.LOGOUT, "{}")], session=EVIL_NODE, auth=auth,
                    dest=node)
    forged = bytearray(signed)
    forged[-1] ^= 0xFF
    wrong_key = FabricAuth(b"\x22" * 32, 2, 78)
    sends += [(evil, t.fabric, _frame([_control(ControlKind.LSA, "{}")], dest=node),
               1),  # no trailer
              (evil, t.fabric, bytes(forged), 1),  # bad MAC
              (evil, t.fabric, _frame([_control(ControlKind.LSA, "{}")], session=EVIL_NODE,
                                      auth=wrong_key, dest=node), 1),
              # a frame for another link (the neighbour's frames bound to someone else)
              (evil, t.fabric, _frame([_control(ControlKind.LSA, "{}")], session=EVIL_NODE,
                                      auth=auth, dest=node + 1), 1),
              (other, t.fabric, signed, 1)]  # not a configured neighbour
    sends.append((evil, t.fabric, signed, 0))  # accepted (a goodbye: it was not up) ...
    sends.append((evil, t.fabric, signed, 1))  # ... and its replay refused
    # random bytes and truncated frames at both ports
    data = bytes(encode_data_frame([{"topic_key": 5, "sequence": 1, "payload": b"x" * 64}],
                                   source_session=3))
    for port in (t.client, t.fabric):
        for _ in range(100):
            sends.append((other, port, rng.randbytes(rng.randrange(1, 300)), 1))
        for frame in _truncated([*valid, data], rng, 100):
            sends.append((other, port, frame, 1))

    counted = flood(t, sends)

    assert counted == sum(s[3] for s in sends) and len(sends) > 1_500
    assert t.app.failure() is None
    status = t.app.status()
    c = status["counters"]
    # the schemas refused every bad document before a handler read it: no handler raised
    assert c.get("control_bad_admin", 0) == 0 and c.get("bad_admin", 0) == 0
    assert c["control_bad_document"] > 1_000
    assert {k for k in c if k.startswith("control_bad_document_")} >= {
        f"control_bad_document_{r}" for r in ("too_large", "not_json", "too_deep", "not_allowed",
                                              "wrong_type", "missing_key", "unknown_key",
                                              "out_of_range")}
    assert set(status["auth"]["rejected"]) >= {"no_trailer", "bad_mac", "unknown_key",
                                              "unknown_peer", "replay", "malformed",
                                              "wrong_link"}
    # the echo beside two bad entries was applied (the only echo): a round-trip time
    assert wait_for(lambda: t.app.status()["neighbours"][0]["rtt_us"] is not None)
    # a bad login document is answered with the reason
    refusal = _documents_of(anon, ControlKind.LOGIN_RESULT)[0]
    assert refusal["accepted"] is False and "bad login document" in refusal["reason"]
    # the hostile session is still there, and a real client is served
    assert sid in [cl["session"] for cl in status["clients"]]
    round_trip(t)
    for s in (anon, other, session_sock):
        s.close()


def test_a_handler_that_raises_costs_its_frame_not_the_appliance(target, monkeypatch):
    """The boundary itself: a handler bug (stood in for by one that raises) in the control
    agent, in the data path's Python handling and in a management command is counted with its
    type, and both threads go on."""
    t = target
    sock = _udp()
    sid = raw_login(t, sock)["session"]

    def boom(*_args, **_kw):
        raise RuntimeError("a handler bug")

    monkeypatch.setattr(t.app.control, "_resolve", boom)
    monkeypatch.setattr(t.app.dataplane.guaranteed, "on_client_frame", boom)
    for _ in range(3):
        sock.sendto(_frame([_control(ControlKind.RESOLVE, '{"keys": [1]}')], session=sid),
                    t.client)
        sock.sendto(_frame([al.SeqRange(1, 2)], FrameType.NAK, session=sid), t.client)
    wait_for(lambda: t.counter("control_bad_admin_runtimeerror") == 3
             and t.counter("bad_admin_runtimeerror") == 3)
    wait_for(lambda: t.counter("control_bad_admin") == 3 and t.counter("bad_admin") == 3)
    # a management command whose handler raises is answered as failed
    monkeypatch.setattr(t.app.control, "_command", boom)
    out = t.app.submit("disconnect_client", {"session": sid})
    assert out["ok"] is False and "RuntimeError: a handler bug" in out["error"]
    wait_for(lambda: t.counter("control_command_failed") == 1)
    assert t.app.failure() is None
    monkeypatch.undo()
    round_trip(t)
    sock.close()


class HostileAppliance:
    """A UDP socket that answers a client as an appliance would, with bad documents first."""

    def __init__(self) -> None:
        self.sock = _udp()
        self.url = f"udp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.client: tuple | None = None

    def next_frame(self, ftype: FrameType):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            data, self.client = self.sock.recvfrom(70_000)
            frame = decode_frame(data)
            if frame.header.frame_type is ftype:
                return frame
        raise AssertionError(f"no {ftype.name} from the client")

    def send(self, frame: bytes) -> None:
        assert self.client is not None
        self.sock.sendto(frame, self.client)


def test_the_client_library_survives_a_hostile_appliances_documents():
    fake = HostileAppliance()
    rng = random.Random(7)
    bad = 0
    result: dict = {}

    def serve_login():
        nonlocal bad
        fake.next_frame(FrameType.CONTROL)  # the LOGIN
        for kind in (ControlKind.LOGIN_RESULT, ControlKind.REQUEST_RESULT, ControlKind.LOGOUT,
                     ControlKind.LSA):
            for text in hostile_documents(kind, "appliance", rng)[:40]:
                if len(text) < 20_000:
                    fake.send(_frame([_control(kind, text)]))
                    bad += 1
        for _ in range(20):
            fake.send(rng.randbytes(rng.randrange(1, 200)))
            bad += 1
        fake.send(_frame([_control(ControlKind.LOGIN_RESULT, json.dumps(
            {"accepted": True, "session": 99, "node": "fake", "node_id": 9, "schemas": []}))]))

    server = threading.Thread(target=serve_login)
    server.start()
    client = connect(fake.url, "feed", timeout_s=15)
    server.join(15)
    try:
        assert client.session == 99
        wait_for(lambda: getattr(client, "malformed", 0) == bad)

        def serve_subscribe():
            frame = fake.next_frame(FrameType.SUBSCRIBE)
            sub_id = frame.admin()[1][0].sub_id
            for doc in ({"request": "subscribe", "sub_id": [sub_id], "accepted": True},
                        {"request": ["subscribe"], "sub_id": sub_id, "accepted": True},
                        {"request": "subscribe", "sub_id": {"a": 1}, "accepted": True},
                        {"request": "subscribe", "accepted": True}):
                fake.send(_frame([_control(ControlKind.REQUEST_RESULT, json.dumps(doc))]))
            fake.send(_frame([_control(ControlKind.LOGOUT, '{"reason": ["x"]}')]))
            fake.send(_frame([_control(ControlKind.REQUEST_RESULT, json.dumps(
                {"request": "subscribe", "sub_id": sub_id, "pattern": "a/#",
                 "accepted": True}))]))
            result["ok"] = True

        server = threading.Thread(target=serve_subscribe)
        server.start()
        sub = client.subscribe("a/#")  # answered after the bad ones: the thread goes on
        server.join(15)
        assert result.get("ok") and sub.pattern == "a/#"
        assert getattr(client, "malformed", 0) == bad + 5
        assert client.logged_out_reason is None  # the bad LOGOUT was not read
    finally:
        client.close()
        fake.sock.close()


# --- (b) exhaustion is a refusal -----------------------------------------------------------------
def test_another_local_process_cannot_pose_as_the_appliance(target):
    """A client's UDP socket is connected to its appliance: a LOGOUT (or anything else) sent
    to the client's port from another local socket never reaches the client library."""
    t = target
    with connect(t.url, "feed", timeout_s=10) as client:
        here = client.channel.local_address
        assert client.channel._sock.getpeername() == t.client
        sub = client.subscribe("pose/#")
        session = client.session
        forger = _udp()
        try:
            for reason in ('{"reason": "operator"}', '{"move": true}', "{}"):
                forger.sendto(_frame([_control(ControlKind.LOGOUT, reason)],
                                     session=client.session), here)
        finally:
            forger.close()
        # on loopback a datagram is queued at its receiver when sent: the round trip below
        # comes after the forged LOGOUTs, so the client has seen them unless the kernel
        # dropped them, as a connected socket does
        client.publish("pose/x", b"after", flush=True)
        got = sub.get(timeout=10)
        assert got is not None and got.payload == b"after"
        assert client.logged_out_reason is None
        assert client.losses_of_connection == 0 and client.session == session


def test_sessions_guaranteed_subscribers_subscriptions_and_registrations_have_limits():
    t = _appliance({"max_sessions": 4, "max_guaranteed_sessions": 1, "max_subscriptions": 3,
                    "max_registrations": 2})
    clients = []
    try:
        clients = [connect(t.url, "feed", timeout_s=10) for _ in range(4)]
        with pytest.raises(LoginError, match=r"all 4 client sessions are taken "
                                             r"\(clients.max_sessions\)"):
            connect(t.url, "feed", timeout_s=10)
        wait_for(lambda: t.counter("control_login_refused_sessions") >= 1)
        c1, c2, c3, c4 = clients
        gsub = c1.subscribe("r/#", qos="guaranteed")
        with pytest.raises(EntitlementError, match=r"clients.max_guaranteed_sessions"):
            c2.subscribe("r/#", qos="guaranteed")
        wait_for(lambda: t.counter("control_refused_guaranteed") == 1)
        sub = c2.subscribe("r/#")  # best-effort is still open to it
        for i in range(3):
            c3.subscribe(f"s/{i}")
        with pytest.raises(EntitlementError, match=r"clients.max_subscriptions"):
            c3.subscribe("s/3")
        wait_for(lambda: t.counter("control_refused_subscriptions") == 1)
        c3.unsubscribe("s/0")  # shrinks its list: allowed at the limit
        c3.subscribe("s/3")
        c4.publish("r/1", b"one", flush=True)
        c4.publish("r/2", b"two", flush=True)
        with pytest.raises(EntitlementError, match=r"clients.max_registrations"):
            c4.publish("r/3", b"three")
        wait_for(lambda: t.counter("control_refused_registrations") == 1)
        c4.publish("r/1", b"again", flush=True)  # a topic it holds: no new registration
        c4.publish("r/2", b"g", qos="guaranteed", flush=True)
        assert _payloads(sub, 3) == [b"one", b"two", b"again"]
        assert b"g" in _payloads(gsub, 4)  # a local publisher's messages reach both classes
        assert t.app.failure() is None
        clients.pop().close()  # a session ends: a new one may log in
        clients.append(wait_for(lambda: _try_connect(t.url)))
    finally:
        for c in clients:
            c.close()
        t.app.stop()
        t.evil.close()


def _payloads(sub, n: int) -> list[bytes]:
    got = [sub.get(timeout=10) for _ in range(n)]
    assert all(got), got
    return [m.payload for m in got]


def test_the_limits_are_config_keys_that_fit_the_port_space():
    cfg = parse_config({"appliance": {"name": "limits"}})
    assert (cfg.max_sessions, cfg.max_guaranteed_sessions, cfg.max_subscriptions,
            cfg.max_registrations, cfg.max_pending_requests) == (256, 128, 1_024, 16_384, 256)
    assert cfg.max_sessions + cfg.max_guaranteed_sessions <= EGRESS_PORTS - 64
    # the 16-bit logical ports hold both limits at their largest (CLIENT_SESSIONS_LIMIT)
    big = parse_config({"appliance": {"name": "limits"},
                        "clients": {"max_sessions": 16_384, "max_guaranteed_sessions": 16_384}})
    assert (big.max_sessions, big.max_guaranteed_sessions) == (16_384, 16_384)
    assert big.max_sessions + big.max_guaranteed_sessions <= EGRESS_PORTS - 64
    for key in ("max_sessions", "max_guaranteed_sessions"):
        with pytest.raises(ConfigError, match=rf"clients.{key}: must be an integer in "
                                              r"\[\d, 16384\], not 16385"):
            parse_config({"appliance": {"name": "limits"}, "clients": {key: 16_385}})
    with pytest.raises(ConfigError, match=r"clients.max_pending_requests"):
        parse_config({"appliance": {"name": "limits"},
                      "clients": {"max_pending_requests": 0}})
    # P&M's document is checked against its schema at start: appliances would refuse it
    with pytest.raises(ConfigError, match=r"pm.identities: P&M's document would be refused"):
        parse_config({"appliance": {"name": "limits"},
                      "pm": {"require_passwords": False,
                             "identities": {"x" * 300: {"publish": ["#"]}}}})


def _try_connect(url: str):
    try:
        return connect(url, "feed", timeout_s=10)
    except LoginError:
        return None


def test_egress_ports_running_out_is_a_refusal(monkeypatch):
    """The 16-bit port space shrunk to 70 ports (64 kept for appliances): six for clients."""
    assert EGRESS_PORTS == MAX_EGRESS_PORT - (1 if CPU_PORT <= MAX_EGRESS_PORT else 0)
    monkeypatch.setattr(control_module, "MAX_EGRESS_PORT", 70)
    t = _appliance({"max_sessions": 8, "max_guaranteed_sessions": 4})
    clients = []
    try:
        clients = [connect(t.url, "feed", timeout_s=10) for _ in range(5)]
        gsub = clients[0].subscribe("p/#", qos="guaranteed")  # the sixth port
        with pytest.raises(LoginError, match=r"no egress port is free"):
            connect(t.url, "feed", timeout_s=10)
        wait_for(lambda: t.counter("control_login_refused_ports") >= 1)
        with pytest.raises(EntitlementError, match=r"no egress port is free"):
            clients[1].subscribe("p/#", qos="guaranteed")
        wait_for(lambda: t.counter("control_refused_ports") == 1)
        sub = clients[1].subscribe("p/#")
        clients[2].publish("p/x", b"served", qos="guaranteed", flush=True)
        assert _payloads(gsub, 1) == [b"served"]
        assert _payloads(sub, 1) == [b"served"]
        assert t.app.failure() is None
    finally:
        for c in clients:
            c.close()
        t.app.stop()
        t.evil.close()


def test_pending_requests_have_a_limit():
    t = _appliance({"max_pending_requests": 2})
    sock = _udp()
    try:
        sid = raw_login(t, sock)["session"]
        # a frame is admitted whole when fewer than the limit wait before it (a batched
        # subscribe_many): its entries then wait, at most the limit plus one frame's
        entries = [al.Subscription(i, 0, 0, 0, f"q/{i}") for i in range(10)]
        sock.sendto(_frame(entries, FrameType.SUBSCRIBE, session=sid), t.client)
        results = {d["sub_id"]: d for d in _documents_of(sock, ControlKind.REQUEST_RESULT, 10)}
        assert sorted(i for i, d in results.items() if d["accepted"]) == list(range(10))
        # with the limit reached (two requests still waiting), a frame is refused whole
        session = t.app.control.sessions[sid]
        wait_for(lambda: session.pending == 0)  # (its answers went)
        session.pending = 2
        entries = [al.Subscription(i, 0, 0, 0, f"r/{i}") for i in range(10, 20)]
        sock.sendto(_frame(entries, FrameType.SUBSCRIBE, session=sid), t.client)
        results = {d["sub_id"]: d for d in _documents_of(sock, ControlKind.REQUEST_RESULT, 10)}
        assert not any(d["accepted"] for d in results.values()) and len(results) == 10
        assert all("clients.max_pending_requests" in d["reason"] for d in results.values())
        wait_for(lambda: t.counter("control_refused_pending") == 10)
        session.pending = 0
        round_trip(t)  # the limit is per session; others go on
    finally:
        sock.close()
        t.app.stop()
        t.evil.close()


def test_the_reported_255_guaranteed_logins_are_refusals_not_a_crash():
    """Default limits; 260 peers, one after the other, log in and subscribe guaranteed (the
    attacker test that ended an appliance with 'pop from empty list' at the 255th login)."""
    t = _appliance()
    socks = [_udp() for _ in range(260)]
    accepted: list[tuple[socket.socket, int]] = []
    refused_logins: list[str] = []
    results: list[dict] = []
    try:
        for s in socks:
            login = raw_login(t, s)
            if not login["accepted"]:
                refused_logins.append(login["reason"])
                continue
            accepted.append((s, login["session"]))
            s.sendto(_frame([al.Subscription(1, 0, 2, 0, "g/#")], FrameType.SUBSCRIBE,
                            session=login["session"]), t.client)
            results += _documents_of(s, ControlKind.REQUEST_RESULT, timeout_s=30)
        assert len(accepted) == 256 and len(refused_logins) == 4
        assert all("clients.max_sessions" in r for r in refused_logins)
        assert sum(r["accepted"] for r in results) == 128
        assert all("clients.max_guaranteed_sessions" in r["reason"]
                   for r in results if not r["accepted"])
        wait_for(lambda: t.counter("control_login_refused_sessions") == 4)
        wait_for(lambda: t.counter("control_refused_guaranteed") == 128)
        assert t.app.failure() is None
        for s, sid in accepted[:10]:  # ten leave; two real clients take their places
            s.sendto(_frame([_control(ControlKind.LOGOUT, "{}")], session=sid), t.client)
        wait_for(lambda: len(t.app.status()["clients"]) == 246)
        round_trip(t)
    finally:
        for s in socks:
            s.close()
        t.app.stop()
        t.evil.close()


# --- (c) bounded state ---------------------------------------------------------------------------
def test_a_flood_of_denials_leaves_the_status_small(target):
    t = target
    sock = _udp()
    sid = raw_login(t, sock, "narrow")["session"]
    before = len(json.dumps(t.app.status()))
    keys = KeyRegistry()
    n = 20_000
    sent = 0
    while sent < n:  # 20,000 registrations the identity may not make, 250 per frame
        entries = [al.RegistryEntry(keys.key_of(f"other/{i}"), 0, f"other/{i}")
                   for i in range(sent, min(n, sent + 250))]
        sock.sendto(_frame(entries, FrameType.REGISTRY_UPDATE, session=sid,
                           body_header={"version": 0}), t.client)
        sent += len(entries)
        if sent % 2_500 == 0 or sent == n:  # a few frames at a time: the socket holds them
            wait_for(lambda s=sent: t.counter("control_denials") == s, timeout_s=30)
    logins = _udp()
    for i in range(500):  # and 500 identities P&M does not know
        logins.sendto(_frame([_control(ControlKind.LOGIN, json.dumps(
            {"identity": f"nobody-{i}" + "x" * 200}))]), t.client)
    wait_for(lambda: t.counter("control_denials") == n + 500, timeout_s=30)
    status = t.app.status()
    assert len(status["denials"]) == DENIALS_KEPT
    wait_for(lambda: t.counter("control_denials_dropped") == n + 500 - DENIALS_KEPT)
    assert all(len(d["pattern"]) <= 128 and len(d["identity"]) <= 128
               for d in status["denials"])
    size = len(json.dumps(status))
    assert size < before + 24_000, (before, size)
    assert t.app.failure() is None
    round_trip(t)
    sock.close()
    logins.close()


def test_bad_frames_from_many_sources_keep_the_log_limiter_bounded(target):
    t = target
    socks = [_udp() for _ in range(LOG_SOURCES_KEPT + 60)]
    for s in socks:
        s.sendto(_frame([_control(ControlKind.LOGIN, "[]")]), t.client)
    wait_for(lambda: t.counter("control_bad_document") == len(socks))
    assert len(t.app.control._log_at) <= LOG_SOURCES_KEPT
    wait_for(lambda: t.counter("control_log_sources_dropped") >= 60)
    assert t.app.failure() is None
    for s in socks:
        s.close()

