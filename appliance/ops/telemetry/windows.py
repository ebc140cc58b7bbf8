"""Telemetry windows: per path, fixed windows of latency buckets, jitter, loss, throughput.

A *path* is (appliance, neighbour, channel): what ``appliance`` received from ``neighbour``
on ``channel``, i.e. the direction neighbour -> appliance. The receiving end measures it:
every window (``WINDOW_NS``, default 1 s, aligned on the wall clock) closes into one row.

Latency buckets (log-linear, HdrHistogram's scheme with 16 sub-buckets per octave)::

    unit U = 64 ns, S = 16 sub-buckets, E = 26 octaves  ->  S * (E + 1) = 432 buckets

    q = latency_ns // U                    (latency in units)
    e = max(bit_length(q) - 5, 0)          (octave; 5 = log2(S) + 1)
    bucket = 16 * e + (q >> e)

    bucket   0 ..  15 : [  0 ,   16) U   width U        (0 .. 1,024 ns in 64 ns steps)
    bucket  16 ..  31 : [ 16 ,   32) U   width U        (1,024 .. 2,048 ns)
    bucket  32 ..  47 : [ 32 ,   64) U   width 2 U
    bucket  48 ..  63 : [ 64 ,  128) U   width 4 U
      ...
    bucket 16 e + m (m in 16..31, e >= 1) : [m * 2**e, (m + 1) * 2**e) U
    bucket 431        : ends at 2**30 U = 68.7 s; above: ``lat_overflow``

A bucket is at most 1/16 of its lower edge wide, so a percentile interpolated inside its
bucket is within 6.25 % of the true value. Rows keep only non-empty buckets, as two equal
length lists ``lat_buckets`` (int32) and ``lat_counts`` (int64).

Clocks. One-way latency = the receiver's kernel receive timestamp minus the ``send_ts_ns``
the sender's channel stamped, both CLOCK_REALTIME. Appliances on one host (any number of
network namespaces) share that clock, so the figure is exact. Across hosts it is exact up to
the clocks' offset: the supported deployment keeps hosts PTP/NTP synchronised well below the
latency differences routing compares, and the route job's ``--clock relative`` removes each
path's floor (min-offset normalisation) for hosts that are not. A latency below zero (the
sender's clock ahead) is never bucketed: it is counted in ``lat_negative`` and the route job
reports and excludes such windows. Jitter (RFC 3550) uses only differences of transit times,
so a constant offset cancels out of it.

Loss is measured with probes: every appliance sends each neighbour a probe frame every
``PROBE_INTERVAL_NS`` carrying a per-link sequence number (appliance/ops/telemetry/probe.py); the
receiver counts sequence gaps (``lost`` of ``expected``). Probes are timed like data, so an
idle link still has latency samples. NAKs are NAK frames received on the path and
retransmissions the messages of RETRANSMISSION frames received on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from appliance.ops.telemetry import _kernels as k
from appliance.ops.telemetry.config import (
    LATENCY_BUCKETS,
    LATENCY_SUB_BUCKETS,
    LATENCY_UNIT_NS,
    PROBE_RESTART_GAP,
    PROBE_STREAM_ID,
    RECORDER_MAX_PEERS,
    WINDOW_NS,
)

UNIT_SHIFT = LATENCY_UNIT_NS.bit_length() - 1
SUB_SHIFT = LATENCY_SUB_BUCKETS.bit_length() - 1
assert 1 << UNIT_SHIFT == LATENCY_UNIT_NS and 1 << SUB_SHIFT == LATENCY_SUB_BUCKETS
LATENCY_MAX_NS = (2 * LATENCY_SUB_BUCKETS << (LATENCY_BUCKETS // LATENCY_SUB_BUCKETS - 2)) \
    * LATENCY_UNIT_NS
"""Upper edge of the last bucket (68.7 s)."""

WINDOW_SCHEMA = pa.schema([
    ("appliance", pa.string()),        # the receiving appliance (reports the window)
    ("neighbour", pa.string()),        # the sending neighbour
    ("channel", pa.string()),          # the appliance's channel ("fabric", "group:NAME")
    ("window_start_ns", pa.int64()),   # wall clock, a multiple of WINDOW_NS
    ("window_ns", pa.int64()),         # length (a multiple of WINDOW_NS)
    ("frames", pa.int64()),
    ("messages", pa.int64()),
    ("bytes", pa.int64()),
    ("lat_count", pa.int64()),         # samples in the buckets
    ("lat_negative", pa.int64()),      # samples below 0 (clock skew), not bucketed
    ("lat_overflow", pa.int64()),      # samples above LATENCY_MAX_NS, not bucketed
    ("lat_min_ns", pa.int64()),        # over every sample (may be < 0); 0 when none
    ("lat_max_ns", pa.int64()),
    ("lat_buckets", pa.list_(pa.int32())),
    ("lat_counts", pa.list_(pa.int64())),
    ("jitter_ns", pa.float64()),       # RFC 3550 J at the window's end
    ("expected", pa.int64()),          # probes expected (sequence numbers)
    ("lost", pa.int64()),              # of which never arrived
    ("naks", pa.int64()),
    ("retransmissions", pa.int64()),
])
"""One row per (path, window)."""
REQUIRED_COLUMNS = tuple(WINDOW_SCHEMA.names)
PATH_COLUMNS = ("appliance", "neighbour", "channel")


# --- the bucket layout -----------------------------------------------------------------------
def bucket_index(latency_ns: np.ndarray) -> np.ndarray:
    """Bucket of each latency (>= 0, ns); may be >= LATENCY_BUCKETS (overflow)."""
    q = np.asarray(latency_ns, dtype=np.int64) >> UNIT_SHIFT
    e = np.maximum(_bit_length(q) - SUB_SHIFT - 1, 0)
    return (e << SUB_SHIFT) + (q >> e)


def _bit_length(q: np.ndarray) -> np.ndarray:
    out = np.zeros(q.shape, dtype=np.int64)
    nz = q > 0
    out[nz] = np.floor(np.log2(q[nz].astype(np.float64))).astype(np.int64) + 1
    # float log2 can be off by one just below a power of two: correct exactly
    over = nz & ((np.int64(1) << np.maximum(out - 1, 0)) > q)
    out[over] -= 1
    under = nz & ((np.int64(1) << out) <= q)
    out[under] += 1
    return out


def bucket_bounds(bucket: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) edges in ns of each bucket: a latency v is in bucket b when
    lower[b] <= v < upper[b]."""
    b = np.asarray(bucket, dtype=np.int64)
    e = np.maximum((b >> SUB_SHIFT) - 1, 0)
    m = b - (e << SUB_SHIFT)
    return (m << e) * LATENCY_UNIT_NS, ((m + 1) << e) * LATENCY_UNIT_NS


