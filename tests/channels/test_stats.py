"""ChannelStats: the vectorized latency recording and the jitter kernel against slow twins."""

import numpy as np
from hdrh.histogram import HdrHistogram

from channels.base import FrameBatch
from channels.stats import (
    LATENCY_HIGHEST_NS,
    LATENCY_LOWEST_NS,
    LATENCY_SIGNIFICANT_DIGITS,
    SIZE_BUCKETS,
    ChannelStats,
)
from tests.channels.peer import make_frame


def stamped_batch(send_ts, recv_ts, peers):
    batch = FrameBatch(len(send_ts), 512)
    for ts, peer in zip(send_ts, peers):
        frame = bytearray(make_frame(1, 1))
        frame[24:32] = int(ts).to_bytes(8, "big")
        batch.append(frame, peer_id=peer)
    batch.recv_ts_ns[: batch.count] = recv_ts
    return batch


def rfc3550_jitter(send_ts, recv_ts, peers):
    """The slow twin: RFC 3550 section 6.4.1, one peer at a time."""
    last, jitter = {}, {}
    for s, r, p in zip(send_ts, recv_ts, peers):
        transit = r - s
        if p in last:
            d = abs(transit - last[p])
            jitter[p] = jitter.get(p, 0.0) + (d - jitter.get(p, 0.0)) / 16
        else:
            jitter[p] = 0.0
        last[p] = transit
    return jitter


def test_latency_recording_matches_hdrhistogram_record_value():
    rng = np.random.default_rng(7)
    n = 3000
    send = rng.integers(1_700_000_000_000_000_000, 1_800_000_000_000_000_000, n)
    latency = np.concatenate([rng.integers(0, 5_000, n // 3), rng.integers(0, 10**7, n // 3),
                              rng.integers(0, LATENCY_HIGHEST_NS, n - 2 * (n // 3))])
    stats = ChannelStats()
    for chunk in range(0, n, 500):
        sl = slice(chunk, chunk + 500)
        stats.on_batch_received(stamped_batch(send[sl], send[sl] + latency[sl],
                                              np.zeros(500, np.int64)))
    twin = HdrHistogram(LATENCY_LOWEST_NS, LATENCY_HIGHEST_NS, LATENCY_SIGNIFICANT_DIGITS)
    for value in latency:
        twin.record_value(int(value))
    assert stats.latency.get_total_count() == twin.get_total_count() == n
    assert list(stats.latency.counts) == list(twin.counts)
    assert stats.latency.get_min_value() == twin.get_min_value()
    assert stats.latency.get_max_value() == twin.get_max_value()
    for p in (50, 99, 99.9):
        assert stats.latency_ns_at(p) == twin.get_value_at_percentile(p)


def test_jitter_per_peer_follows_rfc3550():
    rng = np.random.default_rng(3)
    n = 400
    peers = rng.integers(0, 5, n)
    send = np.cumsum(rng.integers(1_000, 50_000, n)) + 10**18
    recv = send + rng.integers(5_000, 90_000, n)
    stats = ChannelStats()
    for chunk in range(0, n, 64):
        sl = slice(chunk, chunk + 64)
        stats.on_batch_received(stamped_batch(send[sl], recv[sl], peers[sl]))
    expected = rfc3550_jitter(send.tolist(), recv.tolist(), peers.tolist())
    got = stats.jitter_by_peer()
    assert set(got) == set(expected)
    for peer, value in expected.items():
        assert abs(got[peer] - value) < 1e-6 * max(1.0, value)
    assert stats.snapshot()["jitter_max_ns"] == max(got.values())


def size_slot(length):
    """The slow twin of the size histogram's slot: the smallest i with length <= 2**i."""
    i = 0
    while (1 << i) < length and i < SIZE_BUCKETS - 1:
        i += 1
    return i


def test_frame_sizes_are_counted_in_power_of_two_slots_every_frame_once():
    rng = np.random.default_rng(11)
    lengths = np.concatenate([[0, 1, 2, 3, 31, 32, 33, 64, 65, 1024, 1025, 65_535],
                              rng.integers(0, 70_000, 500), [1 << 24, (1 << 24) + 1, 1 << 30]])
    buf = np.zeros(64, np.uint8)  # the frames' bytes do not matter for their sizes
    offsets = np.zeros(len(lengths), np.int64)
    stats = ChannelStats()
    for chunk in range(0, len(lengths), 100):
        part = lengths[chunk:chunk + 100].astype(np.int64)
        stats.on_receive(buf, offsets[:len(part)], part,
                         np.zeros(len(part), np.int64), np.zeros(len(part), np.int64), len(part))
    twin = np.zeros(SIZE_BUCKETS, np.int64)
    for length in lengths:
        twin[size_slot(int(length))] += 1
    assert stats.size_counts.tolist() == twin.tolist()
    assert stats.size_counts.sum() == stats.frames_in == len(lengths)
    assert stats.bytes_in == int(lengths.sum())


def test_frames_that_cannot_be_timed_are_not_recorded():
    batch = stamped_batch([0, 1_000, 5_000], [100, 900, 5_000 + 2 * LATENCY_HIGHEST_NS],
                          [1, 1, 1])
    garbage = bytearray(batch.frame(0))
    garbage[0] = 0  # not TW: never timed
    batch.slot(0)[: len(garbage)] = np.frombuffer(bytes(garbage), np.uint8)
    stats = ChannelStats()
    stats.on_batch_received(batch)
    assert stats.frames_in == 3 and stats.latency.get_total_count() == 0
    assert stats.latency_out_of_range == 2  # received before sent; above the histogram


def test_reliability_counters_have_their_own_places():
    stats = ChannelStats("x")
    stats.on_nak(2)
    stats.on_retransmission(5)
    stats.on_loss(3)
    stats.on_backpressure(4)
    snap = stats.snapshot()
    assert (snap["naks"], snap["retransmissions"], snap["lost"], snap["backpressure"]) == \
        (2, 5, 3, 4)


def test_naks_and_retransmissions_are_counted_where_they_leave_and_where_they_arrive():
    """ChannelSink counts the NAK frames and retransmitted messages it sends; decode_batch
    counts the valid ones received (a malformed NAK is not a NAK)."""
    import numpy as np

    from channels.base import ChannelSink, FrameBatch, decode_batch
    from channels.udp import UdpChannel
    from datapath.protocol.batch import new_message_batch
    from datapath.protocol.frame_layout import FrameType
    from tests.datapath.reliability.frames import data, nak

    with UdpChannel(("127.0.0.1", 0)) as rx, UdpChannel(("127.0.0.1", 0)) as tx:
        sink = ChannelSink(tx)
        frames = [nak([(5, 9)], from_session=1), data([1, 2, 3]),
                  data([5, 6, 7, 8], frame_type=FrameType.RETRANSMISSION),
                  nak([(11, 12)], from_session=1)[:-1],  # cut short: malformed
                  data([9], frame_type=FrameType.RETRANSMISSION)]
        for frame in frames:
            sink.send_frame(frame, rx.local_address)
        assert sink.flush() == len(frames)
        assert (tx.stats.naks, tx.stats.retransmissions) == (2, 5)
        batch = FrameBatch(8)
        got = 0
        while got < len(frames):
            assert rx.receive(batch, 2_000_000_000)
            got += batch.count
            decode_batch(batch, new_message_batch(64), np.zeros(8, np.uint8),
                         np.zeros(8, np.uint8), rx.stats)
        assert (rx.stats.naks, rx.stats.retransmissions, rx.stats.malformed) == (1, 5, 1)
