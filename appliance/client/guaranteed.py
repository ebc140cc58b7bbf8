"""The client's guaranteed streams: publishing on its reliable stream to the appliance (each
message's ``Outcome`` resolved by the appliance's acknowledgements, appliance/client/outcomes.py),
receiving its reliable stream from the appliance (in order, repaired by NAK, losses
declared) (``GuaranteedSide``, one part of ``Client``)."""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.client.errors import ClientError, ConnectionLostError
from appliance.client.messages import (
    GUARANTEED_QUEUE_MESSAGES,
    NO_HEADERS,
    QOS,
    Loss,
    Message,
)
from appliance.client.outcomes import REASON_REFUSED, Outcome
from appliance.config import (
    GUARANTEED_RETRANSMIT_BUFFER_BYTES,
    GUARANTEED_RETRANSMIT_BUFFER_MESSAGES,
    GUARANTEED_UDP_FRAME_BYTES,
)
from appliance.dataplane.guaranteed import LOSS_NOTICE_KEY, RELIABLE_STREAM_BIT
from datapath.config import MAX_FRAME_BYTES
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol.extensions import EXTENSION_FLAGS, HEADERS_FLAG
from datapath.protocol.segments import SEGMENT_CHUNK_BYTES, SEGMENT_REGION_BYTES, segment
from datapath.reliability import ReliableSender

if TYPE_CHECKING:
    from appliance.client.api import Client

_MSG = ml.MESSAGE_HEADER_STRUCT
_FLOW_TYPE = int(fl.FrameType.FLOW_CONTROL)


class _GuaranteedHandler:
    """The client's reliable receiver delivers through here (the client thread)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def on_message(self, stream: Any, message: memoryview) -> bool:
        return self.client._on_guaranteed(stream, message)

    def on_loss(self, event: Any) -> None:
        self.client._on_guaranteed_loss(event)


class _ClientSink:
    """FrameSink of the client's reliable sender and receiver: to its appliance."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def send_frame(self, frame: memoryview, dest: object = None) -> None:
        self.client._send_raw(frame)


class _ClientSender(ReliableSender):
    """The client's reliable sender; what it answers with LOSS (no longer in its
    retransmission buffer when the appliance asked for it again) fails those outcomes."""

    def __init__(self, client: Client, **kwargs: Any) -> None:
        super().__init__(_ClientSink(client), **kwargs)
        self.client = client

    def _announce_loss(self, lost: list) -> None:
        super()._announce_loss(lost)
        for r in lost:
            self.client._outcomes.fail_range(
                r.first_seq, r.last_seq, f"{REASON_REFUSED} (no longer in the client's "
                "retransmission buffer when the appliance asked for it again)")


