"""A message a sender cannot take (its pending queue full) and skips keeps its sequence number
as a declared loss: receivers report exactly the skipped sequences as one SENDER_LOSS event in
their position, a skipped tail is announced (and probed), NAKs for skipped sequences are
answered with LOSS, and a LOSS naming sequences far ahead of a receiver's window is ignored."""

from datapath.flow_control import PolicyQueue
from datapath.protocol.admin_layout import FlowPolicy
from datapath.protocol.frame_layout import FrameType
from datapath.reliability import (
    LossReason,
    ReceiverConfig,
    ReliableReceiver,
    ReliableSender,
    SenderConfig,
    StreamKey,
)
from datapath.reliability.sink import CollectingSink
from tests.datapath.reliability.frames import (
    SENDER_ADDR,
    SENDER_SESSION,
    STREAM,
    admin,
    data,
    loss,
    make_receiver,
    message_seqs,
    nak,
    nak_ranges,
    sent_of,
)
from tests.datapath.reliability.simnet import Recorder

MS = 1_000_000
KEY = StreamKey(SENDER_SESSION, STREAM)
RECEIVER = 99


class Pipe:
    """A sender and a receiver joined in memory; ACKs can be held back (a closed window) and
    frames of one type dropped."""

    def __init__(self, *, window=10, pending=3, receiver_window=65_536):
        self.tx_sink, self.rx_sink = CollectingSink(), CollectingSink()
        self.tx = ReliableSender(self.tx_sink, session_id=SENDER_SESSION, stream_id=STREAM,
                                 dest="R", latency_budget_ns=0,
                                 config=SenderConfig(send_window_messages=window,
                                                     pending_messages=pending))
        self.rec = Recorder()
        self.rx = ReliableReceiver(self.rec, self.rx_sink, session_id=RECEIVER,
                                   config=ReceiverConfig(window_messages=receiver_window))
        self.hold_acks = False
        self.held: list[bytes] = []
        self.drop_type: int | None = None
        self.to_rx: list[int] = []
        """Types of the frames that reached the receiver, in order."""

    def pump(self, t):
        """Deliver frames both ways and run both duty cycles until nothing moves."""
        while True:
            self.tx.do_work(t)
            self.tx.flush(t)
            frames = self.tx_sink.take()
            for f, _ in frames:
                if f[3] != self.drop_type:
                    self.to_rx.append(f[3])
                    self.rx.on_frame(f, t, "S")
            self.rx.do_work(t)
            replies = self.rx_sink.take()
            for f, _ in replies:
                if self.hold_acks and f[3] == FrameType.ACK:
                    self.held.append(f)
                else:
                    self.tx.on_frame(f, t)
            if not frames and not replies:
                return

    def release_acks(self, t):
        self.hold_acks = False
        for f in self.held:
            self.tx.on_frame(f, t)
        self.held.clear()

    def offer(self, n, t, start):
        """Offer messages start..start+n-1 (topic key = index); skip the ones refused."""
        refused = 0
        for i in range(start, start + n):
            if not self.tx.offer(i, b"m%05d" % i, t):
                self.tx.skip(t)
                refused += 1
        return refused


def test_messages_refused_behind_a_closed_window_become_one_loss_in_their_place():
    p = Pipe(window=10, pending=3)
    p.offer(1, 0, start=0)
    p.pump(0)                                 # seq 1 delivered and ACKed: window up to 11
    p.hold_acks = True
    assert p.offer(10, MS, start=1) == 0      # seqs 2..11 go out
    assert p.offer(3, MS, start=11) == 0      # pending full: 12..14 wait
    assert p.offer(4, MS, start=14) == 4      # refused and skipped: 15..18
    assert len(p.tx.pending) == 4             # one marker past the capacity of 3
    p.pump(2 * MS)
    assert p.rec.seqs == list(range(1, 12)) and p.rec.losses == []
    p.release_acks(3 * MS)                    # the window opens
    p.pump(3 * MS)
    assert p.offer(3, 4 * MS, start=18) == 0  # later messages: 19..21
    p.pump(4 * MS)
    assert p.rec.items == ([("msg", s) for s in range(1, 15)] + [("loss", (15, 18))]
                           + [("msg", s) for s in range(19, 22)])
    assert [(e.first_seq, e.last_seq, e.reason) for e in p.rec.losses] == [
        (15, 18, LossReason.SENDER_LOSS)]
    assert p.rec.keys == list(range(14)) + [18, 19, 20]  # every accepted message, in order
    assert p.tx.counters.offers_refused == 4 and p.tx.buffer.skipped_messages == 4
    assert p.rx.counters.lost_messages == 4 and not p.tx.pending


