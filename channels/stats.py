"""Per-channel statistics: frame/byte counters, drops, latency and frame-size histograms,
per-peer jitter.

``ChannelStats.on_receive`` takes a whole received batch: one numba kernel reads each frame's
``send_ts_ns`` (header bytes 24..31), records ``recv_ts_ns - send_ts_ns`` into the HdrHistogram's
own counts array (``_record_latency``, the vectorized twin of ``HdrHistogram.record_value``),
counts the frame's length in a power-of-two size histogram (``size_counts[i]``: frames of at
most ``2**i`` bytes and more than ``2**(i-1)``; the last slot also holds every larger one) and
updates the RFC 3550 interarrival jitter of the frame's peer (``J += (|D| - J) / 16`` with
``D`` the change in transit time between consecutive frames of that peer) in a small
open-addressing table of arrays. No Python runs per frame.

Only frames whose header says ``TW`` v1 and whose ``send_ts_ns`` is nonzero are timed; a
latency below 0 (clock skew between hosts) or above ``LATENCY_HIGHEST_NS`` is counted in
``latency_out_of_range`` instead. Loss, NAKs and retransmissions are counted by the
reliability layer through ``on_loss``/``on_nak``/``on_retransmission``. One thread updates a
channel's stats (the channel's owner); readers take ``snapshot()``.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from hdrh.histogram import HdrHistogram

from datapath.protocol import frame_layout as fl
from datapath.protocol.errors import MalformedReason

LATENCY_LOWEST_NS = 1
"""Smallest latency the histogram tells apart from 0."""
LATENCY_HIGHEST_NS = 60_000_000_000
"""Largest latency the histogram records (60 s); above is counted as out of range."""
LATENCY_SIGNIFICANT_DIGITS = 3
"""HdrHistogram precision (0.1 % of the value)."""
JITTER_MAX_PEERS = 4_096
"""Peers whose jitter is tracked per channel (a power of two); further peers are counted in
``jitter_peers_untracked``."""
JITTER_GAIN_SHIFT = 4
"""RFC 3550's 1/16 gain, as a shift."""
SIZE_BUCKETS = 25
"""Slots of the received frame-size histogram: slot ``i`` counts frames of at most ``2**i``
bytes (and more than half that); slot 24 (16 MiB) also counts every larger frame."""

_EMPTY = np.iinfo(np.int64).min
_MAGIC_HI = fl.FRAME_MAGIC >> 8
_MAGIC_LO = fl.FRAME_MAGIC & 0xFF


@numba.njit(cache=True, nogil=True)
def _bit_length(v: int) -> int:
    n = 0
    while v >= 65536:
        v >>= 16
        n += 16
    while v:
        v >>= 1
        n += 1
    return n


@numba.njit(cache=True, nogil=True)
def _counts_index(value: int, sub_bucket_mask: int, unit_magnitude: int,
                  sub_bucket_half_count_magnitude: int, sub_bucket_half_count: int) -> int:
    """``HdrHistogram._counts_index_for`` in numba (same arithmetic)."""
    pow2ceiling = _bit_length(value | sub_bucket_mask)
    bucket_index = pow2ceiling - unit_magnitude - (sub_bucket_half_count_magnitude + 1)
    sub_bucket_index = value >> (bucket_index + unit_magnitude)
    return ((bucket_index + 1) << sub_bucket_half_count_magnitude) + (
        sub_bucket_index - sub_bucket_half_count)


