"""The client API: a session with one appliance over UDP or the shared-memory bus.

A ``Client`` owns one channel and one background thread (an ``AgentRunner`` with the
``_ClientAgent``): it receives frames, answers waiting requests, resolves unknown topic keys,
delivers messages to subscriptions, heartbeats the appliance and sends the open publish
frame when its latency budget (``CLIENT_BATCH_BUDGET_NS``) is spent. ``publish`` packs
messages into that frame (batching): a frame leaves when full, when the budget is spent,
or on ``flush()``; ``publish_batch`` packs many at once (appliance/client/batching.py).
Publishing holds ``_pub_lock``, not the lock the client thread receives under. Poll
subscriptions' frames go to ``Client.poll`` undecoded (appliance/client/polling.py).

Guaranteed QoS (appliance/dataplane/guaranteed.py): ``publish(..., qos="guaranteed")`` goes through
this client's reliable sender (a stream of its own, recovered by NAK and retransmission up to
the appliance); a ``subscribe(..., qos="guaranteed")`` gets its messages over a reliable
stream per (origin appliance, publisher), in order, each once. What the transport cannot
recover reaches the subscription as a ``Loss`` event (``on_loss`` callback, ``losses``,
``lost_messages``): losses on this client's own hop, and loss notices from the appliances
upstream. A guaranteed message's ``sequence`` is its stream's transport sequence (contiguous
per publisher and origin across topics), not the publisher's per-topic number.

Guaranteed publishing returns an ``Outcome`` per message, resolved by the appliance's
acknowledgements (appliance/client/outcomes.py); ``flush(timeout=)`` raises
``UnacknowledgedError`` with the count, ``close()`` returns it. The connection's state, its
liveness probes and reconnection are appliance/client/connection.py.

Requests (login, subscribe, unsubscribe, the first publish of a topic, which registers it)
wait for the appliance's answer and raise ``EntitlementError`` when P&M's entitlements
refuse them. Subscriptions follow seed 000: ``unsubscribe`` of a pattern narrower than a
subscription is a partial unsubscribe (the client's list, kept here and at the appliance,
decides delivery). Selectors are evaluated here on each message of the subscription.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import secrets
import struct
import threading
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

import channels
from appliance.client.checks import (
    MAX_NAMESPACE,
    MAX_SCHEMA_ID,
    check_identity,
    check_int,
    check_pattern,
    check_topic,
)
from appliance.client.connection import (
    CLOSED,
    CONNECTED,
    RECONNECTING,
    ConnectionSide,
    StateChange,
    unacknowledged_text,
)
from appliance.client.errors import (
    BackPressureError,
    BusyError,
    ClientError,
    EntitlementError,
    LoginError,
    NoAnswerError,
    SelectorRefusedError,
    UnacknowledgedError,
)
from appliance.client.exactly_once import MAX_REPUBLISH_WINDOW, REPUBLISH_WINDOW, Republished
from appliance.client.flow import FLOW_WAIT_S, PublishHold, ReceiveFlow
from appliance.client.guaranteed import GuaranteedSide, _ClientSink, _GuaranteedHandler
from appliance.client.messages import (
    GUARANTEED_QOS,
    GUARANTEED_QUEUE_MESSAGES,
    NO_HEADERS,
    QOS,
    Headers,
    Loss,
    Message,
)
from appliance.client.outcomes import REASON_CLOSED, Outcome, OutcomeTracker
from appliance.client.pathwatch import MoveBounds, PathMonitor
from appliance.client.polling import PollQueue, PollView
from appliance.client.rdma import SCHEME as RDMA_SCHEME
from appliance.client.replay import take_frame
from appliance.client.routes import Routes
from appliance.client.settings import (
    CLOSE_ACK_TIMEOUT_S,
    LOGIN_ROUNDS,
    POLL_LIMIT,
    POLL_LIMIT_MAX,
    RECONNECT_LOGIN_TIMEOUT_S,
    RECONNECT_MAX_S,
    RECONNECT_S,
    SEND_WAIT_S,
    SESSION_TIMEOUT_MAX_S,
    SESSION_TIMEOUT_MIN_S,
    SESSION_TIMEOUT_S,
    SHM_RX_RING_BYTES,
)
from appliance.client.successor import SuccessorSide
from appliance.config import (
    CLIENT_BATCH_BUDGET_NS,
    CLIENT_HEARTBEAT_INTERVAL_NS,
    REQUEST_RETRY_FIRST_S,
    REQUEST_RETRY_MAX_S,
    REQUEST_TIMEOUT_S,
)
from appliance.dataplane.guaranteed import RELIABLE_STREAM_BIT
from channels.errors import ChannelDeviceError
from datapath import jit
from datapath.agent import (
    AgentRunner,
    AgentWakeup,
    BackoffIdle,
    BusySpinIdle,
    PollingIdle,
    SleepingIdle,
    WaitSet,
)
from datapath.config import MAX_FRAME_BYTES
from datapath.errors import TopicwireError
from datapath.flow_control import FlowControlError, policy_from_name
from datapath.protocol import admin_layout as al
from datapath.protocol import extension_layout as xl
from datapath.protocol import frame_layout as fl
from datapath.protocol import frame_mac as fm
from datapath.protocol import message_layout as ml
from datapath.protocol._kernels import (
    DOWN_KEYED,
    DOWN_LOGIN,
    DOWN_OPEN,
    UNVERIFIED,
    check_down_frames,
    sign_frames,
)
from datapath.protocol.codec import FrameWriter, MessageView, decode_frame, encode_admin
from datapath.protocol.errors import ProtocolError
from datapath.protocol.extensions import EXTENSION_FLAGS, ExtensionError, encode_headers
from datapath.protocol.extensions import HEADERS_FLAG as _HEADERS_FLAG
from datapath.protocol.extensions import split as split_extensions
from datapath.protocol.frame_mac import new_state
from datapath.protocol.replay_layout import REPLAY_STREAM_ID
from datapath.protocol.segments import (
    SEGMENT_CHUNK_BYTES,
    SEGMENT_REGION_BYTES,
    Reassembler,
    segment,
)
from datapath.topics.algebra import is_pattern
from datapath.topics.registry import KeyRegistry
from datapath.topics.sublist import SubscriptionList

SUBSCRIPTION_QUEUE_MESSAGES = 1_000_000
"""Messages a subscription queue holds before the oldest are dropped (best-effort) and
counted; last-value subscriptions keep one per topic instead."""
CLIENT_DISPATCH_FRAMES = 8
"""Frames of a received burst decoded and handed over at a time; between two such steps
the client tells its appliance its receive queue's state (flow control)."""
CLIENT_DECODE_MESSAGES = 65_536
"""Messages one batch decode of received frames can hold."""
_DATA_TYPE = int(fl.FrameType.DATA)
_DATA_FRAME = fl.FrameType.DATA
_SEND_RECEIVE_APART = ("udp", "shm")
"""Channel kinds whose send and receive may run on two threads at once."""
_RETX_TYPE = int(fl.FrameType.RETRANSMISSION)
_LOSS_TYPE = int(fl.FrameType.LOSS)
_TO_SENDER_TYPES = (int(fl.FrameType.NAK), int(fl.FrameType.ACK),
                    int(fl.FrameType.FLOW_CONTROL))
_STREAM = struct.Struct(">I")
_MSG = ml.MESSAGE_HEADER_STRUCT
SUBSCRIPTION_LOSS_EVENTS = 1_024
"""Loss events a subscription keeps (``losses``); ``lost_messages`` counts them all."""
ROUTE_CACHE_TOPICS = 65_536
"""Topics whose matching subscriptions a client remembers (cleared when full)."""
IDLE_STRATEGIES = ("block", "busy", "backoff", "sleep")
"""How a client's thread waits when idle (``connect(..., idle=)``): ``block`` (the default)
blocks in poll(2) on its channel's descriptor (a socket, or a shared-memory ring's doorbell)
for at most 1 ms, so a frame ends the wait at once (it spins ``CLIENT_SPIN_NS`` first only
while a publish frame waits for its batching budget); ``busy`` spins; ``backoff`` spins,
yields, then sleeps up to 1 ms (a frame waits for the sleep to end); ``sleep`` sleeps 1 ms
(least CPU, up to 1 ms more latency)."""
CLIENT_SPIN_NS = 200_000
"""``idle="block"``: how long the client's thread keeps looking after its last work while a
publish frame waits for its batching budget (otherwise it parks at once)."""
CLIENT_MAX_PARK_NS = 1_000_000
"""``idle="block"``: its longest wait in poll(2) (its timers: heartbeats, retransmissions)."""
RESOLVE_RETRY_NS = 200_000_000
"""An unanswered key resolution is asked again after this long."""
log = logging.getLogger("topicwire.client")
_ZERO = np.zeros(1, np.int64)
_NONE = np.zeros(0, np.int64)
"""Arguments of ``sign_frames`` for one frame at offset 0 to the session's appliance."""


FAILOVER_LOOKBACK_S = 0.25
"""A replay after a move begins this long before the latest message each publisher had handed
over (publishers' clocks may differ from each other by up to this much)."""
SEEN_MESSAGES = 262_144
"""Messages a guaranteed subscription of a client with a standby recognises when a replay
after a move hands them over again (26 s of a 10,000 messages/s stream)."""


