"""``CacheStore`` on real files: every page of a replay is at most ``REPLAY_PAGE_FRAMES``
frames that the client's batch decoder takes, whatever the payloads and topics (each
frame within the client channel's frame size), pages cover the log in order, a narrower
pattern skips the other topics, and retention by size deletes the oldest segments."""

from __future__ import annotations

import random

from appliance.cache.settings import (
    CACHE_MAX_PAYLOAD_BYTES,
    REPLAY_PAGE_FRAMES,
    CacheSettings,
)
from appliance.cache.store import CacheStore, ReplayPage
from appliance.client.replay import decode_page
from datapath.config import MAX_TOPIC_BYTES
from datapath.protocol.extensions import HEADERS_FLAG, encode_headers
from datapath.topics.registry import topic_key_hash

FRAME_BYTES = 65_472

TOPICS = ["orders/a", "orders/" + "é" * 500, "orders/" + "\U0001f600" * 254,
          "orders/" + "x" * (MAX_TOPIC_BYTES - 7)]


def _pages(store: CacheStore, pattern: str, **start):
    """Each page's messages, as the client decodes them from the page's frames."""
    page_start = dict(start)
    page = ReplayPage(FRAME_BYTES)
    page.request_id = 3
    while True:
        page.page_id += 1
        next_seq, done = store.page("orders/#", pattern, page_start.get("from_seq"),
                                    page_start.get("from_time_ns"), page)
        assert page.frames <= REPLAY_PAGE_FRAMES
        frames = [bytes(page.stamp(i, 1, 2, 0)) for i in range(page.frames)]
        assert all(len(f) <= FRAME_BYTES for f in frames)
        messages = decode_page(frames, pattern)
        assert len(messages) == page.count
        yield messages
        if done:
            return
        page_start = {"from_seq": next_seq}


def test_every_page_is_bounded_frames_and_the_pages_cover_the_log(tmp_path):
    rng = random.Random(7)
    store = CacheStore(CacheSettings(tmp_path, ("orders/#",)))
    kept = []
    try:
        for i in range(400):
            topic = rng.choice(TOPICS)
            assert len(topic.encode()) <= MAX_TOPIC_BYTES
            size = rng.choice([0, 10, 1_000, CACHE_MAX_PAYLOAD_BYTES])
            payload = rng.randbytes(size)
            headers = ({"i": str(i), "b": bytes([i % 256])}
                       if i % 5 == 0 and size < CACHE_MAX_PAYLOAD_BYTES else {})
            region = payload + encode_headers(headers) if headers else payload
            store.append(topic, 0, i + 1, topic_key_hash(0, topic), 2, 3, 0, 0, 1_000 + i, region,
                         HEADERS_FLAG if headers else 0)
            kept.append((topic, payload, headers, i + 1))
        store.commit()
        got = []
        pages = 0
        for messages in _pages(store, "orders/#"):
            pages += 1
            got += [(m.topic, m.payload, dict(m.headers), m.cache_seq) for m in messages]
        assert got == kept
        assert pages > 10
        from_time = list(_pages(store, "orders/#", from_time_ns=1_200))
        assert sum(len(r) for r in from_time) == 200
        narrow = [m for page in _pages(store, "orders/a") for m in page]
        assert [(m.topic, m.payload) for m in narrow] == [
            (t, p) for t, p, _, _ in kept if t == "orders/a"]
    finally:
        store.close()


def test_retention_by_size_deletes_the_oldest_segments(tmp_path):
    settings = CacheSettings(tmp_path, ("orders/#",), retention_bytes=4 << 20)
    store = CacheStore(settings)
    try:
        for i in range(6_000):
            store.append("orders/a", 0, i + 1, 1, 2, 3, 0, 0, i, bytes(1_000))
            if i % 100 == 99:
                store.commit()
        store.commit()
        assert store.enforce_retention() > 0
        log = store.logs["orders/#"]
        assert log.size_bytes() <= 4 << 20 and log.first_seq() > 1
        rows = [m for page in _pages(store, "orders/#") for m in page]
        assert rows[0].cache_seq == log.first_seq() and rows[-1].cache_seq == 6_000
    finally:
        store.close()
