"""Telemetry windows: the bucket layout, the recording kernel against its pure-Python twin,
window closing, Arrow rows, and a recorder fed by a real UDP channel."""

import struct
import time

import numpy as np
import pytest

from appliance.ops.telemetry import _kernels as k
from appliance.ops.telemetry.config import (
    LATENCY_BUCKETS,
    LATENCY_SUB_BUCKETS,
    LATENCY_UNIT_NS,
    PROBE_RESTART_GAP,
    PROBE_STREAM_ID,
)
from appliance.ops.telemetry.windows import (
    LATENCY_MAX_NS,
    WINDOW_SCHEMA,
    WindowRecorder,
    bucket_bounds,
    bucket_index,
    sparse_buckets,
    windows_table,
)
from channels.base import FrameBatch
from datapath.protocol import frame_layout as fl

HEADER = fl.FRAME_HEADER_STRUCT


def twin_bucket(v: int) -> int:
    """The layout as windows.py's docstring states it, one value at a time."""
    q = v // LATENCY_UNIT_NS
    e = max(q.bit_length() - (LATENCY_SUB_BUCKETS.bit_length() - 1) - 1, 0)
    return LATENCY_SUB_BUCKETS * e + (q >> e)


def frame(ftype: int, *, msgs: int = 0, stream: int = 5, send_ts: int = 0,
          body: bytes = b"", length: int | None = None) -> bytes:
    size = fl.FRAME_HEADER_BYTES + len(body)
    size += -size % 8
    data = HEADER.pack(fl.FRAME_MAGIC, 1, ftype, 0, msgs, size, 1, 2, stream, send_ts) + body
    data += bytes(size - len(data))
    return data[:length] if length is not None else data


def probe(seq: int, send_ts: int) -> bytes:
    return frame(1, stream=PROBE_STREAM_ID, send_ts=send_ts, body=struct.pack(">Q", seq))


class TwinRecorder:
    """Pure-Python twin of _kernels._record_frames (one dict per peer)."""

    def __init__(self):
        self.peers = {}

    def record(self, data: bytes, peer: int, recv_ts: int):
        if len(data) < 32 or data[0] != 0x54 or data[1] != 0x57 or data[2] != 1:
            return
        p = self.peers.setdefault(peer, {
            "frames": 0, "messages": 0, "bytes": 0, "lat_count": 0, "lat_negative": 0,
            "lat_overflow": 0, "min": None, "max": None, "expected": 0, "lost": 0, "late": 0,
            "naks": 0, "retx": 0, "buckets": {}, "jitter": 0.0, "last": None, "next": -1})
        if data[3] == 1 and data[5] & 1 and not int.from_bytes(data[20:24], "big") >> 31:
            return  # a plain DATA frame that kept its trailer: refused by the frame MAC
        p["frames"] += 1
        p["bytes"] += len(data)
        ftype = data[3]
        if ftype == 7:
            p["naks"] += 1
            return
        if ftype not in (1, 8):
            return
        msgs = int.from_bytes(data[6:8], "big")
        p["messages"] += msgs
        if ftype == 8:
            p["retx"] += msgs
        elif msgs == 0 and len(data) >= 40 and int.from_bytes(data[20:24], "big") == \
                PROBE_STREAM_ID:
            seq = int.from_bytes(data[32:40], "big")
            nxt = p["next"]
            if nxt < 0 or seq >= nxt or nxt - seq > PROBE_RESTART_GAP:
                gap = seq - nxt if nxt >= 0 and seq >= nxt else 0
                p["expected"] += gap + 1
                p["lost"] += gap
                p["next"] = seq + 1
            else:
                p["late"] += 1
        sent = int.from_bytes(data[24:32], "big")
        if sent <= 0 or sent >= 1 << 63:
            return
        transit = recv_ts - sent
        p["min"] = transit if p["min"] is None else min(p["min"], transit)
        p["max"] = transit if p["max"] is None else max(p["max"], transit)
        if transit < 0:
            p["lat_negative"] += 1
        elif twin_bucket(transit) >= LATENCY_BUCKETS:
            p["lat_overflow"] += 1
        else:
            b = twin_bucket(transit)
            p["buckets"][b] = p["buckets"].get(b, 0) + 1
            p["lat_count"] += 1
        if p["last"] is not None:
            p["jitter"] += (abs(transit - p["last"]) - p["jitter"]) / 16
        p["last"] = transit


