"""Applying routes without a fabric: duplicate suppression by sequence, frames on the old path
of a switched pair (grace) and on backup paths, route tables to P&M routes, the [telemetry]
and [routes] config tables, and two appliances on loopback writing path telemetry."""

import random
import struct
import time

import pytest

from appliance.config import ConfigError, parse_config
from appliance.control.route_apply import (
    DEDUP_WINDOW,
    DUP_DEST_BIT,
    Deduplicator,
    other_route,
    table_routes,
)
from appliance.dataplane.agent import ForwardingTables
from appliance.ops.telemetry.store import read_windows
from datapath.protocol import frame_layout as fl
from tests.appliance.helpers import FABRIC_KEY, free_port, wait_for


def message(key: int, seq: int, payload: bytes) -> bytes:
    pad = -(len(payload)) % 8
    return struct.pack(">QQQIHBBIHH", key, seq, 0, 0, 0, 0, 0, len(payload), 0, 0) + \
        payload + bytes(pad)


def frame(msgs: list[bytes]) -> bytearray:
    body = b"".join(msgs)
    return bytearray(fl.FRAME_HEADER_STRUCT.pack(fl.FRAME_MAGIC, 1, 1, 0, len(msgs),
                                                 32 + len(body), 7, 9 | DUP_DEST_BIT, 3, 0)
                     + body)


def messages_of(buf: bytearray, length: int) -> list[tuple[int, int, bytes]]:
    count = struct.unpack_from(">H", buf, 6)[0]
    assert struct.unpack_from(">I", buf, 8)[0] == length
    out, pos = [], 32
    for _ in range(count):
        key, seq = struct.unpack_from(">QQ", buf, pos)
        plen = struct.unpack_from(">I", buf, pos + 32)[0]
        out.append((key, seq, bytes(buf[pos + 40 : pos + 40 + plen])))
        pos += 40 + ((plen + 7) & ~7)
    assert pos == length
    return out


def test_each_message_passes_once_whichever_copy_comes_first():
    rng = random.Random(5)
    dedup = Deduplicator()
    sent = [(key, seq) for seq in range(300) for key in (11, 12)]
    # two copies of every frame (3 messages each), interleaved at random
    frames = [sent[i:i + 3] for i in range(0, len(sent), 3)]
    arrivals = [f for f in frames for _ in (0, 1)]
    rng.shuffle(arrivals)
    got = []
    for msgs in arrivals:
        buf = frame([message(k, s, f"{k}:{s}:{'x' * (s % 11)}".encode()) for k, s in msgs])
        kept = dedup.admit(buf, 0, len(buf), src=7, stream=3)
        if kept:
            got += messages_of(buf, kept)
    assert sorted((k, s) for k, s, _ in got) == sorted(sent)
    assert all(p.startswith(f"{k}:{s}:".encode()) for k, s, p in got)
    assert dedup.dropped == len(sent) and dedup.passed == len(sent)


def test_a_frame_with_some_seen_messages_keeps_only_the_new_ones_in_order():
    dedup = Deduplicator()
    first = frame([message(1, s, b"a" * s) for s in (1, 2)])
    assert dedup.admit(first, 0, len(first), 7, 3) == len(first)
    mixed = frame([message(1, s, b"b" * s) for s in (1, 3, 2, 4)])
    kept = dedup.admit(mixed, 0, len(mixed), 7, 3)
    assert [(k, s, p) for k, s, p in messages_of(mixed, kept)] == [(1, 3, b"bbb"),
                                                                  (1, 4, b"bbbb")]
    # other sources and streams are separate; far older sequences count as seen
    other = frame([message(1, 1, b"")])
    assert dedup.admit(other, 0, len(other), 8, 3) == len(other)
    high = frame([message(1, DEDUP_WINDOW + 10, b"")])
    assert dedup.admit(high, 0, len(high), 7, 3) == len(high)
    old = frame([message(1, 5, b"")])  # never seen, but out of the window below the highest
    assert dedup.admit(old, 0, len(old), 7, 3) == 0


def test_a_frame_whose_messages_do_not_fill_it_is_left_whole_for_the_nic():
    """Deduplication runs before the software NIC validates a frame: one whose messages run
    past its end, stop short of it or are none is returned untouched, whatever was seen (a
    neighbour's such frame stopped the data path, tests/fuzz/corpus/live-cfc52c4e...)."""
    dedup = Deduplicator()
    seen = frame([message(1, 1, b"a")])
    assert dedup.admit(seen, 0, len(seen), 7, 3) == len(seen)
    over = frame([message(1, 1, b"a"), message(1, 2, b"b")])
    struct.pack_into(">I", over, 32 + 48 + 32, 0xFFFF_FFF0)  # the second's payload_len
    short = frame([message(1, 1, b"a"), message(1, 3, b"c")]) + bytes(8)
    none = frame([])
    buf = bytearray(4096)  # each in a larger buffer, as in a receive batch
    for bad in (over, short, none):
        buf[:] = bytes(4096)
        buf[64 : 64 + len(bad)] = bad
        before = bytes(buf)
        assert dedup.admit(buf, 64, len(bad), 7, 3) == len(bad)
        assert bytes(buf) == before


def tables(**kw):
    return ForwardingTables(5, transit={(1, 9): (5, 77)}, **kw)