# --- the recorder ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ClosedWindows:
    """What one recorder's window close hands to the writer (arrays it owns)."""

    appliance: str
    channel: str
    window_start_ns: int
    window_ns: int
    neighbours: tuple[str, ...]
    stats: np.ndarray
    """(paths, STATS) int64, the kernel's columns."""
    counts: np.ndarray
    """(paths, LATENCY_BUCKETS) int64."""
    jitter_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.neighbours)


class WindowRecorder:
    """Windows of one channel of one appliance, per peer; the data-path thread only.

    ``on_batch`` runs the kernel ``_kernels._record_frames`` over a received batch;
    ``close_if_due(now_ns, names)`` closes the window when the wall clock has passed its end
    and returns a ``ClosedWindows`` (peers named by ``names``: peer id -> neighbour; peers not
    in it are left out and counted in ``unnamed_windows``), else None.
    """

    def __init__(self, appliance: str, channel: str, *, window_ns: int = WINDOW_NS,
                 max_peers: int = RECORDER_MAX_PEERS, now_ns: int = 0) -> None:
        if max_peers & (max_peers - 1) or window_ns <= 0:
            raise ValueError("telemetry: max_peers must be a power of two and window_ns > 0")
        self.appliance = appliance
        self.channel = channel
        self.window_ns = window_ns
        self.keys = np.full(max_peers, k.EMPTY, dtype=np.int64)
        self.counts = np.zeros((max_peers, LATENCY_BUCKETS), dtype=np.int64)
        self.stats = np.zeros((max_peers, k.STATS), dtype=np.int64)
        self.jitter = np.zeros(max_peers, dtype=np.float64)
        self.last_transit = np.full(max_peers, k.EMPTY, dtype=np.int64)
        self.next_seq = np.full(max_peers, -1, dtype=np.int64)
        self._reset(np.arange(max_peers))
        self.window_start_ns = now_ns - now_ns % window_ns
        self.window_end_ns = self.window_start_ns + window_ns
        self.untracked_frames = 0
        self.unnamed_windows = 0

    def _reset(self, rows: np.ndarray) -> None:
        self.counts[rows] = 0
        self.stats[rows] = 0
        self.stats[rows, k.LAT_MIN] = k.NO_MIN
        self.stats[rows, k.LAT_MAX] = k.NO_MAX

    def on_receive(self, buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                   peer_ids: np.ndarray, recv_ts_ns: np.ndarray, count: int) -> None:
        """Record ``count`` received frames (kernel ``_record_frames``)."""
        if count > 0:
            self.untracked_frames += k._record_frames(
                buf, offsets, lengths, peer_ids, recv_ts_ns, count, self.keys, self.counts,
                self.stats, self.jitter, self.last_transit, self.next_seq, PROBE_STREAM_ID,
                PROBE_RESTART_GAP, UNIT_SHIFT, SUB_SHIFT)

    def on_batch(self, batch: object) -> None:
        """``on_receive`` over a ``FrameBatch``'s first ``count`` frames."""
        self.on_receive(batch.buf, batch.offsets, batch.lengths,  # type: ignore[attr-defined]
                        batch.peer_ids, batch.recv_ts_ns, batch.count)  # type: ignore[attr-defined]

    def close_if_due(self, now_ns: int, names: Mapping[int, str]) -> ClosedWindows | None:
        """Close the window if ``now_ns`` (wall clock) is past its end; see the class."""
        if now_ns < self.window_end_ns:
            return None
        start = self.window_start_ns
        end = now_ns - now_ns % self.window_ns
        self.window_start_ns = end
        self.window_end_ns = end + self.window_ns
        used = np.flatnonzero((self.keys != k.EMPTY) & (self.stats[:, k.FRAMES] > 0))
        named = [int(s) for s in used if int(self.keys[s]) in names]
        self.unnamed_windows += len(used) - len(named)
        rows = np.asarray(named, dtype=np.int64)
        closed = ClosedWindows(
            self.appliance, self.channel, start, end - start,
            tuple(names[int(self.keys[s])] for s in named),
            self.stats[rows].copy(), self.counts[rows].copy(), self.jitter[rows].copy())
        self._reset(used)
        return closed if len(closed) else None