class GuaranteedSide:
    """The guaranteed streams of a ``Client`` (which inherits them); its methods use the
    client's state and lock."""

    def _publish_guaranteed(self, key: int, topic: str, payload: Any, now: int, namespace: int,
                            schema_id: int, flush: bool, on_outcome: Any,
                            outcome: Outcome | None = None, flags: int = 0) -> Outcome:
        """Offer one guaranteed message; its ``Outcome`` (``outcome``: one sent again after
        a reconnection, which takes its new sequence). ``payload`` is the payload region
        (the header block after the payload when ``flags`` has HEADERS)."""
        with self._lock:
            sender = self._sender_locked()
            self._offer_locked(sender, key, payload, now, namespace, schema_id, flags)
            self.published += 1
            # a message held in the pending queue (flow control, the send window) takes its
            # sequence when it leaves the queue, after those ahead of it
            seq = sender.next_seq + len(sender.pending) - 1
            if outcome is None:
                outcome = Outcome(self._outcomes, seq, topic)
                if self.resend:  # kept to be sent again on the next session
                    outcome._message = (key, bytes(payload), now, namespace, schema_id, flags)
            else:
                outcome.sequence = seq
            self._outcomes.add(outcome, on_outcome)
            if flush:
                sender.flush(time.monotonic_ns())
            return outcome

    def _offer_locked(self, sender: _ClientSender, key: int, payload: Any, now: int,
                      namespace: int, schema_id: int, flags: int) -> None:
        """One message to the guaranteed stream's sender (under the lock); ClientError when
        it cannot take it."""
        from datapath.reliability import ReliabilityError

        try:
            ok = sender.offer(key, payload, time.monotonic_ns(), publish_ts_ns=now,
                              namespace_id=namespace, schema_id=schema_id,
                              qos=QOS["guaranteed"], flags=flags)
        except ReliabilityError as exc:
            raise ClientError(str(exc).removeprefix("reliability: ")) from None
        if not ok:
            raise ClientError("the guaranteed stream is flow-controlled and its pending "
                              "queue is full; publish more slowly")

    def _sender_locked(self) -> _ClientSender:
        """The client's guaranteed stream's sender (made by the first guaranteed publish)."""
        from datapath.reliability import SenderConfig

        if self._gsender is None:
            if not self.session:  # lost since the caller looked: a sender made now would
                # stamp session 0 on its frames for good, and the appliance drops them
                raise ConnectionLostError("the connection to the appliance was lost; publish "
                                          "again once it is connected", state=self.state)
            size = GUARANTEED_UDP_FRAME_BYTES if self.channel.kind == "udp" else \
                fl.align8(self.channel.max_frame_bytes) - 8
            config = SenderConfig(
                max_frame_bytes=min(size, MAX_FRAME_BYTES),
                retransmit_buffer_bytes=GUARANTEED_RETRANSMIT_BUFFER_BYTES,
                retransmit_buffer_messages=GUARANTEED_RETRANSMIT_BUFFER_MESSAGES)
            self._gsender = _ClientSender(self, session_id=self.session,
                                          stream_id=self.session | RELIABLE_STREAM_BIT,
                                          config=config)
            self._gsender.hold = self.hold_frames
        return self._gsender

    def _publish_segmented(self, key: int, topic: str, payload: Any, block: bytes, now: int,
                           namespace: int, schema_id: int, flush: bool, on_outcome: Any,
                           outcome: Outcome | None = None) -> Outcome:
        """A guaranteed message above one segment's room, as segment messages in order on
        the reliable stream (``datapath/protocol/segments.py``). One ``Outcome``: its
        ``sequence`` is the last segment's (acknowledged with it), ``first_sequence`` the
        first's; a loss of any segment fails it. Paced by the appliance's acknowledgements:
        at most half the retransmission buffer is unacknowledged, so every segment can still
        be repaired; ``ClientError`` if they stop coming for ``timeout_s``."""

        segment_id = next(self._segment_ids) & 0xFFFFFFFF
        parts = list(segment(payload, block, SEGMENT_CHUNK_BYTES, segment_id))
        in_flight = max(1, GUARANTEED_RETRANSMIT_BUFFER_BYTES // 2 // SEGMENT_REGION_BYTES)
        first_seq = 0
        for index, (region, flags) in enumerate(parts[:-1]):
            deadline = time.monotonic() + self.timeout_s
            while True:
                with self._lock:
                    self._check_usable()
                    sender = self._sender_locked()
                    acked = max(sender.acks.values(), default=0)
                    queued = sender.next_seq + len(sender.pending) - 1
                    if queued - acked < in_flight:
                        break
                    sender.flush(time.monotonic_ns())
                if time.monotonic() > deadline:
                    raise ClientError(f"a large guaranteed message ({len(payload):,} bytes): "
                                      f"the appliance acknowledged nothing for {self.timeout_s}"
                                      f" s after segment {index} of {len(parts)}; the "
                                      "segments sent will be dropped by the subscribers")
                time.sleep(0.0005)
            with self._lock:
                self._offer_locked(sender, key, region, now, namespace,
                                   0 if index else schema_id, flags)
                if index == 0:
                    first_seq = sender.next_seq + len(sender.pending) - 1
        self.segments_published += 1
        region, flags = parts[-1]
        if outcome is None:
            outcome = Outcome(self._outcomes, 0, topic)
            if self.resend:  # the whole message, to be segmented again on the next session
                outcome._message = (key, b"".join((bytes(payload), block)), now, namespace,
                                    schema_id, HEADERS_FLAG if block else 0)
        outcome.first_sequence = first_seq
        return self._publish_guaranteed(key, topic, region, now, namespace, 0, flush,
                                        on_outcome, outcome, flags)

    def _on_sender_frame(self, frame: memoryview, now_ns: int) -> None:
        """A NAK, ACK or FLOW_CONTROL frame for this client's sender (the client thread):
        an ACK resolves the outcomes up to it. A FLOW_CONTROL frame of the session's own
        stream holds or releases this client's publishes (appliance/client/flow.py)."""
        if frame[fl.TYPE_OFFSET] == _FLOW_TYPE and self._hold.on_frame(frame):
            return
        with self._lock:
            sender = self._gsender
            if sender is None:
                return
            sender.on_frame(frame, now_ns)
            acked = max(sender.acks.values(), default=0)
        if acked:
            self._outcomes.acknowledge_upto(acked)

    # --- guaranteed streams (the client thread) -------------------------------------------------
    def _send_raw(self, frame: memoryview | bytes | bytearray) -> None:
        """A frame of the reliable transport (NAK, ACK, DATA, RETRANSMISSION) to the appliance."""
        buf = np.frombuffer(bytearray(frame) + bytes(fl.AUTH_TRAILER_BYTES), dtype=np.uint8)
        with self._lock, self._pub_lock:  # (the signature's sequence: _pub_lock)
            if self.channel.closed or self.channel.failure is not None:
                return  # the session is gone with the connection (the client thread says so)
            sent = self.channel.send((buf, np.zeros(1, np.int64),
                                      np.array([self._sign(buf, len(frame))], np.int64), 1))
        if sent != 1:
            self.send_drops += 1  # recovered by the transport (its NAKs and retransmissions)

    def _on_guaranteed(self, stream: Any, message: memoryview) -> bool:
        """One message of a guaranteed stream, in order (the receiver's DeliveryHandler)."""
        key, seq, ts, ns, schema, qos, flags, plen, _, _ = _MSG.unpack_from(message, 0)
        region = message[ml.MESSAGE_HEADER_BYTES : ml.MESSAGE_HEADER_BYTES + plen]
        headers, parts = NO_HEADERS, 1
        if flags & EXTENSION_FLAGS:
            split = self._split_extensions(region, flags, ("g", stream, key), schema)
            if split is None:
                return True  # dropped and counted
            region, headers, schema, parts = split
        payload = bytes(region)
        origin, publisher = stream[0], stream[1] & ~RELIABLE_STREAM_BIT
        now = time.time_ns()
        if key == LOSS_NOTICE_KEY:
            try:
                doc = json.loads(payload)
                item: Message | Loss = Loss(
                    int(doc["origin"]), int(doc["stream"]), int(doc["first"]),
                    int(doc["last"]), int(doc["messages"]), str(doc["reason"]), int(doc["at"]),
                    now)
            except (ValueError, KeyError, TypeError):
                self.malformed = getattr(self, "malformed", 0) + 1
                return True
        else:
            known = self._topics.get(key)
            item = Message("" if known is None else known[1], payload, key, seq, ts, ns, schema,
                           qos, origin, publisher, now, True, headers=headers, segments=parts)
        held = self._held.get(stream)
        if held is not None:
            if len(held) >= GUARANTEED_QUEUE_MESSAGES:
                return False
            held.append(item)
            return True
        if isinstance(item, Message) and key not in self._topics:
            self._held[stream] = deque([item])
            self._pending.setdefault(key, [])
            return True
        return self._deliver_guaranteed(item)

    def _deliver_guaranteed(self, item: Message | Loss) -> bool:
        """To the guaranteed subscriptions; False (back-pressure) when a queue is full."""
        if isinstance(item, Loss):
            self.losses += 1
            self.lost_messages += item.messages
            for sub in [s for s in self._subs if s.qos == "guaranteed"]:
                sub._loss(item)
            return True
        targets = self._targets(item.namespace, item.topic, True, qos=item.qos)
        if any(sub._full() for sub in targets):
            return False
        self.received += 1
        self._dispatch(item)
        return True

    def _on_guaranteed_loss(self, event: Any) -> None:
        """An unrecoverable loss on this client's own hop."""
        loss = Loss(event.stream[0], event.stream[1] & ~RELIABLE_STREAM_BIT, event.first_seq,
                    event.last_seq, event.messages, event.reason.name, 0, time.time_ns())
        held = self._held.get(event.stream)
        if held is not None:
            held.append(loss)
        else:
            self._deliver_guaranteed(loss)

    def _release_held(self) -> None:
        """Deliver held guaranteed items, in order, up to the next still-unknown topic."""
        for stream, held in list(self._held.items()):
            while held:
                item = held[0]
                if isinstance(item, Message) and not item.topic:
                    known = self._topics.get(item.topic_key)
                    if known is None:
                        self._pending.setdefault(item.topic_key, [])
                        break
                    item = held[0] = replace(item, topic=known[1])
                if not self._deliver_guaranteed(item):
                    break
                held.popleft()
            if not held:
                del self._held[stream]

    def _guaranteed_timers(self, now_ns: int) -> int:
        work = 0
        with self._lock:
            if self._gsender is not None:
                work += self._gsender.do_work(now_ns)
        if self._greceiver is not None:
            work += self._greceiver.do_work(now_ns)
        if self._held:
            self._release_held()
        return work

    def guaranteed_counters(self) -> dict[str, dict[str, int]]:
        """The reliable transport's counters of this client: its guaranteed subscriptions'
        receiver and its guaranteed publishing stream's sender."""
        out = {}
        if self._greceiver is not None:
            out["receiver"] = self._greceiver.counters.as_dict()
        if self._gsender is not None:
            out["sender"] = self._gsender.counters.as_dict()
        return out
