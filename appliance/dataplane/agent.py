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
   every ``STATUS_REFRESH_NS``.

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

import logging
import struct
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from appliance.config import (
    AUTH_LOG_INTERVAL_NS,
    CLIENT_MAX_FRAME_BYTES,
    DATAPATH_RECEIVE_FRAMES,
    GUARANTEED_HELD_RETRY_NS,
    INBOX_FRAMES,
    OUTBOX_FRAMES,
    PARKED_MESSAGE_TTL_NS,
    PARKED_MESSAGES,
    STATUS_REFRESH_NS,
)
from appliance.control import route_apply
from appliance.dataplane import express as _express
from appliance.dataplane import fastpath as _fastpath
from appliance.dataplane.guaranteed import (
    LOSS_NOTICE_KEY,
    RELIABILITY_ADMIN_TYPES,
    RELIABLE_STREAM_BIT,
    GuaranteedPlane,
)
from appliance.dataplane.names import CLIENT_SHM, CLIENT_UDP, FABRIC, GROUP_RX, GROUP_TX
from appliance.dataplane.status_channels import sample_channel
from channels.base import EACH_SLOT, FrameArrays, FrameBatch
from channels.udp import DatagramChannel, peer_id_of
from datapath.agent import AgentWakeup, CommandQueue, WaitSet
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from nic_offload.model import DigestReason
from nic_offload.softnic import SoftNic
from nic_offload.softnic.layout import DescriptorKind, MessageVerdict

log = logging.getLogger("topicwire.appliance")

__all__ = ["CLIENT_SHM", "CLIENT_UDP", "FABRIC", "GROUP_RX", "GROUP_TX", "DataPlaneAgent",
           "DpSession", "ForwardingTables"]


_DATA = int(fl.FrameType.DATA)
_RETX = int(fl.FrameType.RETRANSMISSION)
_HEADER = fl.FRAME_HEADER_STRUCT
_GROUP = int(DescriptorKind.GROUP)
_UNKNOWN = int(MessageVerdict.UNKNOWN_KEY)
_U32 = struct.Struct(">I")
_KEY = struct.Struct(">Q")
_DIGEST_NAMES = {int(r): f"digests_{r.name.lower()}" for r in DigestReason}
_DIGEST_UNKNOWN_KEY = int(DigestReason.UNKNOWN_KEY)
UNKNOWN_KEYS_KEPT = 8
"""How many of the latest unknown topic keys the status snapshot shows."""
_PROBE = 0x7FFF_FFFF
_FEW = 16
"""Up to this many values, a Python list beats a numpy reduction."""
"""``stream_id`` of telemetry probes (appliance/ops/telemetry/config.py PROBE_STREAM_ID)."""


