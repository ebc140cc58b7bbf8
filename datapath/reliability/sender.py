"""The sending end of one reliable stream: sequence, batch, keep, answer NAKs, probe the tail.

``offer`` gives a message a sequence number and packs it into the open DATA frame; the
``AdaptiveBatcher`` says when the frame leaves (full, target reached, or latency budget spent).
Each frame sent is kept in a bounded ``RetransmitBuffer``. A NAK is answered at once with
RETRANSMISSION frames (messages flagged RETRANSMITTED) for what the buffer holds and a LOSS
frame for what it no longer holds; ranges never sent are ignored. While the stream is quiet
the sender resends its last message as a tail-loss probe, backing off to a maximum interval.
FLOW_CONTROL "on" from any receiver pauses new data: offers then wait in a pending queue under
the receivers' policy (seed 002). Time is always passed in (``now_ns``).

A sender may have an ``evicted_source`` (``EvictedSource``): something else that may still
hold what its buffer no longer does (an appliance's cache). A NAK for such sequences is
then handed to it instead of being answered with LOSS at once; it answers later through
``retransmit_stored`` (RETRANSMISSION frames, as for the buffer's messages) and
``declare_lost`` (LOSS for what neither holds), or not at all (the receiver asks again).

A message the stream should carry but cannot take (``offer`` refused it: the pending queue is
full under THROTTLE) is not lost silently when the caller ``skip``s it: it gets a sequence
number in its place, is never sent, and is announced as lost (a LOSS frame at once, the tail
probe while it ends the stream, LOSS in answer to any NAK), so every receiver reports it as an
``UnrecoverableLoss`` (SENDER_LOSS) in sequence position.
"""

from __future__ import annotations

import time
from typing import Protocol

from datapath.batching import LATENCY_BUDGET_NS, AdaptiveBatcher
from datapath.flow_control import PolicyQueue, SenderFlowControl
from datapath.protocol import message_layout as ml
from datapath.protocol.admin_layout import FlowPolicy, SeqRange
from datapath.protocol.codec import Buffer, FrameWriter, decode_frame
from datapath.protocol.errors import ProtocolError
from datapath.protocol.frame_layout import FRAME_HEADER_BYTES, FrameType
from datapath.reliability.config import FIRST_SEQUENCE, SenderConfig
from datapath.reliability.errors import ReliabilityError
from datapath.reliability.events import SenderCounters, StreamKey
from datapath.reliability.retransmit import AnswerBudget, RetransmitBuffer
from datapath.reliability.sink import FrameSink
from datapath.reliability.wire import RawFrameBuilder, admin_frames

_ADMIN_FOR_SENDER = frozenset({FrameType.NAK, FrameType.ACK, FrameType.FLOW_CONTROL})
_APP_FLAGS = ml.APP_MESSAGE_FLAGS
MAX_ACKING_RECEIVERS = 1_024
"""Receivers whose ACK position a sender remembers."""


class EvictedSource(Protocol):
    """Where a sender looks for NAKed messages its retransmission buffer no longer holds."""

    def request(self, sender: ReliableSender, first: int, last: int,
                now_ns: int) -> list[SeqRange]:
        """Sequences ``first``..``last`` were NAKed and are gone from ``sender``'s buffer:
        returns the parts to announce lost now; the rest it answers later (or refuses, and
        the receiver asks again)."""
        ...