def test_bucket_layout_matches_its_documented_formula_and_edges():
    rng = np.random.default_rng(1)
    values = np.concatenate([
        np.arange(0, 5000),
        (1 << np.arange(0, 37)) - 1, 1 << np.arange(0, 37), (1 << np.arange(0, 37)) + 1,
        rng.integers(0, LATENCY_MAX_NS * 2, 20_000),
    ]).astype(np.int64)
    got = bucket_index(values)
    assert got.tolist() == [twin_bucket(int(v)) for v in values]
    inside = got < LATENCY_BUCKETS
    lo, hi = bucket_bounds(got[inside])
    assert np.all(lo <= values[inside]) and np.all(values[inside] < hi)
    # contiguous edges, widths at most 1/16 of the lower edge past the linear range
    lo, hi = bucket_bounds(np.arange(LATENCY_BUCKETS))
    assert lo[0] == 0 and np.all(hi[:-1] == lo[1:]) and hi[-1] == LATENCY_MAX_NS
    assert np.all((hi - lo)[16:] * 16 <= lo[16:])
    assert bucket_index(np.array([LATENCY_MAX_NS - 1, LATENCY_MAX_NS])).tolist() == [
        LATENCY_BUCKETS - 1, LATENCY_BUCKETS]


def test_sparse_buckets_count_every_sample_once():
    lat = np.array([0, 63, 64, 1_000, 1_000, 5_000_000, LATENCY_MAX_NS + 5])
    buckets, counts, overflow = sparse_buckets(lat)
    assert buckets.tolist() == sorted({twin_bucket(int(v)) for v in lat[:-1]})
    assert counts.sum() == 6 and overflow == 1
    assert dict(zip(buckets.tolist(), counts.tolist()))[twin_bucket(1_000)] == 2


def random_frames(rng, n):
    """Frames of every kind the kernel tells apart, from a few peers, plus garbage."""
    now = 1_700_000_000_000_000_000
    out = []
    seqs = {p: 0 for p in range(6)}
    for _ in range(n):
        peer = int(rng.integers(0, 6))
        recv = now + int(rng.integers(0, 10**9))
        kind = int(rng.integers(0, 11))
        lat = int(rng.choice([rng.integers(0, 2000), rng.integers(0, 10**8),
                              -int(rng.integers(1, 10**6)), LATENCY_MAX_NS + 7]))
        if kind == 0:
            data = frame(1, msgs=int(rng.integers(1, 20)), send_ts=recv - lat, body=bytes(40))
        elif kind == 1:
            data = frame(8, msgs=int(rng.integers(1, 5)), send_ts=recv - lat, body=bytes(16))
        elif kind == 2:
            data = frame(7, body=bytes(16))
        elif kind == 3:  # probes: mostly in order, some gaps, some late, some restarts
            step = int(rng.choice([1, 1, 1, 3, -2, -(PROBE_RESTART_GAP + 10)]))
            seqs[peer] = max(seqs[peer] + step, 0)
            data = probe(seqs[peer], recv - lat)
        elif kind == 4:
            data = frame(3, send_ts=recv - lat)           # heartbeat: counted, not timed
        elif kind == 5:
            data = frame(1, msgs=2, send_ts=0, body=bytes(8))  # unstamped: not timed
        elif kind == 6:
            data = bytes(rng.integers(0, 256, int(rng.integers(0, 64)), dtype=np.uint8))
        elif kind == 7:
            data = frame(1, msgs=1, send_ts=recv - lat, body=bytes(8), length=20)  # short
        elif kind == 8:
            data = frame(1, msgs=1, send_ts=(1 << 63) + 5, body=bytes(8))  # sign bit set
        else:  # with the trailer flag: refused by the frame MAC (plain), or a reliable stream's
            data = bytearray(frame(1, msgs=1, send_ts=recv - lat, body=bytes(40),
                                   stream=5 if kind == 9 else 0x8000_0005))
            data[5] |= 1
            data = bytes(data)
        out.append((data, peer * 7919 + 3, recv))
    return out


def feed(recorder, frames, batch_size):
    batch = FrameBatch(batch_size, 256)
    for i in range(0, len(frames), batch_size):
        batch.clear()
        for data, peer, recv in frames[i:i + batch_size]:
            slot = batch.append(data[:256], peer)
            batch.recv_ts_ns[slot] = recv
            batch.lengths[slot] = len(data[:256])
        recorder.on_batch(batch)


@pytest.mark.parametrize("seed", range(6))
def test_recording_kernel_matches_its_pure_python_twin(seed):
    rng = np.random.default_rng(seed)
    frames = random_frames(rng, 600)
    rec = WindowRecorder("a", "fabric", max_peers=8)
    feed(rec, frames, int(rng.integers(1, 64)))
    twin = TwinRecorder()
    for data, peer, recv in frames:
        twin.record(data[:256], peer, recv)
    assert rec.untracked_frames == 0
    for peer, p in twin.peers.items():
        slot = int(np.flatnonzero(rec.keys == peer)[0])
        st = rec.stats[slot]
        assert (st[k.FRAMES], st[k.MESSAGES], st[k.BYTES]) == (p["frames"], p["messages"],
                                                                p["bytes"])
        assert (st[k.LAT_COUNT], st[k.LAT_NEGATIVE], st[k.LAT_OVERFLOW]) == (
            p["lat_count"], p["lat_negative"], p["lat_overflow"])
        assert (st[k.EXPECTED], st[k.LOST], st[k.LATE]) == (p["expected"], p["lost"], p["late"])
        assert (st[k.NAKS], st[k.RETRANSMISSIONS]) == (p["naks"], p["retx"])
        if p["min"] is not None:
            assert (st[k.LAT_MIN], st[k.LAT_MAX]) == (p["min"], p["max"])
        nz = np.flatnonzero(rec.counts[slot])
        assert dict(zip(nz.tolist(), rec.counts[slot][nz].tolist())) == p["buckets"]
        assert rec.jitter[slot] == pytest.approx(p["jitter"], rel=1e-12, abs=1e-9)
    assert len(twin.peers) == int(np.count_nonzero(rec.keys != k.EMPTY))