# --- to Arrow ----------------------------------------------------------------------------------
def windows_table(closed: list[ClosedWindows]) -> pa.Table:
    """The rows of closed windows as one table of ``WINDOW_SCHEMA``."""
    cols: dict[str, list] = {name: [] for name in WINDOW_SCHEMA.names}
    for c in closed:
        n = len(c)
        st = c.stats
        cols["appliance"] += [c.appliance] * n
        cols["neighbour"] += list(c.neighbours)
        cols["channel"] += [c.channel] * n
        cols["window_start_ns"] += [c.window_start_ns] * n
        cols["window_ns"] += [c.window_ns] * n
        for name, col in (("frames", k.FRAMES), ("messages", k.MESSAGES), ("bytes", k.BYTES),
                          ("lat_count", k.LAT_COUNT), ("lat_negative", k.LAT_NEGATIVE),
                          ("lat_overflow", k.LAT_OVERFLOW), ("expected", k.EXPECTED),
                          ("lost", k.LOST), ("naks", k.NAKS),
                          ("retransmissions", k.RETRANSMISSIONS)):
            cols[name] += st[:, col].tolist()
        timed = st[:, k.LAT_MIN] != k.NO_MIN
        cols["lat_min_ns"] += np.where(timed, st[:, k.LAT_MIN], 0).tolist()
        cols["lat_max_ns"] += np.where(timed, st[:, k.LAT_MAX], 0).tolist()
        for row in c.counts:
            nz = np.flatnonzero(row)
            cols["lat_buckets"].append(nz.astype(np.int32))
            cols["lat_counts"].append(row[nz])
        cols["jitter_ns"] += c.jitter_ns.tolist()
    return pa.table({name: pa.array(values, type=WINDOW_SCHEMA.field(name).type)
                     for name, values in cols.items()}, schema=WINDOW_SCHEMA)


def sparse_buckets(latency_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(buckets, counts, overflow) of latencies >= 0: what a window stores for them."""
    b = bucket_index(latency_ns)
    overflow = int(np.count_nonzero(b >= LATENCY_BUCKETS))
    buckets, counts = np.unique(b[b < LATENCY_BUCKETS], return_counts=True)
    return buckets.astype(np.int32), counts.astype(np.int64), overflow
