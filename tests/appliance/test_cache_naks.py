"""NAKs served from the cache end to end (docs/reliability.md, "NAKs served from the cache"):
a real appliance (its data path in a process of its own) with a small retransmission buffer
(``appliance.retransmit_buffer_messages = 16``) sends a guaranteed subscriber its stream
through a lossy UDP relay. The relay loses some of its DATA frames and every datagram from
the subscriber (its NAKs and ACKs) until the stream has gone ``HEAL_AFTER`` messages past the
last frame lost; then it lets the NAKs through. The sender's buffer no longer holds what they
ask for: with ``[cache]`` keeping the topic, it is resent from the cache and every message
arrives once, in order, with no loss event (``nak_served_from_cache`` counts them); without
a cache, the same run ends in a ``SENDER_LOSS`` loss event. The same across the fabric."""

from __future__ import annotations

import select
import socket
import threading

import pytest

from appliance.cache.node import CachingAppliance
from appliance.client import LoginError, connect
from appliance.config import parse_config
from datapath.protocol import message_layout as ml
from datapath.protocol.frame_layout import (
    FRAME_HEADER_BYTES,
    MSG_COUNT_OFFSET,
    TYPE_OFFSET,
    FrameType,
    align8,
)
from tests.appliance.helpers import FABRIC_KEY, free_port, wait_for

TOPIC = "orders/eu/x"
BUFFER_MESSAGES = 16
"""``appliance.retransmit_buffer_messages`` of the sending appliance."""
BEFORE = 50
"""Messages delivered before the loss."""
DURING = 400
"""Messages published while the relay loses frames and the subscriber's NAKs."""
AFTER = 50
LOST = 100
"""Messages the relay loses (the first of the burst, in the frames that hold only them)."""
LARGE_DURING = 3_000
LARGE_LOST = 2_000
"""A gap of more messages than one NAK may ask of the cache (CACHE_NAK_MESSAGES_PER_NAK)."""
HEAL_AFTER = 4 * BUFFER_MESSAGES
"""The relay lets the receiving side's datagrams through again once a DATA frame this far
past the last lost one has passed: the lost ones have left the sender's buffer by then."""


def _highest_seq(frame: bytes) -> int:
    """The highest message sequence of a DATA frame (0 when it has none)."""
    count = int.from_bytes(frame[MSG_COUNT_OFFSET : MSG_COUNT_OFFSET + 2], "big")
    pos, highest = FRAME_HEADER_BYTES, 0
    for _ in range(count):
        if pos + ml.MESSAGE_HEADER_BYTES > len(frame):
            break
        seq = int.from_bytes(frame[pos + 8 : pos + 16], "big")
        plen = int.from_bytes(frame[pos + 32 : pos + 36], "big")
        tlen = int.from_bytes(frame[pos + 36 : pos + 38], "big")
        highest = max(highest, seq)
        pos += ml.MESSAGE_HEADER_BYTES + align8(plen + tlen)
    return highest


class LossPlan:
    """What a relay loses: after ``lose(until)``, every DATA frame towards the receiving
    side whose messages are all at or below sequence ``until`` and every datagram from that
    side, until a DATA frame ``HEAL_AFTER`` messages past ``until`` has passed (``healed``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.until = 0
        self.blocked = False
        self.dropped_data = 0
        self.dropped_up = 0
        self.healed = threading.Event()

    def lose(self, until: int) -> None:
        with self._lock:
            self.until = until
            self.blocked = True

    def down(self, data: bytes) -> bool:
        """Whether a datagram towards the receiving side passes."""
        if len(data) <= TYPE_OFFSET or data[TYPE_OFFSET] != FrameType.DATA:
            return True
        seq = _highest_seq(data)
        with self._lock:
            if self.blocked and seq <= self.until:
                self.dropped_data += 1
                return False
            if self.blocked and seq >= self.until + HEAL_AFTER:
                self.blocked = False
                self.healed.set()
        return True

    def up(self) -> bool:
        """Whether a datagram from the receiving side passes."""
        with self._lock:
            if self.blocked:
                self.dropped_up += 1
                return False
        return True


def _udp(host: str) -> socket.socket:
    """A UDP socket on ``host`` with a large receive buffer: the relay itself must not lose
    what it is not told to (a burst of retransmissions while the machine is busy)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 8 << 20)
    except OSError:  # not privileged: as large as the system allows
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((host, 0))
    return sock