def test_a_full_peer_table_counts_the_frames_it_cannot_track():
    rec = WindowRecorder("a", "fabric", max_peers=2)
    frames = [(frame(1, msgs=1, send_ts=10, body=bytes(8)), peer, 100) for peer in (1, 2, 3, 3)]
    feed(rec, frames, 4)
    assert rec.untracked_frames == 2
    assert sorted(rec.keys.tolist()) == [1, 2]


def test_windows_close_on_wall_clock_boundaries_and_start_afresh():
    w = 1_000_000_000
    t0 = 1_700_000_000 * w + 250_000_000
    rec = WindowRecorder("core2", "fabric", window_ns=w, now_ns=t0)
    assert rec.window_start_ns == t0 - 250_000_000
    feed(rec, [(frame(1, msgs=3, send_ts=t0, body=bytes(8)), 11, t0 + 40_000),
               (probe(0, t0), 11, t0 + 30_000), (probe(2, t0), 11, t0 + 50_000),
               (frame(1, msgs=1, send_ts=t0, body=bytes(8)), 99, t0 + 1)], 8)
    assert rec.close_if_due(t0 + 500_000_000, {11: "core1"}) is None
    closed = rec.close_if_due(t0 + 2_100_000_000, {11: "core1"})
    assert closed.neighbours == ("core1",) and rec.unnamed_windows == 1
    assert closed.window_start_ns == t0 - 250_000_000 and closed.window_ns == 2 * w
    row = windows_table([closed]).to_pylist()[0]
    assert row["appliance"] == "core2" and row["channel"] == "fabric"
    assert (row["frames"], row["messages"], row["lat_count"]) == (3, 3, 3)
    assert (row["expected"], row["lost"]) == (3, 1)
    assert (row["lat_min_ns"], row["lat_max_ns"]) == (30_000, 50_000)
    assert sum(row["lat_counts"]) == 3
    assert row["lat_buckets"] == sorted({twin_bucket(v) for v in (30_000, 40_000, 50_000)})
    # the next window starts empty (jitter and probe sequence carry on)
    assert rec.window_start_ns == t0 - 250_000_000 + 2 * w
    assert rec.close_if_due(t0 + 3_000_000_000, {11: "core1"}) is None
    feed(rec, [(probe(3, t0), 11, t0 + 30_000)], 1)
    row = windows_table([rec.close_if_due(t0 + 4_000_000_000, {11: "core1"})]).to_pylist()[0]
    assert (row["frames"], row["expected"], row["lost"], row["lat_count"]) == (1, 1, 0, 1)


def test_a_window_without_a_timed_frame_stores_no_buckets_and_zero_extremes():
    rec = WindowRecorder("a", "fabric", window_ns=10, now_ns=0)
    feed(rec, [(frame(7, body=bytes(8)), 5, 3)], 1)
    table = windows_table([rec.close_if_due(10, {5: "b"})])
    assert table.schema == WINDOW_SCHEMA
    row = table.to_pylist()[0]
    assert row["naks"] == 1 and row["lat_buckets"] == [] and row["lat_min_ns"] == 0


def test_recorder_times_frames_that_crossed_a_real_udp_socket():
    from channels.udp import UdpChannel

    with UdpChannel(("127.0.0.1", 0)) as rx, UdpChannel(("127.0.0.1", 0)) as tx:
        out = FrameBatch(8, 256)
        for seq in range(5):
            out.append(probe(seq, 0))  # the channel stamps send_ts_ns
        assert tx.send(out, rx.local_address) == 5
        rec = WindowRecorder("rx", "fabric", now_ns=time.time_ns())
        got = FrameBatch(8, 256)
        deadline = time.monotonic() + 5
        n = 0
        while n < 5 and time.monotonic() < deadline:
            got.clear()
            m = rx.receive(got, 100_000_000)
            rec.on_batch(got)
            n += m
        assert n == 5
        peer = int(got.peer_ids[0])
        closed = rec.close_if_due(rec.window_end_ns, {peer: "tx"})
        row = windows_table([closed]).to_pylist()[0]
        assert (row["frames"], row["expected"], row["lost"], row["lat_count"]) == (5, 5, 0, 5)
        assert 0 < row["lat_min_ns"] <= row["lat_max_ns"] < 5_000_000_000
