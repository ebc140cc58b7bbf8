"""The reliable transport (datapath.reliability), unchanged, over the RDMA channel.

The glue is the one the UDP tests use (tests/reliability/peer.py): received batches are
validated by ``decode_batch`` and handed to the agents' ``on_frame``; their frames leave
through a ``ChannelSink``. RDMA's RC transport loses nothing, so one test also drops DATA
frames before they enter the channel: NAKs and retransmissions then cross RDMA too.
"""

from __future__ import annotations

import time

import numpy as np

from channels.base import ChannelSink, FrameBatch, decode_batch
from datapath.flow_control import SubscriberQueue
from datapath.protocol.batch import new_message_batch
from datapath.protocol.frame_layout import FrameType
from datapath.reliability import ReceiverConfig, ReliableReceiver, ReliableSender
from hwtests.rdma.base import RdmaTestCase
from tests.reliability.peer import Checker, payload_of

RELIABLE_MESSAGES = 20_000
"""Messages per run: every one goes through the sender's and receiver's Python per-message
path, ~30x slower under emulation than on the host."""
PUBLISH_CHUNK = 64
WAIT_NS = 300_000_000_000


class Feeder:
    """A channel's received frames to an agent's ``on_frame``, validated in batches."""

    def __init__(self, channel: object) -> None:
        self.channel = channel
        self.batch = FrameBatch(64, 2_048)
        self.view = memoryview(self.batch.buf)
        self.messages = new_message_batch(64 * 40)
        self.status = np.zeros(64, np.uint8)
        self.types = np.zeros(64, np.uint8)

    def poll(self, on_frame: object, now_ns: int) -> int:
        batch = self.batch
        n = self.channel.receive(batch, 0)
        if n:
            result = decode_batch(batch, self.messages, self.status, self.types,
                                  self.channel.stats)
            for i in range(n):
                if i < result.frames and self.status[i]:
                    continue
                off = int(batch.offsets[i])
                on_frame(self.view[off:off + int(batch.lengths[i])], now_ns,
                         int(batch.peer_ids[i]), i < result.frames)
        return n


class DroppingSink:
    """Drops every ``every``-th DATA frame before it reaches the channel (a lossy link)."""

    def __init__(self, sink: ChannelSink, every: int) -> None:
        self.sink, self.every, self.seen, self.dropped = sink, every, 0, 0

    def send_frame(self, frame: memoryview, dest: object = None) -> None:
        if frame[3] == FrameType.DATA:
            self.seen += 1
            if self.seen % self.every == 0:
                self.dropped += 1
                return
        self.sink.send_frame(frame, dest)

    def flush(self) -> int:
        return self.sink.flush()


def run_stream(near: object, far: object, count: int, drop_every: int = 0) -> dict:
    """Publish ``count`` messages from ``near`` to a receiver on ``far``; return the tallies."""
    sink = ChannelSink(near)
    out = DroppingSink(sink, drop_every) if drop_every else sink
    tx = ReliableSender(out, session_id=5, stream_id=1)
    rx_sink = ChannelSink(far)
    queue = SubscriberQueue(capacity=16_384, high_watermark=8_192, low_watermark=2_048)
    rx = ReliableReceiver(queue, rx_sink, session_id=7, config=ReceiverConfig(), seed=1)
    queue.signal = rx.send_flow_control
    checker = Checker(count)
    near_feed, far_feed = Feeder(near), Feeder(far)

    def to_receiver(frame, now_ns, peer, validated):
        rx.on_frame(frame, now_ns, peer, validated=validated)

    def to_sender(frame, now_ns, peer, validated):
        tx.on_frame(frame, now_ns, peer)

    published = 0
    start = time.monotonic_ns()
    while not checker.done or min(tx.acks.values(), default=0) < count:
        now = time.monotonic_ns()
        assert now - start < WAIT_NS, (checker.consumed, rx.counters.as_dict())
        for _ in range(min(PUBLISH_CHUNK, count - published)):
            if not tx.offer(published % 97 + 1, payload_of(published, 16 + published % 200),
                            now):
                break
            published += 1
        if published == count:
            tx.flush(now)
        near_feed.poll(to_sender, now)
        tx.do_work(now)
        sink.flush()
        far_feed.poll(to_receiver, now)
        rx.do_work(now)
        queue.do_work(now)
        rx_sink.flush()
        checker.on_losses(queue.take_losses())
        for _, message in queue.drain(4_096):
            checker.on_message(message)
        if checker.done:
            rx.send_acks(now)
            rx_sink.flush()
    return {"checker": checker, "rx": rx.counters.as_dict(), "tx": tx.counters.as_dict(),
            "dropped": out.dropped if drop_every else 0,
            "elapsed_s": (time.monotonic_ns() - start) / 1e9}


def assert_complete_in_order(checker: Checker, count: int) -> None:
    assert checker.done and checker.consumed == count
    assert checker.order_errors == 0 and checker.content_errors == 0
    assert checker.loss_events == []


class TestReliableTransportOverRdma(RdmaTestCase):
    def test_a_reliable_stream_arrives_complete_and_in_order_with_acks_back(self):
        far, near = self.pair()
        with far, near:
            result = run_stream(near, far, RELIABLE_MESSAGES)
            assert_complete_in_order(result["checker"], RELIABLE_MESSAGES)
            assert result["rx"]["recovered"] == 0 and result["rx"]["nak_frames"] == 0
            assert far.stats.drops == near.stats.drops == 0
            assert near.stats.frames_in > 0  # the ACKs came back over RDMA
        print(f"\n{RELIABLE_MESSAGES} reliable messages over RDMA: "
              f"{result['elapsed_s']:.1f} s")

    def test_frames_lost_before_the_channel_are_recovered_by_naks_over_rdma(self):
        far, near = self.pair()
        with far, near:
            result = run_stream(near, far, RELIABLE_MESSAGES, drop_every=25)
            assert_complete_in_order(result["checker"], RELIABLE_MESSAGES)
            assert result["dropped"] > 0
            assert result["rx"]["recovered"] > 0 and result["rx"]["nak_frames"] > 0
            assert result["tx"]["retransmitted"] > 0
            # the NAKs crossed the RDMA channel one way, the retransmissions the other
            assert far.stats.naks > 0 and near.stats.naks > 0
            assert far.stats.retransmissions > 0
