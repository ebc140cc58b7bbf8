"""The channel rows of the status snapshot: the data path copies, the control thread computes.

Walking a latency histogram is too slow for the data-path thread: hdrh's
``get_value_at_percentile`` is a Python loop over the buckets below the percentile (about
12,000 for latencies in milliseconds, ~2 ms per percentile and channel), and the data path
publishes every ``STATUS_REFRESH_NS``. So the data path only takes a ``ChannelSample`` per
channel (its counters, the used part of its histogram's counts array, the largest peer
jitter: a few microseconds), and the control thread turns samples into the rows of the
status contract (docs/appliance.md) with ``channel_rows``: one numpy cumulative sum per
channel (``latency_ns_at``, the array twin of ``HdrHistogram.get_value_at_percentile``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram


@dataclass(frozen=True)
class ChannelSample:
    """One channel's figures as the data path copied them (nothing here is shared)."""

    name: str
    kind: str
    frames_in: int
    frames_out: int
    bytes_in: int
    bytes_out: int
    loss: int
    naks: int
    retransmissions: int
    jitter_max_ns: float
    latency_counts: np.ndarray
    """A copy of the histogram's counts up to the bucket of the largest value recorded."""
    latency_total: int
    histogram: tuple[int, int, int]
    """The channel histogram's (lowest, highest trackable value, significant figures): its
    bucket arithmetic (a sample crosses from a data path in a process of its own as plain
    data)."""


def sample_channel(name: str, channel: Any) -> ChannelSample:
    """Copy what the status row of ``channel`` needs (on the thread that owns its stats)."""
    s = channel.stats
    h = s.latency
    total = h.get_total_count()
    used = h.get_counts_array_index(h.get_max_value()) + 1 if total else 0
    counts = np.ctypeslib.as_array(h.counts)[:used].copy()
    jitter = s.jitter_by_peer()
    return ChannelSample(
        name=name, kind=channel.kind, frames_in=s.frames_in, frames_out=s.frames_out,
        bytes_in=s.bytes_in, bytes_out=s.bytes_out, loss=s.lost + s.drops, naks=s.naks,
        retransmissions=s.retransmissions, jitter_max_ns=max(jitter.values(), default=0.0),
        latency_counts=counts, latency_total=total,
        histogram=(h.lowest_trackable_value, h.highest_trackable_value, h.significant_figures))


@functools.lru_cache(maxsize=8)
def _arithmetic(params: tuple[int, int, int]) -> HdrHistogram:
    """An empty histogram with the bucket layout ``params`` (only its arithmetic is used)."""
    return HdrHistogram(*params)


def latency_ns_at(sample: ChannelSample, percentile: float) -> int:
    """The value ``HdrHistogram.get_value_at_percentile`` gives for the copied counts; 0 when
    nothing was recorded."""
    total = sample.latency_total
    counts = sample.latency_counts
    if total == 0 or len(counts) == 0:
        return 0
    h = _arithmetic(sample.histogram)
    target = max(int(min(percentile, 100.0) * total / 100 + 0.5), 1)
    index = min(int(np.searchsorted(np.cumsum(counts), target)), len(counts) - 1)
    value = h.get_value_from_index(index)
    if percentile:
        return int(h.get_highest_equivalent_value(value))
    return int(h.get_lowest_equivalent_value(value))


def channel_row(sample: ChannelSample) -> dict[str, Any]:
    """The status contract's row for one channel."""
    return {"name": sample.name, "kind": sample.kind, "frames_in": sample.frames_in,
            "frames_out": sample.frames_out, "bytes_in": sample.bytes_in,
            "bytes_out": sample.bytes_out, "loss": sample.loss, "naks": sample.naks,
            "retransmissions": sample.retransmissions,
            "p50_us": latency_ns_at(sample, 50) / 1e3, "p99_us": latency_ns_at(sample, 99) / 1e3,
            "jitter_us": sample.jitter_max_ns / 1e3}


def channel_rows(samples: list[ChannelSample]) -> list[dict[str, Any]]:
    """``channel_row`` of each sample, in order (the control thread)."""
    return [channel_row(s) for s in samples]