class Subscription:
    """One ``subscribe`` call: iterate it, ``get()`` from it, or give a callback."""

    def __init__(self, client: Client, sub_id: int, pattern: str, namespace: int,
                 selector: Any, qos: str, callback: Callable[[Message], None] | None,
                 on_loss: Callable[[Loss], None] | None = None, poll: bool = False) -> None:
        self.client = client
        self.poll_mode = poll
        """A poll subscription (``subscribe(..., poll=True)``): its messages are handed over
        by ``Client.poll``, not as ``Message`` objects."""
        self.sub_id = sub_id
        self.pattern = pattern
        self.namespace = namespace
        self.selector = selector
        self.qos = qos
        self.callback = callback
        self.on_loss = on_loss
        self.losses: deque[Loss] = deque(maxlen=SUBSCRIPTION_LOSS_EVENTS)
        """The most recent loss events (guaranteed subscriptions)."""
        self.lost_messages = 0
        """Messages named by loss events so far."""
        self.dropped = 0
        self.delivered = 0
        self.flow_flags = 0
        """The policy this subscription asked for, as its SUBSCRIBE entry's flag bits."""
        self.own_class = False
        """Made with ``own_class``: it takes only the messages of its class when the client
        holds a subscription of the other class that matches them (``Client.subscribe``)."""
        self.own_class_applied = False
        """The appliance said it leaves the other class's copies out for this subscription
        (an appliance built before ``own_class`` does not: the client then drops them on
        arrival)."""
        self.flow_policy: str | None = None
        """Its flow-control policy when one was configured (asked for, or P&M's identity or
        global policy: the appliance's answer says); None: the QoS's default."""
        self.policy_drops: Counter[str] = Counter()
        """Messages of its topics the appliance's flow-control policy dropped, by policy
        (POLICY_DROPS reports; a message several subscriptions match counts in each)."""
        self._queue: deque[Message] = deque()
        self._latest: OrderedDict[int, Message] = OrderedDict()
        self._cond = threading.Condition()
        self.closed = False
        self.durable: str | None = None
        """The durable subscription's name (``subscribe(..., durable=)``)."""
        self.selector_filtered = False
        """The appliance evaluates ``selector`` before it sends (its answer said so, at the
        subscribe and again after a reconnection): the client does not evaluate it again on
        a message only this subscription takes (it does when several of the client's
        subscriptions match the topic, and on a message reassembled from segments)."""
        self.duplicates = 0
        """Messages not handed over because they were handed over already (after a move
        or a reconnection, the replay from the cache and the live stream overlap)."""
        self._seen: dict[tuple, None] | None = (
            {} if qos == "guaranteed" and len(client.targets) > 1 else None)
        """A guaranteed subscription of a client with a standby: the identities of the last
        ``SEEN_MESSAGES`` messages handed over (origin, publishing session, topic key,
        publish time, payload hash), to join a replay to the live stream after a move. Not
        sequence numbers: each reliable hop numbers its own stream, so the cache's and the
        live stream's numbers of one message differ."""
        self._filling = False
        self._held_live: list[Message] = []
        self._last_ts: dict[tuple[int, int], int] = {}
        """A failover subscription: each publishing session's (origin, stream) latest publish
        time handed over, where a replay after a move begins (its own clock's times)."""
        self._fetcher: Any = None
        """A durable subscription's pager (appliance/client/durable.py)."""

    def _full(self) -> bool:
        return self.callback is None and len(self._queue) >= GUARANTEED_QUEUE_MESSAGES

    def _loss(self, loss: Loss) -> None:
        self.losses.append(loss)
        self.lost_messages += loss.messages
        if self.on_loss is not None:
            self.on_loss(loss)

    def _put(self, msg: Message) -> None:
        if self._seen is not None and not self._admit(msg):
            return
        self._hand(msg)

    def _admit(self, msg: Message, replayed: bool = False) -> bool:
        """Whether ``msg`` is handed over now: not when it was handed over already, nor
        (a live one) while a replay fills the gap of a move; it is held then."""
        with self._cond:
            if self._filling and not replayed:
                self._held_live.append(msg)
                return False
            seen = self._seen
            assert seen is not None
            ident = (msg.origin, msg.stream, msg.topic_key, msg.publish_ts_ns,
                     hash(msg.payload))
            if ident in seen:
                self.duplicates += 1
                return False
            seen[ident] = None
            if len(seen) > SEEN_MESSAGES:  # bounded: the oldest is not recognised again
                del seen[next(iter(seen))]
            publisher = (msg.origin, msg.stream)
            if msg.publish_ts_ns > self._last_ts.get(publisher, 0):
                if publisher not in self._last_ts and len(self._last_ts) >= SEEN_MESSAGES:
                    self._last_ts.clear()
                self._last_ts[publisher] = msg.publish_ts_ns
            return True

    def _fill_from_ns(self, silent_since_ns: int) -> int:
        """Where a replay after a move begins: before the latest message handed over of each
        publishing session (its clock), and before the silence began (this one's)."""
        with self._cond:
            first = min(self._last_ts.values(), default=silent_since_ns)
        return max(0, min(first, silent_since_ns) - int(FAILOVER_LOOKBACK_S * 1e9))

    def _begin_fill(self) -> None:
        with self._cond:
            self._filling = True

    def _fill(self, msg: Message) -> None:
        """A replayed message (the gap of a move): handed over unless it was already."""
        if self._admit(msg, replayed=True):
            self._hand(msg)

    def _joined(self) -> bool:
        """Whether the replay reached the live stream: the first live message held of each
        publishing session is one the replay handed over (the cache had kept it). Not yet:
        the cache has not appended what was published just before the subscription took
        effect at this appliance (``_fill_gap`` asks it again)."""
        with self._cond:
            seen = self._seen
            assert seen is not None
            firsts: dict[tuple[int, int], Message] = {}
            for msg in self._held_live:
                firsts.setdefault((msg.origin, msg.stream), msg)
            return all((m.origin, m.stream, m.topic_key, m.publish_ts_ns, hash(m.payload))
                       in seen for m in firsts.values())

    def _end_fill(self) -> None:
        """The replay is over: the live messages held meanwhile, those not handed over."""
        while True:
            with self._cond:
                held, self._held_live = self._held_live, []
                if not held:
                    self._filling = False
                    return
            for msg in held:
                if self._admit(msg, replayed=True):
                    self._hand(msg)

    def _hand(self, msg: Message) -> None:
        if self.callback is not None:
            self.delivered += 1
            self.callback(msg)
            return
        with self._cond:
            if self.qos == "last-value":
                self._latest.pop(msg.topic_key, None)
                self._latest[msg.topic_key] = msg
            else:
                if len(self._queue) >= SUBSCRIPTION_QUEUE_MESSAGES and self.qos != "guaranteed":
                    self._queue.popleft()
                    self.dropped += 1
                self._queue.append(msg)
            self.delivered += 1
            self._cond.notify()

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message; None on timeout or when the subscription is closed and empty."""
        if self.poll_mode:
            raise ClientError(f"the subscription to {self.pattern!r} is a poll subscription: "
                              "its messages come from client.poll(handler, limit)")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._queue:
                    msg = self._queue.popleft()
                    if self._fetcher is not None:  # handed over: acknowledged next request
                        self._fetcher.handed = msg.cache_seq + 1
                        self._cond.notify_all()
                    return msg
                if self._latest:
                    return self._latest.popitem(last=False)[1]
                if self.closed:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)

    def __iter__(self) -> Iterator[Message]:
        if self.poll_mode:
            raise ClientError(f"the subscription to {self.pattern!r} is a poll subscription: "
                              "its messages come from client.poll(handler, limit)")
        while True:
            msg = self.get()
            if msg is None:
                return
            yield msg

    def _close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def _wait_for_room(self, stop: threading.Event) -> bool:
        """A durable subscription's pager waits while its queue is full; False once
        ``stop`` is set."""
        from appliance.client.durable import DURABLE_QUEUE_MESSAGES

        with self._cond:
            while (self.callback is None and len(self._queue) >= DURABLE_QUEUE_MESSAGES
                   and not stop.is_set()):
                self._cond.wait(0.1)
        return not stop.is_set()

    def unsubscribe(self) -> None:
        """Withdraw this subscription's pattern (``Client.unsubscribe(self.pattern)``). A
        durable subscription stops receiving and the appliance keeps its place (its
        messages are kept for it): ``Client.delete_durable`` ends it."""
        if self._fetcher is not None:
            self.client._end_durable(self)
            return
        self.client.unsubscribe(self.pattern, namespace=self.namespace)


BATCH_FRAME_OVERHEAD_BYTES = 256
"""Room left in a batched request's frame for the header, body header and MAC trailer."""


def _subscribe_options(qos: str, poll: object, selector: str | None, callback: object,
                       durable: str | None, on_loss: object, flow_policy: str | None,
                       own_class: object = False) -> int:
    """``subscribe``'s options checked (ClientError otherwise); the entry's flow flags."""
    if qos not in QOS:
        raise ClientError(f"qos {qos!r} is not one of {', '.join(QOS)}")
    if not isinstance(poll, bool):
        raise ClientError(f"poll is True or False, not {poll!r}")
    if not isinstance(own_class, bool):
        raise ClientError(f"own_class is True or False, not {own_class!r}")
    if own_class and (poll or selector or durable is not None):
        raise ClientError("subscribe(own_class=True) takes no poll, selector nor durable "
                          "name: it says which class of the session's messages this "
                          "subscription takes, and those pick messages otherwise")
    if poll and (qos != "best-effort" or selector or callback is not None or durable
                 is not None or on_loss is not None):
        raise ClientError("subscribe(poll=True) makes a best-effort subscription whose "
                          "messages client.poll(handler) hands over: it takes no qos other "
                          "than best-effort, no selector, callback, on_loss nor durable "
                          "name (subscribe without poll=True for those)")
    if flow_policy is None:
        return 0
    try:
        return int(policy_from_name(flow_policy, "flow_policy")) + 1
    except FlowControlError as exc:
        raise ClientError(str(exc)) from None


def frame_entries(frame: bytearray) -> int:
    """The entry count of an encoded admin frame (its header's ``msg_count``)."""
    return int.from_bytes(frame[fl.MSG_COUNT_OFFSET:fl.MSG_COUNT_OFFSET + 2], "big")


class _Waiter:
    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.result: dict | None = None


