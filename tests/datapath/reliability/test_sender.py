"""A sender numbers, batches and keeps what it sends, answers NAKs from its buffer (LOSS for
what left it), ignores what it never sent, probes an idle tail and obeys flow control."""

import pytest

from datapath.protocol.admin_layout import Ack, FlowControl, FlowPolicy, FlowState, SeqRange
from datapath.protocol.codec import decode_frame, encode_admin
from datapath.protocol.frame_layout import FrameType
from datapath.reliability import ReliabilityError, ReliableSender, SenderConfig
from datapath.reliability.sink import CollectingSink
from tests.datapath.reliability.frames import SENDER_SESSION, STREAM, admin, message_seqs, nak

MS = 1_000_000
PEER = ("10.0.0.2", 47470)
RECEIVER = 42


def make_sender(budget_ns=0, answer_budget=None, **config):
    sink = CollectingSink()
    tx = ReliableSender(sink, session_id=SENDER_SESSION, stream_id=STREAM, dest=PEER,
                        config=SenderConfig(**config), latency_budget_ns=budget_ns,
                        answer_budget=answer_budget)
    return tx, sink


def frames_of(sink, frame_type):
    return [f for f, _ in sink.take() if f[3] == frame_type]


def publish(tx, n, now_ns=0, start=0):
    for i in range(start, start + n):
        assert tx.offer(i, b"m%05d" % i, now_ns)
    tx.flush(now_ns)


def flow(state, policy=FlowPolicy.THROTTLE, receiver=RECEIVER):
    return bytes(encode_admin(FrameType.FLOW_CONTROL, [FlowControl(state, policy, 0, 10, 5)],
                              source_session=receiver, dest_session=SENDER_SESSION,
                              stream_id=STREAM))


def test_messages_are_numbered_from_one_and_framed_with_the_stream_ids():
    tx, sink = make_sender(budget_ns=MS)
    publish(tx, 5)
    seqs = []
    for frame, dest in sink.take():
        parsed = decode_frame(frame)
        assert dest == PEER and parsed.header.frame_type is FrameType.DATA
        assert (parsed.header.source_session, parsed.header.stream_id) == (SENDER_SESSION,
                                                                           STREAM)
        seqs += message_seqs(frame)
    assert seqs == [1, 2, 3, 4, 5] and tx.highest_sent == 5


def test_a_nak_is_answered_with_the_same_messages_flagged_retransmitted():
    tx, sink = make_sender()
    publish(tx, 10)
    originals = {m.sequence: m.snapshot() for f, _ in sink.take()
                 for m in decode_frame(f).messages()}
    tx.on_frame(nak([(3, 5), (9, 9)], from_session=RECEIVER), MS)
    retx = frames_of(sink, FrameType.RETRANSMISSION)
    got = [m.snapshot() for f in retx for m in decode_frame(f).messages()]
    assert [m["sequence"] for m in got] == [3, 4, 5, 9]
    for m in got:
        assert m["flags"] == 1
        assert {**m, "flags": 0} == originals[m["sequence"]]
    assert tx.counters.retransmitted == 4


def test_a_nak_for_messages_that_left_the_buffer_is_answered_with_loss():
    tx, sink = make_sender(retransmit_buffer_messages=4)
    publish(tx, 10)  # one message per frame: 1..6 evicted, 7..10 held
    sink.take()
    tx.on_frame(nak([(2, 8)], from_session=RECEIVER), MS)
    out = sink.take()
    losses = [admin(f)[1] for f, _ in out if f[3] == FrameType.LOSS]
    assert [[(e.first_seq, e.last_seq) for e in entries] for entries in losses] == [[(2, 6)]]
    assert [s for f, _ in out if f[3] == FrameType.RETRANSMISSION
            for s in message_seqs(f)] == [7, 8]
    assert tx.counters.loss_messages == 5


class _Source:
    """An evicted_source that keeps every other sequence (even ones) and answers later."""

    def __init__(self):
        self.asked = []

    def request(self, sender, first, last, now_ns):
        self.asked.append((first, last))
        return [SeqRange(s, s) for s in range(first, last + 1) if s % 2]