def test_a_skipped_run_longer_than_the_window_never_goes_past_it():
    p = Pipe(window=4, pending=2)
    p.offer(1, 0, start=0)
    p.pump(0)                                 # window up to 1 + 4 = 5
    p.hold_acks = True
    assert p.offer(4, MS, start=1) == 0       # 2..5 out
    assert p.offer(2, MS, start=5) == 0       # 6..7 pending
    assert p.offer(9, MS, start=7) == 9       # 8..16 skipped
    p.pump(MS)
    p.release_acks(2 * MS)                    # ACK 5: up to 9
    p.pump(2 * MS)
    assert p.tx.next_seq - 1 <= max(p.tx.acks.values()) + 4
    for t in range(3, 10):                    # each ACK moves the window on
        p.pump(t * MS)
    assert p.tx.next_seq == 17 and not p.tx.pending
    covered = [s for e in p.rec.losses for s in range(e.first_seq, e.last_seq + 1)]
    assert covered == list(range(8, 17))
    assert all(e.reason is LossReason.SENDER_LOSS for e in p.rec.losses)
    assert p.rec.seqs == list(range(1, 8))


def test_a_skip_at_the_tail_is_reported_even_when_its_announcement_is_lost():
    p = Pipe()
    p.offer(3, 0, start=0)
    p.pump(0)
    p.drop_type = FrameType.LOSS              # the immediate announcement does not arrive
    p.tx.skip(MS)
    p.pump(MS)
    assert p.rec.losses == [] and p.tx.highest_sent == 4
    p.drop_type = None
    t = MS
    while not p.rec.losses and t < 100 * MS:  # the tail probe names the skipped range
        t += MS
        p.pump(t)
    assert p.rec.items[-1] == ("loss", (4, 4))
    assert p.rec.losses[0].reason is LossReason.SENDER_LOSS
    assert p.rx.stream_state(KEY)["low"] == 5 and p.tx.counters.tail_probes >= 1
    assert FrameType.RETRANSMISSION not in p.to_rx  # the probe named the loss, not message 3


def test_a_loss_ahead_of_the_stream_naks_what_lies_before_it_and_keeps_order():
    rx, rec, sink = make_receiver()
    rx.on_frame(data([1, 2]), 0, SENDER_ADDR)
    rx.on_frame(loss([(5, 6)]), 0, SENDER_ADDR)  # DATA 3..4 lost on the way
    rx.do_work(0)
    assert nak_ranges(sent_of(sink, FrameType.NAK)) == [(3, 4)]
    assert rec.items == [("msg", 1), ("msg", 2)]
    rx.on_frame(data([3, 4], frame_type=FrameType.RETRANSMISSION), MS, SENDER_ADDR)
    rx.on_frame(data([5, 7]), MS, SENDER_ADDR)  # 5 is a duplicate of the lost range
    assert rec.items == [("msg", 1), ("msg", 2), ("msg", 3), ("msg", 4), ("loss", (5, 6)),
                         ("msg", 7)]
    assert rx.counters.duplicates == 1


def test_a_forged_loss_far_beyond_the_window_is_ignored_and_one_across_it_is_cut_to_it():
    rx, rec, sink = make_receiver(window_messages=100)
    rx.on_frame(data([1, 2, 3]), 0, SENDER_ADDR)
    rx.on_frame(loss([(1_000, 1_005), (2**63, 2**64 - 1)]), 0, SENDER_ADDR)
    rx.do_work(0)
    assert rec.losses == [] and rx.stream_state(KEY)["highest"] == 3
    assert sent_of(sink, FrameType.NAK) == [] and rx.counters.beyond_window == 2
    rx.on_frame(loss([(4, 2**64 - 1)]), MS, SENDER_ADDR)
    assert [(e.first_seq, e.last_seq) for e in rec.losses] == [(4, 103)]  # low 4 + window 100
    assert rx.stream_state(KEY)["highest"] == 103


