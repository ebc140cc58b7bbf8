"""Guaranteed QoS in the appliance: the reliable transport (datapath/reliability) on its hops.

A message travels over the reliable transport wherever it goes to a *guaranteed*
subscription, and from a publisher that publishes it ``qos="guaranteed"``. Each reliable
stream is one ``ReliableSender`` and a ``ReliableReceiver`` stream at the other end:

```
 publisher client --(1)--> ingress appliance A --(2)--> ... --(2)--> destination D --(3)--> client
 (1) key (session, session|R), dest_session 0: the client's sender; A's receiver per client
     channel (session id = A's node id); NAK/ACK back to the client's address or ring.
 (2) key (A, session|R), dest_session D: A's sender per (D, publishing session); the frames
     are per-destination frames like any other, forwarded by (source, destination) through
     transit appliances; D's fabric receiver (session id = D) NAKs/ACKs along path(D, A).
 (3) key (origin, session|R), dest_session = the client's session: D's sender per (client,
     origin, publishing session); the client's receiver.
```

``R`` is ``RELIABLE_STREAM_BIT``: client sessions are below 2^31, so a stream id with the top
bit set names a guaranteed stream and keeps the publishing session beside it. The stream's
sequence numbers are the transport's (contiguous per stream, across topics); each hop
delivers in order, recovers gaps by NAK/retransmission and declares what it cannot recover
within the recovery bound as an ``UnrecoverableLoss``. A loss cannot name the topics it hit,
so the appliance that sees it sends a **loss notice** down every guaranteed stream that could
have carried them: a message with topic key ``LOSS_NOTICE_KEY`` (0, which no topic has) and a
JSON payload ``{"origin", "stream", "first", "last", "messages", "reason", "at"}``, in
sequence position. Destinations relay notices to their guaranteed clients; the client library
turns them (and its own hop's losses) into loss events on its guaranteed subscriptions.

Authentication: every reliable-stream frame between appliances (DATA, RETRANSMISSION, NAK,
ACK, LOSS, FLOW_CONTROL) carries the fabric MAC trailer (control/auth.py), appended by
``_to_node`` and checked by ``on_fabric_frame`` at the destination before anything reads it:
the MAC covers its (source, destination) node ids, so it is bound to its end-to-end link, and
a replay window per source refuses it a second time. The MAC is also bound to the epoch of
the stream's receiving appliance (the destination's, as the sender knew it when it made the
stream: ``_Sender.epoch``), so a restarted destination refuses the streams made for its
earlier incarnation until their senders learn its new epoch and start new ones at sequence 1
(control/auth.py). A LOSS names only its own sender's
streams (``source_session`` is the stream's), and since the MAC authenticates
``source_session``, a LOSS is accepted only from the stream's sender. What NAKs make a sender
resend is bounded per requester: never what the requester's own cumulative ACK covers, and
at most an ``AnswerBudget`` (GUARANTEED_NAK_ANSWER_*) shared by the streams towards it.
Frames to and from clients are not authenticated yet (docs/security.md).

Persisted acknowledgements (``[cache] acknowledge = "persisted"``, docs/fault-tolerance.md
"Acknowledged once persisted"): ``persist_acks`` names the cache's session. A publishing
client's stream then gets a ``_Gate``: the sequences its receiver delivered that the data
path has not routed yet, and the ones routed to the cache's session that the cache has not
reported persisted (``take_persisted``, the cache's ``persisted`` command to the data path,
by (publishing session, the message's sequence on the data path's stream to the cache)).
The receiver's cumulative ACK stops before the first of either
(``ReliableReceiver.ack_limit``).

Senders and receivers live on the data-path thread (``GuaranteedPlane``, owned by the
``DataPlaneAgent``); their frames leave through the data path's out queues.
"""

from __future__ import annotations

import json
import struct
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from appliance.config import (
    CLIENT_MAX_FRAME_BYTES,
    GUARANTEED_NAK_ANSWER_BURST_BYTES,
    GUARANTEED_NAK_ANSWER_BYTES_PER_S,
    GUARANTEED_RETRANSMIT_BUFFER_BYTES,
    GUARANTEED_RETRANSMIT_BUFFER_MESSAGES,
    GUARANTEED_SENDER_LINGER_NS,
    GUARANTEED_SWEEP_INTERVAL_NS,
    GUARANTEED_TIMER_INTERVAL_NS,
    GUARANTEED_UDP_FRAME_BYTES,
)
from appliance.dataplane.cache_naks import CacheNaks
from appliance.dataplane.names import CLIENT_SHM, CLIENT_UDP, FABRIC
from appliance.dataplane.remote_persist import Reporter, Waiter
from appliance.dataplane.state import log
from datapath.protocol import extension_layout as xl
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol.frame_layout import FrameType
from datapath.reliability import (
    ReceiverConfig,
    ReliabilityError,
    ReliableReceiver,
    ReliableSender,
    SenderConfig,
    StreamKey,
    UnrecoverableLoss,
)
from datapath.reliability.retransmit import AnswerBudget
from datapath.topics.registry import NO_KEY