def test_a_nak_past_the_buffer_goes_to_the_evicted_source_which_answers_later():
    tx, sink = make_sender(retransmit_buffer_messages=4)
    tx.evicted_source = source = _Source()
    publish(tx, 10)  # 1..6 evicted, 7..10 held
    old = {}
    for f, _ in sink.take():
        for s in message_seqs(f):
            old[s] = bytes(f[32:])  # one message per frame: its wire bytes
    tx.on_frame(nak([(2, 8)], from_session=RECEIVER), MS)
    out = sink.take()
    assert source.asked == [(2, 6)]
    losses = [admin(f)[1] for f, _ in out if f[3] == FrameType.LOSS]
    assert [[(e.first_seq, e.last_seq) for e in entries] for entries in losses] == [
        [(3, 3), (5, 5)]]  # what the source does not hold, at once
    assert [s for f, _ in out if f[3] == FrameType.RETRANSMISSION
            for s in message_seqs(f)] == [7, 8]
    # later: the source's answer goes out on the same retransmission path, and LOSS for a miss
    assert tx.retransmit_stored([old[2], old[4]], 2 * MS) == 2
    tx.declare_lost([SeqRange(6, 6)])
    out = sink.take()
    assert [s for f, _ in out if f[3] == FrameType.RETRANSMISSION
            for s in message_seqs(f)] == [2, 4]
    assert [[(e.first_seq, e.last_seq) for e in admin(f)[1]] for f, _ in out
            if f[3] == FrameType.LOSS] == [[(6, 6)]]
    assert tx.counters.retransmitted == 4 and tx.counters.loss_messages == 3


def test_naks_for_ranges_never_sent_or_impossible_are_counted_and_ignored():
    tx, sink = make_sender()
    publish(tx, 3)
    sink.take()
    tx.on_frame(nak([(4, 100), (2**63, 2**64 - 1), (5, 2), (0, 0)], from_session=RECEIVER), MS)
    assert sink.take() == []
    assert tx.counters.nak_ranges_unsent == 2 and tx.counters.nak_ranges_invalid == 2
    tx.on_frame(nak([(3, 10**6)], from_session=RECEIVER), MS)  # the sent part is served
    assert [s for f in frames_of(sink, FrameType.RETRANSMISSION) for s in message_seqs(f)] == [3]


def test_one_nak_cannot_make_the_sender_resend_more_than_the_cap():
    tx, sink = make_sender(max_retransmit_messages_per_nak=50)
    publish(tx, 200)
    sink.take()
    tx.on_frame(nak([(1, 2**64 - 1)], from_session=RECEIVER), MS)
    resent = [s for f in frames_of(sink, FrameType.RETRANSMISSION) for s in message_seqs(f)]
    assert resent == list(range(1, 51)) and tx.counters.retransmits_capped == 150


def test_a_range_resent_within_the_linger_time_is_not_resent_again():
    tx, sink = make_sender(retransmit_linger_ns=10 * MS)
    publish(tx, 5)
    sink.take()
    for t, receiver in ((0, 1), (MS, 2), (9 * MS, 3), (10 * MS, 4)):
        tx.on_frame(nak([(2, 3)], from_session=receiver), t)
    resent = [s for f in frames_of(sink, FrameType.RETRANSMISSION) for s in message_seqs(f)]
    assert resent == [2, 3, 2, 3] and tx.counters.retransmits_lingering == 4


