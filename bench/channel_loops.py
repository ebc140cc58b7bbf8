"""The measuring loops of the channel benchmark, one for every channel kind (UDP, multicast,
shared memory, RDMA): send all, count what came, echo, ping-pong, and the figures from them.
``bench.channel`` and ``bench.channel_rdma`` both run them."""

from __future__ import annotations

import argparse
import time
from typing import Any

from datapath.errors import DeviceError

BENCH_BATCH_FRAMES = 64
WARMUP_PINGS = 500
RECEIVE_IDLE_END_NS = 500_000_000
"""The throughput receiver stops after this long without a frame."""
CHILD_START_TIMEOUT_S = 60.0
STOP_STREAM_ID = 0xFFFF_FFFF
"""A ping with this stream id tells the echoing child to stop."""
_COMPONENT = "bench"


def _bench_batch(count: int, size: int, stream_id: int = 1):  # noqa: ANN202 - FrameBatch
    from channels.base import FrameBatch
    from datapath.protocol import frame_layout as fl

    batch = FrameBatch(count, max(size, 64))
    header = fl.FRAME_HEADER_STRUCT.pack(fl.FRAME_MAGIC, fl.PROTOCOL_VERSION, fl.FrameType.DATA,
                                         0, 1, size, 1, 0, stream_id, 0)
    frame = header + bytes(size - len(header))
    for _ in range(count):
        batch.append(frame)
    return batch


def count_frames(channel: Any, batch: Any, messages: int,
                 idle_end_ns: int = RECEIVE_IDLE_END_NS) -> dict[str, int]:
    """Receive until ``messages`` frames came or none for ``idle_end_ns``: how many, and when
    the last one came (CLOCK_MONOTONIC, the sender's clock too)."""
    received, last = 0, 0
    while received < messages:
        n = channel.receive(batch, idle_end_ns if received else
                            int(CHILD_START_TIMEOUT_S * 1e9))
        if not n:
            break
        received += n
        last = time.monotonic_ns()
    return {"received": received, "last_ns": last}


def echo(channel: Any, batch: Any, dest: Any, spin: bool) -> dict[str, int]:
    """Send every batch back until the stop ping; the channel's own one-way figures."""
    while True:
        if not _receive(channel, batch, int(CHILD_START_TIMEOUT_S * 1e9), spin):
            break
        if int.from_bytes(bytes(batch.frame(0)[20:24]), "big") == STOP_STREAM_ID:
            break
        channel.send(batch, dest)
    stats = channel.stats
    return {"header_p50_ns": stats.latency_ns_at(50), "header_p99_ns": stats.latency_ns_at(99)}


def _receive(channel: Any, batch: Any, timeout_ns: int, spin: bool) -> int:
    """One receive that waits up to ``timeout_ns``: in ``poll`` or, with ``spin``, busy."""
    if not spin:
        return channel.receive(batch, timeout_ns)
    deadline = time.monotonic_ns() + timeout_ns
    while True:
        n = channel.receive(batch, 0)
        if n or time.monotonic_ns() > deadline:
            return n


def send_all(channel: Any, dest: Any, args: argparse.Namespace) -> tuple[int, int, int]:
    """Send ``args.messages`` frames in batches as fast as the channel takes them:
    (sent, start ns, elapsed ns)."""
    batch = _bench_batch(args.batch, args.size)
    sent = 0
    start = time.monotonic_ns()
    while sent < args.messages:
        batch.count = min(args.batch, args.messages - sent)
        taken = channel.send(batch, dest)
        sent += taken
        if taken < batch.count:
            time.sleep(0)
    return sent, start, max(time.monotonic_ns() - start, 1)


def throughput_figures(sent: int, start: int, elapsed: int, got: dict) -> dict[str, float]:
    """Receiver's rate (first send to last frame received), sender's rate, frames lost."""
    span = max(got["last_ns"] - start, 1)
    received = got["received"]
    return {"msgs_per_s": received * 1e9 / span,
            "sent_msgs_per_s": sent * 1e9 / elapsed, "lost": float(sent - received)}


def ping_pong(channel: Any, dest: Any, args: argparse.Namespace, *,
              warmup: int = WARMUP_PINGS) -> Any:
    """Ping-pong one frame at a time for ``args.duration_s`` after ``warmup`` pings; the
    HdrHistogram of half round trips (ns). Ends with the stop ping."""
    from hdrh.histogram import HdrHistogram

    from channels.base import FrameBatch

    ping = _bench_batch(1, args.size)
    pong = FrameBatch(BENCH_BATCH_FRAMES, max(args.size, 64))
    histogram = HdrHistogram(1, 60_000_000_000, 3)
    timeout_ns = int(CHILD_START_TIMEOUT_S * 1e9) // 10
    end = None
    pings = 0
    while end is None or time.perf_counter_ns() < end:
        t0 = time.perf_counter_ns()
        ping.count = 1
        if channel.send(ping, dest) != 1:
            continue
        if not _receive(channel, pong, timeout_ns, args.idle == "spin"):
            raise DeviceError(f"{args.kind}: a ping got no answer (lost?); rerun",
                              component=_COMPONENT)
        pings += 1
        if pings == warmup:
            end = time.perf_counter_ns() + int(args.duration_s * 1e9)
        elif pings > warmup:
            histogram.record_value(max((time.perf_counter_ns() - t0) // 2, 1))
    stop = _bench_batch(1, args.size, stream_id=STOP_STREAM_ID)
    while channel.send(stop, dest) != 1:
        time.sleep(0)
    return histogram


def latency_figures(histogram: Any, child_figures: dict) -> dict[str, float]:
    """Percentiles of the half round trips and the echoing end's header figures, in us."""
    return {"p50_us": histogram.get_value_at_percentile(50) / 1e3,
            "p99_us": histogram.get_value_at_percentile(99) / 1e3,
            "p999_us": histogram.get_value_at_percentile(99.9) / 1e3,
            "header_p50_us": child_figures["header_p50_ns"] / 1e3,
            "header_p99_us": child_figures["header_p99_ns"] / 1e3}
