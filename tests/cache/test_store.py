"""``CacheStore`` on real files: every page of a replay fits one CONTROL document whatever
the payloads and topics, pages cover the log in order, and retention by size deletes the
oldest segments."""

from __future__ import annotations

import json
import random

from appliance.cache.settings import CACHE_MAX_PAYLOAD_BYTES, CacheSettings
from appliance.cache.store import CacheStore
from appliance.control.documents import validate
from datapath.config import MAX_TOPIC_BYTES
from datapath.protocol.admin_layout import MAX_CONTROL_DOCUMENT_BYTES, ControlKind

TOPICS = ["orders/a", "orders/" + "é" * 500, "orders/" + "\U0001f600" * 254,
          "orders/" + "x" * (MAX_TOPIC_BYTES - 7)]


def _pages(store: CacheStore, pattern: str, **start):
    page_start = dict(start)
    while True:
        rows, next_seq, done = store.page("orders/#", pattern, page_start.get("from_seq"),
                                          page_start.get("from_time_ns"))
        yield rows
        if done:
            return
        page_start = {"from_seq": next_seq}


def test_every_page_fits_one_replay_result_and_the_pages_cover_the_log(tmp_path):
    rng = random.Random(7)
    store = CacheStore(CacheSettings(tmp_path, ("orders/#",)))
    kept = []
    try:
        for i in range(400):
            topic = rng.choice(TOPICS)
            assert len(topic.encode()) <= MAX_TOPIC_BYTES
            size = rng.choice([0, 10, 1_000, CACHE_MAX_PAYLOAD_BYTES])
            payload = rng.randbytes(size)
            store.append(topic, 0, i + 1, 1, 2, 3, 0, 0, 1_000 + i, payload)
            kept.append((topic, payload))
        store.commit()
        got = []
        pages = 0
        for rows in _pages(store, "orders/#"):
            pages += 1
            doc = {"id": 1, "accepted": True, "messages": rows, "next_seq": 1, "done": False}
            text = json.dumps(doc, separators=(",", ":"))  # as the cache agent sends it
            assert len(text.encode()) <= MAX_CONTROL_DOCUMENT_BYTES
            validate(ControlKind.REPLAY_RESULT, text, "appliance")
            got += [(r[1], r[10]) for r in rows]
        import base64

        assert [(t, base64.b64decode(p)) for t, p in got] == kept
        assert pages > 100
        from_time = list(_pages(store, "orders/#", from_time_ns=1_200))
        assert sum(len(r) for r in from_time) == 200
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
        rows = [r for page in _pages(store, "orders/#") for r in page]
        assert rows[0][0] == log.first_seq() and rows[-1][0] == 6_000
    finally:
        store.close()
