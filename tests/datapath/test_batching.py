"""Adaptive batching (seed 002): frames fill with the rate, no message waits beyond the
latency budget. Driven by a deterministic clock: Poisson arrivals from a seeded RNG, and the
duty cycle run at every arrival and at every flush deadline."""

import random

import pytest

from datapath.batching import AdaptiveBatcher, BatchingError
from datapath.protocol.codec import decode_frame
from datapath.protocol.message_layout import message_bytes
from datapath.reliability import ReliableSender
from datapath.reliability.sink import CollectingSink

BUDGET_NS = 100_000
FRAME_BYTES = 1_472
MESSAGE = message_bytes(16, 0)  # 56 bytes
FULL = (FRAME_BYTES - 32) // MESSAGE  # 25 messages


def simulate(rate_per_s, n=20_000, seed=1, budget_ns=BUDGET_NS):
    """Frames as lists of per-message queueing delays (ns)."""
    rng = random.Random(seed)
    batcher = AdaptiveBatcher(budget_ns, max_frame_bytes=FRAME_BYTES)
    frames, waiting = [], []
    mean_gap_ns = 1e9 / rate_per_s

    def flush(now):
        frames.append([now - a for a in waiting])
        assert batcher.on_flush(now) == len(waiting)
        waiting.clear()

    arrival, arrived = rng.expovariate(1 / mean_gap_ns), 0
    while arrived < n or waiting:
        deadline = batcher.deadline_ns()
        if arrived < n and (deadline is None or arrival < deadline):
            now = int(arrival)
            if batcher.due(now):  # the duty cycle just before this arrival
                flush(now)
            if not batcher.fits(MESSAGE):
                flush(now)
            waiting.append(now)
            arrived += 1
            if batcher.on_append(MESSAGE, now):
                flush(now)
            arrival += rng.expovariate(1 / mean_gap_ns)
        else:
            assert batcher.due(deadline)
            flush(deadline)
    return frames, batcher


RATES = [100, 1_000, 10_000, 30_000, 100_000, 300_000, 1_000_000, 10_000_000]


@pytest.mark.parametrize("rate", RATES)
def test_no_message_waits_longer_than_the_budget(rate):
    frames, batcher = simulate(rate)
    assert sum(len(f) for f in frames) == 20_000
    assert max(max(f) for f in frames) <= BUDGET_NS
    assert batcher.max_delay_ns <= BUDGET_NS
    assert all(1 <= len(f) <= FULL for f in frames)


def test_messages_per_frame_grow_with_the_rate_from_one_to_full_frames():
    means = [simulate(rate)[1].messages_per_frame for rate in RATES]
    assert means == sorted(means), means
    assert all(a < b for a, b in zip(means[2:], means[3:-1])), means  # strictly, once it can
    assert means[0] == means[1] == 1.0  # low rates: one message per frame
    assert means[-1] > 0.95 * FULL and means[-2] > 0.9 * FULL  # high rates: full frames
    assert 5 < means[4] < 15  # 100k/s with 100 us: about rate * budget = 10


def test_at_low_rates_messages_leave_at_once():
    frames, _ = simulate(1_000)
    delays = [d for f in frames for d in f]
    assert sum(1 for d in delays if d == 0) > 0.99 * len(delays)


def test_a_burst_after_silence_starts_alone_then_fills_frames():
    batcher = AdaptiveBatcher(BUDGET_NS, max_frame_bytes=FRAME_BYTES)
    sizes = []
    for i in range(500):  # 10 million messages per second after a quiet start
        now = 10**9 + i * 100
        if not batcher.fits(MESSAGE):
            sizes.append(batcher.on_flush(now))
        if batcher.on_append(MESSAGE, now):
            sizes.append(batcher.on_flush(now))
    assert sizes[0] == 1 and sizes[-1] == FULL and sizes == sorted(sizes)


def test_the_sender_sends_a_lone_message_at_once_and_fills_frames_under_load():
    sink = CollectingSink()
    tx = ReliableSender(sink, session_id=1, stream_id=1, dest="peer", latency_budget_ns=BUDGET_NS)
    for i in range(20):  # one per millisecond: each leaves in its own frame, immediately
        tx.offer(i, bytes(16), i * 1_000_000)
        assert len(sink.frames) == i + 1
    sink.take()
    for i in range(6_000):  # one per microsecond
        now = 10**8 + i * 1_000
        tx.offer(i, bytes(16), now)
        tx.do_work(now)
    counts = [decode_frame(f).header.msg_count for f, _ in sink.take()]
    steady = counts[len(counts) // 2 :]  # once the rate estimate has settled (~1 ms)
    assert counts[0] == 1  # the rate is not known yet: no holding back
    assert min(steady) == max(steady) == FULL


@pytest.mark.parametrize("kwargs", [{"latency_budget_ns": -1}, {"max_frame_bytes": 40},
                                    {"max_messages": 0}])
def test_settings_that_cannot_work_are_refused_with_the_component_named(kwargs):
    with pytest.raises(BatchingError, match="^batching: "):
        AdaptiveBatcher(**kwargs)
