"""Flow control: watermarks with hysteresis (seed 002, figure 7), the three policies, the
sender's pause, and a stalled subscriber that throttles its sender and recovers."""

import pytest

from datapath.flow_control import (
    FlowControlError,
    PolicyQueue,
    SenderFlowControl,
    SubscriberQueue,
    WatermarkGate,
    policy_for_qos,
)
from datapath.protocol.admin_layout import FlowControl, FlowPolicy, FlowState
from datapath.protocol.codec import encode_data_frame
from datapath.protocol.message_layout import Qos
from datapath.reliability import (
    ReceiverConfig,
    ReliableReceiver,
    ReliableSender,
    SenderConfig,
    StreamKey,
)
from tests.datapath.reliability.simnet import SimNet, run

MS = 1_000_000
STREAM = StreamKey(7, 3)


def message(topic_key, seq=1, payload=b"v"):
    frame = encode_data_frame([{"topic_key": topic_key, "sequence": seq, "payload": payload}])
    return memoryview(frame)[32:]


def test_a_depth_hovering_around_the_high_watermark_turns_flow_control_on_exactly_once():
    gate = WatermarkGate(high=100, low=20)
    naive_state, naive_flips = False, 0  # one threshold, no hysteresis, for contrast
    depths = list(range(0, 102)) + [99, 101] * 500 + [50, 19] + [21, 19] * 500
    for depth in depths:
        gate.update(depth)
        if (depth > 100) != naive_state:
            naive_state, naive_flips = depth > 100, naive_flips + 1
    assert (gate.turned_on, gate.turned_off) == (1, 1)
    assert gate.state is FlowState.OFF
    # the same depths without hysteresis: on at 101, 1,000 flips while hovering, off at 50
    assert naive_flips == 1 + 1_000 + 1


def test_each_full_swing_across_both_watermarks_is_one_on_and_one_off():
    gate = WatermarkGate(high=100, low=20)
    changes = []
    for _ in range(7):
        for depth in (0, 50, 101, 150, 60, 19, 5):
            state = gate.update(depth)
            if state is not None:
                changes.append((depth, state))
    assert changes == [(101, FlowState.ON), (19, FlowState.OFF)] * 7
    assert (gate.turned_on, gate.turned_off) == (7, 7)