if TYPE_CHECKING:
    from appliance.control.auth import FabricAuth
    from appliance.dataplane.agent import DataPlaneAgent

RELIABLE_STREAM_BIT = 0x8000_0000
"""Set in ``stream_id``: the frame belongs to a guaranteed (reliable) stream."""
LOSS_NOTICE_KEY = NO_KEY
"""Topic key of a loss notice inside a guaranteed stream (key 0 is never a topic's)."""
RELIABILITY_ADMIN_TYPES = frozenset({int(FrameType.NAK), int(FrameType.ACK),
                                     int(FrameType.FLOW_CONTROL), int(FrameType.LOSS)})
"""Frame types the reliable transport exchanges besides its DATA and RETRANSMISSION."""
_TO_SENDER = frozenset({int(FrameType.NAK), int(FrameType.ACK), int(FrameType.FLOW_CONTROL)})
_MSG = ml.MESSAGE_HEADER_STRUCT
_HEADER = fl.FRAME_HEADER_STRUCT  # magic .. send_ts_ns; [7] is dest_session
_APP_FLAGS = ml.APP_MESSAGE_FLAGS
_SEQ = struct.Struct(">Q")
_SEGMENT_FLAG = int(ml.MessageFlags.SEGMENT)


def is_reliable_stream(stream_id: int) -> bool:
    return bool(stream_id & RELIABLE_STREAM_BIT)


def loss_notice(origin: int, stream: int, first: int, last: int, reason: str, at: int) -> bytes:
    """The payload of a loss notice (see the module docstring)."""
    return json.dumps({"origin": origin, "stream": stream & ~RELIABLE_STREAM_BIT,
                       "first": first, "last": last, "messages": last - first + 1,
                       "reason": reason, "at": at}, separators=(",", ":")).encode()


class _Collector:
    """A receiver's DeliveryHandler: messages and losses wait for the data path's cycle."""

    def __init__(self, plane: GuaranteedPlane, where: str) -> None:
        self.plane = plane
        self.where = where

    def on_message(self, stream: StreamKey, message: memoryview) -> bool:
        plane = self.plane
        plane.delivered.append((self.where, stream, bytes(message)))
        if plane.gating and self.where != FABRIC:
            gate = plane.gates.get(stream.source_session)
            if gate is None:
                gate = plane.gates[stream.source_session] = _Gate(self.where)
            gate.unrouted.append(_SEQ.unpack_from(message, ml.SEQUENCE_OFFSET)[0])
        return True

    def on_loss(self, event: UnrecoverableLoss) -> None:
        self.plane.on_loss(self.where, event)


class _Sink:
    """FrameSink of the reliable agents: ``route(frame, dest)`` queues on the data path."""

    def __init__(self, route: Callable[[memoryview, Any], None]) -> None:
        self.send_frame = route


class _Gate:
    """One publishing client's stream under persisted acknowledgements (module docstring)."""

    __slots__ = ("failed_at", "unrouted", "waiting", "where")

    def __init__(self, where: str) -> None:
        self.where = where
        self.unrouted: deque[int] = deque()
        """Stream sequences delivered by the receiver, not yet through the tables."""
        self.waiting: deque[tuple[int, int]] = deque()
        """(stream sequence, its sequence on the stream to the cache's session) handed to
        the cache and not yet reported persisted, in stream order."""
        self.failed_at = 0
        """The first stream sequence that will never be persisted (``_persist_failed``):
        nothing from it on is acknowledged (0: none)."""

    def limit(self, upto: int) -> int:
        if self.failed_at:
            upto = min(upto, self.failed_at - 1)
        if self.unrouted:
            upto = min(upto, self.unrouted[0] - 1)
        if self.waiting:
            upto = min(upto, self.waiting[0][0] - 1)
        return upto


@dataclass
class _Sender:
    sender: ReliableSender
    epoch: int = 0
    """For a sender towards an appliance: that appliance's epoch when it was made."""
    last_offer_ns: int = 0
    cache_map: Any = None
    """Its sequences -> the cache's (``SenderCacheMap``), once a message both took."""