def test_frames_draining_from_an_old_path_are_forwarded_until_the_grace_ends():
    now = time.monotonic_ns()
    t = tables(grace={(1, 9): (4, 66, now + 10**9), (2, 9): (4, None, now + 10**9)})
    assert other_route(t, 1, 9, 4, now) == (4, 77)      # on the new path too: continue on it
    assert other_route(t, 2, 9, 4, now) == (4, None)    # this node was the old destination
    assert other_route(t, 1, 9, 3, now) is None          # not the old previous hop
    assert other_route(t, 1, 9, 4, now + 2 * 10**9) is None  # grace over


def test_duplicated_copies_follow_the_primary_or_the_backup_path_by_their_previous_hop():
    t = tables(alt_transit={(1, 9): (6, 88)})
    dup = 9 | DUP_DEST_BIT
    assert other_route(t, 1, dup, 5, 0) == (5, 77)
    assert other_route(t, 1, dup, 6, 0) == (6, 88)
    assert other_route(t, 1, dup, 4, 0) is None


def test_a_route_table_becomes_routes_and_backups_by_node_id():
    ids = {"a": 1, "b": 2, "c": 3, "d": 4}

    def named(name):
        if name not in ids:
            raise ValueError(f"no appliance named {name!r}")
        return ids[name]

    doc = {"routes": [
        {"source": "a", "destination": "d", "path": ["a", "c", "d"], "backup": ["a", "b", "d"]},
        {"source": "b", "destination": "d", "path": ["b", "d"], "backup": None},
        {"source": "a", "destination": "x", "path": ["a", "x"]},
        {"source": "a", "destination": "b", "path": ["c", "b"]}]}
    routes, backups, problems = table_routes(doc, named)
    assert routes == [[1, 4, [1, 3, 4]], [2, 4, [2, 4]]]
    assert backups == [[1, 4, [1, 2, 4]]]
    assert len(problems) == 2 and "no appliance named 'x'" in problems[0]


BASE = {"appliance": {"name": "a"}, "fabric": {"listen": "127.0.0.1:47000", "key": FABRIC_KEY}}


def test_telemetry_and_routes_tables_are_checked_with_the_key_named(tmp_path):
    cfg = parse_config({**BASE, "telemetry": {"dir": "tel", "probe_interval_ms": 5},
                        "routes": {"table": "r.json", "duplicate": ["md/#"]}}, tmp_path / "a.toml")
    assert cfg.telemetry.dir == tmp_path / "tel" and cfg.telemetry.probe_interval_ns == 5_000_000
    assert cfg.routes.table == tmp_path / "r.json" and cfg.routes.duplicate == ("md/#",)
    assert parse_config(BASE).telemetry is None
    for bad, key in (({"telemetry": {}}, "telemetry.dir"),
                     ({"telemetry": {"dir": "t", "window_ms": 700}}, "telemetry.window_ms"),
                     ({"telemetry": {"dir": "t", "bogus": 1}}, "telemetry.bogus"),
                     ({"routes": {"duplicate": ["a/b#"]}}, "routes.duplicate"),
                     ({"routes": {"table": "r"}, "pm": {"mode": "remote"}}, "routes.table")):
        with pytest.raises(ConfigError, match=f"config: {key}: "):
            parse_config({**BASE, **bad})


def test_two_appliances_on_loopback_write_probe_windows_for_both_directions(tmp_path):
    from appliance.node import Appliance

    ports = [free_port(), free_port()]
    configs = []
    for i, name in enumerate(("a", "b")):
        other = 1 - i
        configs.append(parse_config({
            # a link that stays up on a busy host: a probe to a neighbour the data path has
            # forgotten (down for a moment) cannot be checked and counts as lost
            "appliance": {"name": name, "heartbeat_interval_ms": 50,
                          "neighbour_dead_ms": 2_000},
            "fabric": {"listen": f"127.0.0.1:{ports[i]}", "key": FABRIC_KEY},
            "neighbours": [{"name": "ba"[i], "address": f"127.0.0.1:{ports[other]}"}],
            "pm": {"mode": "embedded" if i == 0 else "remote"},
            "telemetry": {"dir": str(tmp_path / "tel"), "probe_interval_ms": 5}}))
    apps = [Appliance(c).start() for c in configs]
    try:
        wait_for(lambda: all(len(a.status().get("routes", [])) == 2 for a in apps), 60)
        start = time.time_ns()
        wait_for(lambda: time.time_ns() > start + 2_200_000_000, 10)
        assert apps[0].status()["counters"]["telemetry_probes_sent"] > 0
    finally:
        for a in apps:
            a.stop()
    table, problems = read_windows(tmp_path / "tel")
    assert problems == []
    rows = table.to_pylist()
    assert {(r["appliance"], r["neighbour"], r["channel"]) for r in rows} == {
        ("a", "b", "fabric"), ("b", "a", "fabric")}
    for r in rows:
        assert r["lost"] == 0 and r["lat_negative"] == 0
        assert r["lat_count"] >= r["expected"]
        assert sum(r["lat_counts"]) == r["lat_count"]
        if r["lat_count"]:  # a window of heartbeats only has no timed frame
            assert 0 < r["lat_min_ns"] <= r["lat_max_ns"] < 5_000_000_000
    # probes begin once the data path knows the neighbour (it signs and checks them): a
    # window of the start may hold its heartbeats only; every direction has probes
    for direction in (("a", "b"), ("b", "a")):
        assert sum(r["expected"] for r in rows
                   if (r["appliance"], r["neighbour"]) == direction) > 0, direction