@numba.njit(cache=True, nogil=True)
def _record_latency(buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                    peer_ids: np.ndarray, recv_ts_ns: np.ndarray, count: int,
                    counts: np.ndarray, highest: int, sub_bucket_mask: int, unit_magnitude: int,
                    shcm: int, sub_bucket_half_count: int, keys: np.ndarray,
                    last_transit: np.ndarray, jitter: np.ndarray, sizes: np.ndarray,
                    out: np.ndarray) -> None:
    """Record latency, size and jitter of ``count`` frames; ``out`` = [recorded, min, max,
    out_of_range, untracked_peers, bytes] (min/max only meaningful when recorded > 0)."""
    recorded = 0
    nbytes = 0
    lo = np.iinfo(np.int64).max
    hi = 0
    bad = 0
    untracked = 0
    mask = len(keys) - 1
    counts_len = len(counts)
    last_size = len(sizes) - 1
    for i in range(count):
        nbytes += lengths[i]
        size_slot = _bit_length(lengths[i] - 1) if lengths[i] > 1 else 0
        sizes[min(size_slot, last_size)] += 1
        if lengths[i] < 32:
            continue
        o = offsets[i]
        if buf[o] != _MAGIC_HI or buf[o + 1] != _MAGIC_LO or buf[o + 2] != 1:
            continue
        sent = np.int64(0)
        for b in range(8):
            sent = (sent << 8) | np.int64(buf[o + 24 + b])
        if sent <= 0:
            continue
        transit = recv_ts_ns[i] - sent
        if transit < 0 or transit > highest:
            bad += 1
        else:
            idx = _counts_index(transit, sub_bucket_mask, unit_magnitude, shcm,
                                sub_bucket_half_count)
            if 0 <= idx < counts_len:
                counts[idx] += 1
                recorded += 1
                if transit < lo:
                    lo = transit
                if transit > hi:
                    hi = transit
            else:
                bad += 1
        # RFC 3550 interarrival jitter of this peer (transit may be negative across hosts:
        # only its changes matter).
        key = peer_ids[i]
        h = (key * np.int64(-7046029254386353131)) >> 40
        slot = h & mask
        found = False
        for _ in range(len(keys)):
            k = keys[slot]
            if k == key or k == _EMPTY:
                found = True
                break
            slot = (slot + 1) & mask
        if not found:
            untracked += 1
            continue
        if keys[slot] == _EMPTY:
            keys[slot] = key
            last_transit[slot] = transit
            continue
        d = transit - last_transit[slot]
        if d < 0:
            d = -d
        jitter[slot] += (d - jitter[slot]) / (1 << JITTER_GAIN_SHIFT)
        last_transit[slot] = transit
    out[0] = recorded
    out[1] = lo
    out[2] = hi
    out[3] = bad
    out[4] = untracked
    out[5] = nbytes