class LossyRelay:
    """A UDP relay between one client and its appliance, losing what its ``plan`` says."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.plan = LossPlan()
        self.down = _udp("127.0.0.1")
        self.address = self.down.getsockname()
        self.up = _udp("127.0.0.1")
        self.client: tuple[str, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="lossy-relay")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.down, self.up], [], [], 0.05)
            for sock in ready:
                data, peer = sock.recvfrom(65_536)
                if sock is self.down:
                    self.client = peer
                    if self.plan.up():
                        self.up.sendto(data, self.upstream)
                elif self.client is not None and self.plan.down(data):
                    self.down.sendto(data, self.client)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.down.close()
        self.up.close()


class FabricRelay:
    """Stands between two appliances as each one's address of the other (127.0.0.2 is
    ``b`` to ``a``, 127.0.0.3 is ``a`` to ``b``), so each sees the other's frames come from
    the address it has for it; loses frames from ``a`` to ``b`` and from ``b`` to ``a`` as
    its ``plan`` says."""

    def __init__(self, a: tuple[str, int], b: tuple[str, int]) -> None:
        self.a, self.b = a, b
        self.plan = LossPlan()
        self.as_b = _udp("127.0.0.2")
        self.as_a = _udp("127.0.0.3")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fabric-relay")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.as_b, self.as_a], [], [], 0.05)
            for sock in ready:
                data, _ = sock.recvfrom(65_536)
                if sock is self.as_b:  # from a, for b
                    if self.plan.down(data):
                        self.as_a.sendto(data, self.b)
                elif self.plan.up():  # from b, for a
                    self.as_b.sendto(data, self.a)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.as_b.close()
        self.as_a.close()


def _start(port: int, cache_dir) -> CachingAppliance:
    doc = {"appliance": {"name": f"naks{port}", "retransmit_buffer_messages": BUFFER_MESSAGES},
           "clients": {"udp": f"127.0.0.1:{port}"},
           "pm": {"anonymous": True, "require_passwords": False}}
    if cache_dir is not None:
        doc["cache"] = {"dir": str(cache_dir), "patterns": ["orders/#"]}
    app = CachingAppliance(parse_config(doc)).start()
    if app.cache is not None:
        assert app.cache.ready.wait(60), "the cache's session did not subscribe"
    return app


def _publish(pub, first: int, count: int) -> None:
    for i in range(first, first + count):
        pub.publish(TOPIC, b"%d" % i, qos="guaranteed")
    pub.flush(timeout=30)


@pytest.mark.parametrize(("cached", "during", "lost"), [
    (True, DURING, LOST), (False, DURING, LOST), (True, LARGE_DURING, LARGE_LOST)],
    ids=["cache", "no-cache", "cache-large-gap"])
def test_a_nak_past_the_senders_buffer_is_served_from_the_cache(tmp_path, cached, during,
                                                                lost):
    """(With a gap larger than one NAK may ask of the cache, the receiver's next NAKs ask
    for the rest.)"""
    port = free_port()
    app = _start(port, tmp_path / "cache" if cached else None)
    relay = LossyRelay(("127.0.0.1", port))
    got: list[int] = []
    try:
        host, rport = relay.address
        with connect(f"udp://{host}:{rport}", "sub") as sub_client, \
                connect(f"udp://127.0.0.1:{port}", "pub") as pub:
            sub = sub_client.subscribe("orders/#", qos="guaranteed")
            _publish(pub, 0, BEFORE)
            got += [int(sub.get(timeout=10).payload) for _ in range(BEFORE)]
            relay.plan.lose(BEFORE + lost)  # (the stream's sequences are 1..)
            _publish(pub, BEFORE, during)
            wait_for(relay.plan.healed.is_set, timeout_s=10,
                     what="the stream past the lost frames")
            assert relay.plan.dropped_data > 0
            _publish(pub, BEFORE + during, AFTER)
            total = BEFORE + during + AFTER

            def settled() -> bool:
                while True:
                    m = sub.get(timeout=0)
                    if m is None:
                        break
                    got.append(int(m.payload))
                return len(got) + sub.lost_messages >= total and (
                    not got or got[-1] == total - 1)
            wait_for(settled, timeout_s=30, what="every message delivered or named lost")
            losses = list(sub.losses)
            lost_count = sub.lost_messages
        counters = {}

        def counted() -> bool:
            counters.update(app.status()["counters"])
            if not cached:
                return counters.get("guaranteed_loss_frames_out", 0) > 0
            # (the lost messages but those of a frame that held later ones too, at most a
            # frame's worth; the cache's counters and the data path's are refreshed apart:
            # a message is read before it is resent)
            served = counters.get("nak_served_from_cache", 0)
            return (served >= lost // 2
                    and counters.get("cache_nak_records_read", 0) >= served)
        wait_for(counted, timeout_s=10, what="the counters of the NAKs served")
    finally:
        relay.close()
        app.stop()
    assert got == sorted(got) and len(set(got)) == len(got)  # in order, once
    if cached:
        assert got == list(range(total)) and lost_count == 0 and not losses, [
            (x.reason, x.first_seq, x.last_seq) for x in losses]
        assert counters["nak_served_from_cache"] >= lost // 2
        assert counters.get("guaranteed_loss_frames_out", 0) == 0
    else:
        assert lost_count > 0 and {loss.reason for loss in losses} == {"SENDER_LOSS"}
        assert len(got) + lost_count == total
        assert counters.get("nak_served_from_cache", 0) == 0
        assert counters["guaranteed_loss_frames_out"] > 0  # the sender announced the loss


def _interest_at(app, qos: str = "guaranteed") -> bool:
    return any(s["pattern"] == "orders/#" and s["qos"] == qos
               for s in app.status()["subscriptions"] if s["origin"] != app.config.name)


@pytest.mark.parametrize("cached", [True, False], ids=["cache", "no-cache"])
def test_a_nak_from_a_neighbour_past_the_senders_buffer_is_served_from_the_cache(
        tmp_path, cached):
    """The same across the fabric: publisher and cache at ``a``, subscriber at ``b``; the
    relay loses DATA frames of ``a``'s stream to ``b`` and, meanwhile, ``b``'s NAKs and ACKs;
    ``a``'s sender towards ``b`` answers from ``a``'s cache."""
    fa, fb = free_port(), free_port()
    relay = FabricRelay(("127.0.0.1", fa), ("127.0.0.1", fb))
    b_to_a, a_to_b = relay.as_b.getsockname(), relay.as_a.getsockname()
    common = {"retransmit_buffer_messages": BUFFER_MESSAGES, "heartbeat_interval_ms": 200,
              "neighbour_dead_ms": 5_000, "lsa_refresh_ms": 500}
    pm = {"anonymous": True, "require_passwords": False}
    doc_a = {"appliance": {"name": f"na{fa}", **common},
             "fabric": {"listen": f"127.0.0.1:{fa}", "key": FABRIC_KEY},
             "neighbours": [{"name": f"nb{fb}", "address": f"{b_to_a[0]}:{b_to_a[1]}"}],
             "clients": {"udp": f"127.0.0.1:{free_port()}"}, "pm": pm}
    if cached:
        doc_a["cache"] = {"dir": str(tmp_path / "cache"), "patterns": ["orders/#"]}
    doc_b = {"appliance": {"name": f"nb{fb}", **common},
             "fabric": {"listen": f"127.0.0.1:{fb}", "key": FABRIC_KEY},
             "neighbours": [{"name": f"na{fa}", "address": f"{a_to_b[0]}:{a_to_b[1]}"}],
             "clients": {"udp": f"127.0.0.1:{free_port()}"}, "pm": {"mode": "remote"}}
    a = b = None
    got: list[int] = []
    try:
        a = CachingAppliance(parse_config(doc_a)).start()
        b = CachingAppliance(parse_config(doc_b)).start()
        if a.cache is not None:
            assert a.cache.ready.wait(60), "the cache's session did not subscribe"
        url_a = "udp://{}:{}".format(*a.config.clients_udp)
        url_b = "udp://{}:{}".format(*b.config.clients_udp)

        def logged_in():
            try:
                return connect(url_b, "sub")
            except LoginError:  # b has no P&M document from a yet
                return None
        with wait_for(logged_in, 30, what="a login at b") as sub_client:
            sub = sub_client.subscribe("orders/#", qos="guaranteed")
            wait_for(lambda: _interest_at(a), 30,
                     what="the subscriber's interest at a")
            with connect(url_a, "pub") as pub:
                _publish(pub, 0, BEFORE)
                got += [int(sub.get(timeout=10).payload) for _ in range(BEFORE)]
                relay.plan.lose(BEFORE + LOST)
                _publish(pub, BEFORE, DURING)
                wait_for(relay.plan.healed.is_set, timeout_s=10,
                         what="the stream from a past the lost frames")
                assert relay.plan.dropped_data > 0
                _publish(pub, BEFORE + DURING, AFTER)
            total = BEFORE + DURING + AFTER

            def settled() -> bool:
                while True:
                    m = sub.get(timeout=0)
                    if m is None:
                        break
                    got.append(int(m.payload))
                return len(got) + sub.lost_messages >= total and (
                    not got or got[-1] == total - 1)
            wait_for(settled, timeout_s=30, what="every message delivered or named lost")
            losses = list(sub.losses)
            lost_count = sub.lost_messages
        counters = {}

        def counted() -> bool:
            counters.update(a.status()["counters"])
            if not cached:
                return counters.get("guaranteed_loss_frames_out", 0) > 0
            return (counters.get("nak_served_from_cache", 0) > 0
                    and counters.get("cache_nak_records_read", 0) > 0)
        wait_for(counted, timeout_s=10, what="a's counters")
    finally:
        relay.close()
        for app in (b, a):
            if app is not None:
                app.stop()
    assert got == sorted(got) and len(set(got)) == len(got)  # in order, once
    if cached:
        assert got == list(range(total)) and lost_count == 0 and not losses, [
            (x.reason, x.first_seq, x.last_seq) for x in losses]
        assert counters["nak_served_from_cache"] > 0
        assert counters.get("guaranteed_loss_frames_out", 0) == 0
    else:
        assert lost_count > 0 and {loss.reason for loss in losses} == {"SENDER_LOSS"}
        assert len(got) + lost_count == total
