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


def test_the_disk_bound_deletes_the_oldest_segments_of_any_log_and_names_the_ranges(tmp_path):
    """Two logs under ``max_disk_bytes``: the older log's segments go first (by their newest
    record's time), the total ends at or under the bound, and the deleted ranges are named
    ``CACHE_DISK_LIMIT`` (retention's ``RETENTION``) for the durable subscriptions."""
    bound = 8 << 20  # four segments of 1 MiB per pattern
    settings = CacheSettings(tmp_path, ("orders/#", "quotes/#"), max_disk_bytes=bound)
    assert settings.log_config().segment_bytes == 1 << 20
    store = CacheStore(settings)
    try:
        for i in range(5_000):  # ~5 MB into orders/# first: under the bound
            store.append("orders/a", 0, i + 1, 1, 2, 3, 0, 0, i, bytes(1_000))
            if i % 100 == 99:
                store.commit()
        store.commit()
        assert store.enforce_disk_limit() == 0 and store.disk_bytes() <= bound
        for i in range(5_000):  # then ~5 MB of newer quotes: over it
            store.append("quotes/b", 0, i + 1, 1, 2, 3, 0, 0, 10_000 + i, bytes(1_000))
            if i % 100 == 99:
                store.commit()
        store.commit()
        assert store.disk_bytes() > bound
        deleted = store.enforce_disk_limit()
        assert deleted > 0 and store.disk_bytes() <= bound
        orders, quotes = store.logs["orders/#"], store.logs["quotes/#"]
        assert orders.first_seq() > 1 and quotes.first_seq() == 1  # the oldest went first
        assert store.disk_status()["segments_deleted"] == deleted
        assert store.disk_status()["records_deleted"] == orders.first_seq() - 1
        first = store.first("orders/#")
        assert store.deleted_ranges("orders/#", 1, first - 1) == [
            (1, first - 1, "CACHE_DISK_LIMIT")]
        # a range partly before what this run deleted: that part is RETENTION (not known)
        store.deleted["orders/#"] = [(10, first - 1, "CACHE_DISK_LIMIT")]
        assert store.deleted_ranges("orders/#", 1, first - 1) == [
            (1, 9, "RETENTION"), (10, first - 1, "CACHE_DISK_LIMIT")]
    finally:
        store.close()


def test_a_durable_page_finds_the_loss_markers_it_covers_and_a_replay_skips_them(tmp_path):
    store = CacheStore(CacheSettings(tmp_path, ("orders/#",)))
    try:
        for i in range(300):
            if i % 10 == 5:
                store.append_marker("orders/#", 1_000 + i, 2, 3,
                                    {"reason": "CACHE_TOO_LARGE", "messages": 1, "i": i})
            else:
                store.append("orders/a", 0, i + 1, 1, 2, 3, 0, 0, 1_000 + i, b"m%d" % i)
        store.commit()
        rows = [m for page in _pages(store, "orders/#") for m in page]
        assert len(rows) == 270 and all(m.payload != b"" for m in rows)  # no marker in them
        page = ReplayPage(FRAME_BYTES)
        markers: list = []
        next_seq, done = store.page("orders/#", "orders/#", 1, None, page, markers, 16)
        assert [seq for seq, _ in markers] == [6 + 10 * j for j in range(16)]
        assert [doc["i"] for _, doc in markers] == [5 + 10 * j for j in range(16)]
        # the page ends before the 17th marker, with every message before it
        assert (next_seq, done) == (166, False) and page.count == 165 - 16
        markers = []
        next_seq, done = store.page("orders/#", "orders/#", next_seq, None, page, markers, 16)
        assert [seq for seq, _ in markers] == [166 + 10 * j for j in range(14)]
        assert done and next_seq == 301 and page.count == 300 - 165 - 14
    finally:
        store.close()