@dataclass(frozen=True)
class ForwardingTables:
    """What the data path forwards with; the control agent builds a new one on every change."""

    node_id: int
    ports: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Offload egress port -> ("client", session) or ("node", destination node id), or the
    guaranteed kinds ("gclient", session) and ("gnode", destination node id)."""
    next_hop: dict[int, int] = field(default_factory=dict)
    """Destination node -> fabric peer id of the next hop on path(self, destination)."""
    transit: dict[tuple[int, int], tuple[int, int | None]] = field(default_factory=dict)
    """(source, destination) through or to this node -> (the node before this one on the
    path, fabric peer id of the next hop, or None when this node is the destination)."""
    peer_node: dict[int, int] = field(default_factory=dict)
    """Fabric peer id -> node id of a neighbour that is up."""
    group_direct: dict[int, str] = field(default_factory=dict)
    """Destination node -> the group-tx channel that reaches it directly (a neighbour on a
    fabric group, heard on it, whose path from this node is the direct link)."""
    group_peers: dict[tuple[str, int], int] = field(default_factory=dict)
    """(group channel, peer id of a member's group sender) -> node id of that neighbour."""
    epochs: dict[int, int] = field(default_factory=dict)
    """Appliance -> the epoch of its advertised interest (a new epoch: it restarted)."""
    grace: dict[tuple[int, int], tuple[int, int | None, int]] = field(default_factory=dict)
    """(source, destination) whose path here changed -> (old previous hop, old next peer,
    until monotonic ns): the old path drains (appliance/control/route_apply.py)."""
    alt_transit: dict[tuple[int, int], tuple[int, int | None]] = field(default_factory=dict)
    """Like ``transit``, on the backup paths of duplicated pairs."""
    alt_next_hop: dict[int, int] = field(default_factory=dict)
    """Destination -> fabric peer of the first hop of this node's backup path to it."""
    dup_keys: frozenset[int] = frozenset()
    """Topic keys sent on both the current and the backup path (duplication mode)."""


@dataclass
class DpSession:
    """A client session as the data path sees it."""

    session_id: int
    identity: str
    channel: str
    """CLIENT_UDP or CLIENT_SHM."""
    dest: int
    """UDP peer id, or the session id for shared memory (its ring is ``tx``)."""
    tx: Any = None
    """The ShmChannel towards the client's ring (shared memory only)."""
    allowed: set[int] = field(default_factory=set)
    """Topic keys this session may publish (granted at registration)."""
    published: int = 0
    delivered: int = 0
    denied: int = 0


class _OutQueue:
    """Frames being built and queued for one channel kind, in a preallocated batch.

    ``add_message`` appends a message to the open frame of its (dest, source, destination,
    stream); ``add_frame`` queues a whole frame. ``flush`` finishes open frames and sends.
    """

    def __init__(self, send: Callable[[FrameBatch], None], max_frame_bytes: int,
                 capacity: int = DATAPATH_RECEIVE_FRAMES, slot_bytes: int = 0) -> None:
        """``max_frame_bytes``: frames built here (``add_message``); ``slot_bytes``: the
        largest whole frame ``add_frame`` takes (admin frames may exceed the data MTU)."""
        self.batch = FrameBatch(capacity, fl.align8(max(max_frame_bytes, slot_bytes, 512)))
        self.too_large = 0
        self._view = memoryview(self.batch.buf)
        self.max_frame_bytes = max_frame_bytes
        self._send = send
        self._open: dict[tuple[int, int, int, int], list[int]] = {}

    def add_message(self, dest: int, src: int, dst: int, stream: int, buf: np.ndarray,
                    off: int, length: int) -> None:
        key = (dest, src, dst, stream)
        state = self._open.get(key)
        if state is not None and (state[1] + length > self.max_frame_bytes
                                  or state[2] >= ml.MAX_MESSAGES_PER_FRAME):
            self._finish(key, state)
            state = None
        if state is None:
            slot = self._new_slot(dest)
            state = self._open[key] = [slot, fl.FRAME_HEADER_BYTES, 0]
        slot, pos, _ = state
        start = int(self.batch.offsets[slot]) + pos
        self.batch.buf[start : start + length] = buf[off : off + length]
        state[1] = pos + length
        state[2] += 1

    def add_frame(self, dest: int, frame: bytes | bytearray | memoryview | np.ndarray) -> None:
        if len(frame) > self.batch.slot_bytes:
            self.too_large += 1
            return
        slot = self._new_slot(dest)
        start = int(self.batch.offsets[slot])
        data = frame if isinstance(frame, np.ndarray) else np.frombuffer(frame, np.uint8)
        self.batch.buf[start : start + len(data)] = data
        self.batch.lengths[slot] = len(data)

    def _new_slot(self, dest: int) -> int:
        if self.batch.count == self.batch.capacity:
            self.flush()
        slot = self.batch.count
        self.batch.count = slot + 1
        self.batch.peer_ids[slot] = dest
        self.batch.lengths[slot] = 0
        return slot

    def _finish(self, key: tuple[int, int, int, int], state: list[int]) -> None:
        slot, pos, count = state
        _dest, src, dst, stream = key
        _HEADER.pack_into(self._view, int(self.batch.offsets[slot]), fl.FRAME_MAGIC,
                          fl.PROTOCOL_VERSION, _DATA, 0, count, pos, src, dst, stream, 0)
        self.batch.lengths[slot] = pos
        del self._open[key]

    def flush(self) -> None:
        for key, state in list(self._open.items()):
            self._finish(key, state)
        if self.batch.count:
            self._send(self.batch)
            self.batch.count = 0


class DataPlaneAgent:
    """See the module docstring. Runs on the data-path thread only (except ``offer``s)."""

    name = "dataplane"

    def __init__(self, node_id: int, nic: SoftNic, channels: dict[str, Any], *,
                 fabric_max_frame_bytes: int) -> None:
        self.node_id = node_id
        self.nic = nic
        self.channels = channels
        self.wakeup = AgentWakeup()
        """Signalled on every offer from the control thread (ends a PollingIdle park)."""
        self.commands = CommandQueue(self.wakeup)
        self.inbox: deque[tuple[str, int, bytes]] = deque()
        self.outbox: deque[tuple[str, int, bytes]] = deque()
        self.tables = ForwardingTables(node_id)
        self.sessions: dict[int, DpSession] = {}
        self._by_peer: dict[tuple[str, int], DpSession] = {}
        self.sessions_version = 0
        """Changes whenever a session comes or goes (the express path's plan follows it)."""
        self.allowed_version = 0
        """Changes whenever a session's publishable keys grow (the express path's session
        table follows it)."""
        self.counters: Counter[str] = Counter()
        self._rx = {name: FrameBatch(DATAPATH_RECEIVE_FRAMES) for name in channels
                    if not name.startswith(GROUP_TX)}
        self._out = {
            FABRIC: _OutQueue(self._send_udp(FABRIC), fabric_max_frame_bytes,
                              slot_bytes=CLIENT_MAX_FRAME_BYTES),
            CLIENT_UDP: _OutQueue(self._send_udp(CLIENT_UDP), CLIENT_MAX_FRAME_BYTES),
            CLIENT_SHM: _OutQueue(self._send_shm, CLIENT_MAX_FRAME_BYTES),
        }
        self._own_group_senders: dict[str, tuple[int, int]] = {}
        for name, channel in channels.items():
            if name.startswith(GROUP_TX):
                self._out[name] = _OutQueue(self._send_group(name), fabric_max_frame_bytes,
                                            slot_bytes=CLIENT_MAX_FRAME_BYTES)
                host, port = channel.local_address
                rx = GROUP_RX + name[len(GROUP_TX):]
                self._own_group_senders[rx] = (peer_id_of(host, 0) >> 16, port)
        self._receivers = self._list_receivers()
        self._out_list = list(self._out.values())
        self.express = _express.Express(self, (CLIENT_UDP, FABRIC, CLIENT_SHM))
        self.digests: Counter[str] = Counter()
        """The software NIC's digests taken off its queue, by reason (``_drain_digests``)."""
        self.unknown_keys: deque[int] = deque(maxlen=UNKNOWN_KEYS_KEPT)
        """The topic keys of the latest UNKNOWN_KEY digests (status: offload.last_unknown_keys)."""
        self.guaranteed = GuaranteedPlane(self, fabric_max_frame_bytes)
        _fastpath.warm_up()
        self.cycle_ns = time.monotonic_ns()
        """When the current (or last) duty cycle started (the control agent's stall check)."""
        self._parked: deque[tuple[tuple, bytes]] = deque()
        self._parked_version = -1
        self._scratch = FrameBatch(DATAPATH_RECEIVE_FRAMES, CLIENT_MAX_FRAME_BYTES)
        self._gscratch = FrameBatch(DATAPATH_RECEIVE_FRAMES, CLIENT_MAX_FRAME_BYTES)
        self._groups: dict[int, tuple[int, ...]] = {}
        self._groups_version = -1
        self._publish_at_ns = 0
        self.published: dict[str, Any] = {"channels": [], "counters": {}, "offload": {}}
        self.closing = False
        self.telemetry: Any = None
        """appliance.ops.telemetry.probe.PathTelemetry when ``[telemetry]`` is configured."""
        self.dedup = route_apply.Deduplicator()
        self._bad_log_at = 0

    # --- called from the control thread -------------------------------------------------------
    def offer_admin(self, channel: str, dest: int, frame: bytes | bytearray) -> bool:
        """Queue an admin frame to send; False (counted) when the outbox is full."""
        if len(self.outbox) >= OUTBOX_FRAMES:
            self.counters["outbox_full"] += 1
            return False
        self.outbox.append((channel, dest, bytes(frame)))
        self.wakeup.signal()
        return True

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

    # --- for the guaranteed plane (data-path thread) ------------------------------------------
    def queue_frame(self, channel: str, dest: int, frame: memoryview | bytes) -> None:
        """Queue a whole frame on a channel's out queue (sent at the end of the cycle)."""
        self._out[channel].add_frame(dest, frame)

    def session_at(self, channel: str, peer: int) -> DpSession | None:
        """The client session whose frames come from ``peer`` on ``channel``."""
        return self._by_peer.get((channel, peer))

    # --- commands (run on the data-path thread) -----------------------------------------------
    def set_tables(self, tables: ForwardingTables) -> None:
        self.tables = tables
        self.guaranteed.on_tables(tables)

    def add_session(self, session: DpSession, peer: tuple[str, int]) -> None:
        self.sessions[session.session_id] = session
        self._by_peer[peer] = session
        self.sessions_version += 1

    def remove_session(self, session_id: int) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        self.sessions_version += 1
        for peer, s in list(self._by_peer.items()):
            if s is session:
                del self._by_peer[peer]
        self.guaranteed.flush(0)
        self._out[CLIENT_SHM].flush()
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

    def allow_keys(self, session_id: int, keys: list[int]) -> None:
        session = self.sessions.get(session_id)
        if session is not None:
            session.allowed.update(keys)
            self.allowed_version += 1

    # --- the duty cycle -----------------------------------------------------------------------
    def do_work(self, now_ns: int) -> int:
        self.cycle_ns = now_ns
        # admin frames out, then commands: a command the control plane offered before a
        # reply is applied before this cycle receives whatever the reply prompts
        # every step below is skipped by a cheap check when it has nothing to do: a cycle
        # that forwards one frame is dominated by fixed costs (docs/appliance.md, benchmark)
        work = self._send_outbox() if self.outbox else 0
        if self.commands:
            work += self.commands.drain(1_024)
        snap_version = self.nic.switch.current.version
        work += self.rerun_parked_before(snap_version, now_ns)
        telemetry = self.telemetry
        express = self.express if _express.ENABLED else None
        for name, batch, channel, fused in self._receivers:
            if fused and express is not None:  # receive, forward and send in one call
                n, taken = express.receive(channel, batch, now_ns, RELIABLE_STREAM_BIT, _PROBE,
                                           now_ns + PARKED_MESSAGE_TTL_NS)
            else:
                n, taken = channel.receive(batch, 0), _express.UNTRIED
            if n:
                work += n
                if telemetry is not None:
                    telemetry.on_batch(name, batch)
                if taken != _express.TAKEN:
                    self._on_batch(name, batch, now_ns, taken == _express.UNTRIED)
        if telemetry is not None:
            work += telemetry.do_work(now_ns, self.queue_frame)
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
        if now_ns >= self._publish_at_ns:
            self._publish(now_ns)
        return work

    def _send_outbox(self) -> int:
        done = 0
        outbox = self.outbox
        while outbox and done < OUTBOX_FRAMES:
            channel, dest, frame = outbox.popleft()
            done += 1
            if channel == "ring":  # a refused shm login: answer on the client's ring once
                self._answer_ring(dest, frame)
                continue
            if channel not in self.channels and channel != CLIENT_SHM:
                self.counters["outbox_no_channel"] += 1
                continue
            self._out[channel].add_frame(dest, frame)
        return done

    def _answer_ring(self, ring: object, frame: bytes) -> None:
        from channels.shm import ShmChannel

        try:
            with ShmChannel(tx=str(ring)) as tx:
                b = FrameBatch(1, fl.align8(len(frame)))
                b.append(frame)
                tx.send(b)
        except Exception:  # the client went away: nothing to answer
            self.counters["ring_answer_failed"] += 1

    # --- classification -----------------------------------------------------------------------
    def _on_batch(self, name: str, batch: FrameBatch, now_ns: int, express: bool = True) -> None:
        """Classify and run a received burst (``express``: may the express path try it; not
        when its receive already declined it)."""
        n = batch.count
        buf = batch.buf
        tables = self.tables
        run_idx: list[int] = []
        ctxs: list[tuple] = []
        deadline = now_ns + PARKED_MESSAGE_TTL_NS
        fabric = name == FABRIC
        group = name.startswith(GROUP_RX)
        own = self._own_group_senders.get(name)
        # a snapshot that came after this cycle began: parked messages go before these
        self.rerun_parked_before(self.nic.switch.current.version, now_ns)
        if not (fabric or group):  # a plain burst of one client: one compiled call
            if express and _express.ENABLED and self.express.ingress(name, batch, now_ns,
                                                         RELIABLE_STREAM_BIT, _PROBE, deadline):
                return
            # else a uniform burst from one client: on arrays
            fast = _fastpath.client_burst(self, name, batch, deadline, RELIABLE_STREAM_BIT)
            if fast is not None:
                self._run(batch, *fast, now_ns)
                return
        offsets = batch.offsets[:n].tolist()  # Python ints: no numpy scalar per field
        lengths = batch.lengths[:n].tolist()
        peers = batch.peer_ids[:n].tolist()
        for i in range(n):
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
            message = ftype == _DATA or ftype == _RETX
            if not message and ftype not in RELIABILITY_ADMIN_TYPES:
                if len(self.inbox) < INBOX_FRAMES:
                    self.inbox.append((name, peer, buf[off : off + length].tobytes()))
                else:
                    self.counters["inbox_full"] += 1
                continue
            if stream == _PROBE and ftype == _DATA and msg_count == 0:
                continue  # a telemetry probe: recorded on arrival, nothing to deliver
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
                if reliable:
                    try:
                        self.guaranteed.on_fabric_frame(memoryview(buf[off : off + length]),
                                                        ftype, src, stream, now_ns)
                    except Exception as exc:  # contained to the frame (see _bad_frame)
                        self._bad_frame(name, peer, exc, now_ns)
                    continue
                if dst & route_apply.DUP_DEST_BIT:
                    kept = self.dedup.admit(buf, off, length, src, stream)
                    if kept == 0:
                        continue
                    batch.lengths[i] = kept
                run_idx.append(i)
                ctxs.append((False, src, stream, None, deadline, 0))
            else:
                session = self._by_peer.get((name, peer))
                if session is None or src != session.session_id:
                    self.counters["unknown_client_frames"] += 1
                    continue
                if reliable:
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
        deadline = now_ns + PARKED_MESSAGE_TTL_NS
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
                else:
                    gp.held[(where, stream)] = deque([(message, due)])
                    self.counters["guaranteed_held"] += 1
                continue
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
            pos += len(message)
            count += 1
        close()
        if scratch.count:
            self._run(scratch, list(range(scratch.count)), ctxs, now_ns)

    # --- tables and framing -------------------------------------------------------------------
    def _run(self, batch: FrameBatch, idx: list[int], ctxs: list[tuple], now_ns: int) -> None:
        nic = self.nic
        n = len(idx)
        if n and idx[-1] == n - 1:  # 0..n-1 (ascending, no repeats): views, no gather
            offsets = batch.offsets[:n]
            lengths = batch.lengths[:n]
        else:
            sel = np.asarray(idx, dtype=np.int64)
            offsets = batch.offsets[sel]
            lengths = batch.lengths[sel]
        done = 0
        while done < n:
            result = nic.process(batch.buf, offsets[done:], lengths[done:])
            self._deliver(batch.buf, result, ctxs[done:], now_ns)
            if result.frames == 0:
                break
            done += result.frames

    def _ports_of_group(self, group: int) -> tuple[int, ...]:
        snap = self.nic.snapshot
        if snap.version != self._groups_version:
            self._groups = {g.group_id: g.ports for g in snap.entries.groups}
            self._groups_version = snap.version
        return self._groups.get(group, ())

    def _deliver(self, buf: np.ndarray, result: Any, ctxs: list[tuple], now_ns: int) -> None:
        nic = self.nic
        msgs = nic.batch
        m = result.messages
        frame_index = msgs["frame_index"][:m].tolist()
        keys = msgs["topic_key"][:m].tolist()
        tables = self.tables
        ports_map = tables.ports
        out_fabric = self._out[FABRIC]
        group_direct = tables.group_direct
        gp = self.guaranteed
        grouped: set[tuple[int, str]] = set()
        me = self.node_id
        counters = self.counters
        checked: dict[int, bool] = {}
        if result.descriptors and (self.tables.dup_keys  # duplication: the general loop
                                   or not _fastpath.deliver(self, buf, result, ctxs)):
            for off, length, target, kind, index in nic.descriptors[
                    : result.descriptors].tolist():
                ingress, origin, stream, session, _, cls = ctxs[frame_index[index]]
                if ingress:
                    ok = checked.get(index)
                    if ok is None:
                        ok = checked[index] = keys[index] in session.allowed
                        if ok:
                            session.published += 1
                        else:
                            session.denied += 1
                            counters["publish_denied"] += 1
                    if not ok:
                        continue
                ports = self._ports_of_group(target) if kind == _GROUP else (target,)
                for port in ports:
                    what = ports_map.get(port)
                    if what is None:
                        counters["no_port"] += 1
                    elif what[0] == "client":
                        if cls and not ingress:  # a guaranteed copy: guaranteed egresses only
                            continue
                        client = self.sessions.get(what[1])
                        if client is not None:
                            self._out[client.channel].add_message(
                                client.dest, origin, client.session_id, stream, buf, off, length)
                            client.delivered += 1
                    elif what[0] == "gclient":
                        if not cls and not ingress:
                            continue
                        client = self.sessions.get(what[1])
                        if client is not None:
                            gp.to_client(client.session_id, origin, stream, buf, off, now_ns)
                            client.delivered += 1
                    elif what[0] == "gnode":
                        if ingress:
                            gp.to_node(what[1], stream, buf, off, now_ns)
                    elif ingress:
                        via = group_direct.get(what[1]) if group_direct else None
                        if via is not None:  # once per message and group, to every member
                            if (index, via) not in grouped:
                                grouped.add((index, via))
                                self._out[via].add_message(0, me, 0, stream, buf, off, length)
                            continue
                        hop = tables.next_hop.get(what[1])
                        if hop is None:
                            counters["unroutable"] += 1
                        elif tables.dup_keys and keys[index] in tables.dup_keys and (
                                what[1] in tables.alt_next_hop):  # duplication mode
                            dup = what[1] | route_apply.DUP_DEST_BIT
                            out_fabric.add_message(hop, me, dup, stream, buf, off, length)
                            out_fabric.add_message(tables.alt_next_hop[what[1]], me, dup,
                                                   stream, buf, off, length)
                            counters["duplicated_messages"] += 1
                        else:
                            out_fabric.add_message(hop, me, what[1], stream, buf, off, length)
        verdicts = nic.verdicts[:m]
        if m > _FEW and not (verdicts == _UNKNOWN).any() or (
                m <= _FEW and _UNKNOWN not in verdicts.tolist()):
            return
        self._park_unknown(buf, m, ctxs, now_ns)

    def _park_unknown(self, buf: np.ndarray, m: int, ctxs: list[tuple], now_ns: int) -> None:
        """Park the messages of the NIC's last burst (``m`` messages) whose key it did not
        know, until a snapshot knows it or their frame's deadline passes (``ctxs`` per
        frame of the burst)."""
        msgs = self.nic.batch
        counters = self.counters
        unknown = np.flatnonzero(self.nic.verdicts[:m] == _UNKNOWN)
        if len(unknown):
            frame_index = msgs["frame_index"][unknown].tolist()
            starts = msgs["payload_offset"][unknown] - ml.MESSAGE_HEADER_BYTES
            sizes = ml.MESSAGE_HEADER_BYTES + ((msgs["payload_len"][unknown].astype(np.int64)
                                                + msgs["topic_len"][unknown] + 7) & ~7)
            for f, start, size in zip(frame_index, starts.tolist(), sizes.tolist()):
                ctx = ctxs[f]
                if ctx[4] <= now_ns:
                    counters["parked_expired"] += 1
                elif len(self._parked) >= PARKED_MESSAGES:
                    counters["parked_full"] += 1
                else:
                    self._parked.append((ctx, buf[start : start + size].tobytes()))
                    counters["parked"] += 1

    # --- software NIC digests ------------------------------------------------------------------
    def _drain_digests(self) -> None:
        """Take the NIC's queued digests (punts, unknown keys, ACL logs): count them by
        reason and keep the latest unknown keys; the queue never fills, so the NIC's
        ``digest_drops`` stays for real overload. Runs only when digests are pending."""
        digests = self.nic.drain_digests()
        reasons = digests["reason"].tolist()
        counts = self.digests
        for reason in reasons:
            counts[_DIGEST_NAMES.get(reason, "digests_other")] += 1
        if _DIGEST_UNKNOWN_KEY in reasons:
            keys = digests["topic_key"][digests["reason"] == _DIGEST_UNKNOWN_KEY]
            self.unknown_keys.extend(keys[-UNKNOWN_KEYS_KEPT:].tolist())

    # --- parked messages ----------------------------------------------------------------------
    def ingress_ctx(self, session: DpSession, deadline: int, cls: int = 0) -> tuple:
        """The context of a frame a local client published (``_run``'s per-frame tuple:
        ingress, origin, stream, session, parking deadline, class)."""
        return (True, self.node_id, session.session_id, session, deadline, cls)

    def rerun_parked_before(self, version: int, now_ns: int) -> int:
        """Run the parked messages again when the tables moved on to snapshot ``version``
        since they were parked (their keys may be known now): before anything newer of
        their publishers runs on it, so none is overtaken. Returns how many ran."""
        if self._parked and version != self._parked_version:
            return self._rerun_parked(now_ns)
        return 0

    def _rerun_parked(self, now_ns: int) -> int:
        self._parked_version = self.nic.switch.current.version
        parked, self._parked = self._parked, deque()
        scratch = self._scratch
        total = len(parked)
        while parked:
            scratch.count = 0
            ctxs = []
            while parked and scratch.count < scratch.capacity:
                ctx, message = parked.popleft()
                slot = scratch.count
                start = int(scratch.offsets[slot])
                size = fl.FRAME_HEADER_BYTES + len(message)
                _HEADER.pack_into(memoryview(scratch.buf), start, fl.FRAME_MAGIC,
                                  fl.PROTOCOL_VERSION, _DATA, 0, 1, size, 0, 0, 0, 0)
                scratch.buf[start + fl.FRAME_HEADER_BYTES : start + size] = np.frombuffer(
                    message, np.uint8)
                scratch.lengths[slot] = size
                scratch.count = slot + 1
                ctxs.append(ctx)
            self._run(scratch, list(range(scratch.count)), ctxs, now_ns)
        self.counters["parked_reruns"] += total
        return total

    def _expire_parked(self, now_ns: int) -> None:
        parked = self._parked
        while parked and parked[0][0][4] <= now_ns:
            parked.popleft()
            self.counters["parked_expired"] += 1

    # --- sending ------------------------------------------------------------------------------
    def _send_udp(self, name: str) -> Callable[[FrameBatch], None]:
        def send(batch: FrameBatch) -> None:
            channel = self.channels.get(name)
            if channel is None:
                self.counters[f"{name}_no_channel"] += batch.count
                return
            self.counted_udp_send(name, batch.count, channel.send(batch, EACH_SLOT))
        return send

    def counted_udp_send(self, name: str, count: int, sent: int) -> None:
        """``sent`` of ``count`` frames went out on UDP channel ``name``: the rest are
        counted as dropped under back-pressure."""
        if sent < count:
            self.counters[f"{name}_backpressure_drops"] += count - sent

    def _send_group(self, name: str) -> Callable[[FrameBatch], None]:
        def send(batch: FrameBatch) -> None:
            sent = self.channels[name].send(batch, None)  # the channel's group
            if sent < batch.count:
                self.counters["group_backpressure_drops"] += batch.count - sent
        return send

    def _send_shm(self, batch: FrameBatch) -> None:
        n = batch.count
        dests = batch.peer_ids[:n]
        for sid in np.unique(dests).tolist():
            session = self.sessions.get(sid)
            if session is None or session.tx is None:
                self.counters["shm_no_session"] += 1
                continue
            sel = np.flatnonzero(dests == sid)
            frames = FrameArrays(batch.buf, batch.offsets[sel], batch.lengths[sel], len(sel))
            try:
                sent = session.tx.send(frames)
            except Exception:  # the client's ring is gone: its session will time out
                self.counters["shm_send_failed"] += len(sel)
                continue
            if sent < len(sel):
                self.counters["shm_backpressure_drops"] += len(sel) - sent

    # --- counters -----------------------------------------------------------------------------
    def _publish(self, now_ns: int) -> None:
        self._publish_at_ns = now_ns + STATUS_REFRESH_NS
        self.express.fold()  # what its kernels counted since
        nic = self.nic
        self.published = {  # channel samples: the control thread computes their percentiles
            "channels": [sample_channel(name, ch) for name, ch in self._status_channels()],
            "counters": {**self.counters, **self.digests, **self.guaranteed.snapshot(),
                         **self._channel_counters(),
                         "duplicates_dropped": self.dedup.dropped,
                         **(self.telemetry.counters() if self.telemetry is not None else {}),
                         "frames_too_large": sum(q.too_large for q in self._out.values())},
            "offload": {"verdicts": nic.counters(), "malformed": nic.malformed(),
                        "snapshot_version": nic.snapshot.version,
                        "parked": len(self._parked),
                        "last_unknown_keys": " ".join(f"{k:#018x}" for k in self.unknown_keys)},
            "sessions": {sid: {"published": s.published, "delivered": s.delivered,
                               "denied": s.denied} for sid, s in self.sessions.items()},
        }

    def _status_channels(self) -> list[tuple[str, Any]]:
        """Every channel, and the parts a channel reports apart (the fabric's RDMA links,
        appliance/dataplane/fabric_links.py)."""
        out = []
        for name, channel in self.channels.items():
            out.append((name, channel))
            parts = getattr(channel, "status_parts", None)
            if parts is not None:
                out.extend(parts())
        return out

    def _channel_counters(self) -> dict[str, int]:
        """Counters a channel keeps of its own (the fabric's RDMA links)."""
        out: dict[str, int] = {}
        for channel in self.channels.values():
            counters = getattr(channel, "status_counters", None)
            if counters is not None:
                out.update(counters())
        return out

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
