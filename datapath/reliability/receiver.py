"""The receiving end: per-stream gap detection, NAKs, reordering, dedup, bounded recovery.

For each stream (source_session, stream_id) the receiver keeps ``low`` (the first sequence not
yet delivered when ordered, not yet received when unordered), ``highest`` (the highest
accepted) and the missing ranges between them (``GapList``). A message below ``low`` or outside
every gap is a duplicate; one at or beyond ``low + window`` is dropped unseen (the bound that
keeps forged sequence numbers from allocating or NAKing anything); one above ``highest + 1``
opens a gap. Gaps are NAKed (immediately on unicast, after a random delay on multicast, where
another receiver's NAK for the same range postpones ours), retried with backoff, and declared
lost at their recovery deadline or when the sender answers LOSS: the application then gets an
``UnrecoverableLoss`` event naming the range, in sequence position, and the stream goes on.
A LOSS frame may also name sequences above ``highest`` (a sender announcing messages it skipped
at its tail): they are lost in order, what lies between is a gap NAKed as usual, and only what
is inside the window counts, as for DATA, so a forged LOSS cannot push a stream far ahead.

Frames come in through ``on_frame`` (from the channel glue, with the address to answer to);
NAK, ACK and FLOW_CONTROL frames go out through the ``FrameSink``; timers run in ``do_work``.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from datapath.protocol.admin_layout import Ack, FlowControl, SeqRange
from datapath.protocol.codec import Buffer, decode_frame, encode_admin
from datapath.protocol.errors import ProtocolError
from datapath.protocol.frame_layout import FRAME_HEADER_BYTES, FRAME_HEADER_STRUCT, FrameType
from datapath.reliability.config import ReceiverConfig
from datapath.reliability.events import (
    DeliveryHandler,
    LossReason,
    ReceiverCounters,
    StreamKey,
    UnrecoverableLoss,
)
from datapath.reliability.nak import Gap, GapList, NakSchedule
from datapath.reliability.sink import FrameSink
from datapath.reliability.wire import LENGTHS_STRUCT, SEQ_STRUCT, admin_frames

MAX_LOSS_LOG = 1_024
"""Recent loss events kept on the receiver for inspection (the handler gets every one)."""

_DATA = int(FrameType.DATA)
_RETRANSMISSION = int(FrameType.RETRANSMISSION)
_NAK = int(FrameType.NAK)
_LOSS = int(FrameType.LOSS)


class _LossMarker:
    """Stands in the reorder store where a lost range starts."""

    __slots__ = ("event",)

    def __init__(self, event: UnrecoverableLoss) -> None:
        self.event = event


class _Stream:
    __slots__ = ("ack_due_ns", "ack_idle_ns", "acked", "backlog", "beyond_min",
                 "beyond_since_ns", "blocked", "gaps", "highest", "key", "last_frame_ns", "live",
                 "low", "reply_to", "store", "store_bytes")

    def __init__(self, key: StreamKey, low: int, max_gaps: int, now_ns: int) -> None:
        self.key = key
        self.low = low
        self.highest = low - 1
        self.gaps = GapList(max_gaps)
        self.store: dict[int, bytes | _LossMarker] = {}
        self.store_bytes = 0
        self.backlog: deque[bytes] = deque()
        self.blocked = False
        self.reply_to: object = None
        self.acked = low - 1
        self.ack_due_ns = now_ns
        self.ack_idle_ns = now_ns
        self.live = False
        """Whether any message of the stream was accepted (it has a sender worth ACKing)."""
        self.last_frame_ns = now_ns
        self.beyond_since_ns: int | None = None
        self.beyond_min = 0


class ReliableReceiver:
    """Receives any number of streams for one DeliveryHandler; an agent."""

    name = "reliable-receiver"

    def __init__(self, handler: DeliveryHandler, sink: FrameSink, *, session_id: int,
                 config: ReceiverConfig | None = None, seed: int | None = None,
                 ack_limit: Callable[[StreamKey, int], int] | None = None) -> None:
        self.config = config = config or ReceiverConfig()
        self.ack_limit = ack_limit
        """``(stream, delivered) -> what may be acknowledged``, at most ``delivered`` (the
        last sequence delivered in order): an application that acknowledges later than
        delivery (the appliance's persisted acknowledgements) holds the cumulative ACK back.
        None: the ACK is what was delivered."""
        self.handler = handler
        self.sink = sink
        self.session_id = session_id
        self.schedule = NakSchedule(config, random.Random(seed))
        self.streams: dict[StreamKey, _Stream] = {}
        self.counters = ReceiverCounters()
        self.losses: deque[UnrecoverableLoss] = deque(maxlen=MAX_LOSS_LOG)

    # --- frames in --------------------------------------------------------------------------

    def on_frame(self, frame: Buffer, now_ns: int, reply_to: object = None, *,
                 validated: bool = False) -> None:
        """One received frame. ``validated``: the caller already checked it (batch decode), so
        message frames are not decoded twice. ``reply_to``: where this stream's sender is."""
        c = self.counters
        c.frames += 1
        buf = frame if isinstance(frame, memoryview) else memoryview(frame)
        if len(buf) < FRAME_HEADER_BYTES:
            c.malformed += 1
            return
        ftype = buf[3]
        if ftype == _DATA or ftype == _RETRANSMISSION:
            if not validated:
                try:
                    decode_frame(buf)
                except ProtocolError:
                    c.malformed += 1
                    return
            (_, _, _, _, count, _, src, dst, stream_id, _) = FRAME_HEADER_STRUCT.unpack_from(buf)
            if dst and dst != self.session_id:
                c.not_for_us += 1
                return
            self._on_messages(buf, count, StreamKey(src, stream_id), now_ns, reply_to)
        elif ftype == _NAK or ftype == _LOSS:
            try:
                parsed = decode_frame(buf)
            except ProtocolError:
                c.malformed += 1
                return
            h = parsed.header
            _, entries = parsed.admin()
            if ftype == _LOSS:
                self._on_loss_frame(StreamKey(h.source_session, h.stream_id), entries, now_ns)
            elif h.source_session == self.session_id:
                c.not_for_us += 1  # our own NAK looped back by the group
            else:
                self._on_peer_nak(StreamKey(h.dest_session, h.stream_id), entries, now_ns)
        else:
            c.not_for_us += 1

    def _stream_for(self, key: StreamKey, first_seq: int, now_ns: int) -> _Stream | None:
        st = self.streams.get(key)
        if st is None:
            if len(self.streams) >= self.config.max_streams:
                self.counters.streams_refused += 1
                return None
            start = self.config.start_seq
            st = _Stream(key, first_seq if start is None else start, self.config.max_gaps,
                         now_ns)
            self.streams[key] = st
        return st

    def _on_messages(self, buf: memoryview, count: int, key: StreamKey, now_ns: int,
                     reply_to: object) -> None:
        pos = FRAME_HEADER_BYTES
        st = self._stream_for(key, SEQ_STRUCT.unpack_from(buf, pos + 8)[0], now_ns)
        if st is None:
            return
        st.last_frame_ns = now_ns
        accept = self._accept_ordered if self.config.ordered else self._accept_unordered
        seq_at = SEQ_STRUCT.unpack_from
        lens_at = LENGTHS_STRUCT.unpack_from
        accepted = False
        for _ in range(count):
            seq = seq_at(buf, pos + 8)[0]
            payload_len, topic_len = lens_at(buf, pos + 32)
            size = 40 + ((payload_len + topic_len + 7) & ~7)
            accepted |= accept(st, seq, buf[pos : pos + size], now_ns)
            pos += size
        if accepted:
            st.live = True
            if reply_to is not None:
                # only a frame that brought something new says where the sender is: a forged
                # duplicate or far-ahead frame must not redirect our NAKs and ACKs
                st.reply_to = reply_to

    def _admit(self, st: _Stream, seq: int, size: int, stores: bool, now_ns: int) -> bool:
        """Window, duplicate and gap bookkeeping for one message; True when it is new."""
        c = self.counters
        c.messages += 1
        if seq < st.low:
            c.duplicates += 1
            st.beyond_since_ns = None
            return False
        config = self.config
        if seq > st.highest:
            if seq - st.low >= config.window_messages:
                c.beyond_window += 1
                if st.beyond_since_ns is None:
                    st.beyond_since_ns = now_ns
                    st.beyond_min = seq
                elif seq < st.beyond_min:
                    st.beyond_min = seq
                return False
            if stores and st.store_bytes + size > config.reorder_max_bytes:
                c.refused_full += 1
                return False
            if seq > st.highest + 1:
                gap = Gap(st.highest + 1, seq - 1, now_ns, now_ns + config.recovery_timeout_ns,
                          self.schedule.first_nak_ns(now_ns))
                if not st.gaps.append(gap):
                    c.refused_full += 1
                    return False
                c.gaps_detected += 1
            st.highest = seq
        else:
            gaps = st.gaps
            if stores and st.store_bytes + size > config.reorder_max_bytes:
                if gaps.contains(seq):
                    c.refused_full += 1
                else:
                    c.duplicates += 1
                return False
            if len(gaps) >= gaps.max_gaps and gaps.would_split(seq):
                c.refused_full += 1
                return False
            gap = gaps.fill(seq)
            if gap is None:
                c.duplicates += 1
                st.beyond_since_ns = None
                return False
            c.recovered += 1
            took = now_ns - gap.detected_ns
            c.recovery_ns_total += took
            if took > c.recovery_ns_max:
                c.recovery_ns_max = took
        st.beyond_since_ns = None
        return True

    def _accept_ordered(self, st: _Stream, seq: int, message: memoryview, now_ns: int) -> bool:
        direct = seq == st.low and not st.blocked
        if not self._admit(st, seq, len(message), not direct, now_ns):
            return False
        if direct:
            if self.handler.on_message(st.key, message):
                self.counters.delivered += 1
                st.low = seq + 1
                if st.store:
                    self._drain(st)
                return True
            st.blocked = True
        st.store[seq] = bytes(message)
        st.store_bytes += len(message)
        return True

    def _accept_unordered(self, st: _Stream, seq: int, message: memoryview,
                          now_ns: int) -> bool:
        if st.backlog and len(st.backlog) >= self.config.window_messages:
            self.counters.refused_full += 1
            self.counters.messages += 1
            return False
        if not self._admit(st, seq, 0, False, now_ns):
            return False
        st.low = st.gaps.gaps[0].first if st.gaps.gaps else st.highest + 1
        if not st.backlog and self.handler.on_message(st.key, message):
            self.counters.delivered += 1
            return True
        st.backlog.append(bytes(message))
        st.blocked = True
        return True

    def _drain(self, st: _Stream) -> int:
        """Deliver what the store holds from ``low`` on; stops at a gap or a refusal."""
        st.blocked = False
        store = st.store
        handler = self.handler
        delivered = 0
        while True:
            item = store.get(st.low)
            if item is None:
                break
            if isinstance(item, _LossMarker):
                del store[st.low]
                handler.on_loss(item.event)
                st.low = item.event.last_seq + 1
                continue
            if not handler.on_message(st.key, memoryview(item)):
                st.blocked = True
                break
            del store[st.low]
            st.store_bytes -= len(item)
            st.low += 1
            delivered += 1
        self.counters.delivered += delivered
        return delivered

    def _drain_backlog(self, st: _Stream) -> int:
        backlog = st.backlog
        delivered = 0
        while backlog:
            if not self.handler.on_message(st.key, memoryview(backlog[0])):
                break
            backlog.popleft()
            delivered += 1
        st.blocked = bool(backlog)
        self.counters.delivered += delivered
        return delivered

    # --- loss -------------------------------------------------------------------------------

    def _declare_loss(self, st: _Stream, first: int, last: int, reason: LossReason,
                      detected_ns: int, now_ns: int) -> None:
        event = UnrecoverableLoss(st.key, first, last, reason, detected_ns, now_ns)
        c = self.counters
        c.loss_events += 1
        c.lost_messages += last - first + 1
        self.losses.append(event)
        if self.config.ordered:
            st.store[first] = _LossMarker(event)
            if first == st.low and not st.blocked:
                self._drain(st)
        else:
            self.handler.on_loss(event)
            st.low = st.gaps.gaps[0].first if st.gaps.gaps else st.highest + 1

    def _on_loss_frame(self, key: StreamKey, ranges: list[SeqRange], now_ns: int) -> None:
        self.counters.loss_frames += 1
        st = self.streams.get(key)
        if st is None:
            return
        for r in ranges:
            for g in st.gaps.remove(max(r.first_seq, st.low), min(r.last_seq, st.highest)):
                self._declare_loss(st, g.first, g.last, LossReason.SENDER_LOSS, g.detected_ns,
                                   now_ns)
            if r.first_seq <= st.highest:
                st.beyond_since_ns = None  # in-window traffic, as a duplicate probe is
            if r.last_seq > st.highest and r.first_seq <= r.last_seq:
                self._loss_ahead(st, max(r.first_seq, st.highest + 1), r.last_seq, now_ns)

    def _loss_ahead(self, st: _Stream, first: int, last: int, now_ns: int) -> None:
        """Sequences first..last above ``highest`` are lost (skipped by the sender): the part
        inside the window is declared in order; the sequences before it become a gap."""
        c = self.counters
        config = self.config
        end = st.low + config.window_messages - 1
        if first > end:
            c.beyond_window += 1
            return
        if first > st.highest + 1:
            gap = Gap(st.highest + 1, first - 1, now_ns, now_ns + config.recovery_timeout_ns,
                      self.schedule.first_nak_ns(now_ns))
            if not st.gaps.append(gap):
                c.refused_full += 1
                return
            c.gaps_detected += 1
        last = min(last, end)
        st.highest = last
        self._declare_loss(st, first, last, LossReason.SENDER_LOSS, now_ns, now_ns)

    def _on_peer_nak(self, key: StreamKey, ranges: list[SeqRange], now_ns: int) -> None:
        c = self.counters
        c.peer_nak_frames += 1
        st = self.streams.get(key)
        if st is None or not self.config.multicast:
            return
        for r in ranges:
            for g in st.gaps.isolate(max(r.first_seq, st.low), min(r.last_seq, st.highest)):
                hold = now_ns + self.schedule.retry_interval_ns(max(g.naks, 1))
                if g.next_nak_ns < hold:
                    g.next_nak_ns = hold
                    c.naks_suppressed += 1

    def _resync(self, st: _Stream, now_ns: int) -> None:
        """Jump to the lowest sequence seen beyond the window, declaring the rest lost."""
        target = st.beyond_min
        since = st.beyond_since_ns or now_ns
        for g in st.gaps.remove(st.low, st.highest):
            self._declare_loss(st, g.first, g.last, LossReason.RESYNC, g.detected_ns, now_ns)
        if st.highest + 1 <= target - 1:
            first = st.highest + 1
            st.highest = target - 1
            self._declare_loss(st, first, target - 1, LossReason.RESYNC, since, now_ns)
        st.beyond_since_ns = None
        self.counters.resyncs += 1

    # --- duty cycle -------------------------------------------------------------------------

    def do_work(self, now_ns: int) -> int:
        work = 0
        config = self.config
        expired: list[StreamKey] = []
        for key, st in self.streams.items():
            if st.blocked:
                st.beyond_since_ns = None
                work += self._drain(st) if config.ordered else self._drain_backlog(st)
            if st.gaps:
                work += self._gap_timers(st, now_ns)
            if (st.beyond_since_ns is not None and not st.blocked
                    and now_ns - st.beyond_since_ns >= config.recovery_timeout_ns):
                self._resync(st, now_ns)
                work += 1
            if now_ns >= st.ack_due_ns and (self._ack_to(st) > st.acked
                                             or (st.live and now_ns >= st.ack_idle_ns)):
                self._send_ack(st, now_ns)
                work += 1
            if (not st.gaps and not st.store and not st.backlog
                    and now_ns - st.last_frame_ns >= config.stream_idle_timeout_ns):
                expired.append(key)
        for key in expired:
            del self.streams[key]
            self.counters.streams_expired += 1
        return work

    def _gap_timers(self, st: _Stream, now_ns: int) -> int:
        naks: list[SeqRange] = []
        lost: list[Gap] = []
        schedule = self.schedule
        for g in st.gaps.gaps:
            if g.deadline_ns <= now_ns:
                lost.append(g)
            elif g.next_nak_ns <= now_ns:
                naks.append(SeqRange(g.first, g.last))
                g.naks += 1
                g.next_nak_ns = now_ns + schedule.retry_interval_ns(g.naks)
        for g in lost:
            for part in st.gaps.remove(g.first, g.last):
                self._declare_loss(st, part.first, part.last, LossReason.RECOVERY_TIMEOUT,
                                   part.detected_ns, now_ns)
        if naks:
            self._send_naks(st, naks)
        return len(lost) + (1 if naks else 0)

    # --- frames out -------------------------------------------------------------------------

    def _send_naks(self, st: _Stream, naks: list[SeqRange]) -> None:
        c = self.counters
        dest = self.config.nak_dest if self.config.nak_dest is not None else st.reply_to
        for frame in admin_frames(FrameType.NAK, naks, self.config.max_nak_ranges_per_frame,
                                  source_session=self.session_id,
                                  dest_session=st.key.source_session,
                                  stream_id=st.key.stream_id):
            self.sink.send_frame(memoryview(frame), dest)
            c.nak_frames += 1
        c.nak_ranges += len(naks)

    def _ack_to(self, st: _Stream) -> int:
        """The cumulative ACK of ``st``: what was delivered in order, or less (``ack_limit``)."""
        upto = st.low - 1
        limit = self.ack_limit
        return upto if limit is None else min(upto, limit(st.key, upto))

    def _send_ack(self, st: _Stream, now_ns: int) -> None:
        window = max(self.config.reorder_max_bytes - st.store_bytes, 0)
        upto = self._ack_to(st)
        frame = encode_admin(FrameType.ACK, [Ack(upto, min(window, 0xFFFFFFFF))],
                             source_session=self.session_id, dest_session=st.key.source_session,
                             stream_id=st.key.stream_id)
        self.sink.send_frame(memoryview(frame), st.reply_to)
        st.acked = upto
        st.ack_due_ns = now_ns + self.config.ack_interval_ns
        st.ack_idle_ns = now_ns + self.config.ack_idle_interval_ns
        self.counters.acks_sent += 1

    def send_acks(self, now_ns: int) -> int:
        """Acknowledge every stream that has delivered anything, now, progress or not (before
        closing, say); the number of ACKs sent."""
        sent = 0
        for st in self.streams.values():
            if st.live:
                self._send_ack(st, now_ns)
                sent += 1
        return sent

    def send_flow_control(self, stream: StreamKey, entry: FlowControl) -> None:
        """Send a FLOW_CONTROL frame to ``stream``'s sender (SubscriberQueue's signal)."""
        st = self.streams.get(stream)
        frame = encode_admin(FrameType.FLOW_CONTROL, [entry], source_session=self.session_id,
                             dest_session=stream.source_session, stream_id=stream.stream_id)
        self.sink.send_frame(memoryview(frame), st.reply_to if st else None)
        self.counters.flow_control_frames += 1

    # --- inspection -------------------------------------------------------------------------

    def stream_state(self, key: StreamKey) -> dict[str, int] | None:
        """low, highest, gaps, missing, stored and stored_bytes of one stream (None if unknown)."""
        st = self.streams.get(key)
        if st is None:
            return None
        return {"low": st.low, "highest": st.highest, "gaps": len(st.gaps),
                "missing": st.gaps.missing(), "stored": len(st.store) + len(st.backlog),
                "stored_bytes": st.store_bytes}

    def on_close(self) -> None:
        return None
