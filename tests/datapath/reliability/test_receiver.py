"""A receiver detects gaps, NAKs them by range with backoff, delivers in order, and reports
what it cannot recover within the bound; duplicates and hostile sequence numbers are dropped."""

import pytest

from datapath.protocol.frame_layout import FrameType
from datapath.reliability import LossReason, ReliabilityError, StreamKey
from tests.datapath.reliability.frames import (
    RECEIVER_SESSION,
    SENDER_ADDR,
    SENDER_SESSION,
    STREAM,
    admin,
    data,
    loss,
    make_receiver,
    nak,
    nak_ranges,
    sent_of,
)

MS = 1_000_000
KEY = StreamKey(SENDER_SESSION, STREAM)


def test_frames_in_order_are_delivered_once_each_in_order():
    rx, rec, sink = make_receiver()
    rx.on_frame(data([1, 2, 3]), 0, SENDER_ADDR)
    rx.on_frame(data([4, 5]), 0, SENDER_ADDR)
    rx.do_work(0)
    assert rec.seqs == [1, 2, 3, 4, 5] and rec.keys == [1001, 1002, 1003, 1004, 1005]
    assert sent_of(sink, FrameType.NAK) == [] and rx.counters.delivered == 5


def test_a_gap_is_naked_as_one_range_addressed_to_the_streams_sender():
    rx, rec, sink = make_receiver()
    rx.on_frame(data([1, 2]), 0, SENDER_ADDR)
    rx.on_frame(data([7, 8]), 0, SENDER_ADDR)
    rx.do_work(0)
    naks = [f for f in sink.take() if f[0][3] == FrameType.NAK]
    assert len(naks) == 1
    frame, dest = naks[0]
    header, entries = admin(frame)
    assert dest == SENDER_ADDR
    assert (header.source_session, header.dest_session, header.stream_id) == (
        RECEIVER_SESSION, SENDER_SESSION, STREAM)
    assert [(e.first_seq, e.last_seq) for e in entries] == [(3, 6)]
    assert rec.seqs == [1, 2]


def test_frames_reordered_within_one_duty_cycle_need_no_nak():
    rx, rec, sink = make_receiver()
    rx.on_frame(data([3, 4]), 0, SENDER_ADDR)
    rx.on_frame(data([1, 2]), 0, SENDER_ADDR)
    rx.do_work(0)
    assert rec.seqs == [1, 2, 3, 4] and sent_of(sink, FrameType.NAK) == []
    assert rx.counters.recovered == 2  # 1 and 2 filled the gap that 3 opened


