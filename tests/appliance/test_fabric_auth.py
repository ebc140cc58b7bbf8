"""Fabric frames are bound to their link, cannot be replayed, and the epoch survives its wrap.

Real appliances (in this process) on loopback. Where a test needs to see or forge the
traffic between two of them, the two are configured to know each other at a relay's
address: a UDP socket the test owns, which forwards every frame between them and keeps a copy
of what it forwarded. To each appliance the relay's address *is* its neighbour's, so what
the test sends from the relay's socket arrives as if the neighbour had sent it: the hostile
sender that forges a neighbour's source address, with the frames it captured on the wire.
"""

from __future__ import annotations

import socket
import threading
import time

from appliance.client import connect
from appliance.config import parse_config
from appliance.control import auth as auth_mod
from appliance.control.auth import FabricAuth
from appliance.dataplane.guaranteed import RELIABLE_STREAM_BIT
from appliance.node import Appliance
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol import frame_mac
from datapath.protocol.codec import encode_admin
from datapath.protocol.frame_layout import FrameType
from tests.appliance.helpers import FABRIC_KEY, free_port, wait_for
from tests.appliance.helpers import counter as _counter
from tests.appliance.helpers import udp_url as _url

IDENTITIES = {"feed": {"publish": ["#"], "subscribe": ["#"]}}
HEARTBEAT_MS = 50
_HEADER = fl.FRAME_HEADER_STRUCT


def _config(name: str, port: int, neighbours: dict[str, tuple[str, int]], pm: bool = False):
    return parse_config({
        "appliance": {"name": name, "heartbeat_interval_ms": HEARTBEAT_MS,
                      "lsa_refresh_ms": 500},
        "fabric": {"listen": f"127.0.0.1:{port}", "key": FABRIC_KEY},
        "neighbours": [{"name": n, "address": f"{h}:{p}"} for n, (h, p) in neighbours.items()],
        "clients": {"udp": f"127.0.0.1:{free_port()}"},
        "pm": {"require_passwords": False, "identities": IDENTITIES} if pm else {"mode": "remote"}})


def _neighbour(app: Appliance, name: str) -> dict:
    return next(n for n in app.status()["neighbours"] if n["name"] == name)


def _up(app: Appliance, name: str) -> bool:
    return _neighbour(app, name)["state"] == "up"


def _rejected(app: Appliance, reason: str) -> int:
    return int(app.status()["auth"]["rejected"].get(reason, 0))


def _fields(frame: bytes) -> tuple[int, int, int, int]:
    """(frame_type, source_session, dest_session, stream_id) of a frame."""
    h = _HEADER.unpack_from(frame)
    return h[2], h[6], h[7], h[8]


class Relay:
    """Forwards frames between two appliances' fabric sockets and keeps what it forwarded."""

    def __init__(self, a: tuple[str, int], b: tuple[str, int]) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.02)
        self.address = self.sock.getsockname()
        self.other = {a: b, b: a}
        self.forwarded: dict[tuple[str, int], list[bytes]] = {a: [], b: []}
        """Frames from each end that the relay delivered to the other."""
        self.blocked: set[tuple[str, int]] = set()
        """Ends whose frames are dropped (as if that appliance had died)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, src = self.sock.recvfrom(70_000)
            except (TimeoutError, OSError):
                continue
            with self._lock:
                if src in self.other and src not in self.blocked:
                    self.sock.sendto(data, self.other[src])
                    self.forwarded[src].append(data)

    def block(self, end: tuple[str, int]) -> list[bytes]:
        """Drop ``end``'s frames from now on; what it had sent through the relay until then."""
        with self._lock:
            self.blocked.add(end)
            return list(self.forwarded[end])

    def captured(self, end: tuple[str, int]) -> list[bytes]:
        with self._lock:
            return list(self.forwarded[end])

    def send_as(self, frame: bytes, to: tuple[str, int]) -> None:
        """Send ``frame`` to ``to`` from the relay's address (its neighbour's, to it)."""
        self.sock.sendto(frame, to)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def _start_at(cfg, start_ns: int, monkeypatch) -> Appliance:
    """Start an appliance whose clock read at start (its epoch, its auth sequences) says
    ``start_ns``."""
    with monkeypatch.context() as m:
        m.setattr(auth_mod, "wall_clock_ns", lambda: start_ns)
        return Appliance(cfg).start()


