"""NAK storms are avoided on multicast: a random first-NAK delay, and a pending NAK is held
back when another receiver's NAK for the range, or the sender's retransmission of it, is seen
on the group."""

from datapath.protocol.frame_layout import FrameType
from datapath.reliability import ReceiverConfig, ReliableReceiver, ReliableSender, SenderConfig
from tests.datapath.reliability.frames import (
    SENDER_ADDR,
    data,
    make_receiver,
    nak,
    nak_ranges,
    sent_of,
)
from tests.datapath.reliability.simnet import Recorder, SimNet, run

MS = 1_000_000
GROUP = "G"


SUPPRESSING = ReceiverConfig(multicast=True, nak_dest=GROUP)
"""Random first-NAK delay, NAKs to the group (peers see them), retransmissions to the group."""


def make_group(seed, losses, *, egress_loss=0.0, config=SUPPRESSING):
    net = SimNet(seed=seed, latency_ns=200_000, jitter_ns=50_000)
    tx = ReliableSender(net.sink("S"), session_id=5, stream_id=1, dest=GROUP,
                        config=SenderConfig(multicast=True), latency_budget_ns=100_000)
    net.add("S", lambda f, t, src: tx.on_frame(f, t, src), egress_loss=egress_loss,
            groups=(GROUP,))
    receivers = []
    for i, loss in enumerate(losses):
        rec = Recorder()
        rx = ReliableReceiver(rec, net.sink(f"R{i}"), session_id=100 + i, config=config,
                              seed=seed * 10 + i)
        net.add(f"R{i}", lambda f, t, src, rx=rx: rx.on_frame(f, t, src), loss=loss,
                groups=(GROUP,))
        receivers.append((rx, rec))
    return net, tx, receivers


def publish_all(net, tx, receivers, total, per_step=10):
    sent = iter(range(total))

    def step(t):
        for _, i in zip(range(per_step), sent):
            tx.offer(i, b"tick-%06d" % i, t)
    run(net, [tx] + [rx for rx, _ in receivers],
        lambda: all(len(rec.seqs) >= total for _, rec in receivers), each_step=step)


def test_three_receivers_each_with_its_own_loss_all_get_everything_in_order():
    total = 10_000
    net, tx, receivers = make_group(1, [0.02, 0.05, 0.10])
    publish_all(net, tx, receivers, total)
    for _, rec in receivers:
        assert rec.seqs == list(range(1, total + 1)) and rec.losses == []
    assert [rx.counters.gaps_detected > 0 for rx, _ in receivers] == [True] * 3


def test_shared_loss_makes_far_fewer_naks_with_delay_and_suppression():
    total = 10_000
    configs = {
        "storm": ReceiverConfig(multicast=False),  # every receiver NAKs every gap at once
        "delay": ReceiverConfig(multicast=True),  # random delay; NAKs unicast to the sender
        "suppress": SUPPRESSING,  # random delay and NAKs seen by the peers
    }
    naks, suppressed = {}, {}
    for name, config in configs.items():
        net, tx, receivers = make_group(2, [0.0, 0.0, 0.0], egress_loss=0.05, config=config)
        publish_all(net, tx, receivers, total)
        assert all(rec.seqs == list(range(1, total + 1)) for _, rec in receivers)
        naks[name] = sum(rx.counters.nak_frames for rx, _ in receivers)
        suppressed[name] = sum(rx.counters.naks_suppressed for rx, _ in receivers)
    # every receiver misses the same frames (lost on the sender's link)
    assert naks["storm"] > naks["delay"] > naks["suppress"], naks
    assert naks["suppress"] < 0.5 * naks["storm"], naks
    assert suppressed == {"storm": 0, "delay": 0, "suppress": suppressed["suppress"]}
    assert suppressed["suppress"] > 0


def test_a_peers_nak_for_the_range_holds_back_our_pending_nak():
    rx, _, sink = make_receiver(seed=3, multicast=True, nak_multicast_max_delay_ns=2 * MS,
                                nak_retry_initial_ns=20 * MS)
    rx.on_frame(data([1, 5]), 0, SENDER_ADDR)
    first_due = rx.streams[next(iter(rx.streams))].gaps.gaps[0].next_nak_ns
    assert 0 < first_due < 2 * MS  # a random delay, not immediate
    rx.on_frame(nak([(2, 4)], from_session=555), 0, SENDER_ADDR)
    for t in range(0, 20 * MS, 100_000):
        rx.do_work(t)
    assert sent_of(sink, FrameType.NAK) == [] and rx.counters.naks_suppressed == 1
    for t in range(20 * MS, 23 * MS, 100_000):  # nobody repaired it: we NAK after all
        rx.do_work(t)
    assert nak_ranges(sent_of(sink, FrameType.NAK)) == [(2, 4)]


def test_a_peers_nak_for_part_of_a_gap_leaves_the_rest_to_us():
    rx, _, sink = make_receiver(seed=3, multicast=True)
    rx.on_frame(data([1, 10]), 0, SENDER_ADDR)
    rx.on_frame(nak([(4, 6)], from_session=555), 0, SENDER_ADDR)
    for t in range(0, 3 * MS, 100_000):
        rx.do_work(t)
    assert sorted(nak_ranges(sent_of(sink, FrameType.NAK))) == [(2, 3), (7, 9)]


def test_a_retransmission_seen_before_our_nak_is_due_cancels_it():
    rx, rec, sink = make_receiver(seed=3, multicast=True)
    rx.on_frame(data([1, 4]), 0, SENDER_ADDR)
    rx.on_frame(data([2, 3], frame_type=FrameType.RETRANSMISSION), 10_000, SENDER_ADDR)
    for t in range(0, 100 * MS, MS):
        rx.do_work(t)
    assert sent_of(sink, FrameType.NAK) == [] and rec.seqs == [1, 2, 3, 4]


def test_unicast_receivers_ignore_naks_from_others():
    rx, _, sink = make_receiver()
    rx.on_frame(data([1, 3]), 0, SENDER_ADDR)
    rx.on_frame(nak([(2, 2)], from_session=555), 0, SENDER_ADDR)
    rx.do_work(0)
    assert nak_ranges(sent_of(sink, FrameType.NAK)) == [(2, 2)]