def _seconds(name: str, value: object, low: float, high: float, *, zero: bool = False
             ) -> float:
    """A duration argument of ``connect``, checked: a ``ClientError`` naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or not (low <= value <= high or zero and value == 0):
        also = " or 0" if zero else ""
        raise ClientError(f"{name} must be a number of seconds from {low:g} to {high:g}{also}, "
                          f"not {value!r}")
    return float(value)


class Client(GuaranteedSide, ConnectionSide, SuccessorSide):
    """A logged-in session with one appliance; see the module docstring."""

    def __init__(self, channel: Any, identity: str, *, ring: str | None = None,
                 owned: Any = None, timeout_s: float = REQUEST_TIMEOUT_S,
                 idle: str = "block", targets: list[Target] | None = None,
                 target_index: int = 0,
                 on_state: Callable[[StateChange], None] | None = None,
                 session_timeout_s: float = SESSION_TIMEOUT_S,
                 reconnect_s: float = RECONNECT_S,
                 resend: bool = False, password: str | bytes | None = None,
                 trusted: str | None = None, move_on: MoveBounds | None = None,
                 client_id: str | None = None,
                 republish_window: int = REPUBLISH_WINDOW) -> None:
        if idle not in IDLE_STRATEGIES:
            raise ClientError(f"idle {idle!r} is not one of {', '.join(IDLE_STRATEGIES)}")
        if on_state is not None and not callable(on_state):
            raise ClientError(f"on_state must be a callable taking a StateChange, not "
                              f"{type(on_state).__name__}")
        self.session_timeout_s = _seconds("session_timeout_s", session_timeout_s,
                                          SESSION_TIMEOUT_MIN_S, SESSION_TIMEOUT_MAX_S)
        self.reconnect_s = _seconds("reconnect_s", reconnect_s, SESSION_TIMEOUT_MIN_S,
                                    RECONNECT_MAX_S, zero=True)
        self.channel = channel
        self.identity = identity
        self._init_successor(client_id)
        self.targets = targets or []
        """The appliances this client may be connected to: the primary, then the standby."""
        self.target_index = target_index
        """The one it is (or was last) connected to."""
        self.url = self.targets[target_index].url if self.targets else ""
        self.moves = 0
        """Times the session moved to the other appliance (the standby, or back)."""
        self.moves_by_reason: dict[str, int] = {}
        """``moves`` by what made the session leave: ``silence`` (the session timeout or a
        failed channel), ``logout``, ``refused`` (the appliance no longer knows it), or the
        bound of ``move_on`` exceeded (``latency``, ``jitter``, ``loss``)."""
        self._lost_why = self._move_why = "silence"
        self._path = PathMonitor(move_on, time.monotonic_ns()) if move_on is not None \
            else None
        """The path's measurement and its bounds (``connect(..., move_on=)``, or P&M's for
        the identity: ``_adopt_move_bounds``): pathwatch.py."""
        self.move_on_source: str | None = "client" if move_on is not None else None
        """Whose bounds ``_path`` watches: ``client`` (``connect(move_on=)``), ``pm`` (the
        identity's ``move_on`` in P&M, given at login) or None (no bounds)."""
        self.filled = 0
        """Messages handed over from a cache's replay after a move (the gap it filled)."""
        self._restored: set[tuple[int, str, int]] = set()
        """The subscriptions the appliance made at the last login from the standby's mirror
        (``LOGIN_RESULT.restored``): not made again (connection.py ``_subscribe_again``)."""
        self.restored_subscriptions = 0
        """Subscriptions found made by the standby's mirror at moves, in all."""
        self.fill_polls = 0
        """Times a failover's gap fill asked the cache again because it had not yet kept
        the first live message of a publisher (``_fill_gap``)."""
        self._replay_pages: dict[int, Any] = {}
        """Request id -> the page frames received for a replay request waiting for its answer
        (appliance/client/replay.py; one entry per waiting request)."""
        self.replay_pages_incomplete = 0
        """Replay pages answered with a frame missing (asked again from what came)."""
        self.replay_frames_unexpected = 0
        """Page frames of no waiting request (a late frame of an answered one)."""
        self.replay_frames_malformed = 0
        """Page frames whose descriptor does not check."""
        self._moved_from: dict | None = None
        """The session the next login replaces on the other appliance (a move)."""
        self.timeout_s = timeout_s
        self._owned = owned
        self._ring = ring
        self._on_state = on_state
        self.state = CONNECTED
        """``connected``, ``lost``, ``reconnecting`` or ``closed`` (connection.py)."""
        self.last_state: StateChange | None = None
        self.state_changes = 0
        self._loss_notice: str | None = None
        self._heard_ns = self._liveness_ns = time.monotonic_ns()
        self._probe_at_ns = 0
        self._token = 0
        self._closing = threading.Event()
        self._reconnector: threading.Thread | None = None
        self._outcomes = OutcomeTracker()
        self.losses_of_connection = 0
        """Times the connection to the appliance was lost."""
        self.reconnects = 0
        """Times the client reconnected."""
        self.probes = 0
        """Liveness probes sent to a silent appliance."""
        if password is not None and not isinstance(password, (str, bytes)):
            raise ClientError(f"password must be a string or bytes, not "
                              f"{type(password).__name__}")
        self._password = password.encode() if isinstance(password, str) else password
        """Kept to log in again after a reconnection; never sent (the login proves it)."""
        self._trusted = trusted
        """The appliance's own process's login token (appliance/edge: in-process only)."""
        self.resend = bool(resend)
        """Send the guaranteed messages a lost session did not acknowledge again on the next
        one (at least once: connection.py)."""
        self._to_resend: list[Outcome] = []
        self.resent = 0
        """Guaranteed messages sent again after a reconnection."""
        self.unacknowledged_at_close = 0
        """What ``close`` returned: guaranteed messages not acknowledged nor reported."""
        self.close_failures: dict[str, int] = {}
        """Those by reason."""
        self._lock = threading.RLock()
        self._pub_lock = threading.RLock()
        """The publish frame, the per-topic sequences and every send on the channel (signed
        under it): apart from ``_lock``, which the client thread holds while it receives, so
        that thread never holds up a publish. Order: ``_lock`` before ``_pub_lock``."""
        self._wakeup = AgentWakeup()
        """Ends the client thread's park when a publish opens a frame (its batching budget
        runs from then, not from the end of a park of up to ``CLIENT_MAX_PARK_NS``)."""
        self._batch_records: np.ndarray | None = None
        self._packed = (0, 0)
        self._pollq: PollQueue | None = None
        """Frames for ``poll`` (made with the first poll subscription)."""
        self._poll_unknown: dict[int, int] = {}
        """Topic keys ``poll`` met and the client does not know -> when first met."""
        self._subs_version = 0
        self._has_push = False
        """A live subscription is not a poll one: received messages are decoded for it."""
        self._waiters: dict[tuple, _Waiter] = {}
        self._keys: dict[tuple[int, str], int] = {}
        self._topics: dict[int, tuple[int, str]] = {}
        self._pending: dict[int, list[Message]] = {}
        self._asked: dict[int, int] = {}
        self._seq: dict[int, int] = {}
        self._subs: list[Subscription] = []
        self._durables: list[Subscription] = []
        self.durables_woken = 0
        """Durable subscriptions' requests given up after a reconnection (asked again of
        the appliance connected to now)."""
        """Durable subscriptions (paged in from the cache; not in the live lists)."""
        self._route_cache: dict[tuple[int, str, bool, bool, bool], list[Subscription]] = {}
        self._own_left_out: set[tuple[int, str, bool, bool, bool]] = set()
        """Keys of ``_route_cache`` whose ``own_class`` subscriptions were left out."""
        self.own_class_copies = 0
        """Messages received in the other class than their own (a guaranteed one on a plain
        stream, another on a reliable one) and handed to no ``own_class`` subscription for
        it: copies an appliance built before ``own_class``, or a session whose other
        subscriptions need them, still sends (``Client.subscribe``)."""
        self._republished = Republished(check_int("republish_window", republish_window,
                                                  MAX_REPUBLISH_WINDOW))
        """MQTT QoS 2 publications sent again by an edge after its crash, dropped
        (appliance/client/exactly_once.py)."""
        self._routes = Routes()
        """``_subs`` indexed by pattern (``_targets``)."""
        self._flow_subs: list[Subscription] = []
        """The subscriptions of ``_subs`` with a flow-control policy (``ReceiveFlow``)."""
        self._lists: dict[int, SubscriptionList] = {}
        self._sub_ids = itertools.count(1)
        self._keyer = KeyRegistry()
        self._schemas: dict[int, Any] = {}
        self.session = 0
        self.node = ""
        self.node_id = 0
        self.closed = False
        self.logged_out_reason: str | None = None
        self.published = 0
        self.send_drops = 0
        """Publish frames the channel did not take within ``SEND_WAIT_S`` (dropped)."""
        self.messages_dropped_at_send = 0
        """Best-effort messages in those frames (guaranteed ones are resent by the transport)."""
        self.send_waits = 0
        """Times a publish frame waited for the channel to take it (backpressure)."""
        self.send_wait_s = SEND_WAIT_S
        """How long a publish frame waits for a channel that pushes back (settable)."""
        self.flow_wait_s = FLOW_WAIT_S
        """How long a publish waits while the appliance holds this publisher off (a
        throttling subscriber is full: docs/flow-control.md) before ``BackPressureError``."""
        self._rflow = ReceiveFlow(self)
        self._hold = PublishHold()
        self._unnamed_drops: dict[int, Counter[str]] = {}
        """Policy drops of keys whose topic the client is still asking for."""
        self.policy_drops: Counter[str] = Counter()
        """Messages the appliance's flow-control policy dropped instead of delivering to
        this client, by policy (``drop-oldest``, ``conflate``, ``throttle``: the latter
        only when a throttle queue overflowed), as its POLICY_DROPS reports said."""
        self.received = 0
        self.malformed_extensions = 0
        """Messages dropped: their header block or segment descriptor did not parse."""
        self.reassembly = Reassembler()
        """Large messages being put back together from their segments, with its counters
        (docs/appliance.md, "Large messages")."""
        self.segments_published = 0
        """Messages this client published as segments."""
        self._segment_ids = itertools.count(1)
        self._writer_room = min(MAX_FRAME_BYTES, channel.max_frame_bytes) - \
            fl.AUTH_TRAILER_BYTES - fl.FRAME_HEADER_BYTES - ml.MESSAGE_HEADER_BYTES
        """The largest payload region one message of a publish frame holds."""
        self._pub = bytearray(MAX_FRAME_BYTES)
        self._pub_np = np.frombuffer(self._pub, dtype=np.uint8)
        self._writer = FrameWriter(self._pub, capacity_bytes=min(MAX_FRAME_BYTES,
                                                                 channel.max_frame_bytes)
                                   - fl.AUTH_TRAILER_BYTES)  # room for the session's MAC
        self._mac: tuple[np.ndarray, np.ndarray] | None = None
        """The session's frame MAC state (a password login: its key), else None."""
        self._down_ab, self._down_ctl = new_state(b"\x00", 0, 0, 0, 0)
        """The check of the appliance's frames (``check_down_frames``): the session's key,
        and what it refused by reason over the client's life (``refused_frames``)."""
        self._down_window = fm.new_windows(1)[0]
        self._down_mode = DOWN_OPEN
        """DOWN_OPEN (a session without a key takes frames as they come), DOWN_LOGIN (a
        login with a password before its proof: only its answers), DOWN_KEYED (only frames
        with the session's MAC)."""
        self._down_login = False
        """A login is waiting for its answer: an unsigned CONTROL frame is read for that
        answer only (the login's own proofs authenticate it)."""
        self._refused_unverified = 0
        self._open_since_ns = 0
        self._one = np.zeros(1, np.int64)
        self._sign_len = np.zeros(1, np.int64)
        self._pub_frames = (self._pub_np, np.zeros(1, np.int64), np.zeros(1, np.int64), 1)
        """The open publish frame as ``channel.send`` takes it (buffer, offset 0, its length
        set by ``_flush_locked``): made once, so a publish allocates no arrays."""
        self._gsender: Any = None
        self._greceiver: Any = None
        self._held: dict[tuple[int, int], deque] = {}
        """Guaranteed stream -> messages (and losses) waiting behind one whose topic is not
        known yet: released in order once it is."""
        self.losses = 0
        """Loss events this client got on its guaranteed streams."""
        self.request_retries = 0
        """Requests sent again because the first send had no answer in time."""
        self.lost_messages = 0
        # load (with a cold cache: compile) the channels' kernels and the batch decoder
        # before the session exists: compiling holds the interpreter for seconds, and during
        # a session it would keep the heartbeats back until the appliance logs the client out
        channels.warm_up()
        jit.preload()
        check_down_frames(self._pub_np, _ZERO, _ZERO, 0, DOWN_OPEN, False, self._down_ab,
                          self._down_ctl, self._down_window, np.zeros(1, np.int8))
        self._runner = AgentRunner([_ClientAgent(self)], self._idle_strategy(idle),
                                   name=f"client-{identity}")
        self._runner.start()
        try:
            self._login(ring)
        except BaseException:
            self.state = CLOSED  # never connected: no state change to report
            self.close()
            raise

    # --- sending -------------------------------------------------------------------------------
    def _send(self, frame: bytes | bytearray) -> None:
        buf = np.frombuffer(bytearray(frame) + bytes(fl.AUTH_TRAILER_BYTES), dtype=np.uint8)
        with self._pub_lock:
            self._one[0] = self._sign(buf, len(frame))
            sent = self._channel_send((buf, np.zeros(1, np.int64), self._one.copy(), 1))
        if sent != 1:
            raise ClientError("the appliance's channel is full; retry later")

    def _sign(self, buf: np.ndarray, length: int) -> int:
        """The length of the frame at ``buf[:length]`` once the session's MAC trailer is
        appended (``buf`` has room; a session without a key: as it is). Under ``_pub_lock``:
        the sequence counts up once per frame."""
        mac = self._mac
        if mac is None:
            return length
        self._sign_len[0] = length
        sign_frames(buf, _ZERO, self._sign_len, _ZERO, 1, len(buf), _NONE, _NONE,
                    self.node_id, time.time_ns(), *mac)
        return int(self._sign_len[0])

    def _channel_send(self, frames: tuple) -> int:
        """``channel.send`` (the caller holds ``_pub_lock``); a channel whose connection is gone
        for good (``Channel.failure``: an RDMA appliance went away) is the caller's
        ``ClientError`` saying so, not the channel's device error; so is a channel the client
        thread closed when the session ended."""
        if self.channel.closed:
            why = f" ({self.logged_out_reason})" if self.logged_out_reason else ""
            raise ClientError(f"the connection is closed{why}; connect again")
        try:
            return self.channel.send(frames)
        except ChannelDeviceError as exc:
            if self.channel.failure is None:
                raise
            raise NoAnswerError(f"the connection to the appliance is gone ({exc}); connect "
                                "again") from None

    def _admin(self, ftype: fl.FrameType, entries: list, body_header: dict | None = None) -> None:
        self._send(encode_admin(ftype, entries, body_header=body_header,
                                source_session=self.session, send_ts_ns=time.time_ns()))

    def _control(self, kind: al.ControlKind, doc: dict) -> None:
        self._admin(fl.FrameType.CONTROL, [al.Control(kind, json.dumps(doc))])

    def _request(self, key: tuple, send: Callable[[], None], *, repeatable: bool = False,
                 timeout_s: float | None = None) -> dict:
        """Send a request and wait for its answer until ``timeout_s``; a ``repeatable``
        one (login, registration: the appliance answers a repeat as the first) is sent
        again with backoff while unanswered, so one lost datagram or an appliance busy for
        a moment costs a retry, not the request."""
        waiter = _Waiter()
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self._waiters[key] = waiter
        try:
            deadline = time.monotonic() + timeout_s
            retry_s = REQUEST_RETRY_FIRST_S if repeatable else timeout_s
            send()
            while not waiter.event.wait(max(0.0, min(retry_s, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    raise NoAnswerError(f"no answer from the appliance to {key[0]} within "
                                        f"{timeout_s} s; is it running?")
                send()
                self.request_retries += 1
                retry_s = min(retry_s * 2, REQUEST_RETRY_MAX_S)
        finally:
            with self._lock:
                self._waiters.pop(key, None)
        if waiter.result is None:  # close() woke it
            raise ClientError(f"the client was closed while waiting for the answer to {key[0]}")
        return waiter.result

    def _admin_frames(self, ftype: fl.FrameType, entries: list,
                      body_header: dict | None = None) -> list[bytearray]:
        """``entries`` in as few admin frames as the channel takes (a batched request)."""
        room = min(MAX_FRAME_BYTES, self.channel.max_frame_bytes) - BATCH_FRAME_OVERHEAD_BYTES
        frames: list[bytearray] = []
        chunk: list = []
        size = 0
        for entry in entries:
            text = entry.topic if ftype is fl.FrameType.REGISTRY_UPDATE else \
                entry.pattern + entry.selector
            cost = 24 + ((len(text.encode("utf-8")) + 7) & ~7)
            if chunk and size + cost > room:
                frames.append(encode_admin(ftype, chunk, body_header=body_header,
                                           source_session=self.session,
                                           send_ts_ns=time.time_ns()))
                chunk, size = [], 0
            chunk.append(entry)
            size += cost
        if chunk:
            frames.append(encode_admin(ftype, chunk, body_header=body_header,
                                       source_session=self.session, send_ts_ns=time.time_ns()))
        return frames

    def _request_frames(self, keys: list[tuple], entries: list, ftype: fl.FrameType,
                        timeout_s: float | None) -> list[dict | None]:
        """A batched (un)subscribe: its frames one after the other, each sent once the
        previous one's entries were answered (the appliance admits a frame whole while the
        session has fewer than ``clients.max_pending_requests`` requests waiting, so frames
        sent together would find the first one's entries waiting); ``timeout_s`` for the
        whole."""
        frames = self._admin_frames(ftype, entries)
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        answers: list[dict | None] = []
        at = 0
        for frame in frames:
            count = frame_entries(frame)
            left = deadline - time.monotonic()
            if left <= 0:
                answers.extend([None] * (len(keys) - at))
                break
            answers.extend(self._request_many(keys[at:at + count], [frame], timeout_s=left))
            at += count
        return answers

    def _request_many(self, keys: list[tuple], frames: list[bytearray], *,
                      repeatable: bool = False, timeout_s: float | None = None,
                      again: Callable[[list[int]], list[bytearray]] | None = None
                      ) -> list[dict | None]:
        """``_request`` of many requests sent together in ``frames``: the answer of each key
        (None: none came within ``timeout_s``). ``repeatable``: sent again with backoff while
        some are unanswered (registration: a repeat is answered as the first): the frames
        ``again`` makes of the unanswered keys' indices, else all ``frames`` (an answered
        entry sent again costs the appliance and the channel as much as a new one)."""
        waiters = [_Waiter() for _ in keys]
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            for key, waiter in zip(keys, waiters):
                self._waiters[key] = waiter
        try:
            deadline = time.monotonic() + timeout_s
            retry_s = REQUEST_RETRY_FIRST_S if repeatable else timeout_s
            for frame in frames:
                self._send(frame)
            at = 0
            while at < len(waiters):
                resend = time.monotonic() + retry_s
                while at < len(waiters) and waiters[at].event.wait(max(0.0, min(
                        resend, deadline) - time.monotonic())):
                    at += 1
                if at == len(waiters) or time.monotonic() >= deadline:
                    break
                if not repeatable:  # (woken early: wait out the deadline)
                    continue
                if again is not None:
                    frames = again([i for i in range(at, len(waiters))
                                    if not waiters[i].event.is_set()])
                for frame in frames:
                    self._send(frame)
                self.request_retries += 1
                retry_s = min(retry_s * 2, REQUEST_RETRY_MAX_S)
        finally:
            with self._lock:
                for key in keys:
                    self._waiters.pop(key, None)
        if self.closed and any(w.result is None for w in waiters):
            raise ClientError("the client was closed while waiting for the answers")
        return [w.result for w in waiters]

    def _send_login(self, token: int, extra: dict | None = None) -> None:
        self._control(al.ControlKind.LOGIN, {"identity": self.identity, "ring": self._ring,
                                             "token": token, **self._login_client_id,
                                             **(extra or {})})

    def _login(self, ring: str | None, timeout_s: float | None = None) -> None:
        """Log in; an identity with a password answers the appliance's challenge with the
        proof of it and checks the appliance's own proof (appliance/control/credentials.py).
        """
        from appliance.control.credentials import (
            NONCE_BYTES,
            CredentialError,
            auth_message,
            client_proof,
        )

        token = secrets.randbits(63)  # names this login: a repeat is answered, not redone
        self._ring = ring
        with self._lock:
            self._mac = None  # a new session: a new key, if any
            # until the login is answered, frames are taken only as its answer (with a
            # password: nothing else until the proof gives the key)
            self._down_mode = DOWN_LOGIN if self._password is not None else DOWN_OPEN
            self._down_login = True
        key = None
        nonce = secrets.token_bytes(NONCE_BYTES)
        first = {"nonce": nonce.hex(), **({"trusted": self._trusted} if self._trusted else {}),
                 **({"moved_from": self._moved_from} if self._moved_from else {}),
                 **({"standby": True} if len(self.targets) > 1 else {})}
        result = self._request(("login",), lambda: self._send_login(token, first),
                               repeatable=True, timeout_s=timeout_s)
        expected = None
        for _ in range(LOGIN_ROUNDS):
            challenge = result.get("challenge")
            if result.get("accepted") or challenge is None:
                break
            if self._password is None:
                raise LoginError(f"login as {self.identity!r} refused: the identity logs in "
                                 f"with a password (connect(..., password=...), or "
                                 f"--password-file)")
            message = auth_message(self.identity, nonce, bytes.fromhex(challenge["nonce"]),
                                   str(result.get("node", "")))
            try:
                proof, expected, key = client_proof(self._password, challenge, message)
            except CredentialError as exc:
                raise LoginError(f"login as {self.identity!r}: the appliance's challenge "
                                 f"asks for scrypt parameters refused here ({exc})") from None
            self._down_key(key)  # the appliance's frames carry the MAC from its answer on
            proven = {**first, "server_nonce": challenge["nonce"], "proof": proof.hex()}
            result = self._request(("login",), lambda p=proven: self._send_login(token, p),
                                   repeatable=True, timeout_s=timeout_s)
        if not result.get("accepted"):
            raise LoginError(f"login as {self.identity!r} refused: {result.get('reason')}")
        if expected is not None and result.get("server_signature") != expected.hex():
            raise LoginError(f"login as {self.identity!r}: the appliance did not prove it "
                             f"knows the identity's credential (is it the one you meant?)")
        with self._lock:
            if key is not None:  # every frame of the session carries its MAC from now on
                self._mac = new_state(key, 0, 0, int(result["session"]), time.time_ns())
            else:  # a session without a key (no password): frames as they come
                self._down_mode = DOWN_OPEN
            self._down_login = False
        self._token = token
        self._hold.release()  # (a hold or credit of a session before this one is no more)
        self.session = int(result["session"])
        self.node = str(result.get("node", ""))
        self.node_id = int(result.get("node_id", 0))
        from datapath.reliability import ReceiverConfig, ReliableReceiver

        with self._lock:
            self._greceiver = ReliableReceiver(_GuaranteedHandler(self), _ClientSink(self),
                                               session_id=self.session, config=ReceiverConfig())
        from nic_offload.schema import Schema

        for doc in result.get("schemas", []):
            schema = Schema.from_dict(doc)
            self._schemas[schema.schema_id] = schema
        self._adopt_move_bounds(result.get("move_on"))
        self._restored = {(int(ns), str(p), int(q)) for ns, p, q in result.get("restored", ())}

    def _adopt_move_bounds(self, bounds: dict | None) -> None:
        """P&M's move bounds for this identity (``LOGIN_RESULT.move_on``), watched by a client
        with a standby that gave none of its own (``connect(move_on=)`` wins). Kept across
        moves while they stay the same (the hold-down goes on); bounds that the client
        cannot take are logged and left."""
        if bounds is None or len(self.targets) < 2 or self.move_on_source == "client":
            return
        try:
            wanted = MoveBounds(**bounds)
        except (ClientError, TypeError) as exc:
            log.warning("client %s: P&M's move bounds for this identity are not taken: %s",
                        self.identity, exc)
            return
        path = self._path
        if path is None or path.bounds != wanted:
            self._path = PathMonitor(wanted, time.monotonic_ns())
            self.move_on_source = "pm"

    def _down_key(self, key: bytes) -> None:
        """Check the appliance's frames under the session key ``key`` from now on, with a
        fresh replay window (a new login)."""
        with self._lock:
            ab = self._down_ab
            ab[fm.B_KEY:fm.B_KEY + fm.MAX_KEY_BYTES] = 0
            ab[fm.B_KEY:fm.B_KEY + len(key)] = np.frombuffer(key, np.uint8)
            self._down_ctl[fm.A_KEY_LEN] = len(key)
            self._down_window[:] = 0
            self._down_window[0] = -1
            self._down_mode = DOWN_KEYED

    @property
    def refused_by_reason(self) -> dict[str, int]:
        """Frames from the appliance's address refused (never delivered), by reason:
        ``no_trailer`` (no MAC on a session with a key), ``unknown_key`` (a MAC before the
        login gave a key), ``bad_mac`` (forged, or not this session's), ``replay`` (seen
        before), ``unverified`` (an unsigned CONTROL frame during a login that was not its
        answer)."""
        c = self._down_ctl
        out = {name: int(c[fm.A_ACCEPTED + i]) for i, name in enumerate(fm.REASONS[:-1])
               if name != "accepted"}
        out["unverified"] = self._refused_unverified
        return out

    @property
    def refused_frames(self) -> int:
        """Frames refused (``refused_by_reason``), all reasons."""
        return sum(self.refused_by_reason.values())

    @property
    def authenticated_frames(self) -> int:
        """Frames from the appliance whose MAC passed."""
        return int(self._down_ctl[fm.A_ACCEPTED])

    # --- publishing ----------------------------------------------------------------------------
    def _key(self, topic: str, namespace: int) -> int:
        key = self._keys.get((namespace, topic))
        if key is not None:
            return key
        check_topic(topic)  # once per topic: a key is cached only for a topic that passed
        key = self._keyer.key_of(topic, namespace)
        result = self._request(("register", namespace, topic), lambda: self._admin(
            fl.FrameType.REGISTRY_UPDATE, [al.RegistryEntry(key, namespace, topic)],
            {"version": 0}), repeatable=True)
        if not result.get("accepted"):
            raise EntitlementError(f"publish to {topic!r} refused: {result.get('reason')}")
        self._keys[(namespace, topic)] = key
        self._topics[key] = (namespace, topic)
        return key

    def register_many(self, topics: Iterable[str], *, namespace: int = 0,
                      timeout_s: float | None = None) -> list[ClientError | None]:
        """Register many topics in one batched request (REGISTRY_UPDATE frames as full as
        the channel takes, sent together), so the first publish to each needs no round
        trip: one result per topic, in order: None (registered, usable at once), an
        ``EntitlementError`` (P&M does not let the identity publish to it; the others are
        registered all the same) or a ``NoAnswerError`` (no answer within ``timeout_s``,
        default the client's timeout). A topic that is not one raises ``ClientError``
        before anything is sent. Topics registered before answer None at once."""
        self._check_usable()
        check_int("namespace", namespace, MAX_NAMESPACE)
        topics = list(topics)
        for topic in topics:
            check_topic(topic)
        out: list[ClientError | None] = [None] * len(topics)
        asked: dict[str, list[int]] = {}
        for i, topic in enumerate(topics):
            if (namespace, topic) not in self._keys:
                asked.setdefault(topic, []).append(i)
        if not asked:
            return out
        names = list(asked)
        keys = [self._keyer.key_of(topic, namespace) for topic in names]
        answers = self._register_entries([
            al.RegistryEntry(key, namespace, topic) for key, topic in zip(keys, names)],
            timeout_s)
        for topic, key, answer in zip(names, keys, answers):
            error: ClientError | None = None
            if answer is None:
                error = NoAnswerError(f"no answer from the appliance to the registration "
                                      f"of {topic!r}; is it running?")
            elif not answer.get("accepted"):
                error = EntitlementError(f"publish to {topic!r} refused: "
                                         f"{answer.get('reason')}")
            else:
                self._keys[(namespace, topic)] = key
                self._topics[key] = (namespace, topic)
            for i in asked[topic]:
                out[i] = error
        return out

    def _register_entries(self, entries: list[al.RegistryEntry], timeout_s: float | None
                          ) -> list[dict | None]:
        """One batched registration of ``entries`` (REGISTRY_UPDATE frames as full as the
        channel takes, sent together; while some are unanswered, the frames of those are sent
        again with backoff): the answer of each (None: none within ``timeout_s``)."""
        def frames(at: list[int]) -> list[bytearray]:
            return self._admin_frames(fl.FrameType.REGISTRY_UPDATE,
                                      [entries[i] for i in at], {"version": 0})

        return self._request_many([("register", e.namespace_id, e.topic) for e in entries],
                                  frames(list(range(len(entries)))), repeatable=True,
                                  timeout_s=timeout_s, again=frames)

    def _idle_strategy(self, idle: str) -> Any:
        """The client thread's idle strategy (``IDLE_STRATEGIES``)."""
        if idle == "block":
            def wait_set() -> WaitSet:  # the channel changes when the client reconnects
                fds = self.channel.wait_fds()
                return WaitSet(fds or (), fds is not None)

            return PollingIdle(wait_set, self._wakeup, spin_ns=CLIENT_SPIN_NS,
                               max_park_ns=CLIENT_MAX_PARK_NS, spin_worth=self._spin_worth)
        return {"busy": BusySpinIdle, "backoff": BackoffIdle, "sleep": SleepingIdle}[idle]()

    def _spin_worth(self) -> bool:
        """``idle="block"``: whether the client's thread, out of work, spins before it parks:
        only while a publish frame waits for its batching budget. After a receive it parks at
        once: what comes next rings its descriptor (the socket, the ring's doorbell), and a
        thread spinning between messages took a core from the appliance and the publisher on
        a small host (docs/appliance.md, "Benchmark: the client API")."""
        return self._open_since_ns > 0

    def publish(self, topic: str, payload: bytes | bytearray | memoryview = b"", *,
                qos: str = "best-effort", namespace: int = 0, schema_id: int = 0,
                flush: bool = False, on_outcome: Callable[[Outcome], None] | None = None,
                headers: Mapping[str, str | bytes] | None = None) -> int | Outcome:
        """Publish one message. ``headers``: its user properties, str -> str or bytes (at
        most 32, 1,024 bytes encoded; subscribers get them as ``Message.headers``).
        Best-effort and last-value: returns its sequence number (per topic). Guaranteed:
        returns its ``Outcome``, resolved when the appliance acknowledges the message or
        failed with the reason (``on_outcome(outcome)`` is called then too).
        The first publish of a topic registers it (one round trip; EntitlementError if P&M
        refuses). ``ConnectionLostError`` when the connection is lost (the first call after
        a loss, and every call until the client is connected again)."""
        if self.closed:
            why = f" ({self.logged_out_reason})" if self.logged_out_reason else ""
            raise ClientError(f"publish on a closed client{why}; connect again")
        if on_outcome is not None and (qos != "guaranteed" or not callable(on_outcome)):
            raise ClientError("on_outcome is a callable, and only for qos=\"guaranteed\" (other "
                              "QoS classes are not acknowledged)")
        self._check_usable()
        if not isinstance(topic, str):  # (a str is checked once, when its key is made)
            check_topic(topic)
        check_int("namespace", namespace, MAX_NAMESPACE)
        check_int("schema_id", schema_id, MAX_SCHEMA_ID)
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            hint = " (encode text first: payload.encode())" if isinstance(payload, str) else ""
            raise ClientError(f"a payload is bytes, bytearray or memoryview, not "
                              f"{type(payload).__name__}{hint}")
        if qos not in QOS:
            raise ClientError(f"qos {qos!r} is not one of {', '.join(QOS)}")
        flags = 0
        block = b""
        if headers:  # the header block after the payload (extension_layout.py)
            try:
                block = encode_headers(headers)
            except ExtensionError as exc:
                raise ClientError(f"headers refused: {exc}") from None
            flags = _HEADERS_FLAG
        elif headers is not None and not isinstance(headers, Mapping):
            raise ClientError(f"headers are a mapping of str to str or bytes, not "
                              f"{type(headers).__name__}")
        if len(payload) > xl.MAX_MESSAGE_BYTES:
            raise ClientError(f"a payload of {len(payload):,} bytes; a message is at most "
                              f"{xl.MAX_MESSAGE_BYTES:,} bytes (16 MiB)")
        key = self._key(topic, namespace)
        now = time.time_ns()
        if qos == "guaranteed":
            if len(payload) + len(block) > SEGMENT_REGION_BYTES:
                return self._publish_segmented(key, topic, payload, block, now, namespace,
                                               schema_id, flush, on_outcome)
            if block:
                payload = b"".join((payload, block))
            return self._publish_guaranteed(key, topic, payload, now, namespace, schema_id,
                                            flush, on_outcome, flags=flags)
        if block:
            payload = b"".join((payload, block))
        if self._hold.held:
            self._wait_for_release()
        if len(payload) > self._writer_room:
            return self._publish_segments_best_effort(key, payload, block, now, QOS[qos],
                                                      namespace, schema_id, flush)
        qos_value = QOS[qos]
        with self._pub_lock:
            seq = self._seq.get(key, 0) + 1
            self._seq[key] = seq
            writer = self._writer
            opened = False
            if self._open_since_ns == 0:
                writer.begin(_DATA_FRAME, source_session=self.session, stream_id=self.session)
                self._open_since_ns = time.monotonic_ns()
                opened = True
            if not writer.append(key, seq, now, payload, namespace_id=namespace,
                                 schema_id=schema_id, qos=qos_value, flags=flags):
                self._flush_locked()
                writer.begin(_DATA_FRAME, source_session=self.session, stream_id=self.session)
                self._open_since_ns = time.monotonic_ns()
                opened = True
                if not writer.append(key, seq, now, payload, namespace_id=namespace,
                                     schema_id=schema_id, qos=qos_value, flags=flags):
                    raise ClientError(f"a payload of {len(payload)} bytes does not fit one "
                                      f"frame (at most {writer.remaining_bytes - 40} bytes "
                                      "with its headers); send smaller messages")
            self.published += 1
            if flush:
                self._flush_locked()
            elif opened:  # the client thread sends it when the budget is spent: wake it
                self._wakeup.signal()
        return seq

    def _wait_for_release(self) -> None:
        """The appliance holds this publisher off (throttle): send what is open, then wait
        up to ``flow_wait_s`` for the release; ``BackPressureError`` if it does not come."""
        with self._pub_lock:
            if self._open_since_ns > 0:
                self._flush_locked()
        if not self._hold.wait(self.flow_wait_s):
            raise BackPressureError(
                f"the appliance held this publisher off for {self.flow_wait_s:g} s (a "
                "subscriber with the throttle flow-control policy is not keeping up); "
                "nothing was sent: publish again later")

    def publish_batch(self, topic: str, payloads: Any, *, qos: str = "best-effort",
                      namespace: int = 0, schema_id: int = 0) -> int:
        """Publish many messages to one topic in one call: ``payloads`` is a sequence of
        bytes-like objects, or a 2-D ``numpy.uint8`` array (one message per row, used in
        place). They are packed into as few frames as fit (~600 messages of 64 B a frame)
        with no per-message allocation, numbered with the topic's next sequences and one
        publish time, and sent before the call returns (no batching budget: what ``publish``
        left open goes first). Returns the last message's sequence. Best-effort or
        last-value; a payload must fit one frame (``publish`` segments larger ones).
        appliance/client/batching.py."""
        from appliance.client.batching import publish_batch

        if self._hold.held:
            self._wait_for_release()
        return publish_batch(self, topic, payloads, qos=qos, namespace=namespace,
                             schema_id=schema_id)

    def _send_packed(self, length: int, messages: int) -> None:
        """Send the frame ``publish_batch`` packed at the start of the publish buffer (under
        ``_pub_lock``, no frame open): as ``_flush_locked`` sends an open one."""
        self._packed = (length, messages)
        self._open_since_ns = -1
        self._flush_locked()


    def _publish_segments_best_effort(self, key: int, region: Any, block: bytes, now: int,
                                      qos: int, namespace: int, schema_id: int,
                                      flush: bool) -> int:
        """A message too large for one frame, as segment messages that share its sequence
        (``datapath/protocol/segments.py``); the subscriber's client puts it back together."""
        payload = memoryview(region)[: len(region) - len(block)]
        with self._pub_lock:
            seq = self._seq.get(key, 0) + 1
            self._seq[key] = seq
            segment_id = next(self._segment_ids) & 0xFFFFFFFF
            writer = self._writer
            parts = segment(payload, block, SEGMENT_CHUNK_BYTES, segment_id)
            for index, (part, flags) in enumerate(parts):  # (schema: the first segment's)
                args = dict(namespace_id=namespace, qos=qos, flags=flags,
                            schema_id=0 if index else schema_id)
                if self._open_since_ns == 0 or not writer.append(key, seq, now, part, **args):
                    self._flush_locked()
                    writer.begin(fl.FrameType.DATA, source_session=self.session,
                                 stream_id=self.session)
                    self._open_since_ns = time.monotonic_ns()
                    writer.append(key, seq, now, part, **args)
            self.published += 1
            self.segments_published += 1
            if flush:
                self._flush_locked()
        return seq

    def flush(self, timeout: float | None = None) -> None:
        """Send the open publish frames (best-effort and guaranteed) now. Raises
        ``UnacknowledgedError`` (with the count) if guaranteed messages failed since the last
        report. With ``timeout`` (seconds), first waits up to that long until the appliance
        has acknowledged every guaranteed message sent, and counts those it has not as
        unacknowledged too. ``ConnectionLostError`` when the connection is lost and nothing
        failed."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(
                timeout, (int, float)) or not timeout >= 0):
            raise ClientError(f"flush(timeout=) takes seconds (a number >= 0), not {timeout!r}")
        if self.state == CONNECTED and not self.closed:
            with self._pub_lock:
                self._flush_locked()
            with self._lock:
                if self._gsender is not None:
                    self._gsender.flush(time.monotonic_ns())
        pending = 0
        if timeout is not None and (self.state == CONNECTED or self._to_resend):
            # (with resend=True, those the lost session left are sent again once connected)
            tracker = self._outcomes
            tracker._wait_for(lambda: not self._to_resend and not any(
                o.state == "pending" for o in tracker._pending), timeout)
            pending = self.unacknowledged
        failed = self._outcomes.take_unreported()
        if failed or pending:
            self._loss_notice = None  # reported here
            raise UnacknowledgedError(
                f"{sum(failed.values()) + pending} guaranteed messages not acknowledged by the "
                f"appliance: {unacknowledged_text(failed, pending, timeout)}; publish them "
                "again once connected", failed=sum(failed.values()), pending=pending,
                reasons=failed)
        self._check_usable()

    hold_frames = False
    """True: guaranteed messages published with ``flush=False`` wait in their open frame
    until it is full, ``send_pending`` or ``flush`` sends it, or the client thread's
    batching budget passes, instead of leaving as soon as the adaptive batcher's target
    (about one message at low rates) is reached: for a caller that publishes in bursts and
    calls ``send_pending`` after each (the MQTT edge, once per wake-up of its loop). Set it
    before the first guaranteed publish."""

    def send_pending(self) -> None:
        """Send the open publish frames (best-effort and guaranteed) now, as ``publish(...,
        flush=True)`` sends its own: for a caller that publishes many messages with
        ``flush=False`` and sends them in one go (the MQTT edge, once per wake-up of its
        loop). Unlike ``flush()`` it neither waits nor reports failed messages."""
        with self._pub_lock:
            self._flush_locked()
        with self._lock:
            if self._gsender is not None:
                self._gsender.flush(time.monotonic_ns())

    @property
    def unacknowledged(self) -> int:
        """Guaranteed messages sent whose outcome is still pending (with ``resend=True``,
        those waiting to be sent again too)."""
        return self._outcomes.unacknowledged() + len(self._to_resend)

    def _flush_locked(self) -> None:
        """Send the open publish frame. A channel that pushes back is given up to
        ``SEND_WAIT_S`` to take it (the publisher is slowed down to its path's pace); a frame
        still refused then is dropped and counted with its messages (``send_drops``,
        ``messages_dropped_at_send``)."""
        if self._open_since_ns == 0:
            return
        if self._open_since_ns < 0:  # a frame publish_batch packed
            length, messages = self._packed
        else:
            messages = self._writer.message_count
            length = self._writer.finish()
        self._open_since_ns = 0
        if not length:
            return
        frames = self._pub_frames
        frames[2][0] = self._sign(self._pub_np, length)
        self._hold.spend(length)  # (a throttle credit: docs/flow-control.md)
        sent = self._channel_send(frames)
        if sent == 1:
            return
        self.send_waits += 1
        deadline = time.monotonic() + self.send_wait_s
        pause = 0.0
        while sent != 1 and time.monotonic() < deadline and not self.channel.closed:
            time.sleep(pause)
            pause = min(0.001, pause * 2 or 0.00005)
            sent = self._channel_send(frames)
        if sent != 1:
            self.send_drops += 1
            self.messages_dropped_at_send += messages
            log.warning("client %s: the appliance's channel took no publish frame for %g s; "
                        "%d messages dropped (send_drops %d)", self.identity, self.send_wait_s,
                        messages, self.send_drops)

    # --- subscribing ---------------------------------------------------------------------------
    def subscribe(self, pattern: str, selector: str | None = None, *, qos: str = "best-effort",
                  namespace: int = 0, callback: Callable[[Message], None] | None = None,
                  on_loss: Callable[[Loss], None] | None = None,
                  durable: str | None = None, poll: bool = False,
                  flow_policy: str | None = None, own_class: bool = False) -> Subscription:
        """Subscribe to ``pattern``; EntitlementError when P&M refuses it (BusyError when
        the session had ``clients.max_pending_requests`` requests waiting). ``on_loss`` is
        called with each ``Loss`` event of a guaranteed subscription (also kept in
        ``Subscription.losses``). ``durable``: a name under which the appliance keeps this
        subscription's place while it is away; its messages come from the appliance's
        cache, from where the last subscription of that name left off, in the order kept
        (appliance/client/durable.py; the pattern must lie within one of the appliance's
        ``cache.patterns``; no selector, QoS or other namespace than the kept one).
        ``poll``: a poll subscription: its messages are handed over by ``poll(handler,
        limit)`` as a flyweight, with no object per message (best-effort, no selector,
        callback nor durable name; appliance/client/polling.py). ``flow_policy``: what the
        appliance does with this subscription's messages while this client holds them off
        (``"throttle"``, ``"drop-oldest"``, ``"conflate"``; default: the identity's or
        P&M's policy, else the QoS's: docs/flow-control.md). ``own_class``: this subscription
        takes only the messages of its own class when this client holds subscriptions of
        the other class too: a best-effort (or last-value) one not the guaranteed messages
        that a guaranteed subscription of this client matches (they come over its reliable
        stream), a guaranteed one not the best-effort messages a best-effort subscription
        of this client matches; so a pattern subscribed in both classes with it receives
        each message once, in its class (the appliance leaves the other copy out,
        ``Subscription.own_class_applied``; docs/appliance.md, "One class per message")."""
        flow_flags = _subscribe_options(qos, poll, selector, callback, durable, on_loss,
                                        flow_policy, own_class)
        self._check_usable()
        check_pattern(pattern)
        check_int("namespace", namespace, MAX_NAMESPACE)
        if durable is not None:
            if selector:
                raise ClientError("a durable subscription takes no selector (its messages "
                                  "come from the cache's log as kept)")
            from appliance.client.durable import open_durable

            sub = open_durable(Subscription(self, 0, pattern, namespace, None, "guaranteed",
                                            callback, on_loss), durable)
            with self._lock:
                self._durables.append(sub)
            return sub
        compiled = _compiled_selector(selector)
        sub_id = next(self._sub_ids)
        flags = flow_flags | self._own_flags(own_class, namespace, qos, [pattern]).get(pattern, 0)
        result = self._request(("subscribe", sub_id), lambda: self._admin(
            fl.FrameType.SUBSCRIBE, [al.Subscription(sub_id, namespace, QOS[qos], flags,
                                                     pattern, selector or "")]))
        if not result.get("accepted"):
            raise _refusal(f"subscription to {pattern!r}", result, selector)
        sub = Subscription(self, sub_id, pattern, namespace, compiled, qos, callback, on_loss,
                           poll=poll)
        sub.selector_filtered = bool(result.get("selector_filtered"))
        sub.flow_flags = flow_flags
        sub.flow_policy = result.get("flow_policy")
        sub.own_class = own_class
        sub.own_class_applied = bool(result.get("own_class"))
        with self._lock:
            if poll and self._pollq is None:
                self._pollq = PollQueue(self)
            self._lists.setdefault(namespace, SubscriptionList()).subscribe(pattern)
            self._subs.append(sub)
            self._subs_changed([sub])
        return sub

    def subscribe_many(self, patterns: Iterable[str], selector: str | None = None, *,
                       qos: str = "best-effort", namespace: int = 0,
                       callback: Callable[[Message], None] | None = None,
                       on_loss: Callable[[Loss], None] | None = None, poll: bool = False,
                       flow_policy: str | None = None, timeout_s: float | None = None,
                       own_class: bool = False) -> list[Subscription | ClientError]:
        """``subscribe`` of many patterns in one request (SUBSCRIBE frames as full as the
        channel takes, sent together; the appliance builds its tables once for all of them
        and answers each once the tables holding it are live), with the same options for
        each: one result per pattern, in order: its ``Subscription``, or the error
        ``subscribe`` would have raised for it alone (``EntitlementError`` when P&M or a
        limit of the appliance refuses it, a ``BusyError`` when the session had
        ``clients.max_pending_requests`` requests waiting: ask again later,
        ``SelectorRefusedError``, a ``NoAnswerError`` when no answer came within
        ``timeout_s``, default the client's timeout); the others are made all the same. A
        pattern or an option that is not one raises ``ClientError`` before anything is
        sent. No durable subscriptions here."""
        flow_flags = _subscribe_options(qos, poll, selector, callback, None, on_loss,
                                        flow_policy, own_class)
        self._check_usable()
        patterns = [check_pattern(p) for p in patterns]
        check_int("namespace", namespace, MAX_NAMESPACE)
        if not patterns:
            return []
        compiled = _compiled_selector(selector)
        ids = [next(self._sub_ids) for _ in patterns]
        own = self._own_flags(own_class, namespace, qos, patterns)
        answers = self._request_frames([("subscribe", i) for i in ids], [
            al.Subscription(sub_id, namespace, QOS[qos], flow_flags | own.get(pattern, 0),
                            pattern, selector or "")
            for sub_id, pattern in zip(ids, patterns)], fl.FrameType.SUBSCRIBE, timeout_s)
        out: list[Subscription | ClientError] = []
        made: list[Subscription] = []
        for sub_id, pattern, result in zip(ids, patterns, answers):
            if result is None:
                out.append(NoAnswerError(f"no answer from the appliance to the subscription "
                                         f"to {pattern!r}; is it running?"))
                continue
            if not result.get("accepted"):
                out.append(_refusal(f"subscription to {pattern!r}", result, selector))
                continue
            sub = Subscription(self, sub_id, pattern, namespace, compiled, qos, callback,
                               on_loss, poll=poll)
            sub.selector_filtered = bool(result.get("selector_filtered"))
            sub.flow_flags = flow_flags
            sub.flow_policy = result.get("flow_policy")
            sub.own_class = own_class
            sub.own_class_applied = bool(result.get("own_class"))
            made.append(sub)
            out.append(sub)
        if made:
            with self._lock:
                if poll and self._pollq is None:
                    self._pollq = PollQueue(self)
                lst = self._lists.setdefault(namespace, SubscriptionList())
                for sub in made:
                    lst.subscribe(sub.pattern)
                self._subs.extend(made)
                self._subs_changed(made)
        return out

    def _own_flags(self, own_class: bool, namespace: int, qos: str, patterns: list[str]
                   ) -> dict[str, int]:
        """Pattern -> the SUBSCRIBE entry's ``SUBSCRIPTION_FLAG_OWN_CLASS`` bit for a new
        subscription with ``own_class``: set unless this client holds a subscription of
        the same pattern and class without the option, which needs the other class's
        copies (the appliance keeps one entry per pattern and class: the last subscribe
        says; this client still leaves them out of the new subscription itself)."""
        if not own_class:
            return {}
        guaranteed = qos == "guaranteed"
        with self._lock:
            plain = {s.pattern for s in self._subs
                     if s.namespace == namespace and not s.own_class
                     and (s.qos == "guaranteed") == guaranteed}
        return {p: al.SUBSCRIPTION_FLAG_OWN_CLASS for p in patterns if p not in plain}

    def unsubscribe_many(self, patterns: Iterable[str], *, namespace: int = 0,
                         timeout_s: float | None = None) -> list[ClientError | None]:
        """``unsubscribe`` of many patterns in one request (one table build at the
        appliance): one result per pattern, in order: None (withdrawn), or the error
        ``unsubscribe`` would have raised for it (a ``NoAnswerError`` when no answer came
        within ``timeout_s``). A pattern that is not one raises ``ClientError`` before
        anything is sent."""
        self._check_usable()
        patterns = [check_pattern(p) for p in patterns]
        check_int("namespace", namespace, MAX_NAMESPACE)
        if not patterns:
            return []
        ids = [next(self._sub_ids) for _ in patterns]
        answers = self._request_frames([("unsubscribe", i) for i in ids], [
            al.Subscription(sub_id, namespace, 0, 0, pattern)
            for sub_id, pattern in zip(ids, patterns)], fl.FrameType.UNSUBSCRIBE, timeout_s)
        out: list[ClientError | None] = []
        done: list[str] = []
        for pattern, result in zip(patterns, answers):
            if result is None:
                out.append(NoAnswerError(f"no answer from the appliance to the unsubscribe "
                                         f"of {pattern!r}; is it running?"))
            elif not result.get("accepted"):
                out.append(_refusal(f"unsubscribe {pattern!r}", result))
            else:
                out.append(None)
                done.append(pattern)
        if done:
            self._withdrawn(namespace, done)
        return out

    def _withdrawn(self, namespace: int, patterns: list[str]) -> None:
        """``patterns`` were unsubscribed at the appliance: the client's list follows, and
        the subscriptions it no longer covers end."""
        with self._lock:
            lst = self._lists.setdefault(namespace, SubscriptionList())
            for pattern in patterns:
                lst.unsubscribe(pattern)
            live = set(lst.positive_patterns())
            wild = [p for p in live if is_pattern(p)]
            keep = []
            for sub in self._subs:
                if sub.namespace != namespace or sub.pattern in live:
                    keep.append(sub)
                    continue
                # a plain pattern overlaps only a wildcard one or itself: the plain live
                # patterns need no look (thousands of connections at an edge, each its own)
                around = wild if not is_pattern(sub.pattern) else live
                if any(matches_or_includes(p, sub.pattern) for p in around):
                    keep.append(sub)
                else:
                    sub._close()
            self._subs = keep
            self._subs_changed()

    def _subs_changed(self, added: list[Subscription] | None = None) -> None:
        """The live subscriptions changed (under ``_lock``): routes are computed afresh;
        ``added``: only these were appended (indexed as they come), else the index is made
        again."""
        self._route_cache = {}
        self._own_left_out = set()
        if added is None:
            self._routes = Routes(self._subs)
            self._flow_subs = [sub for sub in self._subs if sub.flow_policy is not None]
        else:
            self._routes.add(added)
            flow = [sub for sub in added if sub.flow_policy is not None]
            if flow:  # (a new list: the client thread may be reading the old one)
                self._flow_subs = self._flow_subs + flow
        self._subs_version += 1
        self._has_push = any(not sub.poll_mode for sub in self._subs)

    def poll(self, handler: Callable[[PollView], Any], limit: int = POLL_LIMIT, *,
             timeout_s: float = 0.0) -> int:
        """Hand up to ``limit`` received messages of this client's poll subscriptions
        (``subscribe(..., poll=True)``) to ``handler``, in the order received, each once
        (one matching several poll subscriptions too), and return how many. ``handler(view)``
        gets the same ``PollView`` each time, pointed at the next message: no object and no
        payload copy per message. The view (and its ``payload`` memoryview) is valid only
        during that call: copy what you keep. ``timeout_s``: with nothing received, wait up
        to that long for a frame (0: return 0 at once, as Aeron's poll does). An exception
        from ``handler`` propagates; the message it was given counts as handed over.
        appliance/client/polling.py."""
        if not callable(handler):
            raise ClientError(f"poll takes a handler (a callable taking a PollView), not "
                              f"{type(handler).__name__}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not \
                1 <= limit <= POLL_LIMIT_MAX:
            raise ClientError(f"poll: limit is a number of messages from 1 to "
                              f"{POLL_LIMIT_MAX}, not {limit!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not \
                0 <= timeout_s <= SESSION_TIMEOUT_MAX_S:
            raise ClientError(f"poll: timeout_s is seconds from 0 to {SESSION_TIMEOUT_MAX_S:g}, "
                              f"not {timeout_s!r}")
        queue = self._pollq
        if queue is None:
            raise ClientError("poll: this client has no poll subscription; make one with "
                              "subscribe(pattern, poll=True)")
        if self.closed and not queue.frames and queue.i >= queue.n:
            raise ClientError("poll on a closed client with nothing left to hand over")
        return queue.poll(handler, limit, float(timeout_s))

    def poll_counters(self) -> dict[str, int]:
        """What ``poll`` handed over and what it could not: ``polled``, ``queued_frames``,
        ``queued_bytes``, ``dropped_frames``/``dropped_messages`` (the queue was full),
        ``unresolved`` (topic key never resolved), ``malformed``."""
        queue = self._pollq
        if queue is None:
            return {"polled": 0, "queued_frames": 0, "queued_bytes": 0, "dropped_frames": 0,
                    "dropped_messages": 0, "unresolved": 0, "malformed": 0}
        return queue.counters()

    def replay(self, pattern: str, *, from_time_ns: int | None = None,
               from_sequence: int | None = None, namespace: int = 0,
               then_live: bool = False) -> Iterator[Message]:
        """The messages the appliance's cache keeps on topics matching ``pattern``, in the
        order it kept them, as ``Message`` objects (``cache_seq`` set): from the first
        published at or after ``from_time_ns`` (wall-clock ns), or from cache sequence
        ``from_sequence``, or from the oldest kept. A generator: pages are asked for as it
        is consumed (appliance/client/replay.py). ``EntitlementError`` when P&M does not
        let the identity subscribe to ``pattern``; ``ClientError`` when the appliance has
        no cache or none for ``pattern``. ``then_live``: after the kept messages, the live
        ones, each publisher's once and without a gap (a best-effort subscription made
        first; ``ReplayThenLive`` says how they are joined)."""
        from appliance.client.replay import replay

        return replay(self, pattern, from_time_ns, from_sequence, namespace, then_live)

    def delete_durable(self, name: str) -> bool:
        """End the durable subscription ``name`` of this identity at the appliance (its
        place is forgotten); True when it existed. A subscription of that name open in this
        client stops first."""
        from appliance.client.durable import delete_durable

        self._check_usable()
        for sub in [s for s in self._durables if s.durable == name]:
            self._end_durable(sub)
        return delete_durable(self, name)

    def _end_durable(self, sub: Subscription) -> None:
        sub._fetcher.close()
        with self._lock:
            if sub in self._durables:
                self._durables.remove(sub)
        sub._close()

    def unsubscribe(self, pattern: str, *, namespace: int = 0) -> None:
        """Seed 000 unsubscribe: withdraws ``pattern`` and what it includes; narrower than a
        subscription, it is a partial unsubscribe."""
        self._check_usable()
        check_pattern(pattern)
        check_int("namespace", namespace, MAX_NAMESPACE)
        sub_id = next(self._sub_ids)
        result = self._request(("unsubscribe", sub_id), lambda: self._admin(
            fl.FrameType.UNSUBSCRIBE, [al.Subscription(sub_id, namespace, 0, 0, pattern)]))
        if not result.get("accepted"):
            raise _refusal(f"unsubscribe {pattern!r}", result)
        self._withdrawn(namespace, [pattern])

    # --- receiving (the client thread) ---------------------------------------------------------
    def _on_frame(self, data: memoryview, now_ns: int, login_only: bool = False) -> None:
        """A frame the batch decoder did not take; ``login_only``: an unverified CONTROL
        frame (``check_down_frames``), read only for the answer to a waiting login."""
        try:
            frame = decode_frame(data)
        except ProtocolError:
            self.malformed = getattr(self, "malformed", 0) + 1
            return
        h = frame.header
        if h.stream_id == REPLAY_STREAM_ID and h.frame_type is fl.FrameType.DATA:
            take_frame(self, data)
            return
        if frame.is_message_frame:
            view = MessageView()
            topics = self._topics
            for m in frame.messages(view):
                key = m.topic_key
                known = topics.get(key)
                region, headers, schema, parts = m.payload, NO_HEADERS, m.schema_id, 1
                if m.flags & EXTENSION_FLAGS:
                    split = self._split_extensions(region, m.flags,
                                                   (h.source_session, h.stream_id, key), schema)
                    if split is None:
                        continue
                    region, headers, schema, parts = split
                msg = Message("" if known is None else known[1], bytes(region), key,
                              m.sequence, m.publish_ts_ns, m.namespace_id, schema, m.qos,
                              h.source_session, h.stream_id, now_ns, headers=headers,
                              segments=parts)
                self.received += 1
                if known is None:
                    self._pending.setdefault(key, []).append(msg)
                else:
                    self._dispatch(msg)
            return
        _, entries = frame.admin()
        if h.frame_type is fl.FrameType.CONTROL:
            from appliance.control.documents import DocumentError, validate

            for entry in entries:
                if login_only and entry.kind is not al.ControlKind.LOGIN_RESULT:
                    self._refused_unverified += 1
                    continue
                try:  # nothing is read from a document its schema did not accept
                    doc = validate(entry.kind, entry.document, "appliance")
                except DocumentError:
                    self.malformed = getattr(self, "malformed", 0) + 1
                    continue
                if login_only:
                    if not self._answer(("login",), doc):
                        self._refused_unverified += 1
                elif entry.kind is al.ControlKind.LOGIN_RESULT:
                    if not self._answer(("login",), doc):
                        self._on_login_answer(doc)
                elif entry.kind is al.ControlKind.REQUEST_RESULT:
                    request = doc.get("request")
                    if request == "register":
                        self._answer(("register", doc.get("namespace", 0), doc.get("topic")),
                                     doc)
                    else:
                        self._answer((request, doc.get("sub_id")), doc)
                elif entry.kind is al.ControlKind.LOGOUT:
                    self._on_logout(str(doc.get("reason", "logged out")),
                                    move=bool(doc.get("move")))
                elif entry.kind is al.ControlKind.REPLAY_RESULT:
                    self._answer(("replay", doc["id"]), doc)
                elif entry.kind is al.ControlKind.POLICY_DROPS:
                    self._on_policy_drops(doc)
                elif entry.kind is al.ControlKind.SUCCESSOR:
                    self._on_successor(doc)
        elif h.frame_type is fl.FrameType.REGISTRY_UPDATE:
            for entry in entries:
                self._topics[entry.topic_key] = (entry.namespace_id, entry.topic)
                drops = self._unnamed_drops.pop(entry.topic_key, None)
                if drops:
                    self._count_drops((entry.namespace_id, entry.topic), drops)
                self._poll_unknown.pop(entry.topic_key, None)
                for msg in self._pending.pop(entry.topic_key, []):
                    self._dispatch(replace(msg, topic=entry.topic))
            if self._held:
                self._release_held()


    def _split_extensions(self, region: Any, flags: int, stream: Any, schema_id: int
                          ) -> tuple[Any, Any, int, int] | None:
        """(application payload, headers, schema id, segments) of a message with extensions;
        None when they do not parse (dropped, counted in ``malformed_extensions``), or when it
        is a segment that does not complete its message (``stream``: whose segments it is one
        of; the message's schema id is its first segment's)."""
        try:
            payload, headers, seg = split_extensions(region, flags)
        except ExtensionError:
            self.malformed_extensions += 1
            return None
        if seg is not None:
            whole = self.reassembly.add(stream, seg, payload, headers, schema_id,
                                        time.monotonic_ns())
            if whole is None:
                return None
            payload, headers, schema_id = whole
        return (payload, NO_HEADERS if headers is None else Headers(headers), schema_id,
                1 if seg is None else seg[4])

    def _answer(self, key: tuple, doc: dict) -> bool:
        """Give ``doc`` to the request waiting for it; whether one was."""
        with self._lock:
            waiter = self._waiters.get(key)
        if waiter is None:
            return False
        waiter.result = doc
        waiter.event.set()
        return True

    def _targets(self, namespace: int, topic: str, guaranteed: bool = False,
                 poll: bool = False, qos: int | None = None) -> list[Subscription]:
        """The subscriptions a topic goes to (cached until the subscriptions change): of the
        guaranteed ones for a message from a guaranteed stream, else of the others; of the
        poll subscriptions with ``poll``, else of the others. ``qos``: the message's; one of
        the other class than its stream (a guaranteed message on a plain stream, another on
        a reliable one) goes to no ``own_class`` subscription when a subscription of its
        own class matches the topic too (that one gets it)."""
        other = qos is not None and (qos == GUARANTEED_QOS) != guaranteed
        key = (namespace, topic, guaranteed, poll, other)
        subs = self._route_cache.get(key)
        if subs is not None:
            return subs
        with self._lock:  # a miss: compute against a consistent set of subscriptions
            lst = self._lists.get(namespace)
            matching = [] if lst is None or not lst.decides(topic) else \
                self._routes.matching(namespace, topic)
            subs = [sub for sub in matching
                    if (sub.qos == "guaranteed") == guaranteed and sub.poll_mode == poll]
            if other and any(sub.own_class for sub in subs) and any(
                    (sub.qos == "guaranteed") != guaranteed for sub in matching):
                subs = [sub for sub in subs if not sub.own_class]
                self._own_left_out.add(key)
            if len(self._route_cache) >= ROUTE_CACHE_TOPICS:
                self._route_cache.clear()
            self._route_cache[key] = subs
        return subs

    def _on_policy_drops(self, doc: dict) -> None:
        """The appliance's report of messages its flow-control policy dropped: counted per
        policy, on the client and on each subscription matching the key's topic."""
        for key, policy, count in doc["drops"]:
            self.policy_drops[policy] += count
            known = self._topics.get(key)
            if known is None:  # counted on its subscriptions once its topic is known
                if key in self._unnamed_drops or len(self._unnamed_drops) < ROUTE_CACHE_TOPICS:
                    self._unnamed_drops.setdefault(key, Counter())[policy] += count
                    self._pending.setdefault(key, [])
                continue
            self._count_drops(known, {policy: count})

    def _count_drops(self, known: tuple[int, str], drops: Mapping[str, int]) -> None:
        # (flow control applies to best-effort messages: callback, iterator and poll ones)
        for sub in (*self._targets(known[0], known[1]),
                    *self._targets(known[0], known[1], poll=True)):
            with sub._cond:
                sub.policy_drops.update(drops)
                sub._cond.notify_all()

    def _dispatch(self, msg: Message) -> None:
        known = self._topics.get(msg.topic_key)
        if known is not None and known[0] != msg.namespace:  # the key names the namespace,
            msg = replace(msg, namespace=known[0])           # not the publisher's header
        if msg.guaranteed and msg.headers and self._republished.again(msg):
            return  # a QoS 2 publication an edge sent again after its crash
        event = None
        if self._successor_routes:
            self._successor_dispatch(msg)
        targets = self._targets(msg.namespace, msg.topic, msg.guaranteed, qos=msg.qos)
        if self._own_left_out and (msg.qos == GUARANTEED_QOS) != msg.guaranteed and (
                msg.namespace, msg.topic, msg.guaranteed, False, True) in self._own_left_out:
            self.own_class_copies += 1
        alone = len(targets) == 1 and msg.segments == 1  # the appliance's check was its own
        for sub in targets:
            if sub.selector is not None and not (alone and sub.selector_filtered):
                if event is None:
                    event = self._event(msg)
                if not sub.selector.evaluate(event):
                    continue
            sub._put(msg)

    def _event(self, msg: Message) -> dict:
        from nic_offload.selectors import message_event

        header = {"topic_key": msg.topic_key, "sequence": msg.sequence,
                  "publish_ts_ns": msg.publish_ts_ns, "namespace_id": msg.namespace,
                  "schema_id": msg.schema_id, "qos": msg.qos}
        return message_event(msg.payload, self._schemas.get(msg.schema_id), header)

    def _housekeeping(self, now_ns: int) -> int:
        work = 0
        if self._poll_unknown:  # keys poll met and waits for (it stops at their messages)
            for key in list(self._poll_unknown):
                if key in self._topics:
                    self._poll_unknown.pop(key, None)
                else:
                    self._pending.setdefault(key, [])
        if self._pending:
            keys = [k for k, msgs in list(self._pending.items())
                    if now_ns - self._asked.get(k, 0) > RESOLVE_RETRY_NS
                    and (msgs or self._held or k in self._poll_unknown
                         or k in self._unnamed_drops)]
            if keys:
                for k in keys:
                    self._asked[k] = now_ns
                try:
                    self._control(al.ControlKind.RESOLVE, {"keys": keys[:4096]})
                except ClientError:
                    pass
                work += 1
        if self.reassembly.messages_in_progress:
            self.reassembly.expire(time.monotonic_ns())
        if self._open_since_ns > 0:
            # a frame waits for its budget: keep looking (spinning) until it is spent
            self._runner.idle.reset()
        with self._pub_lock:
            if self._open_since_ns > 0 and time.monotonic_ns() - self._open_since_ns >= \
                    CLIENT_BATCH_BUDGET_NS:
                try:
                    self._flush_locked()
                except ClientError:
                    pass  # the connection is gone: the next receive ends the session
                work += 1
        return work

    # --- closing -------------------------------------------------------------------------------
    def close(self) -> int:
        """Send what is open, wait up to ``CLOSE_ACK_TIMEOUT_S`` for the appliance to
        acknowledge every guaranteed message, log out, stop the client's threads, close the
        channel (safe twice). Never raises for unacknowledged messages: it fails their
        outcomes (reason ``session closed``), logs a warning with the count, and returns the
        number of guaranteed messages not acknowledged and not yet reported by ``flush``
        (0 when every one was); call ``flush(timeout=...)`` first to get an exception."""
        if self.closed:
            return self.unacknowledged_at_close
        for sub in list(self._durables):  # their acknowledgements go out before the logout
            self._end_durable(sub)
        self.closed = True
        self._closing.set()
        with self._lock:  # a reconnection attempt waiting for an answer stops waiting
            waiting = [w for w in self._waiters.values() if w.result is None]
        for w in waiting:
            w.event.set()
        reconnector = self._reconnector
        if reconnector is not None and reconnector is not threading.current_thread():
            reconnector.join(RECONNECT_LOGIN_TIMEOUT_S * 4)
        try:
            if self.session and self.state == CONNECTED and not self.channel.closed:
                with self._pub_lock:
                    self._flush_locked()
                with self._lock:
                    if self._gsender is not None:
                        self._gsender.flush(time.monotonic_ns())
                self._outcomes.wait_all(CLOSE_ACK_TIMEOUT_S)
                self._control(al.ControlKind.LOGOUT, {"reason": "client closed"})
        except (TopicwireError, OSError):
            pass  # the connection is gone: what was not acknowledged fails below
        self._outcomes.fail_all(REASON_CLOSED)
        with self._lock:
            held, self._to_resend = self._to_resend, []
        self._outcomes.fail_detached(held, REASON_CLOSED)
        failed = self._outcomes.take_unreported()
        self.unacknowledged_at_close = count = sum(failed.values())
        self.close_failures = dict(failed)
        if count:
            log.warning("client %s: closed with %d guaranteed messages not acknowledged (%s)",
                        self.identity, count, unacknowledged_text(failed, 0, None))
        try:
            self._runner.stop()
        finally:
            for sub in self._subs:
                sub._close()
            with self._lock, self._pub_lock:
                self.channel.close()
            self._wakeup.close()
            if self._owned is not None:
                self._owned.stop()
            if self.state != CLOSED:
                self.state = CLOSED
                self._emit(CLOSED, "client closed", failed=count)
        return count


    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # returns (and logs) the unacknowledged count; see close()


PENDING_LIMIT_KEY = "clients.max_pending_requests"
"""Named by the reason of a (un)subscribe the appliance refused because the session had too
many requests waiting for their answer (appliance/control/clients.py,
``_subscribe_refused``)."""


def _refusal(what: str, result: dict, selector: str | None = None) -> ClientError:
    """The error of a (un)subscribe the appliance refused (``what``: "subscription to 'p'"
    or "unsubscribe 'p'"): ``BusyError`` for its pending requests' limit, ask again later;
    ``SelectorRefusedError`` for a selector; else ``EntitlementError`` for a subscription,
    ``ClientError`` for an unsubscribe."""
    reason = str(result.get("reason"))
    if PENDING_LIMIT_KEY in reason:
        error: type[ClientError] = BusyError
    elif selector and reason.startswith("selectors:"):
        error = SelectorRefusedError
    else:
        error = EntitlementError if what.startswith("subscription") else ClientError
    return error(f"{what} refused: {reason}")


def matches_or_includes(live: str, pattern: str) -> bool:
    from datapath.topics.algebra import includes

    return includes(live, pattern) or includes(pattern, live)


class _ClientAgent:
    name = "client"

    def __init__(self, client: Client) -> None:
        from channels.base import FrameBatch
        from datapath.protocol.batch import new_message_batch

        self.client = client
        self.batch = FrameBatch(64)
        self.messages = new_message_batch(CLIENT_DECODE_MESSAGES)
        self.status = np.zeros(64, np.uint8)
        self.types = np.zeros(64, np.uint8)
        self.verdicts = np.zeros(64, np.int8)
        self._slots = self.batch.offsets.copy()
        """The batch's slot offsets (``_check`` moves the frames it keeps to the front;
        they are put back before the next receive)."""
        self._moved = False
        self._heartbeat_at = 0

    def do_work(self, now_ns: int) -> int:
        client = self.client
        unverified: set[int] = set()
        with client._lock:  # a channel is used by one thread at a time (docs/channels.md)
            if client.channel.closed:  # (asked under the lock: whoever closes it holds it)
                return 0
            # UDP and shared memory send and receive on two threads at once (their scratch
            # state is apart); another channel (RDMA: one completion queue) receives under
            # the publishing lock too (order: _lock, then _pub_lock)
            apart = client.channel.kind in _SEND_RECEIVE_APART
            if not apart:
                client._pub_lock.acquire()
            try:
                n = client.channel.receive(self.batch, 0)
            except ChannelDeviceError as exc:
                if client.channel.failure is None:
                    raise
                # the channel's connection is gone for good (an RDMA peer left): so is the
                # session
                failure: str | None = str(exc)
            else:
                failure = None
                if n:  # (under the lock: a login installs the key)
                    n, unverified = self._check(n)
            finally:
                if not apart:
                    client._pub_lock.release()
        if failure is not None:
            client._lost(f"the connection failed ({failure})")
            return 0
        if n:
            client._heard_ns = now_ns
            if client._subs:  # before the burst is handed over (which may take long): the
                # appliance hears "on" while what it sent still fits this client's socket
                client._rflow.do_work(now_ns, n, self._burst_messages(n))
            self._on_batch(n, time.time_ns(), now_ns, unverified)
        if self._moved:
            self.batch.offsets[:] = self._slots
            self._moved = False
        work = n + client._housekeeping(now_ns) + client._rflow.do_work(now_ns, n)
        if client._greceiver is not None or client._gsender is not None:
            work += client._guaranteed_timers(now_ns)
        work += client._liveness(now_ns)
        # (also while a reconnection makes its subscriptions again on the new session)
        if client.session and client.state in (CONNECTED, RECONNECTING) and \
                now_ns >= self._heartbeat_at:
            self._heartbeat_at = now_ns + CLIENT_HEARTBEAT_INTERVAL_NS
            try:
                client._admin(fl.FrameType.HEARTBEAT, [al.Hello(
                    client.session, 0, CLIENT_HEARTBEAT_INTERVAL_NS // 1_000_000,
                    al.NodeRole.CLIENT, 0, client.identity[:255])])
            except ClientError:
                pass
        return work

    def _burst_messages(self, n: int, first: int = 0) -> int:
        """Messages in frames ``first`` to ``n`` of the burst just received (their headers'
        counts)."""
        buf = self.batch.buf
        at = fl.MSG_COUNT_OFFSET
        return sum(int(buf[o + at]) << 8 | int(buf[o + at + 1])
                   for o in self.batch.offsets[first:n].tolist())

    def _check(self, n: int) -> tuple[int, set[int]]:
        """Check the ``n`` frames received (``check_down_frames``, one call): the refused
        ones are dropped from the batch (counted); (frames left, the indexes of those taken
        unverified: a login's answer only)."""
        client = self.client
        batch = self.batch
        verdicts = self.verdicts
        check_down_frames(batch.buf, batch.offsets, batch.lengths, n, client._down_mode,
                          client._down_login, client._down_ab, client._down_ctl,
                          client._down_window, verdicts)
        v = verdicts[:n]
        refused = v == fm.REFUSED
        if refused.any():
            keep = np.flatnonzero(~refused)
            k = len(keep)
            batch.offsets[:k] = batch.offsets[keep]
            batch.lengths[:k] = batch.lengths[keep]
            batch.peer_ids[:k] = batch.peer_ids[keep]
            v[:k] = v[keep]
            n = k
            self._moved = True
        unverified = set(np.flatnonzero(v[:n] == UNVERIFIED).tolist()) if n else set()
        return n, unverified

    def _on_batch(self, n: int, wall: int, now_ns: int, unverified: set[int] | None = None
                  ) -> None:
        """Message frames through the batch decoder (numba), admin frames one by one; frames
        of guaranteed streams to the reliable receiver (or sender). ``unverified``: CONTROL
        frames read only for a login's answer."""
        from datapath.protocol.batch import decode_frames

        batch = self.batch
        client = self.client
        done = 0
        while done < n:
            end = min(n, done + CLIENT_DISPATCH_FRAMES)
            result = decode_frames(batch.buf, batch.offsets[done:end], batch.lengths[done:end],
                                   self.messages, self.status, self.types)
            frames = max(result.frames, 1)
            reliable: set[int] = set()
            pollq = client._pollq
            for i in range(frames):
                ftype = int(self.types[i])
                if self.status[i] != 0:
                    client.malformed = getattr(client, "malformed", 0) + 1
                    continue
                frame = memoryview(batch.frame(done + i))
                if ftype == _DATA_TYPE or ftype == _RETX_TYPE:
                    stream = _STREAM.unpack_from(frame, fl.STREAM_ID_OFFSET)[0]
                    if stream == REPLAY_STREAM_ID and ftype == _DATA_TYPE:
                        reliable.add(i)  # (not delivered as live messages)
                        take_frame(client, frame)
                    elif stream & RELIABLE_STREAM_BIT:
                        reliable.add(i)
                        if client._greceiver is not None:
                            client._greceiver.on_frame(frame, now_ns, validated=True)
                    elif pollq is not None:  # whole, for poll: no decode, no object
                        pollq.push(frame, wall)
                        if not client._has_push:
                            reliable.add(i)  # (nothing to decode it for here)
                elif ftype in _TO_SENDER_TYPES:
                    client._on_sender_frame(frame, now_ns)
                elif ftype == _LOSS_TYPE:
                    if client._greceiver is not None:
                        client._greceiver.on_frame(frame, now_ns)
                else:
                    client._on_frame(frame, wall, bool(unverified) and done + i in unverified)
            if result.messages:
                self._deliver(done, result.messages, wall, reliable)
            done += frames
            if done < n and client._subs:  # a long burst: the appliance hears in between
                client._rflow.do_work(time.monotonic_ns(), 1, self._burst_messages(n, done))

    def _deliver(self, first: int, count: int, wall: int, skip: set[int]) -> None:
        m = self.messages[:count]
        buf = self.batch.buf
        client = self.client
        topics = client._topics
        offs = self.batch.offsets
        hdr = fl.FRAME_HEADER_STRUCT
        heads: dict[int, tuple[int, int]] = {}
        ext = EXTENSION_FLAGS
        flags = m["flags"]  # (a batch without extensions reads no message's flags)
        flag_list = flags.tolist() if (flags & ext).any() else itertools.repeat(0, count)
        for key, seq, ts, ns, schema, qos, mflags, poff, plen, fi in zip(
                m["topic_key"].tolist(), m["sequence"].tolist(), m["publish_ts_ns"].tolist(),
                m["namespace_id"].tolist(), m["schema_id"].tolist(), m["qos"].tolist(),
                flag_list, m["payload_offset"].tolist(), m["payload_len"].tolist(),
                m["frame_index"].tolist()):
            if fi in skip:
                continue
            ids = heads.get(fi)
            if ids is None:
                fields = hdr.unpack_from(buf, int(offs[first + fi]))
                ids = heads[fi] = (fields[6], fields[8])
            known = topics.get(key)
            if mflags & ext:
                split = client._split_extensions(buf[poff : poff + plen], mflags,
                                                 (ids[0], ids[1], key), schema)
                if split is None:
                    continue
                msg = Message("" if known is None else known[1], bytes(split[0]), key, seq,
                              ts, ns, split[2], qos, ids[0], ids[1], wall, headers=split[1],
                              segments=split[3])
            else:
                msg = Message("" if known is None else known[1],
                              buf[poff : poff + plen].tobytes(), key, seq, ts, ns, schema, qos,
                              ids[0], ids[1], wall)
            client.received += 1
            if known is None:
                client._pending.setdefault(key, []).append(msg)
            else:
                client._dispatch(msg)

    def on_close(self) -> None:
        return None


def connect(url: str, identity: str = "anonymous", *,
            timeout_s: float = REQUEST_TIMEOUT_S, idle: str = "block",
            rdma_device: str | None = None, rdma_gid_index: int | None = None,
            rdma_bind: str | None = None,
            on_state: Callable[[StateChange], None] | None = None,
            session_timeout_s: float = SESSION_TIMEOUT_S,
            reconnect_s: float = RECONNECT_S, resend: bool = False,
            password: str | bytes | None = None, standby: str | None = None,
            move_on: MoveBounds | None = None, client_id: str | None = None,
            republish_window: int = REPUBLISH_WINDOW,
            _trusted: str | None = None) -> Client:
    """Log in to an appliance: ``shm://RING``, ``udp://HOST:PORT``, ``rdma://HOST:PORT`` or
    ``embedded:``. For ``rdma://``, ``rdma_bind`` (this host's address on its RDMA device),
    ``rdma_device`` and ``rdma_gid_index`` pick the device and GID (default: the address the
    kernel would send from to HOST).

    ``on_state(change)`` is called with each ``StateChange`` of the connection (``lost``,
    ``reconnecting``, ``reconnected``, ``closed``); ``session_timeout_s``: silence from the
    appliance after which the connection is lost; ``reconnect_s``: how long the client then
    tries to connect again (0: never; it closes); ``resend``: send the guaranteed messages
    the lost session did not acknowledge again on the new one (at least once: some may arrive
    twice) instead of failing their outcomes. docs/appliance.md, "Connection states".
    ``password``: the identity's password, when P&M gives it one; it is never sent: the login
    proves it (docs/security.md, "Client credentials").

    ``standby``: a second appliance's address. The client logs in to the primary (to the
    standby when the primary does not take the login); when the connection is lost it
    tries the other one first, then alternates, and moves its session there: logs in,
    registers its topics and makes its subscriptions again (docs/fault-tolerance.md,
    "Session failover").

    ``move_on``: a ``MoveBounds`` (needs ``standby``): the session also moves when its
    measured round trip to its appliance (latency, jitter) or the share of its probes left
    unanswered (loss) stays above a bound over a window, e.g.
    ``MoveBounds(latency_ms=100, window_s=5)``; without it only silence, a logout or a
    refusal moves it (appliance/client/pathwatch.py).

    ``client_id``: a name of this client that outlives its sessions (1..64 printable
    characters), for successor delivery (``announce_successor``, ``set_successor``): a
    login with the client id of a session still held replaces that session.

    ``republish_window``: the MQTT QoS 2 publications (by their publishing edge's number)
    the client remembers, to drop a copy an edge publishes again after its crash (0: off;
    appliance/client/exactly_once.py)."""

    if not isinstance(url, str):
        raise ClientError(f"connect takes the appliance's address as a string (shm://RING, "
                          f"udp://HOST:PORT, HOST:PORT, rdma://HOST:PORT or embedded:), not "
                          f"{type(url).__name__}")
    check_identity(identity)
    check_int("republish_window", republish_window, MAX_REPUBLISH_WINDOW)
    if "://" not in url and not url.startswith("embedded:"):
        url = f"udp://{url}"  # HOST:PORT, as the command line takes it
    if on_state is not None and not callable(on_state):
        raise ClientError(f"on_state must be a callable taking a StateChange, not "
                          f"{type(on_state).__name__}")
    _seconds("session_timeout_s", session_timeout_s, SESSION_TIMEOUT_MIN_S,
             SESSION_TIMEOUT_MAX_S)
    _seconds("reconnect_s", reconnect_s, SESSION_TIMEOUT_MIN_S, RECONNECT_MAX_S, zero=True)
    if move_on is not None:
        if not isinstance(move_on, MoveBounds):
            raise ClientError(f"move_on takes a MoveBounds(latency_ms=..., jitter_ms=..., "
                              f"loss_ratio=..., window_s=...), not {type(move_on).__name__}")
        if standby is None:
            raise ClientError("move_on needs a standby: the session moves there when a "
                              "bound is exceeded")
    if standby is not None:
        if not isinstance(standby, str) or not standby:
            raise ClientError(f"standby: an appliance address as a string, not {standby!r}")
        if "://" not in standby:
            standby = f"udp://{standby}"
        if url.startswith("embedded:") or standby.startswith("embedded:"):
            raise ClientError("an embedded appliance has no standby: give the primary's and "
                              "the standby's addresses (udp://, shm://, rdma://)")
        if standby == url:
            raise ClientError(f"the standby {standby!r} is the primary itself: give another "
                              "appliance")
    session = dict(timeout_s=timeout_s, idle=idle, on_state=on_state,
                   session_timeout_s=session_timeout_s, reconnect_s=reconnect_s,
                   resend=resend, password=password, trusted=_trusted, move_on=move_on,
                   client_id=client_id, republish_window=republish_window)
    if not url.startswith("embedded:"):
        rdma = dict(device=rdma_device, gid_index=rdma_gid_index, bind=rdma_bind,
                    timeout_s=timeout_s)
        targets = [Target(url, *_opener(url, rdma))]
        if standby is not None:
            targets.append(Target(standby, *_opener(standby, rdma)))
        for index, target in enumerate(targets):
            try:
                channel, ring = target.open()
                return Client(channel, identity, ring=ring, targets=targets,
                              target_index=index, **session)
            except TopicwireError as exc:  # the primary does not answer: the standby
                if index == len(targets) - 1:
                    raise
                log.warning("client %s: the primary %s did not take the login (%s): trying "
                            "the standby %s", identity, url, exc, standby)
    if url.startswith("embedded:"):
        from appliance.config import parse_config
        from appliance.node import Appliance

        name = f"embedded-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        config = parse_config({"appliance": {"name": name},
                               "clients": {"shm": name},
                               # its own process's clients only (a private ring): no passwords
                               "pm": {"anonymous": True, "require_passwords": False}})
        appliance = Appliance(config).start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client = connect(f"shm://{name}", identity, timeout_s=timeout_s, idle=idle,
                                 on_state=on_state, session_timeout_s=session_timeout_s,
                                 reconnect_s=reconnect_s, resend=resend, password=password,
                                 republish_window=republish_window)
                client._owned = appliance
                return client
            except ClientError:
                if time.monotonic() > deadline:
                    appliance.stop()
                    raise
                time.sleep(0.05)
    raise ClientError(f"cannot connect to {url!r}: give shm://RING, udp://HOST:PORT (or "
                      "HOST:PORT), rdma://HOST:PORT or embedded:")


@dataclass(frozen=True)
class Target:
    """An appliance a client may be connected to (the primary, the standby) and how to make
    a channel to it."""

    url: str
    open: Callable[[], tuple[Any, str | None]]
    """A new channel to it and the reply ring (shared memory), else None."""
    reopen: bool
    """A reconnection to it needs a new channel (shared memory, RDMA: a restarted
    appliance's bus or queue pair is new); a UDP socket serves a restarted appliance."""


def _compiled_selector(selector: str | None) -> Any:
    """A subscription's selector compiled (None without one); ClientError when too long,
    SelectorSyntaxError when it does not parse."""
    if not selector:
        return None
    from nic_offload.selectors import compile_selector

    if len(selector.encode("utf-8")) > al.MAX_SELECTOR_BYTES:
        raise ClientError(f"the selector has {len(selector.encode('utf-8'))} UTF-8 "
                          f"bytes, at most {al.MAX_SELECTOR_BYTES}; shorten it")
    return compile_selector(selector)


def _opener(url: str, rdma: dict) -> tuple[Callable[[], tuple[Any, str | None]], bool]:
    """(open, reopen) of ``Target`` for ``url``; ClientError for an address it cannot use."""
    from channels.shm import ShmChannel
    from channels.udp import UdpChannel

    if url.startswith(RDMA_SCHEME):
        from appliance.client.rdma import open_rdma_channel

        def open_rdma() -> tuple[Any, str | None]:
            return open_rdma_channel(url, **rdma), None

        return open_rdma, True
    if url.startswith("udp://"):
        from appliance.config import ConfigError, parse_address

        try:
            host, port = parse_address(url[len("udp://"):], "appliance address")
        except ConfigError as exc:
            raise ClientError(str(exc).removeprefix("config: ")) from None
        bind = "127.0.0.1" if host.startswith("127.") else "0.0.0.0"

        def open_udp() -> tuple[Any, str | None]:
            # connected: the kernel takes datagrams from the appliance's address only, so no
            # other local process can pose as the appliance (a LOGOUT, a delivery)
            return UdpChannel((bind, 0), dest=(host, port), connect=True,
                              name=f"client:{host}:{port}"), None

        return open_udp, False
    if url.startswith("shm://"):
        bus = url[len("shm://"):]

        def open_shm() -> tuple[Any, str | None]:
            # a restarted appliance makes its bus anew: a new ring and a new producer slot
            ring = f"client-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            channel = ShmChannel(rx=ring, name=f"client:shm:{bus}",
                                 ring_bytes=SHM_RX_RING_BYTES)
            try:
                channel.connect(bus)
            except BaseException:
                channel.close()
                raise
            return channel, ring

        return open_shm, True
    raise ClientError(f"cannot connect to {url!r}: give shm://RING, udp://HOST:PORT (or "
                      "HOST:PORT), rdma://HOST:PORT or embedded:")