def _delivers(sub_app: Appliance, pub_app: Appliance, topic: str) -> None:
    """A subscriber at ``sub_app`` gets what a publisher at ``pub_app`` publishes (published
    again until the interest has reached the publisher's appliance)."""
    with connect(_url(sub_app), "feed", timeout_s=10) as sc, \
            connect(_url(pub_app), "feed", timeout_s=10) as pc:
        sub = sc.subscribe(topic.split("/")[0] + "/#")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pc.publish(topic, b"across", flush=True)
            got = sub.get(timeout=0.2)
            if got is not None:
                assert got.payload == b"across"
                return
        raise AssertionError(f"nothing published at {pub_app.config.name} reached "
                             f"{sub_app.config.name}")


# --- the epoch wrap (issue 20, item 7) -----------------------------------------------------------
def test_an_appliance_restarted_across_an_epoch_wrap_is_taken_back_by_its_neighbour(monkeypatch):
    """A's first life starts 300 ms before its 32-bit ms epoch wraps, its second 300 ms
    after: the epoch in its frames went from 2^32 - 300 to 300. Its neighbour takes it back
    at once (before the fix it refused every frame as ``stale_epoch`` until it restarted
    itself), and A's interest is in force there again (messages reach A's subscriber)."""
    fa, fb = free_port(), free_port()
    a_cfg = _config(f"wa{fa}", fa, {f"wb{fb}": ("127.0.0.1", fb)})
    b_cfg = _config(f"wb{fb}", fb, {f"wa{fa}": ("127.0.0.1", fa)}, pm=True)
    wrap_ms = (time.time_ns() // 1_000_000) >> 32 << 32
    b = Appliance(b_cfg).start()
    a = None
    try:
        a = _start_at(a_cfg, (wrap_ms - 300) * 1_000_000, monkeypatch)
        first_epoch = a.status()["node"]["epoch"]
        assert wait_for(lambda: _up(a, b_cfg.name) and _up(b, a_cfg.name)
                        and a.status()["node"]["pm"] is not None)
        assert _neighbour(b, a_cfg.name)["epoch"] == first_epoch & auth_mod.EPOCH_MASK
        _delivers(a, b, "w/1")
        a.stop()
        a = _start_at(a_cfg, (wrap_ms + 300) * 1_000_000, monkeypatch)
        second_epoch = a.status()["node"]["epoch"]
        assert second_epoch > first_epoch  # the epoch itself never wraps (64 bits, ms)
        assert second_epoch & auth_mod.EPOCH_MASK < first_epoch & auth_mod.EPOCH_MASK
        assert wait_for(lambda: _neighbour(b, a_cfg.name)["epoch"]
                        == second_epoch & auth_mod.EPOCH_MASK and _up(b, a_cfg.name)
                        and _up(a, b_cfg.name) and a.status()["node"]["pm"] is not None)
        _delivers(a, b, "w/2")
        rejected = b.status()["auth"]["rejected"]
        assert "replay" not in rejected and "stale_epoch" not in rejected, rejected
    finally:
        if a is not None:
            a.stop()
        b.stop()


# --- frames bound to their link; liveness not replayable (issue 20, item 4) ---------------------
def test_frames_of_one_link_are_refused_on_another_and_replayed_hellos_keep_no_one_alive():
    """N has two neighbours, M and P, each behind a relay that keeps what N sent. (1) Every
    frame captured on N -> M, sent to P from N's address (as P knows it), is refused as
    ``wrong_link``. (2) N dies for P (the relay drops its frames) while N's captured HELLOs
    and heartbeats to P are replayed to P from N's address, again and again: P declares N
    down all the same, refuses every replay, and N stays down."""
    fn, fm, fp = free_port(), free_port(), free_port()
    n_addr, m_addr, p_addr = ("127.0.0.1", fn), ("127.0.0.1", fm), ("127.0.0.1", fp)
    to_m, to_p = Relay(n_addr, m_addr), Relay(n_addr, p_addr)
    names = {"n": f"n{fn}", "m": f"m{fm}", "p": f"p{fp}"}
    apps: list[Appliance] = []
    try:
        n = Appliance(_config(names["n"], fn, {names["m"]: to_m.address,
                                               names["p"]: to_p.address}, pm=True)).start()
        apps.append(n)
        m = Appliance(_config(names["m"], fm, {names["n"]: to_m.address})).start()
        apps.append(m)
        p = Appliance(_config(names["p"], fp, {names["n"]: to_p.address})).start()
        apps.append(p)
        # what N sent P before P's socket was bound never reached it: such a frame would be
        # new to P (a delayed frame within the replay window is accepted once); the replays
        # below are of frames P received
        received_from = len(to_p.captured(n_addr))
        assert wait_for(lambda: _up(m, names["n"]) and _up(p, names["n"])
                        and _up(n, names["m"]) and _up(n, names["p"]))
        m_id, p_id = m.status()["node"]["id"], p.status()["node"]["id"]

        # (1) N -> M frames at P
        wait_for(lambda: sum(_fields(f)[2] == m_id for f in to_m.captured(n_addr)) >= 20)
        captured = to_m.captured(n_addr)
        assert {_fields(f)[2] for f in captured} <= {m_id, auth_mod.hello_link_id(names["m"])}
        assert any(_fields(f)[0] == FrameType.CONTROL for f in captured)
        before = _rejected(p, "wrong_link")
        for frame in captured:
            to_p.send_as(frame, p_addr)
        assert wait_for(lambda: _rejected(p, "wrong_link") == before + len(captured))
        assert _up(p, names["n"]) and _neighbour(p, names["n"])["id"] == n.status()["node"]["id"]

        # (2) N dies for P; its HELLOs to P are replayed to P
        hellos = [f for f in to_p.block(n_addr)[received_from:]
                  if _fields(f)[0] in (FrameType.HELLO, FrameType.HEARTBEAT)]
        assert len(hellos) >= 5 and any(_fields(f)[2] == p_id for f in hellos)
        replays_before = _rejected(p, "replay")
        sent = 0
        deadline = time.monotonic() + 10
        while _up(p, names["n"]):
            assert time.monotonic() < deadline, "a dead neighbour is kept up by replays"
            to_p.send_as(hellos[sent % len(hellos)], p_addr)
            sent += 1
            time.sleep(HEARTBEAT_MS / 1e3 / 5)
        for frame in hellos:  # once more, all of them, now that it is down
            to_p.send_as(frame, p_addr)
        sent += len(hellos)
        assert wait_for(lambda: _rejected(p, "replay") == replays_before + sent)
        assert not _up(p, names["n"])
        assert _up(m, names["n"])  # the other link never noticed
    finally:
        for app in apps:
            app.stop()
        to_m.close()
        to_p.close()


# --- plain DATA frames (issue 20, item 4) -------------------------------------------------------
def _plain_data(frames: list[bytes]) -> list[bytes]:
    """The plain DATA frames (messages, not probes: not of a reliable stream) among ``frames``."""
    return [f for f in frames if _fields(f)[0] == FrameType.DATA
            and not _fields(f)[3] & RELIABLE_STREAM_BIT and _HEADER.unpack_from(f)[4] > 0]


def _unsigned(frame: bytes) -> bytes:
    """``frame`` without its trailer: what an appliance sent before DATA frames were signed."""
    out = bytearray(frame[:-fl.AUTH_TRAILER_BYTES])
    out[fl.FLAGS_OFFSET + 1] &= ~int(fl.FrameFlags.AUTH_TRAILER) & 0xFF
    out[fl.FRAME_LEN_OFFSET:fl.FRAME_LEN_OFFSET + 4] = len(out).to_bytes(4, "big")
    return bytes(out)


def test_plain_data_frames_are_signed_for_their_link_and_forged_or_replayed_ones_delivered_never():
    """N publishes to a subscriber at M, through a relay that keeps what N sent. Every plain
    DATA frame N sent carries a trailer whose MAC (hashlib's BLAKE2b, frame_mac.mac_py) is the
    one of the link N -> M. From N's address (as M knows it): the same frames without their
    trailer (what a spoofing host sends), with a payload byte changed, replayed as captured,
    and signed for another link, are dropped, each counted under its reason, and the
    subscriber receives none of them: only the messages N published."""
    fn, fm = free_port(), free_port()
    n_addr, m_addr = ("127.0.0.1", fn), ("127.0.0.1", fm)
    relay = Relay(n_addr, m_addr)
    n_name, m_name = f"dn{fn}", f"dm{fm}"
    apps: list[Appliance] = []
    try:
        n = Appliance(_config(n_name, fn, {m_name: relay.address}, pm=True)).start()
        apps.append(n)
        m = Appliance(_config(m_name, fm, {n_name: relay.address})).start()
        apps.append(m)
        assert wait_for(lambda: _up(n, m_name) and _up(m, n_name)
                        and m.status()["node"]["pm"] is not None)
        n_id, m_id = n.status()["node"]["id"], m.status()["node"]["id"]
        with connect(_url(m), "feed", timeout_s=10) as sc, \
                connect(_url(n), "feed", timeout_s=10) as pc:
            sub = sc.subscribe("d/#")
            assert wait_for(lambda: any(s["origin"] == m_name
                                        for s in n.status()["subscriptions"]))
            sent = []
            deadline = time.monotonic() + 30
            while True:  # 20 messages at least, then until one of N's DATA frames is captured
                sent.append(b"genuine %d" % len(sent))
                pc.publish("d/x", sent[-1], flush=True)
                if len(sent) < 20:
                    continue
                try:
                    wait_for(lambda: _plain_data(relay.captured(n_addr)), 0.5)
                    break
                except AssertionError:
                    assert time.monotonic() < deadline, "no plain DATA frame from N reached M"
            got = []
            while len(got) < len(sent):
                msg = sub.get(timeout=10)
                assert msg is not None, f"{len(got)} of {len(sent)} genuine messages arrived"
                got.append(msg.payload)
            genuine = _plain_data(relay.captured(n_addr))
            for frame in genuine:
                assert frame[fl.FLAGS_OFFSET + 1] & int(fl.FrameFlags.AUTH_TRAILER)
                assert frame[-16:] == frame_mac.mac_py(bytes.fromhex(FABRIC_KEY), frame[:-16],
                                                       n_id, m_id)

            before = {r: _counter(m, f"data_auth_{r}") for r in ("no_trailer", "bad_mac",
                                                                  "replay")}
            spoofed = [_unsigned(genuine[i % len(genuine)]) for i in range(50)]
            for frame in spoofed:
                relay.send_as(frame, m_addr)
            tampered = bytearray(genuine[-1])
            tampered[fl.FRAME_HEADER_BYTES + 40] ^= 0xFF  # in the first message's payload
            relay.send_as(bytes(tampered), m_addr)
            for frame in genuine:
                relay.send_as(frame, m_addr)
            # N's frames to M, sent to N from M's address: the link M -> N is another
            for frame in genuine[:5]:
                relay.send_as(frame, n_addr)
            want = {"no_trailer": before["no_trailer"] + 50, "bad_mac": before["bad_mac"] + 1,
                    "replay": before["replay"] + len(genuine)}
            seen: dict[str, int] = {}

            def refused():
                seen.update({r: _counter(m, f"data_auth_{r}") for r in want},
                            n_bad_mac=_counter(n, "data_auth_bad_mac"))
                return ({r: seen[r] for r in want} == want
                        and seen["n_bad_mac"] == len(genuine[:5]))
            try:
                wait_for(refused)
            except AssertionError:
                raise AssertionError(f"refusals {seen}, wanted {want} (before: {before})") \
                    from None
            pc.publish("d/x", b"last", flush=True)
            rest = []
            while not rest or rest[-1] != b"last":
                msg = sub.get(timeout=10)
                assert msg is not None, f"the last message did not arrive after {rest}"
                rest.append(msg.payload)
            assert got == sent and rest == [b"last"]  # nothing forged was delivered
    finally:
        for app in apps:
            app.stop()
        relay.close()


# --- reliable-stream frames (issue 20, item 4) ---------------------------------------------------
def test_forged_loss_and_nak_frames_are_refused_and_the_guaranteed_stream_loses_nothing():
    """A guaranteed stream from a publisher at A to a subscriber at D, through a relay that
    a hostile sender also sends from (A's address to D, D's address to A). Forged LOSS frames
    (unsigned, signed with another key, a captured genuine frame replayed) for the next 500
    messages, and forged NAKs for everything sent, are refused and counted; so is a LOSS
    for A's stream signed with the fabric key by another neighbour of D (only the stream's
    sender, on the path from it, may send one); 0 messages are declared lost and 0 are
    retransmitted; the subscriber gets every message. A NAK signed by a holder of the fabric
    key for messages the subscriber has acknowledged makes A resend nothing."""
    fa, fd = free_port(), free_port()
    a_addr, d_addr = ("127.0.0.1", fa), ("127.0.0.1", fd)
    relay = Relay(a_addr, d_addr)
    a_name, d_name = f"ga{fa}", f"gd{fd}"
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # D's other neighbour, keyed
    other.bind(("127.0.0.1", 0))
    apps: list[Appliance] = []
    try:
        a = Appliance(_config(a_name, fa, {d_name: relay.address}, pm=True)).start()
        apps.append(a)
        d = Appliance(_config(d_name, fd, {a_name: relay.address,
                                            "other": other.getsockname()})).start()
        apps.append(d)
        assert wait_for(lambda: _up(a, d_name) and _up(d, a_name)
                        and d.status()["node"]["pm"] is not None)
        a_id, d_id = a.status()["node"]["id"], d.status()["node"]["id"]
        holder = FabricAuth(bytes.fromhex(FABRIC_KEY), 1, 1)
        with connect(_url(d), "feed", timeout_s=10) as sc, \
                connect(_url(a), "feed", timeout_s=10) as pc:
            sub = sc.subscribe("g/#", qos="guaranteed")
            assert wait_for(lambda: any(s["qos"] == "guaranteed" and s["origin"] == d_name
                                        for s in a.status()["subscriptions"]))
            for i in range(200):
                pc.publish("g/x", b"%d" % i, qos="guaranteed")
            pc.flush()
            got = [sub.get(timeout=10) for _ in range(200)]
            assert [m.payload for m in got] == [b"%d" % i for i in range(200)]
            streams = {_fields(f)[3] for f in relay.captured(a_addr)
                       if _fields(f)[0] == FrameType.DATA and _fields(f)[3] & RELIABLE_STREAM_BIT}
            assert len(streams) == 1
            stream = streams.pop()
            genuine = [f for f in relay.captured(a_addr) if _fields(f)[3] == stream]

            rogue = FabricAuth(b"\x5a" * 32, 1, 1)
            loss = [al.SeqRange(201, 700)]

            def forged(ftype, entries, src, dst, signer=None):
                frame = encode_admin(ftype, entries, source_session=src, dest_session=dst,
                                     stream_id=stream,
                                     auth=signer.next_auth() if signer else None)
                return bytes(signer.sign(frame) if signer else frame)

            refused = {r: _counter(d, f"guaranteed_auth_refused_{r}")
                       for r in ("no_trailer", "bad_mac", "replay")}
            for _ in range(5):
                relay.send_as(forged(FrameType.LOSS, loss, a_id, d_id), d_addr)
                relay.send_as(forged(FrameType.LOSS, loss, a_id, d_id, rogue), d_addr)
            for frame in genuine:
                relay.send_as(frame, d_addr)
            want = {"no_trailer": 5, "bad_mac": 5, "replay": len(genuine)}

            def seen():
                return {r: _counter(d, f"guaranteed_auth_refused_{r}") - refused[r]
                        for r in want}
            try:
                wait_for(lambda: seen() == want, 60)
            except AssertionError:
                raise AssertionError(f"refused at D {seen()}, expected {want}") from None

            resent = _counter(a, "guaranteed_retransmitted_bytes")
            nak_refused = _counter(a, "guaranteed_auth_refused_no_trailer")
            everything = [al.SeqRange(1, 200)]
            for _ in range(20):
                relay.send_as(forged(FrameType.NAK, everything, d_id, a_id), a_addr)
            assert wait_for(lambda: _counter(a, "guaranteed_auth_refused_no_trailer")
                            == nak_refused + 20)

            # D's other neighbour holds the key and signs a LOSS for A's stream
            hello = encode_admin(FrameType.HELLO, [al.Hello(4_242, 1, HEARTBEAT_MS,
                                                            al.NodeRole.CORE, 0, "other")],
                                 source_session=4_242, dest_session=d_id,
                                 auth=holder.next_auth())
            other.sendto(bytes(holder.sign(hello)), d_addr)
            guarded = _counter(d, "off_path") + _counter(d, "unknown_peer")
            other.sendto(forged(FrameType.LOSS, loss, a_id, d_id, holder), d_addr)
            assert wait_for(lambda: _counter(d, "off_path") + _counter(d, "unknown_peer")
                            == guarded + 1)

            for i in range(200, 700):
                pc.publish("g/x", b"%d" % i, qos="guaranteed")
            pc.flush()
            got = [sub.get(timeout=10) for _ in range(500)]
            assert [m.payload for m in got] == [b"%d" % i for i in range(200, 700)]
            assert sub.lost_messages == 0 and not sub.losses
            assert _counter(d, "guaranteed_lost_messages") == 0
            assert _counter(a, "guaranteed_retransmitted_bytes") == resent

            # a key holder's NAK for what D has acknowledged: nothing is resent (it binds the
            # MAC to D's epoch, as D does: control/auth.py, "Incarnation of a reliable stream")
            acked_before = _counter(a, "guaranteed_nak_ranges_acked")
            nak = encode_admin(FrameType.NAK, everything, source_session=d_id,
                               dest_session=a_id, stream_id=stream)
            relay.send_as(bytes(holder.signed_copy(nak, bind=d.control.epoch)), a_addr)
            assert wait_for(lambda: _counter(a, "guaranteed_nak_ranges_acked")
                            == acked_before + 1)
            assert _counter(a, "guaranteed_retransmitted_bytes") == resent
    finally:
        for app in apps:
            app.stop()
        relay.close()
        other.close()


# --- NAK answers to a hostile client (issue 20, item 4) ------------------------------------------
def _recv_until(sock: socket.socket, want, timeout_s: float = 10.0):
    """Frames arriving at ``sock`` until ``want(frame)`` returns something; that."""
    from datapath.protocol.codec import decode_frame

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(70_000)
        except TimeoutError:
            break
        found = want(decode_frame(data))
        if found:
            return found
    raise AssertionError("the appliance did not send what was expected")


def _control_doc(kind):
    import json

    def want(frame):
        if frame.header.frame_type is FrameType.CONTROL:
            for entry in frame.admin()[1]:
                if entry.kind is kind:
                    return json.loads(entry.document)
        return None
    return want


def test_a_hostile_clients_naks_make_the_appliance_resend_a_bounded_amount():
    """A client (a raw socket speaking the client protocol) subscribes guaranteed and gets a
    stream of 3,000 messages (312 KB of messages) it never acknowledges; then it NAKs all of
    it. One 48-byte NAK makes the appliance resend at most GUARANTEED_NAK_ANSWER_BURST_BYTES
    (the rest counted as limited), a flood of them at most the budget's rate, and once the
    client has acknowledged the stream, NAKs for it make the appliance resend nothing."""
    import json
    import random

    from appliance.config import GUARANTEED_NAK_ANSWER_BURST_BYTES as BURST
    from appliance.config import GUARANTEED_NAK_ANSWER_BYTES_PER_S as RATE

    port = free_port()
    app = Appliance(parse_config({
        "appliance": {"name": f"nak{port}"}, "fabric": {"listen": f"127.0.0.1:{port}",
                                                         "key": FABRIC_KEY},
        "clients": {"udp": f"127.0.0.1:{free_port()}"}, "pm": {"require_passwords": False,
                                                               "identities": IDENTITIES}}))
    app.start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind(("127.0.0.1", 0))
    to = app.config.clients_udp

    def send(ftype, entries, session=0, dest=0, stream=0):
        sock.sendto(bytes(encode_admin(ftype, entries, source_session=session,
                                       dest_session=dest, stream_id=stream,
                                       send_ts_ns=time.time_ns())), to)

    n = 3_000
    try:
        send(FrameType.CONTROL, [al.Control(al.ControlKind.LOGIN, json.dumps(
            {"identity": "feed", "ring": None, "token": random.getrandbits(63)}))])
        sid = _recv_until(sock, _control_doc(al.ControlKind.LOGIN_RESULT))["session"]
        send(FrameType.SUBSCRIBE, [al.Subscription(1, 0, 2, 0, "h/#")], session=sid)
        assert _recv_until(sock, _control_doc(al.ControlKind.REQUEST_RESULT))["accepted"]
        with connect(_url(app), "feed", timeout_s=10) as pc:
            for _ in range(n):
                pc.publish("h/x", bytes(64), qos="guaranteed")
            pc.flush()

            def reliable(frame):
                h = frame.header
                if frame.is_message_frame and h.stream_id & RELIABLE_STREAM_BIT:
                    return h.source_session, h.stream_id
                return None
            origin, stream = _recv_until(sock, reliable)
            assert wait_for(lambda: _counter(app, "guaranteed_sent") >= n)
            c0 = app.status()["counters"]

            # one NAK for everything
            send(FrameType.NAK, [al.SeqRange(1, n)], session=sid, dest=origin, stream=stream)
            assert wait_for(lambda: _counter(app, "guaranteed_nak_frames_in")
                            == c0.get("guaranteed_nak_frames_in", 0) + 1)
            c1 = app.status()["counters"]
            one = c1["guaranteed_retransmitted_bytes"] - c0.get("guaranteed_retransmitted_bytes",
                                                                0)
            assert 0 < one <= BURST < n * 104  # without the budget: all of it, 312 KB
            assert c1["guaranteed_nak_answers_limited"] == 1
            assert c1["guaranteed_retransmits_limited"] > 0

            # a flood of them
            flood = 50
            t0 = time.monotonic()
            for _ in range(flood):
                send(FrameType.NAK, [al.SeqRange(1, n)], session=sid, dest=origin,
                     stream=stream)
            assert wait_for(lambda: _counter(app, "guaranteed_nak_frames_in")
                            == c1["guaranteed_nak_frames_in"] + flood)
            elapsed_s = time.monotonic() - t0
            c2 = app.status()["counters"]
            resent = c2["guaranteed_retransmitted_bytes"] - c1["guaranteed_retransmitted_bytes"]
            assert resent <= BURST + RATE * elapsed_s, (resent, elapsed_s)
            assert c2["guaranteed_nak_answers_limited"] > c1["guaranteed_nak_answers_limited"]

            # acknowledged: nothing more
            send(FrameType.ACK, [al.Ack(n, 1 << 20)], session=sid, dest=origin, stream=stream)
            for _ in range(10):
                send(FrameType.NAK, [al.SeqRange(1, n)], session=sid, dest=origin,
                     stream=stream)
            assert wait_for(lambda: _counter(app, "guaranteed_nak_ranges_acked")
                            == c2.get("guaranteed_nak_ranges_acked", 0) + 10)
            assert (_counter(app, "guaranteed_retransmitted_bytes")
                    == c2["guaranteed_retransmitted_bytes"])
    finally:
        sock.close()
        app.stop()
