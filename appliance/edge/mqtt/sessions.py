"""An MQTT session apart from its connection: its identity's shared native session, the
subscriptions, the QoS 1/2 deliveries in flight and queued, the QoS 2 publishes awaiting
PUBREL, and how the session ends (expiry, a delayed will).

A clean session (3.1.1 clean session 1, 5.0 Session Expiry Interval 0) ends with its
connection. A persistent one outlives it: while its client is away (``conn`` None) its
filters keep its identity's native subscriptions alive (identities.py: the session holds no
native session of its own), QoS 1/2 messages wait in its queue (at most
``mqtt.max_queued``; beyond, dropped, counted and logged once per absence) and QoS 0 ones are
dropped (counted). A CONNECT with the same client identifier, the same identity and clean
start 0 takes the session up again (session present 1): the deliveries left unacknowledged
are sent again with DUP set (a PUBREL for those past PUBREC), then the queue. An offline
session ends after its expiry interval (at most ``mqtt.max_session_expiry_s``). Without
``mqtt.state_dir`` sessions live in memory only: an edge restart loses them. With it, a
persistent session, its filters, its QoS 1/2 deliveries (queued or unacknowledged) and its
incoming QoS 2 ids awaiting PUBREL are recorded in the state store (store.py) as they change,
and ``restore`` takes them up again as offline sessions when the edge starts.

Messages from the fabric arrive at the identity's shared native session, which hands each
session the filters of its that match (``from_fabric``, on the event loop).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from appliance.client.messages import GUARANTEED_QOS
from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType
from appliance.edge.mqtt.state import Delivery, SubOptions

if TYPE_CHECKING:
    from appliance.edge.mqtt.connection import MqttConnection
    from appliance.edge.mqtt.identities import IdentitySession
    from appliance.edge.mqtt.server import MqttServer

log = logging.getLogger("topicwire.edge.mqtt")

WILL_AT_ONCE_S = 0.001
"""A restored session that expired while the edge was down, with a will still waiting: it
ends this soon after the start, publishing its will."""
_NUMBERS = itertools.count(1)
"""Session numbers on this edge (``mqtt.sender``: identities.py, No Local)."""


class SessionState:
    """See the module docstring."""

    def __init__(self, server: MqttServer, client_id: str, identity: str) -> None:
        self.server = server
        self.cfg = server.cfg
        self.client_id = client_id
        self.identity = identity
        self.number = next(_NUMBERS)
        self.ident: IdentitySession | None = None
        """Its identity's shared native session (identities.py), once joined."""
        self.conn: MqttConnection | None = None
        self.filters: dict[str, SubOptions] = {}
        self.carve_outs: dict[str, int] = {}
        """Partial unsubscribes (seed 000): filter -> its place in the ordered list, taken from
        the same count as ``SubOptions.seq`` (handle_subscribe.py)."""
        self.next_seq = 1
        self.inflight: dict[int, Delivery] = {}
        """Outgoing QoS 1/2 packet id -> its delivery (``awaiting``: the next ack)."""
        self.queued: deque[Delivery] = deque()
        """QoS 1/2 deliveries waiting for a free inflight slot or for the client."""
        self.awaiting_rel: set[int] = set()
        """Incoming QoS 2 packet ids published, awaiting PUBREL."""
        self.expiry_s = 0
        """Session Expiry Interval: how long it outlives its connection (0: it does not)."""
        self.will: codec.Will | None = None
        """A will waiting for its delay (5.0 Will Delay Interval) while the client is away."""
        self.will_due = 0.0
        """When it is due (wall clock; recorded with the session, store.py)."""
        self.offline_at: float | None = None
        """When its client went away (wall clock), None while connected."""
        self.ended = False
        self.stored = False
        """Recorded in the state store (store.py): a persistent session with ``state_dir``."""
        self.restored_origins: set[int] = set()
        """Restored: the publishes its recorded deliveries came from (store.StoredSession);
        the same publish sent again at start is not delivered twice."""
        self._unrecorded: set[int] = set()
        """Packet ids of QoS 2 deliveries waiting for their record's sync (_send_new)."""
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._ids = itertools.cycle(range(1, 65_536))
        self._drop_logged = False

    def count(self, name: str, n: int = 1) -> None:
        self.server.count(name, n)

    @property
    def native(self) -> Any:
        """The identity's shared native client (None before the login, after the end)."""
        return None if self.ident is None else self.ident.native

    async def join(self) -> None:
        """Join the identity's shared native session (logging it in when it is the first);
        raises the login's ``ClientError``, the session then holds none."""
        server = self.server
        ident = server.identities.get(self.identity)
        if ident is None or ident.closing:
            from appliance.edge.mqtt.identities import IdentitySession

            ident = server.identities[self.identity] = IdentitySession(server, self.identity)
        ident.members.add(self)
        self.ident = ident
        try:
            await ident.ready()
        except BaseException:
            self.ident = None
            ident.members.discard(self)
            if not ident.members:
                await ident.close()
            raise

    def no_local_for(self, topic: str) -> bool:
        """A No Local filter of this session matches ``topic`` (its PUBLISH to ``topic`` is
        marked with ``mqtt.sender``: identities.py)."""
        if not self.filters:  # (a publisher's session, mostly)
            return False
        from appliance.edge.mqtt.topics import mqtt_matches

        return any(o.no_local and mqtt_matches(o.match, topic) for o in self.filters.values())

    # --- towards the client --------------------------------------------------------------------
    def window(self) -> int:
        """QoS 1/2 deliveries that may be in flight now (0 while the client is away or its
        connection is closing, from either side: they wait in the queue for the next one,
        instead of being written to a socket that is gone)."""
        conn = self.conn
        if conn is None or conn.closing or conn.writer.is_closing():
            return 0
        return min(self.cfg.max_inflight, conn.client_receive_maximum)

    def deliver(self, d: Delivery) -> None:
        """Send ``d`` at its QoS: QoS 0 now or never; QoS 1/2 in a free inflight slot, else
        queued (offline too), else dropped and counted."""
        if self.ended:
            return
        if d.meta is not None and d.meta.expired(time.monotonic()):
            self.count("deliveries_dropped_expired")
            return
        conn = self.conn
        if conn is None and self.server.successors.route(self, d):
            return  # its client dropped: to its successor (successor.py)
        if d.qos == 0:
            if conn is None or conn.closing:
                self.count("deliveries_dropped_offline_qos0")
            elif conn.send_publish(d, 0, False):
                self.count("messages_out")
            return
        if len(self.inflight) >= self.window():
            if len(self.queued) >= self.cfg.max_queued:
                self.count("deliveries_dropped_queue_full")
                if not self._drop_logged:
                    self._drop_logged = True
                    log.warning("mqtt: session %r: queue full (%d); QoS 1/2 messages dropped",
                                self.client_id, self.cfg.max_queued)
                return
            self.queued.append(d)
            self.count("deliveries_queued")
            if self.stored:
                self.server.store.kept(self, d)
            return
        self._send_new(d)

    def _send_new(self, d: Delivery) -> None:
        packet_id = next(self._ids)
        while packet_id in self.inflight:
            packet_id = next(self._ids)
        assert self.conn is not None
        if d.qos == 2 and self.stored:
            # exactly once across a crash: the client gets it only once its record (and
            # the publish number in it) is on disk, so a copy published again after a
            # restart finds it (exactly_once.py)
            d.awaiting = "pubrec"
            self.inflight[packet_id] = d
            self._unrecorded.add(packet_id)
            self.server.store.sent(self, packet_id, d,
                                   lambda ok: self._send_recorded(packet_id, d))
            return
        if self.conn.send_publish(d, packet_id, False):
            d.awaiting = "puback" if d.qos == 1 else "pubrec"
            self.inflight[packet_id] = d
            self.count("messages_out")
            if self.stored:
                self.server.store.sent(self, packet_id, d)
        else:
            self.forget(d)

    def _send_recorded(self, packet_id: int, d: Delivery) -> None:
        """A QoS 2 delivery's record is on disk (or could not be written: counted by the
        store; sent all the same): to the client, unless it left meanwhile (its connection
        gone: sent with the others when the client is back, ``attach``)."""
        self._unrecorded.discard(packet_id)
        conn = self.conn
        if self.inflight.get(packet_id) is not d or conn is None or conn.closing:
            return
        if conn.send_publish(d, packet_id, False):
            self.count("messages_out")
        else:
            del self.inflight[packet_id]
            self.forget(d)
            self.drain()

    def forget(self, d: Delivery) -> None:
        """``d`` left this session (its flow ended, dropped, handed to another): its record
        in the state store goes."""
        if d.stored and self.server.store is not None:
            self.server.store.done(self, d)

    def release(self, packet_id: int) -> None:
        """An outgoing QoS 1/2 flow ended: its slot takes the next queued delivery."""
        self.forget(self.inflight.pop(packet_id))
        self.drain()

    def drain(self) -> None:
        """Fill free inflight slots from the queue (expired messages dropped)."""
        while self.queued and len(self.inflight) < self.window():
            d = self.queued.popleft()
            if d.meta is not None and d.meta.expired(time.monotonic()):
                self.count("deliveries_dropped_expired")
                self.forget(d)
                continue
            self._send_new(d)

    # --- the connection comes and goes ---------------------------------------------------------
    def attach(self, conn: MqttConnection, connack: bytes) -> None:
        """``conn`` takes this session (a new one, or a persistent one taken up again) and
        sends its ``connack``; then unacknowledged deliveries go again (DUP), then the
        queue."""
        self.conn = conn
        self.offline_at = None
        self.will = None  # the client is back before its will's delay ran out
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._drop_logged = False
        conn.send(connack)
        if any(o.group is not None for o in self.filters.values()):
            self.server.shared_router.changed()  # (a member connected again)
        for packet_id, d in list(self.inflight.items()):
            if packet_id in self._unrecorded:
                continue  # sent once its record is on disk (_send_recorded)
            if d.awaiting == "pubcomp":
                conn.send(codec.encode_ack(PacketType.PUBREL, packet_id, conn.version))
            elif d.meta is not None and d.meta.expired(time.monotonic()):
                del self.inflight[packet_id]
                self.count("deliveries_dropped_expired")
                self.forget(d)
            elif conn.send_publish(d, packet_id, True):
                self.count("redeliveries")
            elif not conn.closing:  # larger than this connection's Maximum Packet Size
                del self.inflight[packet_id]
                self.forget(d)
        self.drain()
        self.server.successors.on_attach(self)

    async def detach(self, will: codec.Will | None, improper: bool = False) -> None:
        """The connection ended: the session goes offline (persistent, and room for it) or
        ends. ``will``: to publish now, or after its delay while offline. ``improper``: the
        socket dropped or the keep-alive expired (an ancestor's clean session is then held
        for its successor, at most ``mqtt.max_session_expiry_s``: successor.py)."""
        self.conn = None
        self.offline_at = time.time()
        self.server.shared_router.take_back(self)
        if self.server.successors.on_detach(self, improper) and not self.expiry_s:
            self.expiry_s = self.cfg.max_session_expiry_s
        delay = 0
        if will is not None:
            delay = int(codec.prop(will.props, "will_delay_interval", 0))  # type: ignore[arg-type]
        if self.expiry_s and not self.ended:
            if self.server.offline_sessions() > self.cfg.max_offline_sessions:
                self.count("sessions_dropped_offline_limit")
                log.warning("mqtt: session %r ended: %d offline sessions kept at most "
                            "(mqtt.max_offline_sessions)", self.client_id,
                            self.cfg.max_offline_sessions)
            else:
                self.count("sessions_offline")
                loop, spawn = self.server.loop, self.server.spawn
                self._timers["expiry"] = loop.call_later(
                    self.expiry_s, lambda: spawn(self.end("expired")))
                if will is not None and delay:
                    self.will = will
                    self.will_due = time.time() + min(delay, self.expiry_s)
                    self._timers["will"] = loop.call_later(
                        min(delay, self.expiry_s), lambda: spawn(self._will_due()))
                if self.stored:  # (not a clean session held for its successor)
                    self.server.store.save_session(self)
                if will is not None and not delay:
                    await self.publish_will(will)
                return
        if will is not None:
            await self.publish_will(will)
        await self.end("closed")

    async def _will_due(self) -> None:
        will, self.will = self.will, None
        if will is not None and self.conn is None and not self.ended:
            if self.stored:  # (published: not recorded any more)
                self.server.store.save_session(self)
            await self.publish_will(will)

    async def publish_will(self, will: codec.Will) -> None:
        from appliance.edge.mqtt.handle_publish import into_fabric
        from appliance.edge.mqtt.state import Closed

        try:
            if await into_fabric(self, will.topic, will.payload, will.qos, will.retain,
                                 will.props) == 0:
                self.count("wills_published")
        except Closed:
            self.count("wills_failed")

    async def end(self, why: str) -> None:
        """The session ends (its connection closed without persistence, expiry, a clean
        start, a takeover by another identity, the edge's stop): a will still waiting is
        published, the native session logs out. Safe twice."""
        if self.ended:
            return
        self.ended = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self.count("sessions_ended_" + why)
        server = self.server
        if server.store is not None and why != "shutdown":  # (a stop keeps it recorded)
            server.store.forget_session(self)
        server.successors.on_end(self, why)
        if server.sessions.get(self.client_id) is self:
            del server.sessions[self.client_id]
        server.shared_router.leave_all(self)
        will, self.will = self.will, None
        if will is not None and why != "shutdown":  # its last publish
            await self.publish_will(will)
        ident, self.ident = self.ident, None
        if ident is not None:
            await ident.leave(self)

    # --- from the fabric ---------------------------------------------------------------------
    def stamp(self) -> int:
        """The next place in the ordered list of filters and carve-outs."""
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def _not_carved_out(self, keys: list[str], topic: str) -> list[str]:
        """``keys`` without the filters that a newer carve-out matching ``topic`` takes the
        topic from (shared subscriptions are not carved)."""
        from appliance.edge.mqtt.topics import mqtt_matches

        newest = max((seq for f, seq in self.carve_outs.items() if mqtt_matches(f, topic)),
                     default=0)
        if not newest:
            return keys
        kept = []
        for key in keys:
            options = self.filters.get(key)
            if options is not None and (options.group is not None or options.seq > newest):
                kept.append(key)
        if not kept:  # (not delivered at all: counted once per message)
            self.count("deliveries_carved_out")
        return kept

    def from_fabric(self, msg: Any, keys: list[str], meta: Any, published_qos: int | None,
                    sender: int, groups: set[str]) -> None:
        """A native message of the identity that matches this session's filters ``keys``
        (identities.py, on the loop). ``sender``: the number of the session of this edge
        that published it (0: another, or unknown), for No Local. ``groups``: the shared
        groups this message was offered to already (each once)."""
        if self.ended:
            return
        if self.carve_outs:
            keys = self._not_carved_out(keys, msg.topic)
        own = sender == self.number
        guaranteed = msg.qos == GUARANTEED_QOS
        qos, rap, sub_ids, my_groups = -1, False, [], []
        for key in keys:
            options = self.filters.get(key)
            if options is None or (own and options.no_local):
                continue
            if options.group is not None:
                my_groups.append(options.group)
                continue
            qos = max(qos, options.qos)
            rap = rap or options.retain_as_published
            if options.sub_id:
                sub_ids.append(options.sub_id)
        if qos < 0 and not my_groups:
            self.count("deliveries_unmatched")  # no-local, or withdrawn
            return
        if meta is not None and meta.expired(time.monotonic()):
            self.count("deliveries_dropped_expired")
            return
        if meta is not None and meta.origin and msg.origin == self.server.node_id and (
                meta.origin in self.restored_origins):
            self.restored_origins.discard(meta.origin)
            self.count("store_duplicates_skipped")
            return
        for group in my_groups:
            if group not in groups:
                groups.add(group)
                self.server.shared_router.offer(group, msg, meta, delivery_qos(
                    guaranteed, published_qos, 2))
        if qos < 0:
            return
        retain = rap and meta is not None and meta.retain
        self.deliver(Delivery(msg.topic, msg.payload, delivery_qos(guaranteed, published_qos,
                                                                   qos), retain, meta,
                              tuple(sub_ids)))