class GuaranteedPlane:
    """The data path's reliable senders and receivers (module docstring)."""

    def __init__(self, dp: DataPlaneAgent, fabric_max_frame_bytes: int,
                 retransmit_buffer_messages: int = GUARANTEED_RETRANSMIT_BUFFER_MESSAGES
                 ) -> None:
        self.dp = dp
        self.retransmit_buffer_messages = retransmit_buffer_messages
        """Messages each sender keeps (``appliance.retransmit_buffer_messages``)."""
        self.node_id = dp.node_id
        self.fabric_frame_bytes = fabric_max_frame_bytes
        self.delivered: list[tuple[str, StreamKey, bytes]] = []
        self.held: dict[tuple[str, StreamKey], deque[tuple[bytes, int]]] = {}
        """Delivered messages waiting for their topic key to reach the tables, per stream
        (everything after one waits too: a stream's order is kept), with their deadlines."""
        self.topic_seq: dict[tuple[int, int], int] = {}
        """(publishing session, topic key) -> the last per-topic sequence given to its
        guaranteed publishes (what plain subscribers see)."""
        self.held_version = -1
        self.held_retry_ns = 0
        self.receivers: dict[str, ReliableReceiver] = {}
        self.senders: dict[tuple, _Sender] = {}
        self.active: dict[tuple, ReliableSender] = {}
        self.counters: Counter[str] = Counter()
        self._busy: set[str] = set()
        self._timers_at = 0
        self._sweep_at = 0
        self._closed_counters: Counter[str] = Counter()
        self.auth: FabricAuth | None = None
        """Signs and checks the reliable streams' frames between appliances (``use_auth``);
        None (no fabric key): such frames are refused and sent unsigned."""
        self.budgets: dict[tuple, AnswerBudget] = {}
        """Requester (("n", node) or ("c", session)) -> what its NAKs may still make us
        resend (shared by the senders towards it)."""
        self.persist_identity: str | None = None
        """The cache's identity when acknowledgements wait for persistence (else None)."""
        self.persist_max_payload = 0
        self.gates: dict[int, _Gate] = {}
        """Publishing session -> its stream's gate (persisted acknowledgements only)."""
        self.persist_failed: dict[int, str] = {}
        """Publishing session -> why one of its messages will never be persisted (the
        control agent ends that session: ``_persist_failed``)."""
        self._routing: dict[tuple[int, int, int], int] = {}
        """(session, topic key, per-topic sequence) -> stream sequence, during one
        ``_run_guaranteed`` (the messages being routed)."""
        self._cache_session: int | None = None
        self._cache_ready: int | None = None
        """The cache's session once it is subscribed to its patterns (``cache_ready``)."""
        self.gating = False
        """Local publishers' acknowledgements wait (a cache here, or a neighbour's)."""
        self.reporter: Reporter | None = None
        """With a cache here: what it persisted of other appliances' publishers, for them
        (appliance/dataplane/remote_persist.py)."""
        self.waiter: Waiter | None = None
        """``[cache] remote``: acknowledgements wait for that neighbour's reports."""
        self.cache_naks = CacheNaks(self)
        """NAKs the senders' buffers no longer answer, served from the cache
        (appliance/dataplane/cache_naks.py)."""

    def persist_acks(self, identity: str, max_payload_bytes: int) -> None:
        """Acknowledge a local publisher's guaranteed messages that reach the session of
        ``identity`` (the cache) only once it reports them persisted; payloads over
        ``max_payload_bytes`` (which it does not keep) are not waited for."""
        self.persist_identity = identity
        self.persist_max_payload = max_payload_bytes
        self.gating = True
        self.reporter = Reporter(self)

    def persist_remote(self, node: int, name: str) -> None:
        """Acknowledge a local publisher's guaranteed messages that go to appliance ``node``
        (``name``, the neighbour ``[cache] remote`` names) only once its cache reports them
        persisted (appliance/dataplane/remote_persist.py)."""
        if self.waiter is not None and self.waiter.node == node:
            return
        if self.waiter is not None:
            for session, gate in self.gates.items():  # a new node id: nothing will come
                if gate.waiting:
                    self._persist_failed(session, gate.waiting[0][0], f"{name} changed its "
                                         "node id before it reported it persisted")
        self.waiter = Waiter(self, node, name)
        self.gating = True

    def take_remote_persisted(self, entries: list) -> None:
        """A PERSISTED document of the neighbour ``[cache] remote`` names (the control agent
        checked where it came from)."""
        if self.waiter is None:
            self.counters["persist_remote_entries_unknown"] += len(entries)
            return
        self.waiter.take(entries)

    def cache_present(self) -> bool:
        """Whether the cache's session is logged in and subscribed to its patterns, so that a
        message for the cache reaches it (one routed before its subscriptions are in the
        tables went elsewhere, and must not be reported as settled)."""
        return self._cache_ready is not None and self._cache_ready in self.dp.sessions

    def cache_ready(self, session_id: int) -> None:
        """The cache's session ``session_id`` is subscribed to its patterns (its command,
        sent after the subscriptions were answered: the tables have them by now)."""
        self._cache_ready = session_id

    def use_auth(self, auth: FabricAuth) -> None:
        """Sign and check with ``auth`` from now on (a command from the control agent)."""
        self.auth = auth

    # --- receivers ----------------------------------------------------------------------------
    def _receiver(self, where: str) -> ReliableReceiver:
        rx = self.receivers.get(where)
        if rx is None:

            route = self._to_node_as_receiver if where == FABRIC else self._to_peer(where)
            rx = ReliableReceiver(_Collector(self, where), _Sink(route), session_id=self.node_id,
                                  config=ReceiverConfig(),
                                  ack_limit=None if where == FABRIC else self._ack_limit)
            self.receivers[where] = rx
        return rx

    # --- persisted acknowledgements ----------------------------------------------------------
    def _ack_limit(self, stream: StreamKey, upto: int) -> int:
        gate = self.gates.get(stream.source_session)
        return upto if gate is None else gate.limit(upto)

    def routed(self, stream: StreamKey, seq: int) -> None:
        """A publishing client's message ``seq`` went through the tables (or was dropped)."""
        gate = self.gates.get(stream.source_session)
        if gate is not None:
            unrouted = gate.unrouted
            while unrouted and unrouted[0] <= seq:
                unrouted.popleft()

    def routing(self, session: int, topic_key: int, topic_seq: int, seq: int) -> None:
        """Message ``seq`` of ``session``'s stream is being routed as (topic key, per-topic
        sequence): if it reaches the cache's session, it waits for the cache."""
        if session in self.gates:
            self._routing[(session, topic_key, topic_seq)] = seq
            waiter = self.waiter
            if waiter is not None and not waiter.ready:
                waiter.unreachable(session, seq, "is not ready (down, not heard from yet, or "
                                   "its cache's guaranteed interest not known here), so its "
                                   "cache cannot persist it")

    def routing_done(self) -> None:
        self._routing.clear()

    def _to_cache(self, session_id: int, message: Any, off: int, cache_seq: int) -> None:
        """A local publisher's message handed to the cache's session as ``cache_seq`` of
        the stream to it: it waits for the cache to report that sequence persisted."""
        topic_key, topic_seq, _, _, _, _, flags, plen, _, _ = _MSG.unpack_from(message, off)
        seq = self._routing.pop((session_id, topic_key, topic_seq), None)
        if seq is None:  # routed outside _run_guaranteed (parked for an unknown key)
            if session_id in self.gates:
                self.counters["guaranteed_persist_untracked"] += 1
            return
        if flags & _SEGMENT_FLAG and plen >= xl.SEGMENT_DESCRIPTOR_BYTES:
            # a large message's segments: the cache keeps (and reports) the whole message
            # once its last segment arrived, which the publisher's outcome waits for too
            _, plen, _, index, count = xl.SEGMENT_STRUCT.unpack_from(
                message, off + ml.MESSAGE_HEADER_BYTES + plen - xl.SEGMENT_DESCRIPTOR_BYTES)
            if index != count - 1:
                return
        if plen > self.persist_max_payload:  # the cache does not keep it: acknowledged
            return  # on receipt
        gate = self.gates.get(session_id)
        if gate is not None:
            gate.waiting.append((seq, cache_seq))

    def _remote_to_cache(self, origin: int, stream: int, message: Any, off: int,
                         cache_seq: int) -> None:
        """Another appliance's publisher's message (its position on the stream from there in
        its sequence field) handed to the cache: its report waits for the cache's."""
        _, pos, _, _, _, _, flags, plen, _, _ = _MSG.unpack_from(message, off)
        if flags & _SEGMENT_FLAG and plen >= xl.SEGMENT_DESCRIPTOR_BYTES:
            _, plen, _, index, count = xl.SEGMENT_STRUCT.unpack_from(
                message, off + ml.MESSAGE_HEADER_BYTES + plen - xl.SEGMENT_DESCRIPTOR_BYTES)
            if index != count - 1:
                return
        if plen <= self.persist_max_payload:
            self.reporter.to_cache(origin, stream, pos, cache_seq)  # type: ignore[union-attr]

    def _is_cache(self, session_id: int) -> bool:
        if self._cache_session == session_id:
            return True
        session = self.dp.sessions.get(session_id)
        if session is not None and session.identity == self.persist_identity:
            self._cache_session = session_id
            return True
        return False

    def take_persisted(self, tokens: list[tuple[int, int]]) -> None:
        """The cache's report (a command on the data-path thread): these messages of local
        publishers (publishing session, sequence on the stream to the cache) are on disk, in
        the order it received them; a publisher's head pops when it is the one reported.
        One that is not the head means the head was never persisted: the publisher's
        session is ended (``_persist_failed``; docs)."""
        for token in tokens:
            if len(token) == 3:  # (origin, stream, cache seq): a neighbour's publisher
                if self.reporter is not None:
                    self.reporter.persisted(*token)
                continue
            session, cache_seq = token
            gate = self.gates.get(session)
            if gate is None or not gate.waiting:
                continue
            if gate.waiting[0][1] == cache_seq:
                gate.waiting.popleft()
                self.counters["guaranteed_persisted_acks"] += 1
                self._busy.add(gate.where)
            else:
                self.counters["guaranteed_persisted_not_head"] += 1
                self._persist_failed(session, gate.waiting[0][0], "the cache kept later "
                                     "messages of this publisher but not this one")

    def take_unpersisted(self, ranges: list[tuple[int, int, int, str]]) -> None:
        """The cache's report that it will never keep these messages of local publishers
        ((publishing session, first and last sequence on the stream to the cache, why):
        dropped from its full queue, or lost on the way): a publisher waiting for one of them
        is failed (``_persist_failed``), never acknowledged and never held for good."""
        for entry in ranges:
            if len(entry) == 5:  # (origin, stream, first, last, why): a neighbour's
                if self.reporter is not None:
                    self.reporter.unkept(*entry)
                continue
            session, first, last, why = entry
            gate = self.gates.get(session)
            if gate is None:
                continue
            for seq, cache_seq in gate.waiting:
                if first <= cache_seq <= last:
                    self._persist_failed(session, seq, why)
                    break

    def _persist_failed(self, session: int, seq: int, why: str) -> None:
        """Message ``seq`` of ``session``'s stream will never be persisted: its
        acknowledgement (and every later one) stays held, and the control agent ends the
        publisher's session saying why (``persist_failed`` in the data path's published
        state), so the client fails or resends what was not acknowledged (docs)."""
        gate = self.gates.get(session)
        if gate is not None and (not gate.failed_at or seq < gate.failed_at):
            gate.failed_at = seq  # held from it on, whatever is routed after it
        if session in self.persist_failed:
            return
        self.counters["guaranteed_persist_failed"] += 1
        reason = (f"guaranteed message {seq} was not persisted by the cache ({why}); "
                  "nothing from it on was acknowledged: publish it again")
        self.persist_failed[session] = reason
        log.error("data path: publishing session %d: %s; the session is ended",
                  session, reason)
        self.dp.publish_soon()

    def on_fabric_frame(self, frame: memoryview, ftype: int, src: int, stream: int,
                        now_ns: int) -> None:
        """A reliability frame for this node from the fabric (after the off-path guard): its
        MAC, link and freshness are checked before anything else reads it."""
        auth = self.auth
        held = None
        if ftype in _TO_SENDER:  # bound to the epoch of the receiver we made the stream for
            held = self.senders.get(("n", src, stream))
            if held is None:
                self.counters["guaranteed_no_sender"] += 1
                return
            bind = held.epoch
        else:  # bound to ours: a stream made for our earlier incarnation is refused
            bind = 0 if auth is None else auth.incarnation
        dst = _HEADER.unpack_from(frame)[7] if len(frame) >= fl.FRAME_HEADER_BYTES else 0
        reason = ("no_key" if auth is None else
                  auth.check_bytes(frame, src, dst, self.node_id, bind))
        if reason is not None:
            self.counters["guaranteed_auth_refused"] += 1
            self.counters[f"guaranteed_auth_refused_{reason}"] += 1
            return
        if held is not None:
            held.sender.on_frame(frame, now_ns)
            return
        self._receiver(FABRIC).on_frame(frame, now_ns, reply_to=src)
        self._busy.add(FABRIC)

    def on_client_frame(self, channel: str, session: Any, peer: int, frame: memoryview,
                        ftype: int, dst: int, stream: int, now_ns: int) -> None:
        """A reliability frame from a logged-in client (its session id already checked)."""
        if ftype in _TO_SENDER:  # about a stream we send to this client
            held = self.senders.get(("c", session.session_id, dst, stream))
            if held is None:
                self.counters["guaranteed_no_sender"] += 1
            else:
                held.sender.on_frame(frame, now_ns)
            return
        if ftype == int(FrameType.LOSS) or stream != session.session_id | RELIABLE_STREAM_BIT:
            self.counters["guaranteed_bad_client_frames"] += 1
            return
        self._receiver(channel).on_frame(frame, now_ns, reply_to=peer)
        self._busy.add(channel)

    # --- senders ------------------------------------------------------------------------------
    def _to_node_as_receiver(self, frame: memoryview, dest: Any) -> None:
        """Our fabric receiver's NAKs and ACKs, bound to our own epoch."""
        self._to_node(frame, dest, 0 if self.auth is None else self.auth.incarnation)

    def _to_node(self, frame: memoryview, dest: Any, bind: int) -> None:
        if dest is None:  # a receiver's answer on a stream it has no address for yet
            self.counters["guaranteed_unroutable"] += 1
            return
        hop = self.dp.tables.next_hop.get(int(dest))
        if hop is None:
            self.counters["guaranteed_unroutable"] += 1  # recovered by NAK once a path exists
            return
        auth = self.auth
        self.dp.queue_frame(FABRIC, hop,
                            frame if auth is None else auth.signed_copy(frame, bind))

    def _to_peer(self, channel: str) -> Callable[[memoryview, Any], None]:
        """Frames to a client by the peer id its frames came from (the receivers' replies)."""

        def route(frame: memoryview, dest: Any) -> None:
            if dest is None:  # a receiver's answer on a stream it has no address for yet:
                self.counters["guaranteed_unroutable"] += 1  # its first frame was beyond
                return  # the window, and the recovery bound moved the stream on
            if channel == CLIENT_SHM:
                session = self.dp.session_at(channel, int(dest))
                if session is None:
                    self.counters["guaranteed_unroutable"] += 1
                    return
                dest = session.session_id
            self.dp.queue_frame(channel, int(dest), frame)
        return route

    def _to_session(self, frame: memoryview, dest: Any) -> None:
        session = self.dp.sessions.get(int(dest))
        if session is None:
            self.counters["guaranteed_unroutable"] += 1
            return
        self.dp.queue_frame(session.channel, session.dest, frame)

    def _sender_to_node(self, node: int, stream: int) -> _Sender | None:
        key = ("n", node, stream)
        held = self.senders.get(key)
        if held is None:
            epoch = self.dp.tables.epochs.get(node)
            if epoch is None:
                self.counters["guaranteed_unroutable"] += 1
                return None
            # its frames leave room for the trailer _to_node appends
            config = SenderConfig(dest_session=node,
                                  max_frame_bytes=self.fabric_frame_bytes - fl.AUTH_TRAILER_BYTES,
                                  retransmit_buffer_bytes=GUARANTEED_RETRANSMIT_BUFFER_BYTES,
                                  retransmit_buffer_messages=self.retransmit_buffer_messages)
            def to_node(frame: memoryview, dest: Any, bind: int = epoch) -> None:
                self._to_node(frame, dest, bind)  # bound to the destination's epoch

            sender = ReliableSender(_Sink(to_node), session_id=self.node_id,
                                    stream_id=stream, dest=node, config=config,
                                    answer_budget=self._budget(("n", node)))
            held = self.senders[key] = _Sender(sender, epoch)
        return held

    def _budget(self, requester: tuple) -> AnswerBudget:
        budget = self.budgets.get(requester)
        if budget is None:
            budget = self.budgets[requester] = AnswerBudget(GUARANTEED_NAK_ANSWER_BYTES_PER_S,
                                                            GUARANTEED_NAK_ANSWER_BURST_BYTES)
        return budget

    def _sender_to_client(self, session_id: int, origin: int, stream: int) -> _Sender | None:
        key = ("c", session_id, origin, stream)
        held = self.senders.get(key)
        if held is None:

            session = self.dp.sessions.get(session_id)
            if session is None:
                return None
            size = GUARANTEED_UDP_FRAME_BYTES if session.channel == CLIENT_UDP else \
                CLIENT_MAX_FRAME_BYTES
            if session.key is not None:  # room for the session's MAC (frame_auth.py)
                size -= fl.AUTH_TRAILER_BYTES
            config = SenderConfig(dest_session=session_id, max_frame_bytes=size,
                                  retransmit_buffer_bytes=GUARANTEED_RETRANSMIT_BUFFER_BYTES,
                                  retransmit_buffer_messages=self.retransmit_buffer_messages)
            sender = ReliableSender(_Sink(self._to_session), session_id=origin, stream_id=stream,
                                    dest=session_id, config=config,
                                    answer_budget=self._budget(("c", session_id)))
            held = self.senders[key] = _Sender(sender)
        return held

    def _offer(self, key: tuple, held: _Sender | None, message: Any, off: int,
               now_ns: int) -> bool:
        if held is None:
            return False
        topic_key, _, ts, ns, schema, qos, flags, plen, _, _ = _MSG.unpack_from(message, off)
        start = off + ml.MESSAGE_HEADER_BYTES
        payload = memoryview(message[start : start + plen])
        seq = 0 if held.sender.pending else held.sender.next_seq  # what it takes (else: not
        # known yet, and not mapped to the cache's sequence)
        try:
            accepted = held.sender.offer(topic_key, payload, now_ns, publish_ts_ns=ts,
                                         namespace_id=ns, schema_id=schema, qos=qos,
                                         flags=flags & _APP_FLAGS)
        except ReliabilityError:
            accepted = None
        held.last_offer_ns = now_ns
        if not accepted:
            # too large for this hop's frames, or its pending queue is full behind a closed
            # send window or flow control: the message takes its sequence number as a declared
            # loss (LOSS to the receivers, then a loss event and loss notices), never a silent one
            held.sender.skip(now_ns)
            self.counters["guaranteed_too_large" if accepted is None else
                          "guaranteed_refused"] += 1
            return False
        self.active[key] = held.sender
        self.counters["guaranteed_offered"] += 1
        if seq and self.cache_naks.identity is not None:
            self.cache_naks.offered(key, held, message, off, seq)
        return True

    def to_node(self, node: int, stream: int, message: Any, off: int, now_ns: int) -> None:
        """A message for destination appliance ``node`` from publishing session ``stream``."""
        publisher = stream
        stream |= RELIABLE_STREAM_BIT
        held = self._sender_to_node(node, stream)
        waiter = self.waiter
        if waiter is None or node != waiter.node or publisher not in self.gates:
            self._offer(("n", node, stream), held, message, off, now_ns)
            return
        # [cache] remote: it waits for the neighbour's report of this position
        topic_key, topic_seq = _MSG.unpack_from(message, off)[:2]
        seq = self._routing.pop((publisher, topic_key, topic_seq), None)
        if seq is None:  # routed outside _run_guaranteed (parked for an unknown key)
            self.counters["guaranteed_persist_untracked"] += 1
            self._offer(("n", node, stream), held, message, off, now_ns)
            return
        if held is None:
            waiter.unreachable(publisher, seq, "has no reliable stream from here (not "
                               "reachable)")
            return
        pos = held.sender.next_seq + len(held.sender.pending)
        if self._offer(("n", node, stream), held, message, off, now_ns):
            self.gates[publisher].waiting.append((seq, pos))
        else:
            waiter.unreachable(publisher, seq, "could not be sent it (the stream's window "
                               "and queue are full)")

    def to_client(self, session_id: int, origin: int, stream: int, message: Any, off: int,
                  now_ns: int) -> None:
        """A message for a local client's guaranteed subscriptions."""
        publisher = stream & ~RELIABLE_STREAM_BIT
        stream |= RELIABLE_STREAM_BIT
        held = self._sender_to_client(session_id, origin, stream)
        if (held is not None and self.persist_identity is not None
                and self._is_cache(session_id)):
            # the sequence this message takes on the stream to the cache (held back behind
            # its pending queue, or skipped as a loss: the cache then never reports it)
            cache_seq = held.sender.next_seq + len(held.sender.pending)
            if origin == self.node_id:
                self._to_cache(publisher, message, off, cache_seq)
            elif self.reporter is not None:
                self._remote_to_cache(origin, stream, message, off, cache_seq)
        self._offer(("c", session_id, origin, stream), held, message, off, now_ns)

    # --- losses -------------------------------------------------------------------------------
    def _notice(self, key: tuple, held: _Sender | None, payload: bytes, now_ns: int) -> None:
        if held is None:
            return
        if not held.sender.offer(LOSS_NOTICE_KEY, payload, now_ns, publish_ts_ns=time.time_ns(),
                                 qos=int(ml.Qos.GUARANTEED)):
            held.sender.skip(now_ns)  # refused as any message: then it is a loss event itself
            self.counters["loss_notices_refused"] += 1
        held.last_offer_ns = now_ns
        self.active[key] = held.sender
        self.counters["loss_notices_sent"] += 1

    def _guaranteed_sessions(self) -> list[int]:
        return [what[1] for what in self.dp.tables.ports.values() if what[0] == "gclient"]

    def _guaranteed_nodes(self) -> list[int]:
        return [what[1] for what in self.dp.tables.ports.values() if what[0] == "gnode"]

    def notify_clients(self, origin: int, stream: int, payload: bytes, now_ns: int) -> None:
        """A loss notice to every local client with a guaranteed subscription."""
        for sid in self._guaranteed_sessions():
            self._notice(("c", sid, origin, stream), self._sender_to_client(sid, origin, stream),
                         payload, now_ns)

    def on_loss(self, where: str, event: UnrecoverableLoss) -> None:
        self.lost(where, event.stream, event.first_seq, event.last_seq, event.reason.name)

    def lost(self, where: str, key: StreamKey, first: int, last: int, reason: str) -> None:
        """Messages ``first``..``last`` of a received stream will not be delivered: count
        them and send loss notices to whoever could have received them."""

        now_ns = time.monotonic_ns()
        self.counters["guaranteed_loss_events"] += 1
        self.counters["guaranteed_lost_messages"] += last - first + 1
        origin, stream = key
        if where == FABRIC and self.reporter is not None:
            self.reporter.lost(origin, stream, first, last, reason)
        if where == FABRIC:  # (origin, stream) from another appliance: tell our clients
            payload = loss_notice(origin, stream, first, last, reason, self.node_id)
            self.notify_clients(origin, stream, payload, now_ns)
            return
        # a publishing client's stream: everyone who could have received those messages
        stream = origin | RELIABLE_STREAM_BIT
        payload = loss_notice(self.node_id, stream, first, last, reason, self.node_id)
        for node in self._guaranteed_nodes():
            self._notice(("n", node, stream), self._sender_to_node(node, stream), payload,
                         now_ns)
        self.notify_clients(self.node_id, stream, payload, now_ns)

    # --- the cycle ----------------------------------------------------------------------------
    def take_delivered(self) -> list[tuple[str, StreamKey, bytes]]:
        out, self.delivered = self.delivered, []
        return out

    def run_timers(self, now_ns: int) -> int:
        """Receivers that saw frames this cycle (their NAKs leave now), and every
        GUARANTEED_TIMER_INTERVAL_NS all receivers and senders (retries, ACKs, probes)."""
        work = 0
        if now_ns >= self._timers_at:
            self._timers_at = now_ns + GUARANTEED_TIMER_INTERVAL_NS
            for rx in self.receivers.values():
                work += rx.do_work(now_ns)
            for held in self.senders.values():
                work += held.sender.do_work(now_ns)
            if now_ns >= self._sweep_at:
                self._sweep_at = now_ns + GUARANTEED_SWEEP_INTERVAL_NS
                self._sweep(now_ns)
                self.cache_naks.expire(now_ns)
        elif self._busy:
            for where in self._busy:
                work += self.receivers[where].do_work(now_ns)
        self._busy.clear()
        return work

    def flush(self, now_ns: int) -> None:
        """Send the open frames of the senders offered to in this cycle."""
        for sender in self.active.values():
            sender.flush(now_ns)
        self.active.clear()
        if self.reporter is not None:
            self.reporter.emit(now_ns)
        self.cache_naks.end_cycle()

    # --- lifetimes ----------------------------------------------------------------------------
    def on_tables(self, tables: Any) -> None:
        """Senders towards an appliance that restarted (a new epoch) are dropped: the new
        incarnation's receivers start from sequence 1, and so does a new sender.

        A sender towards an appliance whose interest is not known now (no epoch) is kept:
        not known is not restarted. Its receiver may still be in the middle of the stream,
        and a new sender starting again at 1 would be taken for duplicates and then for the
        stream's continuation: what this one holds would vanish without a loss event. It
        ends with its publishing stream (``_sweep``) or on a new epoch."""
        for key, held in list(self.senders.items()):
            if key[0] != "n":
                continue
            epoch = tables.epochs.get(key[1])
            if epoch is not None and epoch != held.epoch:
                self._drop(key)
                self.counters["guaranteed_streams_restarted"] += 1
                if self.waiter is not None and key[1] == self.waiter.node:
                    self.waiter.sender_dropped(key[2], "restarted")

    def on_session_removed(self, session_id: int) -> None:
        for key in [k for k in self.senders if k[0] == "c" and k[1] == session_id]:
            self._drop(key)
        stream = StreamKey(session_id, session_id | RELIABLE_STREAM_BIT)
        for rx in self.receivers.values():
            rx.streams.pop(stream, None)
        for key in [k for k in self.topic_seq if k[0] == session_id]:
            del self.topic_seq[key]
        self.gates.pop(session_id, None)
        self.persist_failed.pop(session_id, None)
        self.cache_naks.session_removed(session_id)
        if self._cache_ready == session_id:
            self._cache_ready = None
        if self._cache_session == session_id:
            self._cache_session = None
            if self.reporter is not None:
                self.reporter.cache_gone()
            for session, gate in self.gates.items():  # what it was handed is gone with it
                if gate.waiting:
                    self._persist_failed(session, gate.waiting[0][0],
                                         "the cache's session ended before it was on disk")

    def _sweep(self, now_ns: int) -> None:
        """Drop senders whose publishing stream ended: its session logged out here, or the
        upstream stream was forgotten by our fabric receiver; after a linger for NAKs."""

        upstream = self.receivers.get(FABRIC)
        for key, held in list(self.senders.items()):
            if now_ns - held.last_offer_ns < GUARANTEED_SENDER_LINGER_NS:
                continue
            origin, stream = (self.node_id, key[2]) if key[0] == "n" else (key[2], key[3])
            if origin == self.node_id:
                ended = (stream & ~RELIABLE_STREAM_BIT) not in self.dp.sessions
            else:
                ended = upstream is None or StreamKey(origin, stream) not in upstream.streams
            if ended:
                self._drop(key)

    def _drop(self, key: tuple) -> None:
        held = self.senders.pop(key, None)
        self.active.pop(key, None)
        if held is not None:
            self._closed_counters.update(_sender_counters(held.sender.counters))
            requester = key[:2]
            if requester in self.budgets and not any(k[:2] == requester for k in self.senders):
                del self.budgets[requester]

    # --- counters -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, int]:
        """Counters for the status snapshot (``guaranteed_*``)."""
        out = {k: int(v) for k, v in self.counters.items()}
        out.update({k: int(v) for k, v in self.cache_naks.counters.items()})
        rx = Counter()
        for r in self.receivers.values():
            c = r.counters
            rx["recovered"] += c.recovered
            rx["duplicates"] += c.duplicates
            rx["nak_frames_out"] += c.nak_frames
            rx["received"] += c.delivered
        tx = Counter(self._closed_counters)
        for held in self.senders.values():
            tx.update(_sender_counters(held.sender.counters))
        auth = self.auth
        if auth is not None:
            out["guaranteed_auth_accepted"] = auth.accepted
        out.update({f"guaranteed_{k}": int(v) for k, v in (rx + tx).items()})
        out["guaranteed_streams_out"] = len(self.senders)
        if self.gating:
            out["guaranteed_awaiting_persist"] = sum(len(g.waiting)
                                                     for g in self.gates.values())
        if self.reporter is not None:
            out.update(self.reporter.count())
        if self.waiter is not None:
            out["persist_remote_ready"] = int(self.waiter.ready)
        out["guaranteed_streams_in"] = sum(len(r.streams) for r in self.receivers.values())
        return out


def _sender_counters(c: Any) -> dict[str, int]:
    """What the status shows of a sender's counters (``guaranteed_<name>``, summed)."""
    return {"retransmitted": c.retransmitted, "retransmitted_bytes": c.retransmitted_bytes,
            "nak_frames_in": c.nak_frames, "sent": c.messages,
            "retransmits_limited": c.retransmits_limited,
            "nak_answers_limited": c.nak_answers_limited,
            "nak_ranges_acked": c.nak_ranges_acked, "loss_frames_out": c.loss_frames}
