"""Replay pages (issue 21, "replay at wire speed"): a replay answer's messages travel as
native message records in page frames, then a REPLAY_RESULT naming the page.

The client's page assembler alone (a frame dropped deterministically: the messages before
the gap are kept, the page is asked again from the one after them); then real appliances
and clients on 127.0.0.1: 100,000 messages of 64 B (some with headers) and a large
guaranteed message (segmented on the wire, kept whole) replayed complete and in order,
through a UDP relay that drops one page frame (the client detects it and asks again:
nothing is skipped); a durable subscription through the same relay."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from appliance.cache.node import CachingAppliance
from appliance.cache.settings import CacheSettings
from appliance.cache.store import CacheStore, ReplayPage
from appliance.client import connect
from appliance.client.messages import Message
from appliance.client.replay import request_page, take_frame
from appliance.config import parse_config
from appliance.control import credentials as cr
from datapath.protocol import frame_layout as fl
from datapath.protocol.replay_layout import REPLAY_STREAM_ID
from datapath.topics.registry import topic_key_hash
from tests.appliance.helpers import free_port, wait_for


# --- the assembler alone ------------------------------------------------------------------------
class _FakeClient:
    """What ``request_page`` uses of a client: the page frames of the page ``frames`` are
    taken as the client thread would (but ``drop``), then the answer ``doc``."""

    def __init__(self, frames: list[bytes], doc: dict, drop: set[int]) -> None:
        self._lock = threading.Lock()
        self._replay_pages: dict = {}
        self.replay_pages_incomplete = 0
        self.replay_frames_unexpected = 0
        self.replay_frames_malformed = 0
        self.frames, self.doc, self.drop = frames, doc, drop

    def _request(self, key, send, **_):
        for i, frame in enumerate(self.frames):
            if i not in self.drop:
                take_frame(self, memoryview(frame))
        return self.doc


def _page_of(tmp_path, count: int, request_id: int) -> tuple[list[bytes], dict]:
    store = CacheStore(CacheSettings(tmp_path, ("a/#",)))
    try:
        key = topic_key_hash(0, "a/x")
        for i in range(count):
            store.append("a/x", 0, i + 1, key, 1, 2, 0, 0, i, bytes([i % 256]) * 64)
        store.commit()
        page = ReplayPage(65_472)
        page.request_id, page.page_id = request_id, 77
        next_seq, done = store.page("a/#", "a/#", None, None, page)
        frames = [bytes(page.stamp(i, 1, 2, 0)) for i in range(page.frames)]
        doc = {"id": request_id, "accepted": True, "page": 77, "frames": page.frames,
               "count": page.count, "next_seq": next_seq, "done": done}
        return frames, doc
    finally:
        store.close()


def test_a_dropped_page_frame_keeps_what_came_before_it_and_asks_again_after(tmp_path):
    frames, doc = _page_of(tmp_path, 3_000, 5)
    assert len(frames) >= 3 and doc["done"]
    whole = request_page(_FakeClient(frames, doc, set()), {"id": 5}, {}, "a/#")
    assert whole.complete and whole.done and len(whole.messages) == 3_000
    assert [m.cache_seq for m in whole.messages] == list(range(1, 3_001))
    assert all(m.payload == bytes([(m.sequence - 1) % 256]) * 64 for m in whole.messages)
    one = whole.messages[9]  # built by slot: the same as by the constructor
    assert one == Message("a/x", bytes([9]) * 64, topic_key_hash(0, "a/x"), 10, 9, 0, 0, 0, 1,
                          2, one.received_ns, cache_seq=10)

    client = _FakeClient(frames, doc, {1})  # the second frame never arrives
    cut = request_page(client, {"id": 5}, {"from_seq": 1}, "a/#")
    assert not cut.complete and not cut.done and client.replay_pages_incomplete == 1
    first = whole.messages[: len(cut.messages)]
    assert 0 < len(cut.messages) < 3_000
    assert [_row(m) for m in cut.messages] == [_row(m) for m in first]
    assert cut.next == {"from_seq": cut.messages[-1].cache_seq + 1}

    client = _FakeClient(frames, doc, {0})  # nothing before the gap: the same start again
    none = request_page(client, {"id": 5}, {"from_time_ns": 9}, "a/#")
    assert none.messages == [] and none.next == {"from_time_ns": 9} and not none.done

    client = _FakeClient(frames, doc, {len(frames) - 1})  # the last frame: also seen
    last = request_page(client, {"id": 5}, {}, "a/#")
    assert not last.complete and not last.done


def _row(msg) -> tuple:
    return (msg.cache_seq, msg.topic, msg.sequence, msg.payload, msg.origin, msg.stream)


def test_frames_of_another_request_or_an_older_page_are_not_taken(tmp_path):
    frames, doc = _page_of(tmp_path, 100, 6)
    client = _FakeClient(frames, {**doc, "id": 6}, set())
    take_frame(client, memoryview(frames[0]))  # nobody waits for request 6 yet
    assert client.replay_frames_unexpected == 1
    stale = {**doc, "page": 76}  # the answer names another page than the frames'
    page = request_page(_FakeClient(frames, stale, set()), {"id": 6}, {}, "a/#")
    assert page.messages == [] and not page.complete
    bad = bytearray(frames[0])
    bad[fl.MSG_COUNT_OFFSET + 1] += 1  # the header's count disagrees with the descriptor
    client = _FakeClient([bytes(bad)], doc, set())
    client._replay_pages[6] = object()
    take_frame(client, memoryview(bytes(bad)))
    assert client.replay_frames_malformed == 1


# --- real appliances, real sockets ------------------------------------------------------------
class DroppingRelay:
    """A UDP relay between one client and an appliance on 127.0.0.1 that drops the frame of
    replay page frame index ``drop_index`` of the first ``drops`` pages it sees."""

    def __init__(self, upstream: tuple[str, int], drop_index: int = 1, drops: int = 1
                 ) -> None:
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", 0))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.connect(upstream)
        for sock in (self.front, self.back):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            sock.settimeout(0.1)
        self.port = self.front.getsockname()[1]
        self.client: tuple[str, int] | None = None
        self.drop_index, self.drops = drop_index, drops
        self.dropped = 0
        self.page_frames = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._up, daemon=True),
                         threading.Thread(target=self._down, daemon=True)]
        for thread in self._threads:
            thread.start()

    def _up(self) -> None:
        while not self._stop.is_set():
            try:
                data, self.client = self.front.recvfrom(65_535)
            except (TimeoutError, OSError):
                continue
            self.back.send(data)

    def _down(self) -> None:
        import struct

        from datapath.protocol import replay_layout as rl

        while not self._stop.is_set():
            try:
                data = self.back.recv(65_535)
            except (TimeoutError, OSError):
                continue
            head = fl.FRAME_HEADER_STRUCT.unpack_from(data)
            if head[2] == fl.FrameType.DATA and head[8] == REPLAY_STREAM_ID:
                self.page_frames += 1
                flags, count, length = head[3], head[4], head[5]
                end = length - (fl.AUTH_TRAILER_BYTES if flags & 1 else 0)
                at = end - rl.DESCRIPTOR_HEAD_BYTES - rl.DESCRIPTOR_ENTRY_BYTES * (count - 1)
                index = struct.unpack_from(">H", data, at + 8)[0]
                if index == self.drop_index and self.dropped < self.drops:
                    self.dropped += 1
                    continue
            if self.client is not None:
                self.front.sendto(data, self.client)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(2)
        self.front.close()
        self.back.close()


@pytest.fixture
def cached(tmp_path):
    port = free_port()
    cfg = parse_config({
        "appliance": {"name": f"pages{port}"},
        "clients": {"udp": f"127.0.0.1:{port}", "shm": f"pages{port}"},
        "pm": {"require_passwords": False,
               "identities": {"feed": {"publish": ["orders/#"], "subscribe": ["#"]},
                              "sealed": {"subscribe": ["orders/#"],
                                         "password": cr.hash_password(PASSWORD, **CHEAP)}}},
        "cache": {"dir": str(tmp_path / "cache"), "patterns": ["orders/#"]}})
    app = CachingAppliance(cfg).start()
    assert app.cache.ready.wait(60), "the cache's session did not subscribe"
    try:
        yield app, port
    finally:
        app.stop()


PASSWORD = "correct horse battery staple"
CHEAP = {"n": 1 << 10, "r": 8, "p": 1}  # scrypt cost of the tests' credentials


def _payload(seq: int) -> bytes:
    return (b"%010d" % seq) * 6 + b"end!"  # 64 bytes, its own per message


def test_100000_messages_of_64_bytes_with_headers_and_a_large_one_replay_whole_through_a_drop(
        cached):
    app, port = cached
    total = 100_000
    large = bytes(range(256)) * 100  # 25,600 bytes: guaranteed, it travels as 19 segments
    with connect(f"udp://127.0.0.1:{port}", "feed") as client:
        for i in range(total):
            seq = i + 1
            headers = {"n": str(seq), "raw": b"\x00\xff"} if seq % 1_000 == 0 else None
            client.publish("orders/eu/x", _payload(seq), headers=headers)
            if i % 64 == 63:
                client.flush()
                time.sleep(0.0005)  # paced: the hop to the cache's session is best-effort
        client.flush()
        outcome = client.publish("orders/big", large, qos="guaranteed",
                                 headers={"kind": "large"})
        outcome.wait(30)
        counters = app.cache.counters
        wait_for(lambda: counters["kept"] + counters["missed"] >= total + 1, 120,
                 what="every message kept or counted missing")
        kept = counters["kept"]
        assert kept + counters["missed"] == total + 1 and counters["too_large"] == 0
    relay = DroppingRelay(("127.0.0.1", port), drop_index=1, drops=2)
    try:
        with connect(f"udp://127.0.0.1:{relay.port}", "feed") as reader:
            count, last, big = 0, 0, None
            for msg in reader.replay("orders/#"):
                if msg.topic == "orders/big":
                    big = msg
                    continue
                assert msg.sequence > last and msg.payload == _payload(msg.sequence)
                assert dict(msg.headers) == ({"n": str(msg.sequence), "raw": b"\x00\xff"}
                                             if msg.sequence % 1_000 == 0 else {})
                count, last = count + 1, msg.sequence
            assert reader.replay_pages_incomplete == 2  # each drop seen, asked again
            assert reader.replay_frames_malformed == 0
        assert relay.dropped == 2
    finally:
        relay.close()
    assert count + 1 == kept
    assert big is not None and big.payload == large and dict(big.headers) == {"kind": "large"}
    assert big.qos == 2 and big.cache_seq > 0
    assert app.cache.counters["replay_frames"] > 100 // 8
    assert app.cache.counters.get("replay_frames_dropped", 0) == 0


def test_a_durable_subscription_through_a_dropped_page_frame_loses_nothing(cached):
    app, port = cached
    relay = DroppingRelay(("127.0.0.1", port), drop_index=0, drops=1)
    try:
        with connect(f"udp://127.0.0.1:{relay.port}", "feed") as reader:
            sub = reader.subscribe("orders/#", durable="pages")
            with connect(f"udp://127.0.0.1:{port}", "feed") as client:
                for i in range(3_000):
                    client.publish("orders/eu/x", _payload(i + 1), qos="guaranteed")
                client.flush()
            got = [sub.get(timeout=20) for _ in range(3_000)]
            assert [m.payload for m in got if m is not None] == [
                _payload(i + 1) for i in range(3_000)]
            assert reader.replay_pages_incomplete >= 1 and relay.dropped == 1
            sub.unsubscribe()
    finally:
        relay.close()


@pytest.mark.parametrize("scheme", ["udp", "shm"])
def test_a_session_with_a_key_reads_signed_page_frames_over_udp_and_shared_memory(
        cached, scheme):
    app, port = cached
    with connect(f"udp://127.0.0.1:{port}", "feed") as client:
        for i in range(5_000):
            client.publish("orders/eu/x", _payload(i + 1), qos="guaranteed")
        client.flush()
    wait_for(lambda: app.cache.counters["kept"] >= 5_000, 60, what="5,000 messages kept")
    url = f"udp://127.0.0.1:{port}" if scheme == "udp" else f"shm://pages{port}"
    with connect(url, "sealed", password=PASSWORD) as reader:
        assert reader._mac is not None  # frames to it carry the session's MAC
        got = [m.payload for m in reader.replay("orders/#")]
        assert got == [_payload(i + 1) for i in range(5_000)]
        assert (reader.replay_pages_incomplete, reader.replay_frames_malformed) == (0, 0)
    assert app.cache.counters["replay_frames"] > 1


def test_a_gap_fill_is_joined_only_once_the_replay_reached_each_publishers_first_live_message():
    from types import SimpleNamespace

    from appliance.client.api import Subscription

    sub = Subscription(SimpleNamespace(targets=[1, 2]), 1, "a/#", 0, None, "guaranteed",
                       lambda m: None)

    def msg(origin: int, n: int) -> Message:
        return Message("a/x", b"%d" % n, 7, n, 1_000 + n, 0, 0, 2, origin, 9, 0)

    sub._begin_fill()
    assert sub._joined()  # nothing live held: nothing to join
    sub._put(msg(1, 5))  # live, held while the replay fills the gap
    sub._put(msg(2, 8))
    sub._put(msg(1, 6))
    sub._fill(msg(1, 4))
    assert not sub._joined()  # the cache has not kept publisher 1's 5 yet
    sub._fill(msg(1, 5))
    assert not sub._joined()  # nor publisher 2's 8
    sub._fill(msg(2, 8))
    assert sub._joined()
    sub._end_fill()
    assert sub.delivered == 4 and sub.duplicates == 2  # 4, 5, 8, then 6; 5 and 8 once
