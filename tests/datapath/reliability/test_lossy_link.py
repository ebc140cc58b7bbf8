"""Sender and receiver over a simulated lossy, duplicating, reordering link (deterministic
clock, seeded RNG): ordered streams arrive complete and in order, or every message that does
not is named in exactly one loss event, in place, and the stream goes on."""

import pytest

from datapath.protocol.frame_layout import FrameType
from datapath.reliability import (
    LossReason,
    ReceiverConfig,
    ReliableReceiver,
    ReliableSender,
    SenderConfig,
)
from tests.datapath.reliability.simnet import Recorder, SimNet, run

MS = 1_000_000


def make_link(seed, *, rx_loss=0.0, tx_loss=0.0, duplicate=0.0, jitter_ns=0,
              latency_ns=200_000, sender_config=None, receiver_config=None):
    net = SimNet(seed=seed, latency_ns=latency_ns, jitter_ns=jitter_ns)
    rec = Recorder()
    tx = ReliableSender(net.sink("S"), session_id=5, stream_id=1, dest="R",
                        config=sender_config or SenderConfig(), latency_budget_ns=100_000)
    rx = ReliableReceiver(rec, net.sink("R"), session_id=9,
                          config=receiver_config or ReceiverConfig(), seed=seed)
    net.add("S", lambda f, t, src: tx.on_frame(f, t, src), loss=tx_loss)
    net.add("R", lambda f, t, src: rx.on_frame(f, t, src), loss=rx_loss, duplicate=duplicate)
    return net, tx, rx, rec


def publisher(tx, total, per_step):
    """An each_step hook offering ``per_step`` messages per step until ``total``."""
    sent = iter(range(total))

    def step(t):
        for _, i in zip(range(per_step), sent):
            tx.offer(i % 97, b"payload-%08d" % i, t)
    return step


def accounted(rec):
    return len(rec.seqs) + sum(e.messages for e in rec.losses)


def assert_partition_in_order(rec, total):
    """Every sequence 1..total appears exactly once, delivered or inside one loss event, and
    items come in sequence order."""
    position = 0
    for kind, value in rec.items:
        first, last = (value, value) if kind == "msg" else value
        assert first == position + 1, (kind, value, position)
        position = last
    assert position == total


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ordered_messages_through_loss_duplicates_and_reordering_arrive_complete(seed):
    total = 20_000
    net, tx, rx, rec = make_link(seed, rx_loss=0.05, tx_loss=0.05, duplicate=0.02,
                                 jitter_ns=300_000)
    run(net, [tx, rx], lambda: len(rec.seqs) >= total, each_step=publisher(tx, total, 20))
    assert rec.seqs == list(range(1, total + 1)) and rec.losses == []
    payloads_ok = all(k == (s - 1) % 97 for s, k in zip(rec.seqs, rec.keys))
    assert payloads_ok
    c = rx.counters
    assert c.duplicates > 0 and c.recovered > 0 and tx.counters.retransmitted > 0
    assert c.recovery_ns_max < rx.config.recovery_timeout_ns


def test_a_lost_tail_is_noticed_through_the_probe_and_recovered():
    net, tx, rx, rec = make_link(4)
    net.links["R"].drop = lambda f: f[3] == FrameType.DATA and f[6:8] == b"\x00\x01" and (
        int.from_bytes(f[32 + 8 : 32 + 16]) == 100)
    for i in range(100):  # one message per frame at this rate; the last frame is lost
        tx.offer(i, b"x", i * MS)
        net.deliver_until(i * MS)
        tx.do_work(i * MS)
        rx.do_work(i * MS)
    end = run(net, [tx, rx], lambda: len(rec.seqs) == 100, start_ns=100 * MS)
    assert net.links["R"].dropped == 1
    assert rec.seqs == list(range(1, 101)) and tx.counters.tail_probes >= 1
    assert end - 99 * MS < 20 * MS  # the first probe (5 ms) exposed it


def test_a_small_sender_buffer_turns_late_naks_into_loss_events_and_the_stream_goes_on():
    total = 5_000
    net, tx, rx, rec = make_link(5, rx_loss=0.2, latency_ns=3 * MS,
                                 sender_config=SenderConfig(retransmit_buffer_messages=64))
    run(net, [tx, rx], lambda: accounted(rec) >= total and net.in_flight == 0,
        each_step=publisher(tx, total, 20))
    assert rec.losses and {e.reason for e in rec.losses} == {LossReason.SENDER_LOSS}
    assert_partition_in_order(rec, total)
    assert tx.counters.loss_frames > 0 and rec.seqs[-1] == total


def test_naks_that_never_reach_the_sender_end_in_loss_events_at_the_recovery_bound():
    total = 5_000
    bound = 50 * MS
    net, tx, rx, rec = make_link(6, rx_loss=0.05, tx_loss=1.0,
                                 receiver_config=ReceiverConfig(recovery_timeout_ns=bound))
    run(net, [tx, rx], lambda: accounted(rec) >= total, each_step=publisher(tx, total, 20))
    assert rec.losses and {e.reason for e in rec.losses} == {LossReason.RECOVERY_TIMEOUT}
    step = 100_000
    assert all(bound <= e.declared_ns - e.detected_ns < bound + step for e in rec.losses)
    assert_partition_in_order(rec, total)
    assert rx.counters.nak_frames > 0 and tx.counters.nak_frames == 0