def test_nak_retries_back_off_until_the_recovery_bound_then_the_loss_is_reported_in_place():
    rx, rec, sink = make_receiver(nak_retry_initial_ns=10 * MS, nak_retry_max_ns=40 * MS,
                                  recovery_timeout_ns=200 * MS)
    rx.on_frame(data([1]), 0, SENDER_ADDR)
    rx.on_frame(data([4, 5]), 0, SENDER_ADDR)
    nak_times = []
    for t in range(0, 300 * MS, MS):
        rx.do_work(t)
        if nak_ranges(sent_of(sink, FrameType.NAK)) == [(2, 3)]:
            nak_times.append(t // MS)
    # first NAK at once, then 10, 20, 40 ms apart, capped at 40, never at/after the deadline
    assert nak_times == [0, 10, 30, 70, 110, 150, 190]
    assert [(e.first_seq, e.last_seq, e.reason) for e in rec.losses] == [
        (2, 3, LossReason.RECOVERY_TIMEOUT)]
    event = rec.losses[0]
    assert event.declared_ns == 200 * MS and event.detected_ns == 0 and event.messages == 2
    assert rec.items == [("msg", 1), ("loss", (2, 3)), ("msg", 4), ("msg", 5)]
    rx.on_frame(data([6]), 300 * MS, SENDER_ADDR)  # the stream goes on
    assert rec.seqs == [1, 4, 5, 6]
    assert rx.counters.lost_messages == 2 and rx.counters.loss_events == 1


def test_a_retransmission_fills_the_gap_and_stops_the_naks():
    rx, rec, sink = make_receiver()
    rx.on_frame(data([1, 4]), 0, SENDER_ADDR)
    rx.do_work(0)
    assert nak_ranges(sent_of(sink, FrameType.NAK)) == [(2, 3)]
    rx.on_frame(data([2, 3], frame_type=FrameType.RETRANSMISSION, flags=1), 5 * MS, SENDER_ADDR)
    for t in range(5 * MS, 3000 * MS, 5 * MS):
        rx.do_work(t)
    assert rec.seqs == [1, 2, 3, 4] and rec.flags == [0, 1, 1, 0]
    assert sent_of(sink, FrameType.NAK) == [] and rec.losses == []
    assert rx.counters.recovery_ns_max == 5 * MS


def test_a_loss_frame_from_the_sender_declares_the_range_at_once():
    rx, rec, sink = make_receiver()
    rx.on_frame(data([1, 2, 6, 7]), 0, SENDER_ADDR)
    rx.do_work(0)
    rx.on_frame(loss([(1, 4)]), MS, SENDER_ADDR)  # 3..4 lost; 5 is still recoverable
    assert [(e.first_seq, e.last_seq, e.reason) for e in rec.losses] == [
        (3, 4, LossReason.SENDER_LOSS)]
    assert rec.seqs == [1, 2]
    rx.on_frame(data([5], frame_type=FrameType.RETRANSMISSION), 2 * MS, SENDER_ADDR)
    assert rec.items == [("msg", 1), ("msg", 2), ("loss", (3, 4)), ("msg", 5), ("msg", 6),
                         ("msg", 7)]


def test_duplicates_are_counted_and_dropped():
    rx, rec, _ = make_receiver()
    rx.on_frame(data([1, 2, 5]), 0, SENDER_ADDR)
    for _ in range(100):
        rx.on_frame(data([1, 2, 5]), 0, SENDER_ADDR)  # delivered ones, and a stored one
    rx.on_frame(data([3, 4]), 0, SENDER_ADDR)
    assert rec.seqs == [1, 2, 3, 4, 5]
    assert rx.counters.duplicates == 300 and rx.counters.delivered == 5


def test_an_unordered_stream_delivers_on_arrival_still_once_each():
    rx, rec, sink = make_receiver(ordered=False)
    rx.on_frame(data([1, 4, 5]), 0, SENDER_ADDR)
    rx.on_frame(data([4, 2]), 0, SENDER_ADDR)
    rx.do_work(0)
    assert rec.seqs == [1, 4, 5, 2]
    assert nak_ranges(sent_of(sink, FrameType.NAK)) == [(3, 3)]
    assert rx.stream_state(KEY)["low"] == 3 and rx.counters.duplicates == 1


def test_a_forged_sequence_beyond_the_window_is_dropped_without_state_or_nak():
    rx, rec, sink = make_receiver(window_messages=1_000)
    rx.on_frame(data([1, 2]), 0, SENDER_ADDR)
    for far in (3 + 1_000, 10**9, 2**64 - 1):  # low + window is the first one out
        rx.on_frame(data([far]), 0, SENDER_ADDR)
    rx.do_work(0)
    assert rx.counters.beyond_window == 3
    assert rx.stream_state(KEY) == {"low": 3, "highest": 2, "gaps": 0, "missing": 0,
                                    "stored": 0, "stored_bytes": 0}
    assert sent_of(sink, FrameType.NAK) == []
    rx.on_frame(data([3, 4]), MS, SENDER_ADDR)
    assert rec.seqs == [1, 2, 3, 4]


def test_the_largest_gap_a_receiver_naks_is_bounded_by_its_window():
    rx, _, sink = make_receiver(window_messages=1_000)
    rx.on_frame(data([1]), 0, SENDER_ADDR)
    rx.on_frame(data([2 + 998]), 0, SENDER_ADDR)  # the last sequence inside the window
    rx.do_work(0)
    assert nak_ranges(sent_of(sink, FrameType.NAK)) == [(2, 999)]


def test_a_sender_a_window_ahead_is_followed_after_the_recovery_bound():
    rx, rec, _ = make_receiver(window_messages=1_000, recovery_timeout_ns=100 * MS)
    rx.on_frame(data([1]), 0, SENDER_ADDR)
    for i, t in enumerate(range(0, 150 * MS, 10 * MS)):  # only far-ahead frames arrive
        rx.on_frame(data([5_000 + i]), t, SENDER_ADDR)
        rx.do_work(t)
    assert [(e.first_seq, e.last_seq, e.reason) for e in rec.losses] == [
        (2, 4_999, LossReason.RESYNC)]
    assert rec.seqs == [1] and rx.counters.resyncs == 1
    # the far frames it had to drop are inside the window now: 5000..5010 are NAKed
    state = rx.stream_state(KEY)
    assert (state["low"], state["highest"], state["missing"]) == (5_000, 5_014, 11)
    rx.on_frame(data(range(5_000, 5_011), frame_type=FrameType.RETRANSMISSION), 200 * MS,
                SENDER_ADDR)
    assert rec.seqs == [1, *range(5_000, 5_015)]


def test_traffic_inside_the_window_keeps_forged_far_frames_from_moving_the_stream():
    rx, rec, _ = make_receiver(window_messages=1_000, recovery_timeout_ns=100 * MS)
    rx.on_frame(data([1]), 0, SENDER_ADDR)
    for i, t in enumerate(range(0, 1000 * MS, 10 * MS)):
        rx.on_frame(data([10**9 + i]), t, SENDER_ADDR)  # forged
        if i % 5 == 0:
            rx.on_frame(data([1], frame_type=FrameType.RETRANSMISSION), t, SENDER_ADDR)  # probe
        rx.do_work(t)
    assert rec.losses == [] and rx.counters.resyncs == 0 and rx.counters.beyond_window == 100
    rx.on_frame(data([2]), 1000 * MS, SENDER_ADDR)
    assert rec.seqs == [1, 2]


def test_back_pressure_holds_messages_in_order_and_delivers_them_later():
    rx, rec, sink = make_receiver()
    rx.on_frame(data([1]), 0, SENDER_ADDR)
    rec.refuse = True
    rx.on_frame(data([2, 3]), 0, SENDER_ADDR)
    rx.on_frame(data([4]), 0, SENDER_ADDR)
    rx.do_work(0)
    assert rec.seqs == [1] and rx.stream_state(KEY)["stored"] == 3
    rec.refuse = False
    rx.do_work(MS)
    assert rec.seqs == [1, 2, 3, 4] and sent_of(sink, FrameType.NAK) == []


def test_a_new_stream_beyond_the_stream_limit_is_refused_and_counted():
    rx, rec, _ = make_receiver(max_streams=2)
    for src in (1, 2, 3):
        rx.on_frame(data([1], src=src), 0, SENDER_ADDR)
    assert len(rec.seqs) == 2 and rx.counters.streams_refused == 1
    assert set(rx.streams) == {StreamKey(1, STREAM), StreamKey(2, STREAM)}


def test_the_gap_limit_defers_new_gaps_to_later_naks():
    rx, rec, sink = make_receiver(max_gaps=2)
    rx.on_frame(data([1, 3, 5, 7, 9]), 0, SENDER_ADDR)  # gaps 2 and 4; 7 and 9 refused
    rx.do_work(0)
    assert nak_ranges(sent_of(sink, FrameType.NAK)) == [(2, 2), (4, 4)]
    assert rx.counters.refused_full == 2
    rx.on_frame(data([2, 4], frame_type=FrameType.RETRANSMISSION), MS, SENDER_ADDR)
    rx.on_frame(data([8, 9]), MS, SENDER_ADDR)  # 6..7 NAKed now
    rx.do_work(MS)
    assert nak_ranges(sent_of(sink, FrameType.NAK)) == [(6, 7)]
    assert rec.seqs == [1, 2, 3, 4, 5]


def test_malformed_frames_and_frames_for_another_session_are_counted_and_dropped():
    rx, rec, _ = make_receiver()
    good = data([1, 2])
    rx.on_frame(good[:-8], 0, SENDER_ADDR)  # truncated
    bad_qos = bytearray(good)
    bad_qos[32 + 30] = 9
    rx.on_frame(bad_qos, 0, SENDER_ADDR)
    rx.on_frame(b"\x00" * 10, 0, SENDER_ADDR)
    rx.on_frame(data([1], dest_session=RECEIVER_SESSION + 1), 0, SENDER_ADDR)
    rx.on_frame(good, 0, SENDER_ADDR)
    assert rec.seqs == [1, 2]
    assert rx.counters.malformed == 3 and rx.counters.not_for_us == 1


def test_progress_is_acknowledged_at_most_once_per_interval():
    rx, _, sink = make_receiver(ack_interval_ns=10 * MS)
    acks = []
    for i, t in enumerate(range(0, 30 * MS, MS)):
        rx.on_frame(data([i + 1]), t, SENDER_ADDR)
        rx.do_work(t)
        for frame, dest in sent_of(sink, FrameType.ACK):
            header, entries = admin(frame)
            assert dest == SENDER_ADDR and header.dest_session == SENDER_SESSION
            acks.append((t // MS, entries[0].ack_seq))
    assert acks == [(0, 1), (10, 11), (20, 21)]


def test_a_late_joiner_starts_at_the_first_sequence_it_sees():
    rx, rec, sink = make_receiver(start_seq=None)
    rx.on_frame(data([500, 501]), 0, SENDER_ADDR)
    rx.do_work(0)
    assert rec.seqs == [500, 501] and sent_of(sink, FrameType.NAK) == []


def test_an_idle_stream_with_nothing_outstanding_is_forgotten():
    rx, _, _ = make_receiver(stream_idle_timeout_ns=100 * MS)
    rx.on_frame(data([1]), 0, SENDER_ADDR)
    rx.do_work(99 * MS)
    assert KEY in rx.streams
    rx.do_work(100 * MS)
    assert KEY not in rx.streams and rx.counters.streams_expired == 1


def test_our_own_nak_looped_back_by_the_group_is_ignored():
    rx, _, _ = make_receiver(multicast=True)
    rx.on_frame(data([1, 3]), 0, SENDER_ADDR)
    rx.on_frame(nak([(2, 2)], from_session=RECEIVER_SESSION), 0, SENDER_ADDR)
    assert rx.counters.naks_suppressed == 0 and rx.counters.not_for_us == 1


@pytest.mark.parametrize("bad", [{"window_messages": 0}, {"start_seq": 0},
                                 {"nak_retry_initial_ns": 10, "nak_retry_max_ns": 5}])
def test_settings_that_cannot_work_are_refused_with_the_component_named(bad):
    with pytest.raises(ReliabilityError, match="^reliability: "):
        make_receiver(**bad)


def test_forged_frames_do_not_redirect_naks_away_from_the_sender():
    rx, _, sink = make_receiver()
    attacker = ("10.0.0.66", 47470)
    rx.on_frame(data([1, 3]), 0, SENDER_ADDR)
    rx.on_frame(data([10**9]), 0, attacker)  # far ahead
    rx.on_frame(data([1]), 0, attacker)  # a duplicate
    rx.do_work(0)
    assert [dest for _, dest in sent_of(sink, FrameType.NAK)] == [SENDER_ADDR]


def test_the_last_ack_is_repeated_while_nothing_moves_so_a_lost_one_is_not_final():
    rx, _, sink = make_receiver(ack_interval_ns=MS, ack_idle_interval_ns=100 * MS)
    rx.on_frame(data([1, 2]), 0, SENDER_ADDR)
    times = []
    for t in range(0, 350 * MS, MS):
        rx.do_work(t)
        times += [(t // MS, admin(f)[1][0].ack_seq) for f, _ in sent_of(sink, FrameType.ACK)]
    assert times == [(0, 2), (100, 2), (200, 2), (300, 2)]
    assert rx.send_acks(350 * MS) == 1 and len(sent_of(sink, FrameType.ACK)) == 1


def test_a_stream_that_never_accepted_anything_is_not_acknowledged():
    rx, _, sink = make_receiver(window_messages=100)
    rx.on_frame(data([10**6]), 0, SENDER_ADDR)  # creates the stream, but beyond the window
    for t in range(0, 500 * MS, 10 * MS):
        rx.do_work(t)
    assert sent_of(sink, FrameType.ACK) == [] and rx.send_acks(0) == 0
