"""The bridge's durable backlog on a real disk: what the remote acknowledged never comes back
after a reopen, a torn tail is cut off, bounds refuse the newest, the journal is compacted."""

from __future__ import annotations

from collections import Counter

from appliance.edge.mqtt import bridge_backlog
from appliance.edge.mqtt.bridge_backlog import JOURNAL, Backlog
from datapath.protocol.extensions import decode_headers, encode_headers


def opened(path, max_messages=1_000, max_bytes=1 << 20) -> tuple[Backlog, Counter]:
    counts: Counter = Counter()
    return Backlog(path, max_messages, max_bytes, lambda k, n: counts.update({k: n})), counts


def test_only_unacknowledged_messages_survive_a_reopen_in_order(tmp_path):
    b, _ = opened(tmp_path)
    entries = [b.append(f"t/{i}", b"p%d" % i, 1, i == 3) for i in range(10)]
    for e in entries[:4] + entries[6:8]:
        assert b.ack(e.seq)
    assert not b.ack(entries[0].seq)  # twice: nothing
    b.close()
    b.close()
    again, _ = opened(tmp_path)
    assert [(e.topic, e.payload) for e in again.snapshot()] == [
        ("t/4", b"p4"), ("t/5", b"p5"), ("t/8", b"p8"), ("t/9", b"p9")]
    assert again.recovered == 4 and again.bytes == sum(e.size for e in again.snapshot())
    nxt = again.append("t/new", b"n", 1, False)  # sequence numbers go on after the old ones
    assert nxt.seq > max(e.seq for e in entries)
    again.close()


def test_metadata_is_kept_with_its_entry_across_a_reopen_and_counts_in_the_bounds(tmp_path):
    meta = encode_headers({"mqtt.qos": "1", "mqtt.content_type": "text/plain"})
    b, _ = opened(tmp_path, max_bytes=len("t/0") * 2 + 2 + len(meta) + 1)
    plain = b.append("t/0", b"a", 1, False)
    rich = b.append("t/1", b"b", 1, True, meta)
    assert plain is not None and rich is not None and rich.size == 3 + 1 + len(meta)
    assert b.append("t/2", b"", 1, False) is None  # the metadata's bytes count
    b.close()
    again, _ = opened(tmp_path)
    assert [(e.topic, e.payload, e.retain, e.meta) for e in again.snapshot()] == [
        ("t/0", b"a", False, b""), ("t/1", b"b", True, meta)]
    assert decode_headers(again.snapshot()[1].meta)["mqtt.content_type"] == "text/plain"
    again.close()


def test_a_torn_tail_is_cut_off_and_counted(tmp_path):
    b, _ = opened(tmp_path)
    for i in range(3):
        b.append(f"t/{i}", b"x" * 10, 1, False)
    b.close()
    path = tmp_path / JOURNAL
    data = path.read_bytes()
    path.write_bytes(data[:-5])  # a crash in the middle of the last record
    again, counts = opened(tmp_path)
    assert [e.topic for e in again.snapshot()] == ["t/0", "t/1"]
    assert counts["backlog_torn_tail_bytes"] > 0
    again.close()


def test_bounds_refuse_the_newest(tmp_path):
    b, _ = opened(tmp_path, max_messages=3, max_bytes=1 << 20)
    kept = [b.append("t", b"x", 1, False) for _ in range(5)]
    assert [k is not None for k in kept] == [True, True, True, False, False]
    assert b.ack(kept[0].seq)
    assert b.append("t", b"y", 1, False) is not None  # room again
    b.close()
    small, _ = opened(tmp_path / "small", max_messages=100, max_bytes=1_024)
    assert small.append("t", b"x" * 1_000, 1, False) is not None
    assert small.append("t", b"x" * 100, 1, False) is None  # bytes, too
    small.close()


def test_the_journal_is_compacted_to_the_live_messages(tmp_path, monkeypatch):
    monkeypatch.setattr(bridge_backlog, "COMPACT_MIN_BYTES", 4_096)
    b, counts = opened(tmp_path)
    for _ in range(200):
        b.ack(b.append("t/x", b"z" * 100, 1, False).seq)
    keep = b.append("t/keep", b"k", 1, False)
    assert b.sync(30)
    b.append("t/last", b"l", 1, False)  # (a batch after the compaction's)
    b.close()
    assert counts["backlog_compactions"] >= 1
    assert (tmp_path / JOURNAL).stat().st_size < 4_096
    again, _ = opened(tmp_path)
    assert [e.topic for e in again.snapshot()] == ["t/keep", "t/last"]
    assert again.snapshot()[0].seq == keep.seq
    again.close()