def test_an_idle_sender_probes_its_tail_with_backoff():
    tx, sink = make_sender(tail_probe_delay_ns=5 * MS, tail_probe_max_interval_ns=40 * MS)
    publish(tx, 3)
    sink.take()
    probes = []
    for t in range(0, 200 * MS, MS):
        tx.do_work(t)
        for f in frames_of(sink, FrameType.RETRANSMISSION):
            assert message_seqs(f) == [3] and decode_frame(f).header.msg_count == 1
            probes.append(t // MS)
    assert probes == [5, 15, 35, 75, 115, 155, 195]
    publish(tx, 1, now_ns=200 * MS, start=3)  # new data restarts the probe schedule
    sink.take()
    tx.do_work(205 * MS)
    assert [message_seqs(f) for f in frames_of(sink, FrameType.RETRANSMISSION)] == [[4]]


def test_flow_control_on_pauses_new_data_and_off_sends_it_in_order():
    tx, sink = make_sender(pending_messages=3)
    publish(tx, 2)
    sink.take()
    assert tx.on_frame(flow(FlowState.ON), MS)
    assert [tx.offer(i, b"x", MS) for i in range(4)] == [True, True, True, False]
    tx.do_work(2 * MS)
    assert frames_of(sink, FrameType.DATA) == [] and tx.paused
    assert tx.counters.offers_refused == 1
    tx.on_frame(flow(FlowState.OFF), 3 * MS)
    tx.do_work(3 * MS)
    assert [s for f in frames_of(sink, FrameType.DATA) for s in message_seqs(f)] == [3, 4, 5]
    assert not tx.paused and tx.flow.paused_episodes == 1


def test_an_on_that_is_not_refreshed_expires():
    tx, sink = make_sender()
    tx.flow.expiry_ns = 100 * MS
    tx.on_frame(flow(FlowState.ON), 0)
    tx.offer(1, b"x", 0)
    tx.do_work(99 * MS)
    assert frames_of(sink, FrameType.DATA) == []
    tx.do_work(100 * MS)
    assert len(frames_of(sink, FrameType.DATA)) == 1


@pytest.mark.parametrize("policy, expected_keys, dropped, conflated", [
    (FlowPolicy.DROP_OLDEST, [3, 4, 5], 3, 0),
    (FlowPolicy.CONFLATE, [0, 1, 2], 0, 3),
])
def test_while_paused_the_pending_queue_applies_the_receivers_policy(
        policy, expected_keys, dropped, conflated):
    tx, sink = make_sender(pending_messages=3)
    tx.on_frame(flow(FlowState.ON, policy), 0)
    for i in range(6):
        assert tx.offer(i % 3 if policy is FlowPolicy.CONFLATE else i, b"v%d" % i, 0)
    tx.on_frame(flow(FlowState.OFF), MS)
    tx.do_work(MS)
    msgs = [m.snapshot() for f in frames_of(sink, FrameType.DATA)
            for m in decode_frame(f).messages()]
    assert [m["topic_key"] for m in msgs] == expected_keys
    if policy is FlowPolicy.CONFLATE:  # the last value of each key
        assert [m["payload"] for m in msgs] == [b"v3", b"v4", b"v5"]
    assert (tx.counters.pending_dropped, tx.counters.pending_conflated) == (dropped, conflated)


def test_frames_for_other_streams_or_malformed_are_counted_and_ignored():
    tx, sink = make_sender()
    publish(tx, 3)
    sink.take()
    assert not tx.on_frame(nak([(1, 1)], from_session=RECEIVER, stream=STREAM + 1), 0)
    assert not tx.on_frame(nak([(1, 1)], from_session=RECEIVER)[:-8], 0)
    assert sink.take() == []
    assert tx.counters.not_for_us == 1 and tx.counters.malformed == 1


def test_a_payload_that_cannot_fit_a_frame_is_refused_with_advice():
    tx, _ = make_sender(max_frame_bytes=256)
    with pytest.raises(ReliabilityError, match="^reliability: .*raise max_frame_bytes"):
        tx.offer(1, bytes(300), 0)
    with pytest.raises(ReliabilityError, match="qos"):
        tx.offer(1, b"x", 0, qos=3)


def ack(seq, receiver=RECEIVER):
    return bytes(encode_admin(FrameType.ACK, [Ack(seq, 1 << 20)], source_session=receiver,
                              dest_session=SENDER_SESSION, stream_id=STREAM))


def sent_seqs(sink):
    return [s for f, _ in sink.take() if f[3] == FrameType.DATA for s in message_seqs(f)]


def test_the_send_window_holds_new_messages_past_the_slowest_receivers_ack():
    tx, sink = make_sender(send_window_messages=10, send_window_receiver_timeout_ns=100 * MS)
    publish(tx, 3)
    tx.on_frame(ack(2), MS)                       # window: up to 2 + 10 = 12
    tx.on_frame(ack(1, receiver=RECEIVER + 1), MS)  # a slower receiver: up to 11
    for i in range(3, 20):
        assert tx.offer(i, b"m%05d" % i, MS)      # accepted; the excess waits, pending
    tx.flush(MS)
    assert sent_seqs(sink) == [1, 2, 3] + list(range(4, 12))
    assert tx.counters.window_full > 0 and len(tx.pending) == 9  # seqs 12..20
    tx.on_frame(ack(9, receiver=RECEIVER + 1), 2 * MS)  # the slow one catches up: up to 12
    tx.do_work(2 * MS)
    tx.flush(2 * MS)
    assert sent_seqs(sink) == [12]
    # the slower receiver goes silent: after the timeout only the other one holds the window
    tx.on_frame(ack(11), 150 * MS)
    tx.do_work(150 * MS)
    tx.flush(150 * MS)
    assert sent_seqs(sink) == list(range(13, 21)) and not tx.pending


def test_the_send_window_holds_what_half_the_retransmission_buffer_cannot_repair():
    """In bytes too: unacknowledged frames never take more than half the buffer, so every
    message sent can still be retransmitted (large messages' segments, 1,000 bytes here)."""
    tx, sink = make_sender(retransmit_buffer_bytes=64 * 1024)
    tx.offer(0, bytes(1_000), 0)
    tx.flush(0)
    tx.on_frame(ack(0), MS)  # a receiver is live, nothing acknowledged
    for i in range(1, 100):
        assert tx.offer(i, bytes(1_000), MS)
        tx.flush(MS)
    sent = sent_seqs(sink)
    held = 32 * 1024 // 1_040  # frames of one 1,000-byte message: 1,040 body bytes
    assert held <= len(sent) <= held + 2 and tx.counters.window_full > 0
    assert tx.buffer.lowest_seq == 1  # nothing unacknowledged was evicted
    tx.on_frame(ack(len(sent)), 2 * MS)
    tx.do_work(2 * MS)
    tx.flush(2 * MS)
    assert sent_seqs(sink)[0] == len(sent) + 1 and len(tx.pending) < 99 - len(sent)


def test_a_send_window_of_zero_is_off():
    tx, sink = make_sender(send_window_messages=0)
    publish(tx, 2)
    tx.on_frame(ack(1), MS)
    publish(tx, 50, MS, start=2)
    assert len(sent_seqs(sink)) == 52 and tx.counters.window_full == 0


def _resent_bytes(sink):
    return sum(len(f) for f in frames_of(sink, FrameType.RETRANSMISSION))


def test_a_nak_for_what_the_requester_acknowledged_resends_nothing():
    tx, sink = make_sender()
    publish(tx, 100)
    sink.take()
    ack = bytes(encode_admin(FrameType.ACK, [Ack(80, 1 << 20)], source_session=RECEIVER,
                             dest_session=SENDER_SESSION, stream_id=STREAM))
    tx.on_frame(ack, MS)
    tx.on_frame(nak([(1, 100)], from_session=RECEIVER), 2 * MS)
    resent = [s for f in frames_of(sink, FrameType.RETRANSMISSION) for s in message_seqs(f)]
    assert resent == list(range(81, 101)) and tx.counters.nak_ranges_acked == 1
    tx.on_frame(nak([(1, 80)], from_session=RECEIVER), 30 * MS)  # stale or forged: nothing
    assert not sink.take() and tx.counters.nak_ranges_acked == 2
    # another receiver's ACK says nothing about this requester
    tx.on_frame(nak([(1, 10)], from_session=RECEIVER + 1), 60 * MS)
    assert tx.counters.retransmitted == 30


def test_what_naks_make_a_sender_resend_is_bounded_per_requester_and_per_time():
    from datapath.reliability.retransmit import AnswerBudget

    budget = AnswerBudget(bytes_per_s=100_000, burst_bytes=4_000)
    tx, sink = make_sender(answer_budget=None)
    tx.answer_budget = budget
    other, other_sink = make_sender()
    other.answer_budget = budget  # a second stream towards the same requester shares it
    publish(tx, 1_000)
    publish(other, 1_000)
    sink.take()
    other_sink.take()
    for t in range(20):  # 20 NAKs of 48 bytes for everything, 1 ms apart
        tx.on_frame(nak([(1, 1_000)], from_session=RECEIVER), (100 + t) * MS)
    resent = tx.counters.retransmitted_bytes
    assert resent <= 4_000 + 100_000 * 0.02  # the burst, then the rate
    assert tx.counters.nak_answers_limited == 20 and tx.counters.retransmits_limited > 0
    other.on_frame(nak([(1, 1_000)], from_session=RECEIVER), 120 * MS)
    assert other.counters.retransmitted_bytes <= 100_000 * 0.001 + 100  # the budget is spent
    tx.on_frame(nak([(1, 1_000)], from_session=RECEIVER), 1_200 * MS)  # a second later
    assert 3_000 <= tx.counters.retransmitted_bytes - resent <= 4_000
    assert _resent_bytes(sink) >= tx.counters.retransmitted_bytes