def test_a_nak_over_skipped_and_held_sequences_gets_both_answers():
    sink = CollectingSink()
    tx = ReliableSender(sink, session_id=SENDER_SESSION, stream_id=STREAM, dest="R",
                        latency_budget_ns=0)
    for i in range(3):
        assert tx.offer(i, b"x", 0)
    tx.skip(0)
    tx.skip(0)
    for i in range(3, 5):
        assert tx.offer(i, b"x", 0)
    tx.flush(0)
    announced = [[(e.first_seq, e.last_seq) for e in admin(f)[1]]
                 for f in [f for f, _ in sink.take() if f[3] == FrameType.LOSS]]
    assert announced == [[(4, 4)], [(5, 5)]]  # each skip is announced as it happens
    tx.on_frame(nak([(2, 7)], from_session=RECEIVER), MS)
    out = sink.take()
    assert [s for f, _ in out if f[3] == FrameType.RETRANSMISSION
            for s in message_seqs(f)] == [2, 3, 6, 7]
    assert [[(e.first_seq, e.last_seq) for e in admin(f)[1]]
            for f, _ in out if f[3] == FrameType.LOSS] == [[(4, 5)]]
    assert tx.counters.loss_messages == 2 and tx.counters.retransmitted == 4


def test_the_sender_forgets_skipped_ranges_below_what_its_buffer_holds():
    sink = CollectingSink()
    tx = ReliableSender(sink, session_id=SENDER_SESSION, stream_id=STREAM, dest="R",
                        latency_budget_ns=0, config=SenderConfig(retransmit_buffer_messages=4))
    for i in range(20):
        assert tx.offer(i, b"x", 0)
        tx.skip(0)                            # 1 sent, 2 skipped, 3 sent, ...
    tx.flush(0)
    sink.take()
    assert len(tx.buffer._skipped) <= 4 and tx.buffer.skipped_messages == 20
    tx.on_frame(nak([(1, 40)], from_session=RECEIVER), MS)
    out = sink.take()
    lost = [(e.first_seq, e.last_seq) for f, _ in out if f[3] == FrameType.LOSS
            for e in admin(f)[1]]
    resent = [s for f, _ in out if f[3] == FrameType.RETRANSMISSION for s in message_seqs(f)]
    assert sorted(resent + [s for a, b in lost for s in range(a, b + 1)]) == list(range(1, 41))
    assert set(resent) <= set(range(1, 41, 2))  # nothing skipped is ever resent


def test_drop_oldest_never_evicts_a_marker():
    q = PolicyQueue(2, FlowPolicy.THROTTLE)
    assert q.offer(1, "a") and q.offer(2, "b") and not q.offer(3, "c")
    q.push_marker("skipped")
    assert len(q) == 3 and q.last_item() == "skipped"
    q.set_policy(FlowPolicy.DROP_OLDEST)
    assert q.offer(4, "d") and q.offer(5, "e") and q.offer(6, "f")
    items = []
    while (slot := q.poll()) is not None:
        items.append(slot[1])
    assert items == ["skipped", "e", "f"] and q.dropped == 3


def test_the_loss_probe_of_a_skipped_tail_keeps_forged_far_frames_from_resyncing():
    rx, rec, _ = make_receiver(window_messages=100, recovery_timeout_ns=100 * MS)
    rx.on_frame(data([1, 2, 3]), 0, SENDER_ADDR)
    rx.on_frame(loss([(4, 4)]), 0, SENDER_ADDR)       # the skipped tail, announced
    rx.on_frame(data([5_000]), MS, SENDER_ADDR)       # forged, far beyond the window
    for t in range(10, 400, 10):                      # the sender's tail probes (LOSS 4..4)
        rx.on_frame(loss([(4, 4)]), t * MS, SENDER_ADDR)
        rx.do_work(t * MS)
    assert rx.counters.resyncs == 0 and rx.stream_state(KEY)["highest"] == 4
    assert rec.items[-1] == ("loss", (4, 4)) and len(rec.losses) == 1
