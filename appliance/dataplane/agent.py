"""The data-path agent: channels -> classify -> software NIC -> per-destination frames -> channels.

One ``DataPlaneAgent`` owns the channels, the ``SoftNic`` and the forwarding tables; it runs
on its own thread under an ``AgentRunner``. Each duty cycle:

1. apply control commands (``CommandQueue``) and send the control agent's admin frames
   (``outbox``);
2. run parked messages again if a new snapshot arrived (their keys may be known now);
3. receive a burst from each channel and classify every frame by its header:
   admin frames go to the control agent (``inbox``, with the channel and peer);
   DATA from a local client session is *ingress* (tables once, per-destination framing);
   DATA for this node from a neighbour is *local delivery* (tables, local clients only);
   DATA for another node is *transit*, forwarded whole by (source, destination) after the
   off-path guard (the sender must be the hop before this node on path(source, destination));
4. run the ingress and local frames through ``SoftNic.process`` and turn its descriptors into
   frames per (egress, source, destination, stream): a destination appliance's frames go to
   the next hop of path(self, destination), a client's to its channel;
5. send everything, take the software NIC's digests off its queue when it made some
   (counted by reason, the latest unknown keys kept for the status) and publish counters
   every ``STATUS_REFRESH_NS`` (every ``STATUS_IDLE_REFRESH_NS`` while no message or command
   comes: an idle appliance's heartbeats do not pay for a status 4 times a second).

Frames for a client carry ``source_session`` = the origin appliance, ``dest_session`` = the
client's session and ``stream_id`` = the publishing session at the origin, so a subscriber
tells publishers apart and checks each one's per-topic sequence numbers.

Guaranteed QoS (appliance/dataplane/guaranteed.py): frames whose ``stream_id`` has
``RELIABLE_STREAM_BIT`` set, and the reliable transport's NAK/ACK/LOSS/FLOW_CONTROL frames,
belong to reliable streams. On the fabric they are forwarded by (source, destination) like
any per-destination frame; at their destination they go to the ``GuaranteedPlane``, whose
receivers hand back the messages in order, which then run through the tables like any
others. Every run of the tables carries a *class*: what arrived on a guaranteed stream goes
only to guaranteed egresses (``gclient``), what arrived plain only to the others; a local
publisher's messages go to both kinds, and to ``gnode`` egresses (destination appliances'
guaranteed interest) over the reliable transport.

Fabric groups (UDP multicast between appliances): a group has a receiving channel
(``group:NAME``, joined) and a send-only channel (``group-tx:NAME``, its own port on the
group's interface). The ingress sends the messages that neighbours on the group want *once*
to the group, as a frame with ``dest_session`` 0 (every member that is a destination at one
hop runs its tables on it; the others find nothing for their clients), instead of one frame
per destination. Such a frame is accepted only from a group peer address that the control
agent has mapped to a neighbour (authenticated HELLOs on the group), only with
``source_session`` equal to that neighbour, and only when this node's path from it is the
direct link. Everything else between neighbours on a group (transit, guaranteed streams,
admin frames) stays unicast to their ``fabric.listen`` addresses.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import replace
from typing import Any

import numpy as np

from appliance.config import (
    AUTH_LOG_INTERVAL_NS,
    CLIENT_MAX_FRAME_BYTES,
    DATAPATH_RECEIVE_FRAMES,
    GUARANTEED_HELD_RETRY_NS,
    GUARANTEED_RETRANSMIT_BUFFER_MESSAGES,
    INBOX_FRAMES,
    OUTBOX_FRAMES,
    PARKED_MESSAGE_TTL_NS,
    RENDEZVOUS_DEDUP_MESSAGES,
    STATUS_REFRESH_NS,
)
from appliance.control import route_apply
from appliance.control.content_routing import AttributeCounts, MessageDedup
from appliance.dataplane import express as _express
from appliance.dataplane.delivery import Delivery
from appliance.dataplane.flow import SessionFlows
from appliance.dataplane.frame_auth import DataAuth, SessionAuth, warm_frame_auth
from appliance.dataplane.guaranteed import (
    LOSS_NOTICE_KEY,
    RELIABILITY_ADMIN_TYPES,
    RELIABLE_STREAM_BIT,
    GuaranteedPlane,
)
from appliance.dataplane.names import CLIENT_SHM, CLIENT_UDP, FABRIC, GROUP_RX, GROUP_TX
from appliance.dataplane.output import Output
from appliance.dataplane.state import (
    _DATA,
    _HEADER,
    _KEY,
    _PROBE,
    _RETX,
    _U32,
    ALL_SELECTORS,
    OWN_PLAIN,
    UNKNOWN_KEYS_KEPT,
    DpSession,
    ForwardingTables,
    _OutQueue,
    log,
)
from channels.base import FrameBatch
from channels.udp import DatagramChannel, peer_id_of
from datapath.agent import POLL_MAX_PARK_NS, AgentWakeup, CommandQueue, WaitSet
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol.admin_layout import SESSION_FLOW_STREAM, FlowPolicy
from nic_offload.model import MAX_EGRESS_PORT
from nic_offload.softnic import SoftNic

_MESSAGE_TYPES = (_DATA, _RETX)
_FLOW = int(fl.FrameType.FLOW_CONTROL)

__all__ = ["CLIENT_SHM", "CLIENT_UDP", "FABRIC", "GROUP_RX", "GROUP_TX", "DataPlaneAgent",
           "DpSession", "ForwardingTables"]


class DataPlaneAgent(Delivery, Output):
    """See the module docstring. Runs on the data-path thread only (except ``offer``s). Its
    methods live in three files by responsibility: this one (state, commands, the duty cycle,
    classification of received bursts, the guaranteed plane's frames), ``delivery.py``
    (``Delivery``: the NIC over a burst, delivery per egress, parked messages) and
    ``output.py`` (``Output``: sending, published counters), which it inherits."""

    name = "dataplane"

    def __init__(self, node_id: int, nic: SoftNic, channels: dict[str, Any], *,
                 fabric_max_frame_bytes: int,
                 parked_ttl_ns: int = PARKED_MESSAGE_TTL_NS,
                 retransmit_buffer_messages: int = GUARANTEED_RETRANSMIT_BUFFER_MESSAGES) -> None:
        self.node_id = node_id
        self.parked_ttl_ns = parked_ttl_ns
        """How long a message whose key the tables do not know yet waits (parked)."""
        self.nic = nic
        self.channels = channels
        self.wakeup = AgentWakeup()
        """Signalled on every offer from the control thread (ends a PollingIdle park)."""
        self.commands = CommandQueue(self.wakeup, self)
        self.inbox: deque[tuple[str, int, bytes]] = deque()
        self.control_wakeup = threading.Event()
        """Set after each frame put in ``inbox`` (the control agent replaces it with the
        event its idle wait watches)."""
        self.outbox: deque[tuple[str, int, bytes]] = deque()
        self.tables = ForwardingTables(node_id)
        """The forwarding tables; their ``ports`` is the agent's own map: the tables' ports
        and the client sessions' ports of ``set_ports``."""
        self.session_ports: dict[int, tuple[str, int]] = {}
        """The client sessions' ports the control agent installed with ``set_ports``."""
        self._client_port: dict[int, int] = {}
        """Session id -> its ("client", session) port in ``tables.ports``."""
        self.own_sessions = 0
        """Sessions with ``own_class`` bits (``set_own_class``): while there are none,
        ``_deliver`` looks at no message's other egresses."""
        self.sessions: dict[int, DpSession] = {}
        self._by_peer: dict[tuple[str, int], DpSession] = {}
        self._peer_of: dict[int, tuple[str, int]] = {}
        """Session id -> the peer it logged in from (its key in ``_by_peer``)."""
        self.sessions_version = 0
        """Changes whenever a session comes or goes (the express path's plan follows it)."""
        self.allowed_version = 0
        """Changes whenever a session's publishable keys grow (the express path's session
        table follows it)."""
        self.counters: Counter[str] = Counter()
        self.flows = SessionFlows(self)
        """Client sessions under flow control (appliance/dataplane/flow.py)."""
        self._rx = {name: FrameBatch(DATAPATH_RECEIVE_FRAMES) for name in channels
                    if not name.startswith(GROUP_TX)}
        self.data_auth = DataAuth(None, 0, 0, node_id, 0)
        """Signs and checks plain DATA frames between appliances (``use_data_auth``)."""
        self.session_auth = SessionAuth(node_id, MAX_EGRESS_PORT + 1, time.time_ns())
        """Checks the frames of client sessions with a key (one per egress port at most),
        and signs the frames sent to them."""
        data_frame_bytes = fabric_max_frame_bytes - fl.AUTH_TRAILER_BYTES  # room to sign
        client_frame_bytes = CLIENT_MAX_FRAME_BYTES - fl.AUTH_TRAILER_BYTES
        self._out = {
            FABRIC: _OutQueue(self._send_udp(FABRIC), data_frame_bytes,
                              slot_bytes=CLIENT_MAX_FRAME_BYTES),
            # (frames built for clients leave room for a session's MAC)
            CLIENT_UDP: _OutQueue(self._send_udp(CLIENT_UDP), client_frame_bytes,
                                  slot_bytes=CLIENT_MAX_FRAME_BYTES),
            CLIENT_SHM: _OutQueue(self._send_shm, client_frame_bytes,
                                  slot_bytes=CLIENT_MAX_FRAME_BYTES),
        }
        self._own_group_senders: dict[str, tuple[int, int]] = {}
        for name, channel in channels.items():
            if name.startswith(GROUP_TX):
                self._out[name] = _OutQueue(self._send_group(name), data_frame_bytes,
                                            slot_bytes=CLIENT_MAX_FRAME_BYTES)
                host, port = channel.local_address
                rx = GROUP_RX + name[len(GROUP_TX):]
                self._own_group_senders[rx] = (peer_id_of(host, 0) >> 16, port)
        self._receivers = self._list_receivers()
        self._out_list = list(self._out.values())
        self.express = _express.Express(self, (CLIENT_UDP, FABRIC, CLIENT_SHM))
        self._load_general_kernels()
        self.acl_classes: dict[int, tuple[str, Any]] = {}
        """Content ACL classes by id: (name, ``AclClass``) (``set_acl_classes``)."""
        self.selector_index: Any = None
        """One ``SelectorIndex`` over (session id, selector text) of every session with
        selector guards (``set_selectors``, changed incrementally), None before the first."""
        self.selector_schemas: dict[int, Any] = {}
        """schema_id -> ``Schema`` of P&M's document, to build a message's selector event."""
        self._selector_texts: dict = {}
        """Session id, or ("n", destination node), -> its selector texts in
        ``selector_index``."""
        self.rdv_keys: dict[int, dict[int, tuple[str, ...]]] = {}
        """Rendezvous mode: destination core -> topic key -> its routing-key texts (an
        event one of which is TRUE for goes to it, its rendezvous core)."""
        self.rdv_regs: dict[int, dict[int, tuple[str, ...]]] = {}
        """Rendezvous mode: destination -> topic key -> the selectors it registered here."""
        self.rdv_uncovered: dict[int, frozenset[int]] = {}
        """Rendezvous mode: destination -> keys its own interest does not cover (sent only
        for its routing keys or its registrations here)."""
        self._counting = False
        self.rdv_dedup = MessageDedup(RENDEZVOUS_DEDUP_MESSAGES)
        """Rendezvous mode: later copies of a message already delivered here are dropped."""
        self.attribute_counts = AttributeCounts()
        """Rendezvous mode: the attributes of the events published here (their selector
        events), shared by the control agent."""
        self.node_selectors: dict[int, dict[int, tuple[str, ...]]] = {}
        """Destination appliance -> topic key -> the selectors behind its interest
        (``set_selectors``): a message none of them takes is not sent towards it."""
        self._acl_log_at = 0
        self._acl_log_lines = 0
        self.digests: Counter[str] = Counter()
        """The software NIC's digests taken off its queue, by reason (``_drain_digests``)."""
        self.unknown_keys: deque[int] = deque(maxlen=UNKNOWN_KEYS_KEPT)
        """The topic keys of the latest UNKNOWN_KEY digests (status: offload.last_unknown_keys)."""
        self.guaranteed = GuaranteedPlane(self, fabric_max_frame_bytes,
                                          retransmit_buffer_messages)
        self.cycle_ns = time.monotonic_ns()
        """When the current (or last) duty cycle started (the control agent's stall check)."""
        self.data_cycle = False
        """Whether the last cycle that did work received messages (``spin_worth``)."""
        self._parked: deque[tuple[tuple, bytes]] = deque()
        self._parked_version = -1
        self._scratch = FrameBatch(DATAPATH_RECEIVE_FRAMES, CLIENT_MAX_FRAME_BYTES)
        self._gscratch = FrameBatch(DATAPATH_RECEIVE_FRAMES, CLIENT_MAX_FRAME_BYTES)
        self._groups: dict[int, tuple[int, ...]] = {}
        self._groups_version = -1
        self._publish_at_ns = 0
        self._active_since_publish = True
        """Whether a message or a command was handled since the last publish (its cadence)."""
        self.published: dict[str, Any] = {"channels": [], "counters": {}, "offload": {}}
        self.closing = False
        self.telemetry: Any = None
        """appliance.ops.telemetry.probe.PathTelemetry when ``[telemetry]`` is configured."""
        self.dedup = route_apply.Deduplicator()
        self._bad_log_at = 0

    def _load_general_kernels(self) -> None:
        """Load (or, with a cold cache, compile) the kernels the general loop calls, before the
        data path runs: a compile on the data-path thread would stall it for seconds (the
        pipeline's kernels are loaded by ``Express``; ``topicwire warm`` fills the cache)."""
        empty = np.zeros(0, np.int64)
        self.nic.switch.current.tables.lookup(np.zeros(1, np.uint64))  # _run_guaranteed
        self.nic.process(np.zeros(fl.FRAME_HEADER_BYTES, np.uint8), empty, empty)  # _run
        warm_frame_auth()  # the frame MAC's kernels: signing, DataAuth.check, SessionAuth

    # --- called from the control thread -------------------------------------------------------
    def offer_admin(self, channel: str, dest: int, frame: bytes | bytearray) -> bool:
        """Queue an admin frame to send; False (counted) when the outbox is full."""
        if len(self.outbox) >= OUTBOX_FRAMES:
            self.counters["outbox_full"] += 1
            return False
        self.outbox.append((channel, dest, bytes(frame)))
        self.wakeup.signal()
        return True

    def command(self, name: str, *args: Any) -> None:
        """Run ``self.name(*args)`` on the data-path thread, in the order offered (the same
        call reaches a data path in a process of its own: appliance/dataplane/process.py)."""
        self.commands.offer((name, args))

    # --- persisted acknowledgements (commands from the cache: [cache] acknowledge) ------------
    def persist_acks(self, identity: str, max_payload_bytes: int) -> None:
        """Hold local publishers' acknowledgements for the cache (``GuaranteedPlane``)."""
        self.guaranteed.persist_acks(identity, max_payload_bytes)

    def cache_ready(self, session_id: int) -> None:
        """The cache's session ``session_id`` is subscribed to its patterns."""
        self.guaranteed.cache_ready(session_id)

    def persisted(self, tokens: list[tuple[int, int]]) -> None:
        """The cache has these local guaranteed messages on disk."""
        self.guaranteed.take_persisted(tokens)

    def persist_remote(self, node: int, name: str) -> None:
        """``[cache] remote``: local publishers' guaranteed messages to ``node`` wait for its
        cache's reports (the control agent, once it knows the neighbour's node id)."""
        self.guaranteed.persist_remote(node, name)

    def remote_ready(self, ready: bool) -> None:
        """That neighbour's cache can take our publishers' messages, or no longer can
        (the control agent: up, and its cache's guaranteed interest known here)."""
        if self.guaranteed.waiter is not None:
            self.guaranteed.waiter.ready = ready

    def remote_gone(self, why: str) -> None:
        """That neighbour stopped: what waited for its reports will not be reported."""
        if self.guaranteed.waiter is not None:
            self.guaranteed.waiter.gone(why)

    def remote_persisted(self, entries: list) -> None:
        """A PERSISTED document of that neighbour (checked by the control agent)."""
        self.guaranteed.take_remote_persisted(entries)

    def unpersisted(self, ranges: list[tuple[int, int, int, str]]) -> None:
        """The cache will never have these local guaranteed messages on disk (dropped or
        lost before it): their publishers' sessions end (``GuaranteedPlane``)."""
        self.guaranteed.take_unpersisted(ranges)

    # --- NAKs served from the cache (appliance/dataplane/cache_naks.py) ------------------------
    def cache_naks(self, identity: str) -> None:
        """Ask the cache whose session logs in as ``identity`` for what senders' buffers no
        longer hold."""
        self.guaranteed.cache_naks.use(identity)

    def cache_nak_answer(self, request_id: int, records: list) -> None:
        """The cache's answer to a request of ``cache_naks``."""
        self.guaranteed.cache_naks.answer(request_id, records, time.monotonic_ns())

    def to_inbox(self, channel: str, data: bytes) -> bool:
        """Hand ``data`` to the control agent as from ``channel`` (False: the inbox is full)."""
        if len(self.inbox) >= INBOX_FRAMES:
            self.counters["inbox_full"] += 1
            return False
        self.inbox.append((channel, 0, data))
        self.control_wakeup.set()
        return True

    def publish_soon(self) -> None:
        """Publish the counters and state at the next cycle, not at the refresh interval."""
        self._publish_at_ns = 0

    def commands_pending(self) -> int:
        """Commands offered and not run yet."""
        return len(self.commands)

    def pending(self) -> int:
        """Commands and admin frames offered and not taken yet (a drain waits for 0)."""
        return len(self.commands) + len(self.outbox)

    def publish_snapshot(self, snapshot: Any) -> None:
        """Forward with ``snapshot`` from the next burst on (``SnapshotSwitch.publish``)."""
        self.nic.switch.publish(snapshot)

    def publish_snapshot_delta(self, entries: Any, changed: dict[str, Any],
                               same: list[str]) -> None:
        """``publish_snapshot`` of the snapshot of ``entries`` whose software-NIC arrays are
        ``changed`` and, for the fields named in ``same``, the current snapshot's (what a
        control plane in another process sends: appliance/dataplane/process.py); an entry
        set or an array may come as a patch of the current one (``snapshot_patch``)."""
        from appliance.dataplane.snapshot_patch import EntriesPatch, resolve
        from nic_offload.snapshot import Snapshot
        from nic_offload.softnic.tables import SoftTables

        snapshot = self.nic.switch.current
        current = snapshot.tables
        if isinstance(entries, EntriesPatch):
            entries = entries.apply(snapshot.entries)
        changed = {name: resolve(sent, getattr(current, name)) for name, sent in changed.items()}
        tables = SoftTables(**{name: getattr(current, name) for name in same}, **changed)
        self.nic.switch.publish(Snapshot(entries, tables))

    def publish_snapshot_rows(self, entries: Any, changed_rows: Any, acl_changed: bool
                              ) -> None:
        """``publish_snapshot`` of the snapshot the control plane made from the current one
        with ``Snapshot.evolve``: ``entries`` (an ``EntriesPatch`` of the current entries)
        differ in the topic_key rows ``changed_rows`` only, and the software NIC's arrays
        are made here from those rows as the control plane made its own (no array crosses
        the link whole, and no one compares whole arrays to find the changes)."""
        # No burst runs now (commands run between them, on this thread): the NIC takes the
        # current snapshot now rather than at its next burst, so that it no longer holds the
        # one before, whose buffers the evolve below patches (nic_offload/buffers.py; held,
        # they would be copied whole instead)
        self.nic.burst_state()
        snapshot = self.nic.switch.current
        entries = entries.apply(snapshot.entries)
        self.nic.switch.publish(snapshot.evolve(entries, changed_rows, acl_changed))

    # --- for the idle strategy (data-path thread) ---------------------------------------------
    def wait_set(self) -> WaitSet:
        """The receiving channels' descriptors (``PollingIdle``); not complete when one of
        them has none (the shared-memory client ring). Timers (guaranteed streams, parked
        messages, telemetry, counters) run within the park time."""
        fds: list[int] = []
        complete = True
        for name in self._rx:
            got = self.channels[name].wait_fds()
            if got is None:
                complete = False
            else:
                fds.extend(got)
        return WaitSet(tuple(fds), complete)

    def wake_at_ns(self, now_ns: int) -> int:
        """When the next duty cycle is due with no frame, command or admin frame arriving
        (those wake the park themselves): in ``POLL_MAX_PARK_NS`` while timers run
        (guaranteed streams, parked messages, telemetry, digests, frames being filled), else
        at the next status publish (an idle data path costs next to nothing)."""
        gp = self.guaranteed
        if (gp.receivers or gp.senders or gp.held or self._parked or self.flows.active
                or self.telemetry is not None or self.nic.pending_digests()
                or any(out.batch.count or out._open for out in self._out_list)):
            return now_ns + POLL_MAX_PARK_NS
        return self._publish_at_ns

    # --- for the guaranteed plane (data-path thread) ------------------------------------------
    def queue_frame(self, channel: str, dest: int, frame: memoryview | bytes) -> None:
        """Queue a whole frame on a channel's out queue (sent at the end of the cycle)."""
        self._out[channel].add_frame(dest, frame)

    def session_at(self, channel: str, peer: int) -> DpSession | None:
        """The client session whose frames come from ``peer`` on ``channel``."""
        return self._by_peer.get((channel, peer))

    # --- commands (run on the data-path thread) -----------------------------------------------
    def set_tables(self, tables: ForwardingTables) -> None:
        """New forwarding tables; the sessions' ports of ``set_ports`` stay (the control
        agent's tables carry the destination appliances' ports only)."""
        ports = {**self.session_ports, **tables.ports}  # (the agent's own: set_ports edits it)
        self.tables = tables = replace(tables, ports=ports)
        self._client_port = {arg: port for port, (what, arg) in ports.items()
                             if what == "client"}
        self.guaranteed.on_tables(tables)

    def set_ports(self, changes: dict[int, tuple[str, int] | None]) -> None:
        """Install or drop client sessions' ports: port -> ("client" or "gclient", session),
        or None when the port is free again. Only these ports' rows of the express plan are
        made again, so a login costs the same whatever the number of sessions."""
        ports, client_port = self.tables.ports, self._client_port
        for port, what in changes.items():
            old = ports.get(port)
            if old is not None and old[0] == "client" and client_port.get(old[1]) == port:
                del client_port[old[1]]
            if what is None:
                self.session_ports.pop(port, None)
                ports.pop(port, None)
            else:
                self.session_ports[port] = ports[port] = what
                if what[0] == "client":
                    client_port[what[1]] = port
        self.express.patch_ports(changes)

    def add_session(self, session: DpSession, peer: tuple[str, int]) -> None:
        if session.channel == CLIENT_SHM and session.tx is None and session.ring is not None:
            from channels.shm import ShmChannel

            try:  # the control agent opened it once to check it: this is the data path's own
                session.tx = ShmChannel(tx=session.ring)
            except Exception as exc:
                self.counters["session_ring_unusable"] += 1
                log.warning("data path: cannot open the reply ring %r of session %d (%s); "
                            "its messages are dropped", session.ring, session.session_id, exc)
        grown = self.session_auth.version
        self.session_auth.attach(session)
        if self.session_auth.version != grown:
            self.express.reset()  # its kernels' arguments hold the smaller arrays
        before = (self.sessions_version, self.allowed_version)
        replaced = self._by_peer.get(peer)
        old = self.sessions.get(session.session_id)
        self.sessions[session.session_id] = session
        if old is not None and old.own_class:
            self._count_own()
        self._by_peer[peer] = session
        self._peer_of[session.session_id] = peer
        self.sessions_version += 1
        port = self._client_port.get(session.session_id)
        self.express.patch_ports(() if port is None else (port,), before[0])
        if replaced is None:  # (else its peer's row changes: the table is built anew)
            self.express.session_added(session, peer, before)

    def remove_session(self, session_id: int) -> None:
        self.flows.forget(session_id)
        self.flows.forget_publisher(session_id)
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        if session.own_class:
            self._count_own()
        before = (self.sessions_version, self.allowed_version)
        self.sessions_version += 1
        peer = self._peer_of.pop(session_id, None)
        if peer is not None and self._by_peer.get(peer) is session:
            del self._by_peer[peer]
            self.express.session_removed(session_id, before)
        port = self._client_port.get(session_id)
        self.express.patch_ports(() if port is None else (port,), before[0])
        self.guaranteed.flush(0)
        if session.auth_slot >= 0 and session.channel == CLIENT_UDP:
            self._out[CLIENT_UDP].flush()  # what is queued for it (a LOGOUT) leaves signed
        self._out[CLIENT_SHM].flush()
        self.session_auth.detach(session)
        self.guaranteed.on_session_removed(session_id)
        if session.tx is not None:
            session.tx.close()

    def replace_channel(self, name: str, channel: Any) -> None:
        """Receive from ``channel`` as ``name`` from now on (a wrapper around the channel, e.g.
        a test's delay injection); run it on the data-path thread (``commands``)."""
        self.channels[name] = channel
        self._receivers = self._list_receivers()

    def _list_receivers(self) -> list[tuple[str, Any, Any, bool]]:
        """(name, receive batch, channel, whether the express path receives from it) of every
        channel the duty cycle receives from."""
        return [(name, batch, channel, name == CLIENT_UDP and isinstance(channel, DatagramChannel))
                for name, batch in self._rx.items()
                for channel in (self.channels[name],)]

    def use_guaranteed_auth(self, auth: Any) -> None:
        """Sign and check the guaranteed plane's frames with ``auth`` (a ``FabricAuth``)."""
        self.guaranteed.use_auth(auth)

    def use_data_auth(self, auth: DataAuth) -> None:
        """Sign and check plain DATA frames between appliances with ``auth`` from now on (a
        command from the control agent, which holds the fabric key)."""
        self.data_auth = auth
        self.express.reset()

    def allow_keys(self, session_id: int, keys: list[int]) -> None:
        session = self.sessions.get(session_id)
        if session is None:
            return
        allowed = session.allowed
        fresh = [key for key in dict.fromkeys(keys) if key not in allowed]
        if not fresh:
            return
        allowed.update(fresh)
        # the sorted copy and the session table patched with the new keys, not built anew
        # from every session's set (a batched registration sends one command per frame)
        _express.keys_added(session, np.asarray(fresh, np.uint64))
        before = (self.sessions_version, self.allowed_version)
        self.allowed_version += 1
        self.express.keys_allowed(session, before)

    def set_selectors(self, guards: dict[int, dict[int, tuple[str, ...]]],
                      schemas: list[dict],
                      nodes: dict[int, dict[int, tuple[str, ...]]] | None = None,
                      routes: dict[int, dict[int, tuple]] | None = None) -> None:
        """Selector guards from the control agent (control/selector_apply.py): session id ->
        topic key -> the selector texts of which one must be TRUE for a message with that key
        to be delivered to the session; ``schemas``: P&M's schema documents. Sessions not
        named have no guard. ``nodes``: the same per destination appliance (the selectors
        behind its interest): a message none of them takes is not sent towards it. Guarded
        egresses leave the express path for the general loop. ``routes`` (rendezvous mode,
        control/rendezvous.py): destination -> topic key -> (its interest covers the key,
        its routing-key texts, the selectors it registered here)."""
        from nic_offload.schema import Schema
        from nic_offload.selectors import SelectorIndex

        index = self.selector_index
        if index is None:
            index = self.selector_index = SelectorIndex()
        nodes = {dest: g for dest, g in (nodes or {}).items() if g}
        if set(nodes) != set(self.node_selectors):
            self.sessions_version += 1  # the express plan changes those destinations' kind
        wanted: dict = {sid: g for sid, g in guards.items() if g and sid in self.sessions}
        wanted.update({("n", dest): g for dest, g in nodes.items()})
        routes = routes or {}
        for dest, per in routes.items():
            for tag, at in (("k", 1), ("r", 2)):
                g = {key: entry[at] for key, entry in per.items() if entry[at]}
                if g:
                    wanted[(tag, dest)] = g
        held = self._selector_texts
        for sub in [sub for sub in held if sub not in wanted]:
            for text in held.pop(sub):
                index.remove((sub, text))
        for sub, guard in wanted.items():
            old = held.get(sub, set())
            new = {t for texts in guard.values() for t in texts}
            for text in old - new:  # only the changes: the index recompiles nothing else
                index.remove((sub, text))
            for text in new - old:
                index.add((sub, text), text)
            held[sub] = new
            # a key guarded by all of them (the usual: one pattern) is checked by the
            # subscriber alone, not by each of its selectors
            wanted[sub] = {key: ALL_SELECTORS if len(texts) == len(new) else texts
                           for key, texts in guard.items()}
        self.node_selectors = {dest: wanted[("n", dest)] for dest in nodes}
        self.rdv_keys = {dest: wanted[("k", dest)] for dest in routes if ("k", dest) in wanted}
        self.rdv_regs = {dest: wanted[("r", dest)] for dest in routes if ("r", dest) in wanted}
        self.rdv_uncovered = {dest: frozenset(k for k, e in per.items() if not e[0])
                              for dest, per in routes.items()}
        for sid, session in self.sessions.items():
            guard = wanted.get(sid)
            if (session.selectors is None) != (guard is None):
                self.sessions_version += 1  # the express plan changes the session's kind
            session.selectors = guard
        self.selector_schemas = {}
        for doc in schemas:
            try:
                schema = Schema.from_dict(doc)
            except Exception as exc:  # checked by P&M's loader already
                log.warning("data path: schema %r unusable for selectors (%s)",
                            doc.get("name"), exc)
                continue
            self.selector_schemas[schema.schema_id] = schema

    def set_flow_policy(self, session_id: int, policy: int, engage: bool = False) -> None:
        """The session's flow-control policy from now on (``FlowPolicy``; the control agent
        resolves it from the subscription, the identity and P&M: docs/flow-control.md);
        ``engage``: it was configured, so the session is under flow control from now on."""
        session = self.sessions.get(session_id)
        if session is None:
            return
        if session.flow_policy != policy:
            session.flow_policy = policy
            if session.flow is not None:  # its queue applies the new policy from now on
                session.flow.policy = FlowPolicy(policy)
                session.flow.queue.set_policy(FlowPolicy(policy))
        if engage:
            self.flows.engage(session, self.cycle_ns)

    def set_own_class(self, session_id: int, own: int) -> None:
        """Session ``session_id`` takes each message once, in its class, for the classes in
        ``own`` (``OWN_PLAIN``, ``OWN_GUARANTEED``; the control agent, from its subscriptions
        made with ``own_class``): a message that goes to both of its egresses is given to the
        other one no more (``Delivery._deliver``). With ``OWN_PLAIN`` the neighbours'
        frames to it take the general loop (the plain copy of a guaranteed message comes
        from there)."""
        session = self.sessions.get(session_id)
        if session is None or session.own_class == own:
            return
        if (session.own_class ^ own) & OWN_PLAIN:
            self.sessions_version += 1  # the express plan changes the session's kind
        session.own_class = own
        self._count_own()

    def _count_own(self) -> None:
        self.own_sessions = sum(1 for s in self.sessions.values() if s.own_class)

    def set_acl_classes(self, classes: dict[int, tuple[str, Any]]) -> None:
        """The content ACL classes of P&M's document: id -> (name, ``AclClass``); the tables
        (the snapshot) hold their compiled form, these name them and their rules in the
        audit lines of LOG verdicts."""
        self.acl_classes = dict(classes)

    def set_session_acl(self, session_id: int, acl_class: int,
                        topics: dict[int, str] | None = None) -> None:
        """Apply content ACL class ``acl_class`` (0: none) to what the session publishes from
        now on; ``topics``: key -> topic of what it may publish (for the audit lines)."""
        session = self.sessions.get(session_id)
        if session is None:
            return
        if topics:
            session.topics.update(topics)
        if session.acl_class != acl_class:
            session.acl_class = acl_class
            self.sessions_version += 1  # the express path leaves its frames to the loop

    def revoke_keys(self, session_id: int, keys: list[int]) -> None:
        """Take back publish rights (an entitlement P&M no longer grants): the session's
        messages with these keys are dropped and counted as denied from now on."""
        session = self.sessions.get(session_id)
        if session is not None:
            session.allowed.difference_update(keys)
            session._sorted_allowed = None  # the sorted copy the pipeline searches
            self.allowed_version += 1

    # --- the duty cycle -----------------------------------------------------------------------
    def spin_worth(self) -> bool:
        """Whether the last cycle that did work handled data (messages, frames in transit,
        reliable streams): the idle strategy spins for a next frame only then, not after a
        heartbeat, an admin frame or a timer (``PollingIdle.spin_worth``)."""
        return self.data_cycle

    def do_work(self, now_ns: int) -> int:
        self.cycle_ns = now_ns
        data = False
        # admin frames out, then commands: a command the control plane offered before a
        # reply is applied before this cycle receives whatever the reply prompts
        # every step below is skipped by a cheap check when it has nothing to do: a cycle
        # that forwards one frame is dominated by fixed costs (docs/appliance.md, benchmark)
        work = self._send_outbox() if self.outbox else 0
        applied = self.commands.drain(1_024) if self.commands else 0
        work += applied
        snap_version = self.nic.switch.current.version
        work += self.rerun_parked_before(snap_version, now_ns)
        telemetry = self.telemetry
        express = self.express if _express.ENABLED else None
        for name, batch, channel, fused in self._receivers:
            if fused and express is not None:  # receive, forward and send in one call
                n, taken, punts = express.receive(channel, batch, now_ns, RELIABLE_STREAM_BIT,
                                                  _PROBE, now_ns + self.parked_ttl_ns)
            else:
                n, taken, punts = channel.receive(batch, 0), _express.UNTRIED, None
            if n:
                work += n
                data = data or self._has_data(batch, n)
                if taken != _express.TAKEN:
                    self._on_batch(name, batch, now_ns, taken == _express.UNTRIED)
                elif punts:
                    self._general(name, batch, punts, now_ns)
                if telemetry is not None:  # after the frame MAC: forged frames do not count
                    telemetry.on_batch(name, batch)
        if telemetry is not None:
            work += telemetry.do_work(now_ns, self.queue_frame, self.tables.peer_node.__contains__)
        if self.flows.active:
            work += self.flows.do_work(now_ns)
        gp = self.guaranteed
        if gp.receivers or gp.senders:
            work += gp.run_timers(now_ns)
            if gp.delivered or (gp.held and (snap_version != gp.held_version
                                             or now_ns >= gp.held_retry_ns)):
                self._run_guaranteed(now_ns)
            gp.flush(now_ns)
        for out in self._out_list:
            if out.batch.count or out._open:
                out.flush()
        if self.nic.pending_digests():
            self._drain_digests()
        if self._parked:
            self._expire_parked(now_ns)
        if (data or applied) and not self._active_since_publish:
            self._active_since_publish = True  # counters move again: publish at the busy pace
            self._publish_at_ns = min(self._publish_at_ns, now_ns + STATUS_REFRESH_NS)
        if now_ns >= self._publish_at_ns:
            self._publish(now_ns)
        if work:
            self.data_cycle = data
        return work

    @staticmethod
    def _has_data(batch: FrameBatch, n: int) -> bool:
        """Whether a received burst holds a frame with messages (DATA or RETRANSMISSION with
        a message count: not a probe nor an admin frame), read from the headers (a data
        burst says so in its first frame; an idle one is a heartbeat or two)."""
        buf, offsets, lengths = batch.buf, batch.offsets, batch.lengths
        for i in range(n):
            o = int(offsets[i])
            if (lengths[i] >= fl.FRAME_HEADER_BYTES and buf[o + fl.TYPE_OFFSET] in _MESSAGE_TYPES
                    and (buf[o + fl.MSG_COUNT_OFFSET] or buf[o + fl.MSG_COUNT_OFFSET + 1])):
                return True
        return False


    # --- classification -----------------------------------------------------------------------
    def _on_batch(self, name: str, batch: FrameBatch, now_ns: int, express: bool = True) -> None:
        """Run a received burst: through the forwarding pipeline (``express``: may it try;
        not when its receive already declined the burst), which leaves the general loop
        only the frames it punts, or through the general loop alone."""
        # a snapshot that came after this cycle began: parked messages go before these
        self.rerun_parked_before(self.nic.switch.current.version, now_ns)
        if express and _express.ENABLED:
            punts = self.express.run(name, batch, now_ns, RELIABLE_STREAM_BIT, _PROBE,
                                     now_ns + self.parked_ttl_ns)
            if punts is not None:
                if punts:
                    self._general(name, batch, punts, now_ns)
                return
        frames: Any = range(batch.count)
        if name == FABRIC or name.startswith(GROUP_RX):  # the pipeline did not check them
            frames = self.data_auth.check(name, batch, self.tables, RELIABLE_STREAM_BIT)
        self._general(name, batch, frames, now_ns)

    def _general(self, name: str, batch: FrameBatch, frames: Any, now_ns: int) -> None:
        """The general loop over the burst's ``frames`` (indexes): classify each by its
        header and run it. It handles the frames the pipeline punts (admin frames, reliable
        streams, probes, strangers, frames off their path), and every frame when the
        pipeline is off (``express.ENABLED``): it is the pipeline's test oracle."""
        n = batch.count
        buf = batch.buf
        tables = self.tables
        run_idx: list[int] = []
        ctxs: list[tuple] = []
        deadline = now_ns + self.parked_ttl_ns
        fabric = name == FABRIC
        group = name.startswith(GROUP_RX)
        client = not (fabric or group)
        own = self._own_group_senders.get(name)
        offsets = batch.offsets[:n].tolist()  # Python ints: no numpy scalar per field
        lengths = batch.lengths[:n].tolist()
        peers = batch.peer_ids[:n].tolist()
        for i in frames:
            off = offsets[i]
            length = lengths[i]
            peer = peers[i]
            if group and own is not None and (peer & 0xFFFF) == own[1] and (
                    own[0] == 0 or peer >> 16 == own[0]):
                self.counters["group_own_frames"] += 1  # our own frame, looped back
                continue
            if length >= fl.FRAME_HEADER_BYTES:
                magic, _, ftype, _, msg_count, _, src, dst, stream, _ = _HEADER.unpack_from(
                    buf, off)
            if length < fl.FRAME_HEADER_BYTES or magic != fl.FRAME_MAGIC:
                run_idx.append(i)  # malformed: the NIC counts it per reason
                ctxs.append((False, 0, 0, None, deadline, 0))
                continue
            if client and src:  # a session's frame: under its key when it has one
                session = self._by_peer.get((name, peer))
                if session is not None and session.auth_slot >= 0 and \
                        src == session.session_id:
                    length = self.session_auth.check(batch, i, session)
                    if length < 0:
                        continue
            message = ftype == _DATA or ftype == _RETX
            if not message and ftype not in RELIABILITY_ADMIN_TYPES:
                if len(self.inbox) < INBOX_FRAMES:
                    self.inbox.append((name, peer, buf[off : off + length].tobytes()))
                    self.control_wakeup.set()
                else:
                    self.counters["inbox_full"] += 1
                continue
            if stream == _PROBE and ftype == _DATA and msg_count == 0:
                self.counters["probe_frames"] += 1  # recorded on arrival, nothing to deliver
                continue
            reliable = not message or stream & RELIABLE_STREAM_BIT
            if group and reliable:  # reliable streams between neighbours are unicast
                self.counters["group_off_path"] += 1
                continue
            if group:
                node = tables.group_peers.get((name, peer))
                if node is None:
                    self.counters["group_unknown_peer"] += 1
                    continue
                route = tables.transit.get((src, self.node_id))
                if (dst != 0 or src != node or route is None or route[0] != node
                        or route[1] is not None):
                    self.counters["group_off_path"] += 1
                    continue
                self.counters["group_data_frames"] += 1
                run_idx.append(i)
                ctxs.append((False, src, stream, None, deadline, 0))
            elif fabric:
                prev = tables.peer_node.get(peer)
                if prev is None:
                    self.counters["unknown_peer"] += 1
                    continue
                route = tables.transit.get((src, dst))
                if route is None or route[0] != prev:
                    # a duplicated copy, or a frame draining from a switched path
                    route = route_apply.other_route(tables, src, dst, prev, now_ns)
                    if route is None:
                        self.counters["off_path"] += 1
                        continue
                if route[1] is not None:
                    self._out[FABRIC].add_frame(route[1], buf[off : off + length])
                    self.counters["transit_frames"] += 1
                    continue
                if ftype == _FLOW and not stream & RELIABLE_STREAM_BIT:
                    # another appliance's throttle hold on a publisher of ours
                    self.counters["flow_frames_in"] += 1
                    self.flows.on_node_frame(memoryview(buf[off : off + length]), src, dst,
                                             stream, now_ns)
                    continue
                if reliable:
                    self.counters["guaranteed_frames_in"] += 1
                    try:
                        self.guaranteed.on_fabric_frame(memoryview(buf[off : off + length]),
                                                        ftype, src, stream, now_ns)
                    except Exception as exc:  # contained to the frame (see _bad_frame)
                        self._bad_frame(name, peer, exc, now_ns)
                    continue
                if dst & route_apply.DUP_DEST_BIT:
                    kept = self.dedup.admit(buf, off, length, src, stream)
                    if kept == 0:  # every message of it was a copy seen before
                        self.counters["duplicate_frames"] += 1
                        continue
                    batch.lengths[i] = kept
                run_idx.append(i)
                ctxs.append((False, src, stream, None, deadline, 0))
            else:
                session = self._by_peer.get((name, peer))
                if session is None or src != session.session_id:
                    self.counters["unknown_client_frames"] += 1
                    continue
                if ftype == _FLOW and stream == SESSION_FLOW_STREAM:
                    self.counters["flow_frames_in"] += 1
                    self.flows.on_frame(session, buf[off : off + length].tobytes(), now_ns)
                    continue
                if reliable:
                    self.counters["guaranteed_frames_in"] += 1
                    try:
                        self.guaranteed.on_client_frame(name, session, peer,
                                                        memoryview(buf[off : off + length]),
                                                        ftype, dst, stream, now_ns)
                    except Exception as exc:  # contained to the frame (see _bad_frame)
                        self._bad_frame(name, peer, exc, now_ns)
                    continue
                run_idx.append(i)
                ctxs.append(self.ingress_ctx(session, deadline))
        if run_idx:
            self._run(batch, run_idx, ctxs, now_ns)
        if self.guaranteed.delivered:
            self._run_guaranteed(now_ns)

    def _bad_frame(self, channel: str, peer: int, exc: Exception, now_ns: int) -> None:
        """A frame whose handling in Python raised: dropped and counted (``bad_admin``,
        ``bad_admin_<exception type>``), logged with its traceback at most once per
        AUTH_LOG_INTERVAL_NS; the data path goes on with the next frame."""
        self.counters["bad_admin"] += 1
        self.counters[f"bad_admin_{type(exc).__name__.lower()}"] += 1
        if now_ns >= self._bad_log_at:
            self._bad_log_at = now_ns + AUTH_LOG_INTERVAL_NS
            log.warning("data path: dropped a frame from %s peer %s whose handling failed "
                        "(%s: %s); counted in bad_admin, further ones not logged for %.0f s",
                        channel, peer, type(exc).__name__, exc, AUTH_LOG_INTERVAL_NS / 1e9,
                        exc_info=exc)

    def _run_guaranteed(self, now_ns: int) -> None:
        """Messages the reliable receivers delivered (in order per stream) through the tables:
        from the fabric as local delivery of the guaranteed class, from a client as ingress
        (numbered again per (publisher, topic), as the client numbers its plain publishes:
        its stream numbered them across topics). Loss notices from the fabric go on to this
        node's guaranteed clients."""
        gp = self.guaranteed
        scratch = self._gscratch
        view = memoryview(scratch.buf)
        deadline = now_ns + self.parked_ttl_ns
        items: list[tuple[str, Any, bytes, int]] = []
        snapshot = self.nic.switch.current
        version = snapshot.version
        if gp.held and (version != gp.held_version or now_ns >= gp.held_retry_ns):
            gp.held_version = version
            gp.held_retry_ns = now_ns + GUARANTEED_HELD_RETRY_NS
            for (where, stream), queue in gp.held.items():
                items.extend((where, stream, message, due) for message, due in queue)
            gp.held.clear()
        items.extend((where, stream, message, deadline)
                     for where, stream, message in gp.take_delivered())
        if not items:
            return
        gates = gp.gating
        reporter = gp.reporter
        keys = np.fromiter((_KEY.unpack_from(item[2], 0)[0] for item in items), np.uint64,
                           len(items))
        known = snapshot.tables.lookup(keys) != 0
        ctxs: list[tuple] = []
        scratch.count = 0
        open_key = None
        pos = count = 0

        def close() -> None:
            if open_key is not None:
                start = int(scratch.offsets[scratch.count - 1])
                _HEADER.pack_into(view, start, fl.FRAME_MAGIC, fl.PROTOCOL_VERSION, _DATA, 0,
                                  count, pos, 0, 0, 0, 0)
                scratch.lengths[scratch.count - 1] = pos

        for i, (where, stream, message, due) in enumerate(items):
            held = gp.held.get((where, stream))
            if held is not None:  # behind a message whose key is not known yet
                held.append((message, due))
                continue
            topic_key = int(keys[i])
            if topic_key != LOSS_NOTICE_KEY and not known[i]:
                if due <= now_ns:
                    seq = int(_KEY.unpack_from(message, ml.SEQUENCE_OFFSET)[0])
                    gp.lost(where, stream, seq, seq, "UNKNOWN_KEY")
                    if gates and where != FABRIC:
                        gp.routed(stream, seq)
                else:
                    gp.held[(where, stream)] = deque([(message, due)])
                    self.counters["guaranteed_held"] += 1
                continue
            if gates and where != FABRIC:  # its gate (persisted acknowledgements) moves on
                in_seq = int(_KEY.unpack_from(message, ml.SEQUENCE_OFFSET)[0])
                gp.routed(stream, in_seq)
            elif reporter is not None and topic_key != LOSS_NOTICE_KEY:
                # another appliance's publisher: its position, for its persisted reports
                reporter.routed(stream.source_session, stream.stream_id,
                                int(_KEY.unpack_from(message, ml.SEQUENCE_OFFSET)[0]))
            if topic_key == LOSS_NOTICE_KEY:
                if where == FABRIC:
                    gp.notify_clients(stream.source_session, stream.stream_id,
                                      message[ml.MESSAGE_HEADER_BYTES:ml.MESSAGE_HEADER_BYTES
                                              + _U32.unpack_from(message, 32)[0]], now_ns)
                else:
                    self.counters["guaranteed_bad_client_frames"] += 1
                continue
            if where == FABRIC:
                ctx = (False, stream.source_session, stream.stream_id, None, deadline, 1)
            else:
                session = self.sessions.get(stream.source_session)
                if session is None:
                    continue
                ctx = self.ingress_ctx(session, deadline, 1)
            key = (where, stream)
            if (key != open_key or count == ml.MAX_MESSAGES_PER_FRAME
                    or pos + len(message) > scratch.slot_bytes):
                close()
                if scratch.count == scratch.capacity:
                    self.counters["guaranteed_delivery_frames"] += scratch.count
                    self._run(scratch, list(range(scratch.count)), ctxs, now_ns)
                    scratch.count = 0
                    ctxs = []
                scratch.count += 1
                ctxs.append(ctx)
                open_key, pos, count = key, fl.FRAME_HEADER_BYTES, 0
            start = int(scratch.offsets[scratch.count - 1]) + pos
            scratch.buf[start : start + len(message)] = np.frombuffer(message, np.uint8)
            if where != FABRIC:  # the publisher's per-topic numbering, as for a plain publish
                tkey = (stream.source_session, topic_key)
                seq = gp.topic_seq[tkey] = gp.topic_seq.get(tkey, 0) + 1
                _KEY.pack_into(view, start + ml.SEQUENCE_OFFSET, seq)
                if gates:
                    gp.routing(stream.source_session, topic_key, seq, in_seq)
            pos += len(message)
            count += 1
        close()
        if scratch.count:
            self.counters["guaranteed_delivery_frames"] += scratch.count
            self._run(scratch, list(range(scratch.count)), ctxs, now_ns)
        if gates:
            gp.routing_done()


    def drain(self) -> None:
        """Send what is queued (shutdown)."""
        self._send_outbox()
        self.guaranteed.flush(0)
        for out in self._out.values():
            out.flush()

    def on_close(self) -> None:
        self.drain()
        for session in self.sessions.values():
            if session.tx is not None:
                session.tx.close()
        self.wakeup.close()