class _Skipped:
    """A pending-queue marker: ``count`` consecutive messages skipped at this place."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count


class ReliableSender:
    """One stream (session_id, stream_id) of a publisher or appliance egress; an agent."""

    name = "reliable-sender"

    def __init__(self, sink: FrameSink, *, session_id: int, stream_id: int, dest: object = None,
                 config: SenderConfig | None = None,
                 latency_budget_ns: int = LATENCY_BUDGET_NS,
                 flow: SenderFlowControl | None = None,
                 answer_budget: AnswerBudget | None = None) -> None:
        self.config = config = config or SenderConfig()
        self.sink = sink
        self.key = StreamKey(session_id, stream_id)
        self.dest = dest
        self.counters = SenderCounters()
        self.batcher = AdaptiveBatcher(latency_budget_ns, max_frame_bytes=config.max_frame_bytes)
        self.buffer = RetransmitBuffer(config.retransmit_buffer_bytes,
                                       config.retransmit_buffer_messages)
        self.flow = flow or SenderFlowControl()
        self.answer_budget = answer_budget
        """Bounds what NAKs make this sender resend (shared by the streams to one requester);
        None: only the per-NAK cap bounds it."""
        self.pending = PolicyQueue(config.pending_messages, FlowPolicy.THROTTLE)
        self.hold = False
        """True: an appended message does not flush the open frame unless it is full (the
        owner sends it with ``flush``, its duty cycle once the latency budget is spent):
        for an owner that offers bursts and flushes after each."""
        self.evicted_source: EvictedSource | None = None
        """Asked for NAKed sequences the buffer no longer holds (None: LOSS at once)."""
        self.acks: dict[int, int] = {}
        """Receiver session -> highest cumulative ACK seen from it."""
        self._acked_ns: dict[int, int] = {}
        """Receiver session -> when its last ACK arrived (receivers holding the window)."""
        self._window_end: int | None = None
        self._window_low: int | None = None
        """The lowest ACK of the receivers heard lately (None: none, or no window)."""
        self._window_bytes = config.retransmit_buffer_bytes // 2
        self._bytes_closed = False
        """Unacknowledged bytes the sender holds at most: what it sends can still be
        repaired from its retransmission buffer (messages of a large message's segments
        would otherwise outrun it)."""
        """Highest sequence the send window lets out (None: no receiver has ACKed yet)."""
        self.next_seq = FIRST_SEQUENCE
        self._buf = bytearray(config.max_frame_bytes)
        self._view = memoryview(self._buf)
        self._writer = FrameWriter(self._buf)
        self._frame_first_seq = FIRST_SEQUENCE
        self._max_payload = config.max_frame_bytes - FRAME_HEADER_BYTES - ml.MESSAGE_HEADER_BYTES
        self._probe_at_ns: int | None = None
        self._probe_interval_ns = config.tail_probe_delay_ns
        self._paused = False

    # --- publishing -------------------------------------------------------------------------

    @property
    def highest_sent(self) -> int:
        """Highest sequence that has left in a frame or was skipped (0 before the first)."""
        return self.buffer.next_seq - 1

    @property
    def paused(self) -> bool:
        """Whether flow control held new data back at the last offer or duty cycle."""
        return self._paused

    def offer(self, topic_key: int, payload: Buffer, now_ns: int, *,
              publish_ts_ns: int | None = None, namespace_id: int = 0, schema_id: int = 0,
              qos: int = 0, flags: int = 0) -> bool:
        """Publish one message; False when refused (paused, THROTTLE policy, pending full)."""
        if len(payload) > self._max_payload:
            raise ReliabilityError(f"a payload of {len(payload)} bytes does not fit one frame of "
                                   f"{self.config.max_frame_bytes} bytes (at most "
                                   f"{self._max_payload}); split it or raise max_frame_bytes")
        if qos > ml.MAX_QOS or flags & ~_APP_FLAGS:
            raise ReliabilityError(f"qos {qos} / flags {flags:#x} are not publishable; use qos "
                                   "0..2 and only the PARTIAL, HEADERS and SEGMENT flags")
        ts = time.time_ns() if publish_ts_ns is None else publish_ts_ns
        if self._must_wait(now_ns):
            return self._hold(topic_key, (topic_key, bytes(payload), ts, namespace_id, schema_id,
                                          qos, flags), now_ns)
        self._append(topic_key, payload, ts, namespace_id, schema_id, qos, flags, now_ns)
        return True

    def _must_wait(self, now_ns: int) -> bool:
        """Whether what is offered now must wait in the pending queue: others wait already,
        a receiver's flow control is on, or the send window is full."""
        return bool(self.pending) or self.flow.paused(now_ns) or not self._window_open(now_ns)

    def _hold(self, topic_key: int, item: tuple, now_ns: int) -> bool:
        paused = self._paused = self.flow.paused(now_ns)
        pending = self.pending
        pending.set_policy(self.flow.policy() if paused else FlowPolicy.THROTTLE)
        ok = pending.offer(topic_key, item, conflate=paused)
        c = self.counters
        c.pending_dropped = pending.dropped
        c.pending_conflated = pending.conflated
        if not ok:
            c.offers_refused += 1
        return ok

    def _append(self, topic_key: int, payload: Buffer, ts: int, namespace_id: int,
                schema_id: int, qos: int, flags: int, now_ns: int) -> None:
        size = ml.message_bytes(len(payload), 0)
        batcher = self.batcher
        if batcher.count and not batcher.fits(size):
            self._flush(now_ns)
        if batcher.count == 0:
            self._writer.begin(FrameType.DATA, source_session=self.key.source_session,
                               dest_session=self.config.dest_session,
                               stream_id=self.key.stream_id)
            self._frame_first_seq = self.next_seq
        self._writer.append(topic_key, self.next_seq, ts, payload, namespace_id=namespace_id,
                            schema_id=schema_id, qos=qos, flags=flags)
        self.next_seq += 1
        self.counters.messages += 1
        if batcher.on_append(size, now_ns) and (not self.hold or batcher.full()):
            self._flush(now_ns)

    def skip(self, now_ns: int) -> None:
        """Account for one message the stream should have carried but could not take (``offer``
        refused it): it gets a sequence number in its place (behind any pending messages), is
        never sent, and every receiver learns of it as an unrecoverable loss (SENDER_LOSS).

        While messages are pending (or the stream is paused or its window is full) the skip
        waits in the pending queue as a marker; consecutive skips share one marker (a count),
        so the queue grows by at most one entry past its capacity. When the marker is reached
        the open frame leaves, ``next_seq`` moves past the skipped sequences (never past the
        send window), a LOSS frame names them, and NAKs covering them are answered with LOSS.
        """
        if self._must_wait(now_ns):
            pending = self.pending
            last = pending.last_item()
            if isinstance(last, _Skipped):
                last.count += 1
            else:
                pending.push_marker(_Skipped(1))
            return
        self._skip_now(1, now_ns)

    def _skip_now(self, count: int, now_ns: int) -> None:
        if self.batcher.count:
            self._flush(now_ns)  # a frame's sequences are contiguous
        first = self.next_seq
        self.next_seq = first + count
        self.buffer.skip(first, count)
        self._announce_loss([SeqRange(first, first + count - 1)])
        self._probe_interval_ns = self.config.tail_probe_delay_ns
        self._probe_at_ns = now_ns + self._probe_interval_ns

    def _announce_loss(self, lost: list[SeqRange]) -> None:
        """LOSS frames naming ``lost`` to the stream's receivers."""
        for frame in admin_frames(FrameType.LOSS, lost, self.config.max_nak_ranges_per_frame,
                                  source_session=self.key.source_session,
                                  dest_session=self.config.dest_session,
                                  stream_id=self.key.stream_id):
            self.sink.send_frame(memoryview(frame), self.dest)
            self.counters.loss_frames += 1

    def flush(self, now_ns: int) -> bool:
        """Send the open frame now, whatever the batcher says; False if there was none."""
        if not self.batcher.count:
            return False
        self._flush(now_ns)
        return True

    def _flush(self, now_ns: int) -> None:
        length = self._writer.finish()
        count = self.batcher.on_flush(now_ns)
        frame = self._view[:length]
        self.buffer.append(self._frame_first_seq, count, frame[FRAME_HEADER_BYTES:])
        if self._window_low is not None:
            self._update_bytes_window()
        self.sink.send_frame(frame, self.dest)
        c = self.counters
        c.frames += 1
        c.bytes += length
        self._probe_interval_ns = self.config.tail_probe_delay_ns
        self._probe_at_ns = now_ns + self._probe_interval_ns

    # --- duty cycle -------------------------------------------------------------------------

    def do_work(self, now_ns: int) -> int:
        work = 0
        self._paused = paused = self.flow.paused(now_ns)
        if not paused and self.pending and self._window_open(now_ns):
            work += self._drain_pending(now_ns)
        if self.batcher.due(now_ns):
            self._flush(now_ns)
            work += 1
        if (self._probe_at_ns is not None and now_ns >= self._probe_at_ns
                and not self.batcher.count):
            work += self._probe_tail(now_ns)
        return work

    def _drain_pending(self, now_ns: int) -> int:
        limit = self.counters.frames + self.config.frames_per_duty_cycle
        peek, poll = self.pending.peek, self.pending.poll
        moved = 0
        while self.counters.frames < limit:
            end = self._window_end
            if end is not None and self.next_seq > end or self._bytes_closed:
                break
            slot = peek()
            if slot is None:
                break
            item = slot[1]
            if isinstance(item, _Skipped):
                n = item.count if end is None else min(item.count, end - self.next_seq + 1)
                item.count -= n
                if not item.count:
                    poll()
                self._skip_now(n, now_ns)
                moved += 1
                continue
            poll()
            topic_key, payload, ts, namespace_id, schema_id, qos, flags = item
            self._append(topic_key, payload, ts, namespace_id, schema_id, qos, flags, now_ns)
            moved += 1
        return moved

    # --- the send window --------------------------------------------------------------------

    def _window_open(self, now_ns: int) -> bool:
        """May the next message go out? Full when it is send_window_messages past the lowest
        ACK of the receivers heard lately, or when what they have not acknowledged takes half
        the retransmission buffer; a receiver silent for the timeout stops counting."""
        end = self._window_end
        if (end is None or self.next_seq <= end) and not self._bytes_closed:
            return True
        self._recompute_window(now_ns)
        end = self._window_end
        if (end is None or self.next_seq <= end) and not self._bytes_closed:
            return True
        self.counters.window_full += 1
        return False

    def _update_bytes_window(self) -> None:
        """Whether the unacknowledged bytes held reach half the retransmission buffer: asked
        when a frame goes out and when an ACK comes (one frame more may go past it)."""
        low = self._window_low
        self._bytes_closed = low is not None and \
            self.buffer.bytes_from(low + 1) >= self._window_bytes

    def _recompute_window(self, now_ns: int) -> None:
        size = self.config.send_window_messages
        if not size:
            self._window_end = self._window_low = None
            self._bytes_closed = False
            return
        since = now_ns - self.config.send_window_receiver_timeout_ns
        live = [self.acks[s] for s, at in self._acked_ns.items() if at >= since]
        self._window_low = min(live) if live else None
        self._window_end = min(live) + size if live else None
        self._update_bytes_window()

    def _probe_tail(self, now_ns: int) -> int:
        """Resend the last message, or name the skipped range that ends the stream in LOSS."""
        self._probe_interval_ns = min(self._probe_interval_ns * 2,
                                      self.config.tail_probe_max_interval_ns)
        self._probe_at_ns = now_ns + self._probe_interval_ns
        tail = self.buffer.tail_skipped()
        if tail is not None:
            self._announce_loss([SeqRange(*tail)])
            self.counters.tail_probes += 1
            return 1
        last = self.buffer.last_message()
        if last is None:
            return 0
        builder = self._builder(FrameType.RETRANSMISSION)
        builder.add(last[1])
        builder.flush()
        self.counters.tail_probes += 1
        return 1

    def _builder(self, frame_type: FrameType) -> RawFrameBuilder:
        return RawFrameBuilder(
            self.config.max_frame_bytes, self._send, frame_type=frame_type,
            source_session=self.key.source_session, dest_session=self.config.dest_session,
            stream_id=self.key.stream_id, set_flags=int(ml.MessageFlags.RETRANSMITTED))

    def _send(self, frame: memoryview) -> None:
        self.sink.send_frame(frame, self.dest)

    # --- control frames from receivers ------------------------------------------------------

    def on_frame(self, frame: Buffer, now_ns: int, reply_to: object = None) -> bool:
        """A NAK, ACK or FLOW_CONTROL frame; True when it was for this stream and used."""
        c = self.counters
        if len(frame) < FRAME_HEADER_BYTES or frame[3] not in _ADMIN_FOR_SENDER:
            c.not_for_us += 1
            return False
        try:
            parsed = decode_frame(frame)
        except ProtocolError:
            c.malformed += 1
            return False
        h = parsed.header
        if h.stream_id != self.key.stream_id or h.dest_session != self.key.source_session:
            c.not_for_us += 1
            return False
        _, entries = parsed.admin()
        if h.frame_type is FrameType.NAK:
            self._on_nak(entries, now_ns, self.acks.get(h.source_session, 0))
        elif h.frame_type is FrameType.ACK:
            c.acks += 1
            if h.source_session in self.acks or len(self.acks) < MAX_ACKING_RECEIVERS:
                best = max(e.ack_seq for e in entries)
                self.acks[h.source_session] = max(self.acks.get(h.source_session, 0), best)
                self._acked_ns[h.source_session] = now_ns
                self._recompute_window(now_ns)
        else:
            c.flow_control_frames += 1
            for entry in entries:
                self.flow.on_signal(h.source_session, entry, now_ns)
            self._paused = self.flow.paused(now_ns)
        return True

    def _on_nak(self, ranges: list[SeqRange], now_ns: int, acked: int = 0) -> None:
        """Answer a NAK from a requester whose cumulative ACK is ``acked``: what it already
        has is never resent, and what is resent is drawn from its ``answer_budget``."""
        c = self.counters
        answer_budget = self.answer_budget
        limited = False
        c.nak_frames += 1
        buffer = self.buffer
        highest = buffer.next_seq - 1
        low = buffer.lowest_seq
        budget = self.config.max_retransmit_messages_per_nak
        linger = self.config.retransmit_linger_ns
        lost: list[SeqRange] = []
        builder = self._builder(FrameType.RETRANSMISSION)
        for r in ranges:
            c.nak_ranges += 1
            first, last = r.first_seq, r.last_seq
            if first > last or first < FIRST_SEQUENCE:
                c.nak_ranges_invalid += 1
                continue
            if first > highest:
                c.nak_ranges_unsent += 1
                continue
            if first <= acked:  # the requester said it has these: stale, or not its NAK
                c.nak_ranges_acked += 1
                first = acked + 1
                if first > last:
                    continue
            if last > highest:
                c.nak_ranges_unsent += 1
                last = highest
            if first < low:
                gone = min(last, low - 1)
                source = self.evicted_source
                for r2 in ([SeqRange(first, gone)] if source is None
                           else source.request(self, first, gone, now_ns)):
                    lost.append(r2)
                    c.loss_messages += r2.last_seq - r2.first_seq + 1
                first = gone + 1
                if first > last:
                    continue
            for a, b in buffer.skipped_in(first, last, budget):
                lost.append(SeqRange(a, b))  # skipped: never sent, answered like evicted ones
                c.loss_messages += b - a + 1
                budget -= 1
            for seq, message in buffer.messages(first, last):
                if budget <= 0:
                    c.retransmits_capped += last - seq + 1
                    break
                if buffer.lingering(seq, now_ns, linger):
                    c.retransmits_lingering += 1
                    continue
                if answer_budget is not None and not answer_budget.take(len(message), now_ns):
                    c.retransmits_limited += last - seq + 1
                    limited = True
                    break
                builder.add(message)
                budget -= 1
                c.retransmitted += 1
                c.retransmitted_bytes += len(message)
        builder.flush()
        c.retransmit_frames += builder.frames
        if limited:
            c.nak_answers_limited += 1
        if lost:
            self._announce_loss(lost)

    def retransmit_stored(self, messages: list[memoryview | bytes], now_ns: int) -> int:
        """Resend messages the buffer no longer held, read back by the ``evicted_source``
        (wire bytes, each with its sequence on this stream): RETRANSMISSION frames as for
        any NAK answer, drawn from the same ``answer_budget``. Returns how many were sent;
        the others wait for the receiver's next NAK (counted ``retransmits_limited``)."""
        c = self.counters
        budget = self.answer_budget
        builder = self._builder(FrameType.RETRANSMISSION)
        sent = 0
        for message in messages:
            if budget is not None and not budget.take(len(message), now_ns):
                c.retransmits_limited += len(messages) - sent
                c.nak_answers_limited += 1
                break
            builder.add(memoryview(message))
            sent += 1
            c.retransmitted += 1
            c.retransmitted_bytes += len(message)
        builder.flush()
        c.retransmit_frames += builder.frames
        return sent

    def declare_lost(self, lost: list[SeqRange]) -> None:
        """LOSS for NAKed sequences neither the buffer nor the ``evicted_source`` holds."""
        if lost:
            self.counters.loss_messages += sum(r.last_seq - r.first_seq + 1 for r in lost)
            self._announce_loss(lost)

    def on_close(self) -> None:
        return None