class ChannelStats:
    """Counters of one channel; the owner thread updates, anyone reads ``snapshot()``."""

    def __init__(self, name: str = "channel") -> None:
        self.name = name
        self.latency = HdrHistogram(LATENCY_LOWEST_NS, LATENCY_HIGHEST_NS,
                                    LATENCY_SIGNIFICANT_DIGITS)
        self._counts = np.ctypeslib.as_array(self.latency.counts)
        self._keys = np.full(JITTER_MAX_PEERS, _EMPTY, dtype=np.int64)
        self._last_transit = np.zeros(JITTER_MAX_PEERS, dtype=np.int64)
        self._jitter = np.zeros(JITTER_MAX_PEERS, dtype=np.float64)
        self._out = np.zeros(6, dtype=np.int64)
        self.malformed_by_reason = np.zeros(max(MalformedReason) + 1, dtype=np.int64)
        self.drop_reasons: dict[str, int] = {}
        self.error_reasons: dict[str, int] = {}
        self.reset_counters()

    def reset_counters(self) -> None:
        self.size_counts = np.zeros(SIZE_BUCKETS, dtype=np.int64)
        """Received frames by size (see ``SIZE_BUCKETS``); sums to ``frames_in``."""
        self.frames_in = 0
        self.bytes_in = 0
        self.frames_out = 0
        self.bytes_out = 0
        self.drops = 0
        """Frames the channel received but could not deliver (truncated, torn, oversized)."""
        self.errors = 0
        """Failed system calls that the channel survived."""
        self.backpressure = 0
        """Frames ``send`` could not take because the socket buffer or ring was full."""
        self.malformed = 0
        """Frames the decoder rejected (``on_malformed``), by reason in ``malformed_by_reason``."""
        self.naks = 0
        self.retransmissions = 0
        self.lost = 0
        """Messages declared unrecoverable by the reliability layer."""
        self.latency_out_of_range = 0
        self.jitter_peers_untracked = 0

    # --- called by channels -----------------------------------------------------------------
    def on_receive(self, buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                   peer_ids: np.ndarray, recv_ts_ns: np.ndarray, count: int) -> None:
        """Count ``count`` received frames and record their latency and jitter."""
        if count <= 0:
            return
        self.frames_in += count
        h = self.latency
        out = self._out
        _record_latency(buf, offsets, lengths, peer_ids, recv_ts_ns, count, self._counts,
                        LATENCY_HIGHEST_NS, h.sub_bucket_mask, h.unit_magnitude,
                        h.sub_bucket_half_count_magnitude, h.sub_bucket_half_count,
                        self._keys, self._last_transit, self._jitter, self.size_counts, out)
        self.bytes_in += int(out[5])
        recorded = int(out[0])
        if recorded:
            h.total_count += recorded
            h.min_value = min(h.min_value, int(out[1]))
            h.max_value = max(h.max_value, int(out[2]))
        self.latency_out_of_range += int(out[3])
        self.jitter_peers_untracked += int(out[4])

    def on_batch_received(self, batch: Any) -> None:
        """``on_receive`` over a ``FrameBatch``'s first ``count`` frames."""
        self.on_receive(batch.buf, batch.offsets, batch.lengths, batch.peer_ids,
                        batch.recv_ts_ns, batch.count)

    def on_send(self, frames: int, nbytes: int) -> None:
        self.frames_out += frames
        self.bytes_out += nbytes

    def on_backpressure(self, frames: int) -> None:
        self.backpressure += frames

    def on_drop(self, reason: str, count: int = 1) -> None:
        self.drops += count
        self.drop_reasons[reason] = self.drop_reasons.get(reason, 0) + count

    def on_error(self, reason: str, count: int = 1) -> None:
        self.errors += count
        self.error_reasons[reason] = self.error_reasons.get(reason, 0) + count

    # --- called by the data path / reliability layer -----------------------------------------
    def on_malformed(self, status: np.ndarray, frames: int) -> int:
        """Count the decoder's verdicts (``decode_frames``'s status array); returns bad frames."""
        verdicts = np.asarray(status[:frames])
        bad = verdicts[verdicts != 0]
        if bad.size:
            np.add.at(self.malformed_by_reason, bad.astype(np.int64), 1)
            self.malformed += int(bad.size)
        return int(bad.size)

    def on_nak(self, count: int = 1) -> None:
        """NAKs sent (receiver side) or received (sender side) on this channel."""
        self.naks += count

    def on_retransmission(self, count: int = 1) -> None:
        """Messages retransmitted on (or received as retransmissions from) this channel."""
        self.retransmissions += count

    def on_loss(self, count: int) -> None:
        """Messages declared unrecoverable (the reliability layer's LOSS)."""
        self.lost += count

    # --- reading ------------------------------------------------------------------------------
    def jitter_ns(self, peer_id: int) -> float | None:
        """RFC 3550 interarrival jitter of one peer, in ns; None if never seen."""
        hit = np.nonzero(self._keys == peer_id)[0]
        return float(self._jitter[hit[0]]) if hit.size else None

    def jitter_by_peer(self) -> dict[int, float]:
        used = self._keys != _EMPTY
        return {int(k): float(j) for k, j in zip(self._keys[used], self._jitter[used])}

    def latency_ns_at(self, percentile: float) -> int:
        """Latency at ``percentile`` (0..100) in ns; 0 when nothing was recorded."""
        if self.latency.get_total_count() == 0:
            return 0
        return int(self.latency.get_value_at_percentile(percentile))

    def snapshot(self) -> dict[str, Any]:
        """Every figure as plain numbers (telemetry, management API)."""
        malformed = {MalformedReason(i).name.lower(): int(n)
                     for i, n in enumerate(self.malformed_by_reason) if n}
        jitters = self.jitter_by_peer()
        return {
            "name": self.name,
            "frames_in": self.frames_in, "bytes_in": self.bytes_in,
            "frames_out": self.frames_out, "bytes_out": self.bytes_out,
            "drops": self.drops, "drop_reasons": dict(self.drop_reasons),
            "errors": self.errors, "error_reasons": dict(self.error_reasons),
            "backpressure": self.backpressure,
            "malformed": self.malformed, "malformed_by_reason": malformed,
            "naks": self.naks, "retransmissions": self.retransmissions, "lost": self.lost,
            "latency_count": self.latency.get_total_count(),
            "latency_p50_ns": self.latency_ns_at(50), "latency_p99_ns": self.latency_ns_at(99),
            "latency_p999_ns": self.latency_ns_at(99.9),
            "latency_max_ns": self.latency.get_max_value(),
            "latency_out_of_range": self.latency_out_of_range,
            "jitter_ns_by_peer": jitters,
            "jitter_max_ns": max(jitters.values(), default=0.0),
        }


def warm_up() -> None:
    """Compile/load the recording kernel."""
    buf = np.zeros(64, np.uint8)
    one = np.zeros(1, np.int64)
    ChannelStats().on_receive(buf, one, np.full(1, 64, np.int64), one, one, 1)