def test_the_subscriber_queue_signals_on_once_refreshes_it_and_signals_off_once():
    signals = []
    queue = SubscriberQueue(capacity=50, high_watermark=30, low_watermark=10,
                            refresh_interval_ns=10 * MS,
                            signal=lambda stream, entry: signals.append((t, stream, entry)))
    t = 0
    for i in range(31):  # depth 31 > 30: on
        assert queue.on_message(STREAM, message(i))
    for t in range(0, 25 * MS, MS):
        queue.do_work(t)
        queue.on_message(STREAM, message(100))  # hover around the high watermark
        queue.poll()
    for _ in range(22):  # depth 9 < 10: off
        queue.poll()
    for t in range(25 * MS, 60 * MS, MS):
        queue.do_work(t)
    assert [(at // MS, e.state) for at, _, e in signals] == [
        (0, FlowState.ON), (10, FlowState.ON), (20, FlowState.ON), (25, FlowState.OFF)]
    assert all(stream == STREAM for _, stream, _ in signals)
    on = signals[0][2]
    assert (on.policy, on.queue_depth, on.high_watermark, on.low_watermark) == (
        FlowPolicy.THROTTLE, 31, 30, 10)
    assert (queue.gate.turned_on, queue.gate.turned_off) == (1, 1)


def test_throttle_refuses_at_capacity_and_loses_nothing():
    q = PolicyQueue(3, FlowPolicy.THROTTLE)
    assert [q.offer(k, k) for k in range(5)] == [True, True, True, False, False]
    assert [q.poll() for _ in range(4)] == [(0, 0), (1, 1), (2, 2), None]
    assert q.refused == 2 and q.dropped == 0


def test_drop_oldest_keeps_the_newest_messages():
    q = PolicyQueue(3, FlowPolicy.DROP_OLDEST)
    assert all(q.offer(k, k) for k in range(10))
    assert [q.poll()[1] for _ in range(3)] == [7, 8, 9] and q.dropped == 7


def test_conflate_keeps_the_last_value_per_topic_key_while_flow_control_is_on():
    q = PolicyQueue(10, FlowPolicy.CONFLATE)
    q.offer(1, "a1")
    q.offer(2, "b1")
    q.offer(1, "a2")  # off: no conflation, both kept
    q.offer(1, "a3", conflate=True)  # on: replaces the newest queued value of key 1 in place
    q.offer(2, "b2", conflate=True)
    q.offer(3, "c1", conflate=True)
    assert [q.poll() for _ in range(5)] == [(1, "a1"), (2, "b2"), (1, "a3"), (3, "c1"), None]
    assert q.conflated == 2


def test_a_conflating_subscriber_keeps_only_the_last_value_of_each_key_while_on():
    queue = SubscriberQueue(policy=FlowPolicy.CONFLATE, capacity=100, high_watermark=3,
                            low_watermark=1)
    for seq in range(1, 5):  # four keys: depth 4 > 3 turns it on
        queue.on_message(STREAM, message(seq, seq))
    for seq in range(5, 45):  # updates of the same four keys are conflated
        queue.on_message(STREAM, message(seq % 4 + 1, seq, b"%d" % seq))
    got = queue.drain(100)
    assert len(got) == 4 and queue.queue.conflated == 40
    # keys 1..4 keep their queue positions and carry their last values (44 is key 1's)
    assert [int.from_bytes(m[0:8]) for _, m in got] == [1, 2, 3, 4]
    assert [int.from_bytes(m[8:16]) for _, m in got] == [44, 41, 42, 43]


def test_the_sender_pauses_while_any_receiver_is_on_and_uses_the_strictest_policy():
    fc = SenderFlowControl(expiry_ns=100)
    on = FlowControl(FlowState.ON, FlowPolicy.DROP_OLDEST, 5, 4, 1)
    fc.on_signal(1, on, now_ns=0)
    fc.on_signal(2, FlowControl(FlowState.ON, FlowPolicy.THROTTLE, 5, 4, 1), now_ns=0)
    assert fc.paused(50) and fc.policy() is FlowPolicy.THROTTLE
    fc.on_signal(2, FlowControl(FlowState.OFF, FlowPolicy.THROTTLE, 0, 4, 1), now_ns=60)
    assert fc.paused(60) and fc.policy() is FlowPolicy.DROP_OLDEST
    assert not fc.paused(100)  # receiver 1's "on" was not refreshed
    assert fc.paused_episodes == 1


def test_the_default_policy_follows_the_subscription_qos():
    assert [policy_for_qos(q) for q in Qos] == [FlowPolicy.DROP_OLDEST, FlowPolicy.CONFLATE,
                                                FlowPolicy.THROTTLE]


@pytest.mark.parametrize("kwargs", [{"high_watermark": 10, "low_watermark": 10},
                                    {"high_watermark": 100, "capacity": 100}])
def test_watermarks_that_cannot_work_are_refused_with_the_component_named(kwargs):
    with pytest.raises(FlowControlError, match="^flow-control: "):
        SubscriberQueue(**{"capacity": 1000, "high_watermark": 100, "low_watermark": 10,
                           **kwargs})


def test_a_stalled_subscriber_throttles_its_sender_and_everything_arrives_after_it_recovers():
    total, per_step = 30_000, 10
    net = SimNet(seed=9, latency_ns=200_000)
    queue = SubscriberQueue(policy=FlowPolicy.THROTTLE, capacity=4_000, high_watermark=2_000,
                            low_watermark=500, refresh_interval_ns=20 * MS)
    # the sender works its backlog off at ~2 frames (~50 messages) per duty cycle, slower than
    # the subscriber catches up (100 per step), so the queue crosses each watermark once
    tx = ReliableSender(net.sink("S"), session_id=7, stream_id=3, dest="R",
                        config=SenderConfig(frames_per_duty_cycle=2))
    rx = ReliableReceiver(queue, net.sink("R"), session_id=9,
                          config=ReceiverConfig(), seed=1)
    queue.signal = rx.send_flow_control
    # data arrives intact (a loss repaired late would release a reorder-buffer burst into the
    # queue: a second, legitimate on/off); control frames to the sender are lost at 5%
    net.add("S", lambda f, t, src: tx.on_frame(f, t, src), loss=0.05)
    net.add("R", lambda f, t, src: rx.on_frame(f, t, src))
    consumed, sent = [], iter(range(total))
    stall = (100 * MS, 300 * MS)
    trace = []

    def step(t):
        for _, i in zip(range(per_step), sent):
            tx.offer(i, b"q%06d" % i, t)
        if not stall[0] <= t < stall[1]:
            consumed.extend(int.from_bytes(m[8:16]) for _, m in queue.drain(100))
        trace.append((t, tx.paused, tx.highest_sent, len(queue)))

    run(net, [tx, rx, queue], lambda: len(consumed) >= total, each_step=step)
    assert consumed == list(range(1, total + 1)) and queue.take_losses() == []
    assert (queue.gate.turned_on, queue.gate.turned_off) == (1, 1)
    assert queue.queue.max_depth <= 4_000 and queue.queue.refused == 0
    paused = [(t, hs) for t, p, hs, _ in trace if p]
    assert paused and stall[0] < paused[0][0] < stall[1] and tx.flow.paused_episodes == 1
    # while paused nothing new left the sender, beyond the frame that was already open
    assert paused[-1][1] - paused[0][1] <= 30
    assert tx.counters.offers_refused == 0