def delivery_qos(guaranteed: bool, published: int | None, granted: int) -> int:
    """The QoS of a delivery: a message published best-effort goes at QoS 0; a guaranteed
    one at min(its MQTT publish QoS, carried in its headers, and the QoS granted), or at
    the QoS granted when it carries none (a native publish)."""
    if not guaranteed:
        return 0
    return granted if published is None else min(published, granted)


async def restore_session(server: MqttServer, stored: Any, now: float) -> SessionState | None:
    """A persistent session read back from the state store (store.StoredSession) as an
    offline session: its native session logged in and subscribed again, its deliveries
    queued (those sent before in flight again, with their packet ids: sent again with DUP
    when its client comes back), its QoS 2 ids awaiting PUBREL, a will waiting for its delay
    (due when it was; at once when that passed while the edge was down), its expiry counted
    from its recorded disconnect (from now when it was connected at the stop; a session that
    expired meanwhile with a will waiting ends at once, publishing it). None: expired, beyond
    ``max_offline_sessions``, or its identity may no longer log in (its records are
    deleted)."""
    from appliance.client.errors import ClientError, EntitlementError

    store = server.store
    state = SessionState(server, stored.client_id, stored.identity)
    state.expiry_s = min(stored.expiry_s, server.cfg.max_session_expiry_s)
    state.stored = True
    left = state.expiry_s - max(0.0, now - stored.offline_since) if (
        stored.offline_since is not None) else state.expiry_s
    if left <= 0 and stored.will is not None:  # its end publishes the will: at once
        left = WILL_AT_ONCE_S
    if left <= 0 or server.offline_sessions() >= server.cfg.max_offline_sessions:
        server.count("store_sessions_expired" if left <= 0 else
                     "sessions_dropped_offline_limit")
        store.forget_session(state)
        return None
    try:
        await state.join()
    except ClientError as exc:
        log.warning("mqtt: stored session %r not restored: login as %r: %s",
                    stored.client_id, stored.identity, exc)
        server.count("store_sessions_refused")
        store.forget_session(state)
        return None
    for key, opts in stored.filters.items():
        try:
            await state.ident.hold(state, key, opts.match)  # type: ignore[union-attr]
        except (EntitlementError, ClientError):
            server.count("store_filters_refused")
            continue
        state.filters[key] = opts
        if opts.group is not None:
            server.shared_router.join(opts.group, state)
    state.carve_outs = dict(stored.carve_outs)
    state.next_seq = 1 + max((*state.carve_outs.values(),
                              *(o.seq for o in state.filters.values())), default=0)
    limit = server.cfg.max_queued + server.cfg.max_inflight
    for seq, d, sent in stored.deliveries:
        d.stored = seq
        if len(state.inflight) + len(state.queued) >= limit:  # (the bounds may have shrunk)
            server.count("deliveries_dropped_queue_full")
            store.done(state, d)
        elif sent is not None and sent[0] not in state.inflight:
            d.awaiting = sent[1]
            state.inflight[sent[0]] = d
        else:
            state.queued.append(d)
    state.awaiting_rel = set(stored.awaiting_rel)
    state.restored_origins = stored.origins
    server.sessions[state.client_id] = state
    server.count("store_sessions_restored")
    server.count("store_deliveries_restored", len(state.inflight) + len(state.queued))
    state._timers["expiry"] = server.loop.call_later(
        left, lambda: server.spawn(state.end("expired")))
    state.offline_at = stored.offline_since if stored.offline_since is not None else now
    if stored.will is not None:  # a will waiting for its delay: due when it was
        state.will, state.will_due = stored.will
        state._timers["will"] = server.loop.call_later(
            max(0.0, min(state.will_due - now, left)), lambda: server.spawn(state._will_due()))
    store.save_session(state)
    return state
