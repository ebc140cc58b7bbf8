"""The control agent: neighbours, link state, paths, interest, P&M, client sessions, the compiler.

It runs on its own thread (an ``AgentRunner`` with a sleeping idle strategy: it runs timers
and admin frames, not the hot path). It owns the routing state, the ``OffloadCompiler`` and
the P&M document; it reaches the data path only through the data plane's ``CommandQueue``,
its outbox of admin frames, and ``SnapshotSwitch.publish``. Wire behaviour:
docs/appliance.md ("Control plane", "Clients").
"""

from __future__ import annotations

import copy
import json
import logging
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from appliance.config import (
    APPLIANCE_EGRESS_PORTS,
    AUTH_LOG_INTERVAL_NS,
    DENIAL_TEXT_CHARS,
    DENIALS_KEPT,
    FABRIC_MAX_ORIGINS,
    LOG_SOURCES_KEPT,
    LSA_MAX_AGE_REFRESHES,
    STATUS_REFRESH_NS,
    ApplianceConfig,
    NeighbourConfig,
)
from appliance.control import pm as pmod
from appliance.control import route_apply
from appliance.control.auth import FabricAuth
from appliance.control.documents import DocumentError, validate
from appliance.control.routing import Lsa, all_paths, graph_of, minimal_patterns, path_cost
from appliance.dataplane.agent import (
    CLIENT_SHM,
    FABRIC,
    GROUP_RX,
    GROUP_TX,
    DataPlaneAgent,
    DpSession,
    ForwardingTables,
)
from appliance.dataplane.status_channels import channel_rows
from channels.udp import peer_id_of
from datapath.protocol import admin_layout as al
from datapath.protocol.codec import decode_frame, encode_admin
from datapath.protocol.errors import ProtocolError
from datapath.protocol.frame_layout import FrameType
from datapath.topics.algebra import TopicError
from datapath.topics.registry import KeyRegistry, RegistryError
from datapath.topics.sublist import SubscriptionList
from nic_offload.compiler import OffloadCompiler
from nic_offload.errors import OffloadError
from nic_offload.model import CPU_PORT, MAX_EGRESS_PORT
from nic_offload.snapshot import SnapshotSwitch

log = logging.getLogger("topicwire.appliance")

ROLE = {"core": al.NodeRole.CORE, "edge": al.NodeRole.EDGE}
QOS_NAMES = {0: "best-effort", 1: "last-value", 2: "guaranteed"}
QOS_GUARANTEED = 2
REGISTRY_FRAME_BYTES = 60_000
"""Registry entries per REGISTRY_UPDATE frame are packed up to about this many bytes."""
ADMIN_FRAME_OVERHEAD_BYTES = 256
"""Room left in a frame for the header, body header and auth trailer when entries are
packed up to a frame size."""
INBOX_PER_CYCLE = 512
"""Admin frames the control agent handles per duty cycle."""


@dataclass
class Neighbour:
    config: NeighbourConfig
    peer: int
    node_id: int | None = None
    epoch: int = 0
    up: bool = False
    last_heard_ns: int = 0
    rtt_us: float | None = None
    group_heard_ns: int = 0
    """When its last authenticated HELLO arrived on its fabric group (0: never)."""


@dataclass
class Session:
    session_id: int
    identity: str
    channel: str
    peer: int
    ents: pmod.Entitlements
    port: int
    ring: str | None = None
    last_heard_ns: int = 0
    patterns: Counter = field(default_factory=Counter)
    """Positive patterns of its best-effort / last-value list (egress ``c:SESSION``)."""
    gpatterns: Counter = field(default_factory=Counter)
    """Positive patterns of its guaranteed list (egress ``g:SESSION``, made on demand)."""
    gport: int | None = None
    qos: dict = field(default_factory=dict)
    login_token: int | None = None
    """The client's name for the login that made this session: a repeat of it (the client
    retries an unanswered login) is answered again, not taken as a new login."""
    registered: set[int] = field(default_factory=set)
    """Topic keys this session registered (at most ``clients.max_registrations``)."""
    pending: int = 0
    """Its answers waiting for the tables to be live (``clients.max_pending_requests``)."""


class ControlAgent:
    """See the module docstring."""

    name = "control"

    def __init__(self, config: ApplianceConfig, dp: DataPlaneAgent, switch: SnapshotSwitch,
                 compiler: OffloadCompiler, registry: KeyRegistry) -> None:
        self.cfg = config
        self.node_id = config.node_id
        self.dp = dp
        self.switch = switch
        self.compiler = compiler
        self.registry = registry
        self.start_ns = time.monotonic_ns()
        self.epoch = (time.time_ns() // 1_000_000) & 0xFFFFFFFF
        self.auth = FabricAuth(config.fabric_key, config.fabric_key_id, self.epoch)
        self.neighbours = {n.name: Neighbour(n, peer_id_of(*n.address))
                           for n in config.neighbours}
        self.by_peer = {nb.peer: nb for nb in self.neighbours.values()}
        self.group_peers: dict[tuple[str, int], int] = {}
        """(group channel, peer id of a member's group sender) -> its node id, learned from
        the authenticated HELLOs it sends to the group."""
        self._groups_in_use = sorted({nb.group for nb in config.neighbours if nb.group})
        self.names: dict[int, str] = {self.node_id: config.name}
        self.lsdb: dict[int, Lsa] = {}
        self.lsa_heard_ns: dict[int, int] = {}
        self.lsa_seq = 0
        self.interest: dict[int, tuple[int, int, frozenset[tuple[int, str]],
                                       frozenset[tuple[int, str]]]] = {}
        """Origin -> (epoch, seq, best-effort patterns, guaranteed patterns)."""
        self.interest_seq = 0
        self.advertised: frozenset[tuple[int, str]] = frozenset()
        self.pm_doc: dict[str, Any] | None = (pmod.embedded_document(config)
                                              if config.pm_mode == "embedded" else None)
        self.overrides: dict[tuple[int, int], tuple[int, ...]] = {}
        """Route overrides of P&M's document: (source, destination) -> path."""
        self.paths: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {}
        self.sessions: dict[int, Session] = {}
        self.session_of_peer: dict[tuple[str, int], int] = {}
        self.denials: Counter[tuple[str, str, str]] = Counter()
        self.counters: Counter[str] = Counter()
        self.dest_egress: dict[tuple[str, int], tuple[int, frozenset[tuple[int, str]]]] = {}
        """("n" or "g", node) -> (port, patterns): an appliance's best-effort and guaranteed
        interest as egresses ``n:NODE`` and ``g:NODE``."""
        self.gadvertised: frozenset[tuple[int, str]] = frozenset()
        self._free_ports = [p for p in range(1, MAX_EGRESS_PORT + 1) if p != CPU_PORT]
        self._free_ports.reverse()
        self._quarantine: list[int] = []
        self._retired: dict[int, tuple[str, int]] = {}
        """Quarantined ports -> what they led to: the forwarding tables keep them until the
        snapshot that no longer uses them is published (its predecessor may still run)."""
        self._topology_dirty = True
        self._interest_dirty = True
        self._tables_dirty = True
        self._lsa_due = True
        self._heartbeat_at = 0
        self._timers_ran_ns = time.monotonic_ns()
        self._refresh_at = 0
        self._status_at = 0
        self._log_at: dict[tuple[str, int], int] = {}
        """(channel, peer) -> when it may be logged again (at most LOG_SOURCES_KEPT)."""
        self._log_full_at = 0
        self._pending_snapshot = None
        self._replies_when_live: list[tuple[Session, al.ControlKind, dict]] = []
        """Replies held until the tables they depend on are live in the data path."""
        self._synced_registry = registry.version
        self.requests: list[tuple[str, dict, threading.Event, dict]] = []
        self._requests_lock = threading.Lock()
        self.accepting = True
        self.status_snapshot: dict[str, Any] = {}
        self.jit: Any = None
        """The process's ``datapath.jit.JitWatch`` (set by the appliance once it preloaded)."""
        self.routes_ext = route_apply.RouteExtension(self)
        """Route tables from P&M, path-switch drain, duplication (control/route_apply.py)."""
        self._build_status(time.monotonic_ns())

    # --- duty cycle ---------------------------------------------------------------------------
    def do_work(self, now_ns: int) -> int:
        work = 0
        inbox = self.dp.inbox
        while inbox and work < INBOX_PER_CYCLE:
            channel, peer, data = inbox.popleft()
            work += 1
            try:
                self._on_admin(channel, peer, data, now_ns)
            except Exception as exc:  # whatever a frame does, it ends here: the agent goes on
                self._bad_admin(channel, peer, exc, now_ns)
        work += self._run_requests()
        work += self._timers(now_ns)
        work += self.routes_ext.do_work(now_ns)
        if self.registry.version != self._synced_registry:
            self._tables_dirty = True
        if self._topology_dirty:
            self._recompute_topology()
            work += 1
        if self._interest_dirty:
            self._advertise_interest()
            work += 1
        if self._tables_dirty:
            self._sync_destinations()
            self._build_snapshot()
            work += 1
        if self._pending_snapshot is not None and len(self.dp.commands) == 0:
            self.switch.publish(self._pending_snapshot)
            self._pending_snapshot = None
            for port in self._quarantine:
                self._free_ports.append(port)
            self._quarantine.clear()
            self._retired.clear()
        if self._replies_when_live and not self._tables_dirty and self._pending_snapshot is None:
            for session, kind, doc in self._replies_when_live:
                session.pending = 0
                self._reply(session, kind, doc)
            self._replies_when_live.clear()
        if now_ns >= self._status_at:
            self._build_status(now_ns)
        return work

    def on_close(self) -> None:
        return None

    # --- sending ------------------------------------------------------------------------------
    def _signed(self, ftype: FrameType, entries: list, body_header: dict | None = None
                ) -> bytes:
        frame = encode_admin(ftype, entries, body_header=body_header,
                             source_session=self.node_id, send_ts_ns=time.time_ns(),
                             auth=self.auth.next_auth())
        return bytes(self.auth.sign(frame))

    def _to_neighbour(self, nb: Neighbour, ftype: FrameType, entries: list,
                      body_header: dict | None = None) -> None:
        if self.cfg.fabric_key is None:
            return
        try:
            frame = self._signed(ftype, entries, body_header)
        except ValueError as exc:  # a document larger than one frame: refused, not fatal
            self.counters["frame_too_large"] += 1
            log.error("%s: cannot send %s to %s: %s", self.cfg.name, ftype.name,
                      nb.config.name, exc)
            return
        self.dp.offer_admin(FABRIC, nb.peer, frame)

    def _control(self, kind: al.ControlKind, doc: dict) -> al.Control:
        return al.Control(kind, json.dumps(doc, separators=(",", ":")))

    def _flood(self, kind: al.ControlKind, doc: dict, skip: Neighbour | None = None) -> None:
        entry = [self._control(kind, doc)]
        for nb in self.neighbours.values():
            if nb.up and nb is not skip:
                self._to_neighbour(nb, FrameType.CONTROL, entry)

    def _to_client(self, session_or_peer: tuple[str, int], ftype: FrameType, entries: list,
                   body_header: dict | None = None, dest_session: int = 0) -> None:
        channel, dest = session_or_peer
        frame = encode_admin(ftype, entries, body_header=body_header,
                             source_session=self.node_id, dest_session=dest_session,
                             send_ts_ns=time.time_ns())
        self.dp.offer_admin(channel, dest, frame)

    def _reply(self, session: Session, kind: al.ControlKind, doc: dict) -> None:
        dest = session.session_id if session.channel == CLIENT_SHM else session.peer
        self._to_client((session.channel, dest), FrameType.CONTROL, [self._control(kind, doc)],
                        dest_session=session.session_id)

    # --- admin frames in ----------------------------------------------------------------------
    def _log_once(self, channel: str, peer: int, text: str, now_ns: int,
                  exc: BaseException | None = None) -> None:
        """Log ``text`` at most once per source per AUTH_LOG_INTERVAL_NS (``exc``: with its
        traceback). The sources remembered are bounded: when LOG_SOURCES_KEPT are waiting
        out their interval, a new source is counted (``log_sources_dropped``), not logged."""
        key = (channel, peer)
        at = self._log_at.get(key)
        if at is not None and now_ns < at:
            return
        if at is None and len(self._log_at) >= LOG_SOURCES_KEPT:
            self._log_at = {k: t for k, t in self._log_at.items() if t > now_ns}
            if len(self._log_at) >= LOG_SOURCES_KEPT:
                self.counters["log_sources_dropped"] += 1
                if now_ns >= self._log_full_at:
                    self._log_full_at = now_ns + AUTH_LOG_INTERVAL_NS
                    log.warning("%s: more than %d sources sent bad frames within %.0f s; the "
                                "others are counted (control_log_sources_dropped), not logged",
                                self.cfg.name, LOG_SOURCES_KEPT, AUTH_LOG_INTERVAL_NS / 1e9)
                return
        self._log_at[key] = now_ns + AUTH_LOG_INTERVAL_NS
        log.warning("%s: %s (from %s peer %s)", self.cfg.name, text, channel, peer,
                    exc_info=exc)

    def _bad_admin(self, channel: str, peer: int, exc: Exception, now_ns: int) -> None:
        """A frame whose handling raised: counted by the exception's type and logged (an
        unexpected one with its traceback); the frame is dropped, the agent goes on."""
        expected = isinstance(exc, (ProtocolError, ValueError, KeyError, TypeError))
        self.counters["bad_admin"] += 1
        self.counters[f"bad_admin_{type(exc).__name__.lower()}"] += 1
        self._log_once(channel, peer, f"dropped a bad admin frame ({type(exc).__name__}: "
                       f"{exc})", now_ns, None if expected else exc)

    def _bad_document(self, channel: str, peer: int, exc: DocumentError, now_ns: int) -> None:
        """A CONTROL entry refused by its schema (control/documents.py): counted by reason."""
        self.counters["bad_document"] += 1
        self.counters[f"bad_document_{exc.reason}"] += 1
        self._log_once(channel, peer, str(exc), now_ns)

    def _on_admin(self, channel: str, peer: int, data: bytes, now_ns: int) -> None:
        if channel == FABRIC:
            self._on_fabric(peer, data, now_ns)
        elif channel.startswith(GROUP_RX):
            self._on_group(channel, peer, data, now_ns)
        else:
            self._on_client(channel, peer, data, now_ns)

    def _on_group(self, channel: str, peer: int, data: bytes, now_ns: int) -> None:
        """An admin frame on a fabric group: only HELLO/HEARTBEAT, which map the sender's
        group address to its node (the data path accepts group frames from mapped peers)."""
        try:
            frame = decode_frame(data)
        except ProtocolError as exc:
            self.auth.reject("malformed")
            self._log_once(channel, peer, f"rejected a malformed admin frame ({exc})", now_ns)
            return
        reason = self.auth.check(frame)
        if reason is not None:
            self._log_once(channel, peer, f"rejected an admin frame: {reason}", now_ns)
            return
        if frame.header.frame_type not in (FrameType.HELLO, FrameType.HEARTBEAT):
            self.counters["group_unexpected_admin"] += 1
            return
        _, entries = frame.admin()
        hello = entries[0]
        nb = self.neighbours.get(hello.name)
        group = channel[len(GROUP_RX):]
        if nb is None or nb.config.group != group or (nb.node_id is not None
                                                      and nb.node_id != hello.node_id):
            self.counters["group_hello_unexpected"] += 1
            self._log_once(channel, peer, f"{hello.name!r} said hello on group {group!r}, "
                           "where no such neighbour is configured", now_ns)
            return
        nb.group_heard_ns = now_ns
        if self.group_peers.get((channel, peer)) != hello.node_id:
            for key, node in list(self.group_peers.items()):
                if node == hello.node_id and key[0] == channel:
                    del self.group_peers[key]  # it restarted: a new sender port
            self.group_peers[(channel, peer)] = hello.node_id
            self._tables_dirty = True
            log.info("%s: neighbour %s heard on group %s", self.cfg.name, hello.name, group)

    def _on_fabric(self, peer: int, data: bytes, now_ns: int) -> None:
        nb = self.by_peer.get(peer)
        try:
            frame = decode_frame(data)
        except ProtocolError as exc:
            self.auth.reject("malformed")
            self._log_once(FABRIC, peer, f"rejected a malformed admin frame ({exc})", now_ns)
            return
        if nb is None:
            self.auth.reject("unknown_peer")
            self._log_once(FABRIC, peer, "rejected an admin frame from an address that is not "
                           "a configured neighbour", now_ns)
            return
        reason = self.auth.check(frame)
        if reason is not None:
            self._log_once(FABRIC, peer, f"rejected an admin frame: {reason}", now_ns)
            return
        ftype = frame.header.frame_type
        _, entries = frame.admin()
        if ftype in (FrameType.HELLO, FrameType.HEARTBEAT):
            self._on_hello(nb, entries[0], frame.header.send_ts_ns, now_ns)
        elif ftype is FrameType.CONTROL:
            for entry in entries:
                try:
                    doc = validate(entry.kind, entry.document, "neighbour")
                except DocumentError as exc:
                    self._bad_document(FABRIC, peer, exc, now_ns)
                    continue
                self._on_fabric_control(nb, entry.kind, doc, now_ns)
        elif ftype is FrameType.REGISTRY_UPDATE:
            self._merge_registry(entries, nb)
        else:
            self.counters["unexpected_admin"] += 1

    def _on_hello(self, nb: Neighbour, hello: al.Hello, send_ts: int, now_ns: int) -> None:
        if hello.name != nb.config.name:
            self.counters["neighbour_name_mismatch"] += 1
            self._log_once(FABRIC, nb.peer, f"neighbour at {nb.config.address} calls itself "
                           f"{hello.name!r}, expected {nb.config.name!r}", now_ns)
            return
        restarted = nb.up and hello.epoch != nb.epoch
        nb.last_heard_ns = now_ns
        if not nb.up or restarted or nb.node_id != hello.node_id:
            nb.up = True
            nb.node_id = hello.node_id
            nb.epoch = hello.epoch
            self.names[hello.node_id] = hello.name
            log.info("%s: neighbour %s (id %d) is up", self.cfg.name, hello.name, hello.node_id)
            self._lsa_due = True
            self._topology_dirty = True
            self._send_hello(nb, FrameType.HELLO)
            self._send_full_state(nb)
        self._to_neighbour(nb, FrameType.CONTROL, [self._control(al.ControlKind.ECHO,
                                                                 {"ts": send_ts})])

    def _new_origin_refused(self, origin: int, table: dict) -> bool:
        """True (counted) when ``origin`` is new to ``table`` and it holds FABRIC_MAX_ORIGINS."""
        if origin in table or len(table) < FABRIC_MAX_ORIGINS:
            return False
        self.counters["origins_refused"] += 1
        return True

    def _on_fabric_control(self, nb: Neighbour, kind: al.ControlKind, doc: dict,
                           now_ns: int) -> None:
        """A neighbour's CONTROL entry whose document ``validate`` accepted."""
        if kind is al.ControlKind.LSA:
            lsa = Lsa(doc["origin"], doc["name"], doc["epoch"], doc["seq"],
                      tuple((a, c) for a, c in doc["links"]))
            if lsa.origin == self.node_id:
                if (lsa.epoch, lsa.seq) >= (self.epoch, self.lsa_seq):
                    self.lsa_seq = lsa.seq + 1 if lsa.epoch == self.epoch else self.lsa_seq
                return
            if self._new_origin_refused(lsa.origin, self.lsdb):
                return
            self.lsa_heard_ns[lsa.origin] = now_ns
            if lsa.newer_than(self.lsdb.get(lsa.origin)):
                self.lsdb[lsa.origin] = lsa
                self.names[lsa.origin] = lsa.name
                self._topology_dirty = True
                self._flood(kind, doc, skip=nb)
        elif kind is al.ControlKind.INTEREST:
            origin = doc["origin"]
            if origin == self.node_id or self._new_origin_refused(origin, self.interest):
                return
            version = (doc["epoch"], doc["seq"])
            old = self.interest.get(origin)
            if old is None or version > old[:2]:
                patterns = frozenset((ns, p) for ns, p in doc["patterns"])
                gpatterns = frozenset((ns, p) for ns, p in doc.get("guaranteed", []))
                self.interest[origin] = (*version, patterns, gpatterns)
                self._tables_dirty = True
                self._flood(kind, doc, skip=nb)
        elif kind is al.ControlKind.PM_UPDATE:
            if self.cfg.pm_mode == "remote" and pmod.is_newer(doc, self.pm_doc):
                self.pm_doc = doc
                self._apply_pm(doc)
                self._flood(kind, doc, skip=nb)
        elif kind is al.ControlKind.LOGOUT:  # the neighbour is shutting down
            if nb.up:
                nb.up = False
                log.info("%s: neighbour %s said goodbye", self.cfg.name, nb.config.name)
                self._lsa_due = True
                self._topology_dirty = True
        elif kind is al.ControlKind.ECHO:
            sent = doc["ts"]
            if sent:
                nb.rtt_us = max(time.time_ns() - sent, 0) / 1e3
        else:
            self.counters["unexpected_control"] += 1

    def _apply_pm(self, doc: dict) -> None:
        routes = {}
        for src, dst, path in doc.get("routes", []):
            routes[(int(src), int(dst))] = tuple(int(x) for x in path)
        self.overrides = routes
        self.routes_ext.on_pm(doc)
        self._topology_dirty = True

    def _merge_registry(self, entries: list, nb: Neighbour | None) -> list:
        try:
            new = self.registry.merge(entries)
        except (RegistryError, TopicError) as exc:
            self.counters["registry_refused"] += 1
            log.warning("%s: refused registry entries: %s", self.cfg.name, exc)
            return []
        if new:
            self._tables_dirty = True
            for other in self.neighbours.values():
                if other.up and other is not nb:
                    self._send_registry(other, new)
        return new

    def _registry_frames(self, records: list) -> list[list[al.RegistryEntry]]:
        """Entries in chunks that fit one frame towards a neighbour (fabric.max_frame_bytes)."""
        budget = self.cfg.fabric_max_frame_bytes - ADMIN_FRAME_OVERHEAD_BYTES
        chunks: list[list[al.RegistryEntry]] = [[]]
        size = 0
        for r in records:
            entry = al.RegistryEntry(r.topic_key, r.namespace_id, r.topic)
            cost = 16 + len(r.topic.encode()) + 8
            if chunks[-1] and size + cost > budget:
                chunks.append([])
                size = 0
            chunks[-1].append(entry)
            size += cost
        return [c for c in chunks if c]

    def _send_registry(self, nb: Neighbour, records: list) -> None:
        for chunk in self._registry_frames(records):
            self._to_neighbour(nb, FrameType.REGISTRY_UPDATE, chunk,
                               {"version": self.registry.version})

    # --- neighbours and timers ----------------------------------------------------------------
    def _send_hello(self, nb: Neighbour, ftype: FrameType) -> None:
        hello = al.Hello(self.node_id, self.epoch, self.cfg.heartbeat_interval_ms,
                         ROLE[self.cfg.role], 0, self.cfg.name)
        self._to_neighbour(nb, ftype, [hello])

    def _group_hellos(self) -> None:
        """A HEARTBEAT to each fabric group in use, from its send-only channel: members learn
        which group address is this appliance."""
        if self.cfg.fabric_key is None or not self._groups_in_use:
            return
        hello = al.Hello(self.node_id, self.epoch, self.cfg.heartbeat_interval_ms,
                         ROLE[self.cfg.role], 0, self.cfg.name)
        for group in self._groups_in_use:
            self.dp.offer_admin(GROUP_TX + group, 0, self._signed(FrameType.HEARTBEAT, [hello]))

    def _send_full_state(self, nb: Neighbour) -> None:
        entries = [self._control(al.ControlKind.LSA, self._lsa_doc())]
        for lsa in self.lsdb.values():
            entries.append(self._control(al.ControlKind.LSA, _lsa_to_doc(lsa)))
        entries.append(self._control(al.ControlKind.INTEREST, self._interest_doc()))
        for origin, (epoch, seq, patterns, gpatterns) in self.interest.items():
            entries.append(self._control(al.ControlKind.INTEREST, {
                "origin": origin, "epoch": epoch, "seq": seq,
                "patterns": sorted([ns, p] for ns, p in patterns),
                "guaranteed": sorted([ns, p] for ns, p in gpatterns)}))
        if self.pm_doc is not None:
            entries.append(self._control(al.ControlKind.PM_UPDATE, self.pm_doc))
        for entry in entries:  # one per frame: documents may be large
            self._to_neighbour(nb, FrameType.CONTROL, [entry])
        if len(self.registry):
            self._send_registry(nb, self.registry.entries())

    def _lsa_doc(self) -> dict:
        links = sorted([nb.node_id, nb.config.cost] for nb in self.neighbours.values()
                       if nb.up and nb.node_id is not None)
        return {"origin": self.node_id, "name": self.cfg.name, "epoch": self.epoch,
                "seq": self.lsa_seq, "links": links}

    def _interest_doc(self) -> dict:
        return {"origin": self.node_id, "epoch": self.epoch, "seq": self.interest_seq,
                "patterns": sorted([ns, p] for ns, p in self.advertised),
                "guaranteed": sorted([ns, p] for ns, p in self.gadvertised)}

    def _timers(self, now_ns: int) -> int:
        work = 0
        cfg = self.cfg
        if now_ns >= self._heartbeat_at:
            self._heartbeat_at = now_ns + cfg.heartbeat_interval_ms * 1_000_000
            dead_ns = cfg.neighbour_dead_ms * 1_000_000
            # After a stall of this process (its control or data-path thread did not run for
            # half the dead interval: a busy host), heartbeats may sit unread in the socket:
            # judge neighbours once both threads have run again, not now.
            paused_ns = max(now_ns - self._timers_ran_ns, now_ns - self.dp.cycle_ns)
            stalled = paused_ns > dead_ns // 2
            self._timers_ran_ns = now_ns
            if stalled:
                self.counters["stalls"] += 1
                for nb in self.neighbours.values():
                    nb.last_heard_ns = max(nb.last_heard_ns, now_ns - dead_ns // 2)
            for nb in self.neighbours.values():
                if nb.up and now_ns - nb.last_heard_ns > dead_ns:
                    nb.up = False
                    log.info("%s: neighbour %s is down", cfg.name, nb.config.name)
                    self._lsa_due = True
                    self._topology_dirty = True
                self._send_hello(nb, FrameType.HEARTBEAT if nb.up else FrameType.HELLO)
            self._group_hellos()
            self._expire_sessions(now_ns, paused_ns)
            work += 1
        if now_ns >= self._refresh_at:
            self._refresh_at = now_ns + cfg.lsa_refresh_ms * 1_000_000
            self._lsa_due = True
            self._flood(al.ControlKind.INTEREST, self._interest_doc())
            if cfg.pm_mode == "embedded" and self.pm_doc is not None:
                self._flood(al.ControlKind.PM_UPDATE, self.pm_doc)
            max_age = LSA_MAX_AGE_REFRESHES * cfg.lsa_refresh_ms * 1_000_000
            for origin, heard in list(self.lsa_heard_ns.items()):
                if now_ns - heard > max_age:
                    del self.lsa_heard_ns[origin]
                    self.lsdb.pop(origin, None)
                    self.interest.pop(origin, None)
                    if all(nb.node_id != origin for nb in self.neighbours.values()):
                        self.names.pop(origin, None)
                    self._topology_dirty = True
            work += 1
        if self._lsa_due:
            self._lsa_due = False
            self.lsa_seq += 1
            self._flood(al.ControlKind.LSA, self._lsa_doc())
            work += 1
        return work

    # --- topology -----------------------------------------------------------------------------
    def _own_lsa(self) -> Lsa:
        doc = self._lsa_doc()
        return Lsa(self.node_id, self.cfg.name, self.epoch, self.lsa_seq,
                   tuple((a, c) for a, c in doc["links"]))

    def _recompute_topology(self) -> None:
        self._topology_dirty = False
        lsas = dict(self.lsdb)
        lsas[self.node_id] = self._own_lsa()
        graph = graph_of(lsas)
        self.paths = all_paths(graph, self.overrides)
        self.graph = graph
        me = self.node_id
        peer_of = {nb.node_id: nb.peer for nb in self.neighbours.values() if nb.up}
        next_hop = {}
        transit: dict[tuple[int, int], tuple[int, int | None]] = {}
        for (src, dst), (_cost, path) in self.paths.items():
            if src == me:
                hop = peer_of.get(path[1])
                if hop is not None:
                    next_hop[dst] = hop
            elif me in path:
                i = path.index(me)
                nxt = None if i == len(path) - 1 else peer_of.get(path[i + 1])
                if i == len(path) - 1 or nxt is not None:
                    transit[(src, dst)] = (path[i - 1], nxt)
        old_fwd = getattr(self, "_fwd", ({}, {}, {}))
        self._fwd = (next_hop, transit, {nb.peer: nb.node_id for nb in self.neighbours.values()
                                         if nb.up and nb.node_id is not None})
        self.routes_ext.on_topology(old_fwd, self._fwd)
        self._tables_dirty = True

    def _install_tables(self) -> None:
        next_hop, transit, peer_node = getattr(self, "_fwd", ({}, {}, {}))
        ports: dict[int, tuple[str, int]] = {}
        ports.update(self._retired)
        for sid, s in self.sessions.items():
            ports[s.port] = ("client", sid)
            if s.gport is not None:
                ports[s.gport] = ("gclient", sid)
        for (kind, node), (port, _) in self.dest_egress.items():
            ports[port] = ("node" if kind == "n" else "gnode", node)
        epochs = {origin: state[0] for origin, state in self.interest.items()}
        up = {nb.node_id: nb for nb in self.neighbours.values() if nb.up and nb.node_id}
        group_peers = {key: node for key, node in self.group_peers.items() if node in up}
        heard = set(group_peers.values())
        group_direct = {}
        for node in heard:
            found = self.paths.get((self.node_id, node))
            if found is not None and found[1] == (self.node_id, node):
                group_direct[node] = GROUP_TX + str(up[node].config.group)
        tables = ForwardingTables(self.node_id, ports, dict(next_hop), dict(transit),
                                  dict(peer_node), group_direct, group_peers, epochs)
        tables = self.routes_ext.extend(tables)
        self.dp.commands.offer(lambda: self.dp.set_tables(tables))

    def _sync_destinations(self) -> None:
        """One destination egress per appliance and class with interest: ``n:NODE``
        (best-effort and last-value) while NODE is reachable, ``g:NODE`` (guaranteed) as long
        as its interest is known, through a partition too: the messages go on into the
        reliable sender towards NODE, which keeps them until a path returns and the receiver
        recovers them (or declares them lost once the sender's buffer has let them go)."""
        reachable = {dst for (src, dst) in self.paths if src == self.node_id}
        wanted = {}
        for origin, (_, _, patterns, gpatterns) in self.interest.items():
            if patterns and origin in reachable:
                wanted[("n", origin)] = patterns
            if gpatterns:
                wanted[("g", origin)] = gpatterns
        for key in list(self.dest_egress):
            port, patterns = self.dest_egress[key]
            if wanted.get(key) != patterns:
                self.compiler.remove_egress(f"{key[0]}:{key[1]}")
                self._quarantine.append(port)
                self._retired[port] = ("node" if key[0] == "n" else "gnode", key[1])
                del self.dest_egress[key]
        for key, patterns in wanted.items():
            if key in self.dest_egress:
                continue
            if not self._free_ports:
                self.counters["no_free_port"] += 1
                log.error("%s: no egress port left for the interest of %s", self.cfg.name,
                          self.names.get(key[1], key[1]))
                continue
            port = self._free_ports.pop()
            egress = f"{key[0]}:{key[1]}"
            self.compiler.add_egress(egress, port)
            for ns, pattern in sorted(patterns):
                try:
                    self.compiler.subscribe(egress, pattern, ns)
                except (TopicError, OffloadError) as exc:  # checked by its schema already
                    self.counters["interest_refused"] += 1
                    log.warning("%s: interest of %s not applied: %s", self.cfg.name,
                                self.names.get(key[1], key[1]), exc)
            self.dest_egress[key] = (port, patterns)

    def _build_snapshot(self) -> None:
        self._tables_dirty = False
        self._synced_registry = self.registry.version
        self._install_tables()
        try:
            self._pending_snapshot = self.compiler.build()
        except OffloadError as exc:
            self.counters["compile_failed"] += 1
            log.error("%s: compiling tables failed: %s", self.cfg.name, exc)

    def _advertise_interest(self) -> None:
        self._interest_dirty = False
        advertised = _minimal(p for s in self.sessions.values() for p in s.patterns)
        gadvertised = _minimal(p for s in self.sessions.values() for p in s.gpatterns)
        if advertised != self.advertised or gadvertised != self.gadvertised:
            self.advertised = advertised
            self.gadvertised = gadvertised
            self.interest_seq += 1
            self._flood(al.ControlKind.INTEREST, self._interest_doc())

    # --- clients ------------------------------------------------------------------------------
    def _on_client(self, channel: str, peer: int, data: bytes, now_ns: int) -> None:
        try:
            frame = decode_frame(data)
        except ProtocolError:
            self.counters["client_malformed"] += 1
            return
        ftype = frame.header.frame_type
        _, entries = frame.admin()
        sid = self.session_of_peer.get((channel, peer))
        session = self.sessions.get(sid) if sid is not None else None
        if ftype is FrameType.CONTROL and entries[0].kind is al.ControlKind.LOGIN:
            try:
                doc = validate(al.ControlKind.LOGIN, entries[0].document, "client")
            except DocumentError as exc:
                self._bad_document(channel, peer, exc, now_ns)
                if channel != CLIENT_SHM:  # a ring is named by the document
                    self._refuse_login(channel, peer, None, "bad_document", str(exc))
                return
            self._login(channel, peer, doc, now_ns)
            return
        if session is None or frame.header.source_session != session.session_id:
            self.counters["client_no_session"] += 1
            return
        session.last_heard_ns = now_ns
        if ftype in (FrameType.SUBSCRIBE, FrameType.UNSUBSCRIBE):
            for entry in entries:
                self._subscribe(session, entry, ftype is FrameType.SUBSCRIBE)
        elif ftype is FrameType.REGISTRY_UPDATE:
            self._register(session, entries)
        elif ftype is FrameType.CONTROL:
            for entry in entries:
                try:
                    doc = validate(entry.kind, entry.document, "client")
                except DocumentError as exc:
                    self._bad_document(channel, peer, exc, now_ns)
                    continue
                if entry.kind is al.ControlKind.RESOLVE:
                    self._resolve(session, doc["keys"])
                elif entry.kind is al.ControlKind.LOGOUT:
                    self._end_session(session, "logout")
                    return
                else:  # a LOGIN after the first entry
                    self.counters["client_unexpected"] += 1
        elif ftype is FrameType.HEARTBEAT:
            pass
        else:
            self.counters["client_unexpected"] += 1

    def _deny(self, identity: str, action: str, pattern: str) -> None:
        """Count a denial per (identity, action, pattern): at most DENIALS_KEPT rows, each
        text cut to DENIAL_TEXT_CHARS; a denial that would need a new row beyond is counted
        in ``denials_dropped`` only (a flood of distinct names cannot grow the status)."""
        self.counters["denials"] += 1
        key = (identity[:DENIAL_TEXT_CHARS], action, pattern[:DENIAL_TEXT_CHARS])
        if key in self.denials or len(self.denials) < DENIALS_KEPT:
            self.denials[key] += 1
        else:
            self.counters["denials_dropped"] += 1

    def _client_port(self) -> int | None:
        """An egress port for a client's egress, or None when only the ones kept for
        destination appliances (APPLIANCE_EGRESS_PORTS) are left."""
        if len(self._free_ports) <= APPLIANCE_EGRESS_PORTS:
            return None
        return self._free_ports.pop()

    def _refuse_login(self, channel: str, peer: int, ring: object, why: str,
                      reason: str) -> None:
        """Answer a login with a refusal (counted ``login_refused_<why>``)."""
        self.counters[f"login_refused_{why}"] += 1
        doc_out = {"accepted": False, "reason": reason, "node": self.cfg.name}
        frame = encode_admin(FrameType.CONTROL, [self._control(al.ControlKind.LOGIN_RESULT,
                                                               doc_out)],
                             source_session=self.node_id, send_ts_ns=time.time_ns())
        if channel == CLIENT_SHM:
            if isinstance(ring, str):
                self.dp.offer_admin("ring", ring, frame)  # type: ignore[arg-type]
        else:
            self.dp.offer_admin(channel, peer, frame)

    def _login(self, channel: str, peer: int, doc: dict, now_ns: int) -> None:
        """A LOGIN whose document ``validate`` accepted."""
        identity = doc["identity"]
        ring = doc.get("ring")
        refuse = why = None
        ents = pmod.entitlements_of(self.pm_doc, identity)
        if not self.accepting:
            refuse, why = "the appliance is shutting down", "stopping"
        elif self.pm_doc is None:
            refuse, why = "no P&M document yet; retry in a moment", "no_pm"
        elif ents is None:
            refuse, why = f"identity {identity!r} is not known to P&M", "identity"
            self._deny(identity, "login", "")
        elif len(self.sessions) >= self.cfg.max_sessions:
            refuse, why = (f"all {self.cfg.max_sessions} client sessions are taken "
                           "(clients.max_sessions)"), "sessions"
        elif channel == CLIENT_SHM and not isinstance(ring, str):
            refuse, why = "a shared-memory client must name its reply ring", "no_ring"
        token = doc.get("token")
        old = self.session_of_peer.get((channel, peer))
        if old is not None and old in self.sessions:
            session = self.sessions[old]
            if (self.accepting and isinstance(token, int) and token == session.login_token
                    and session.identity == identity):
                self.counters["login_repeats"] += 1
                self._reply(session, al.ControlKind.LOGIN_RESULT, self._login_result(session))
                return
            self._end_session(session, "replaced by a new login")
        tx = None
        if refuse is None and channel == CLIENT_SHM:
            from channels.shm import ShmChannel

            try:
                tx = ShmChannel(tx=ring)
            except Exception as exc:
                refuse, why = f"cannot open reply ring {ring!r}: {exc}", "ring"
        port = self._client_port() if refuse is None else None
        if refuse is None and port is None:  # ports of ended sessions wait for a snapshot
            refuse, why = ("no egress port is free for another client session on this "
                           "appliance; retry later"), "ports"
        if refuse is not None or port is None:
            if tx is not None:
                tx.close()
            self._refuse_login(channel, peer, ring, str(why), str(refuse))
            return
        sid = random.randrange(1, 2**31)
        while sid in self.sessions or sid in self.names:
            sid = random.randrange(1, 2**31)
        self.compiler.add_egress(f"c:{sid}", port)
        session = Session(sid, identity, channel, peer, ents, port, ring, now_ns,
                          login_token=token if isinstance(token, int) else None)
        self.sessions[sid] = session
        self.session_of_peer[(channel, peer)] = sid
        dest = sid if channel == CLIENT_SHM else peer
        dps = DpSession(sid, identity, channel, dest, tx)
        self.dp.commands.offer(lambda: self.dp.add_session(dps, (channel, peer)))
        self._tables_dirty = True
        log.info("%s: client %r logged in (session %d, %s)", self.cfg.name, identity, sid,
                 channel)
        self._reply(session, al.ControlKind.LOGIN_RESULT, self._login_result(session))

    def _login_result(self, session: Session) -> dict:
        return {"accepted": True, "session": session.session_id, "node": self.cfg.name,
                "node_id": self.node_id, "schemas": (self.pm_doc or {}).get("schemas", [])}

    def _end_session(self, session: Session, why: str) -> None:
        if self.sessions.pop(session.session_id, None) is None:
            return
        for key, sid in list(self.session_of_peer.items()):
            if sid == session.session_id:
                del self.session_of_peer[key]
        self.compiler.remove_egress(f"c:{session.session_id}")
        self._quarantine.append(session.port)
        self._retired[session.port] = ("client", session.session_id)
        if session.gport is not None:
            self.compiler.remove_egress(f"g:{session.session_id}")
            self._quarantine.append(session.gport)
            self._retired[session.gport] = ("gclient", session.session_id)
        sid = session.session_id
        self.dp.commands.offer(lambda: self.dp.remove_session(sid))
        self._interest_dirty = True
        self._tables_dirty = True
        log.info("%s: client %r session %d ended (%s)", self.cfg.name, session.identity,
                 session.session_id, why)

    def _expire_sessions(self, now_ns: int, paused_ns: int) -> None:
        """Log out clients silent for session_dead_ms; after a stall of this process
        (``paused_ns``: its threads did not run, e.g. compiling or a busy host) their
        heartbeats may still sit unread, so they get half the interval again first."""
        dead_ns = self.cfg.session_dead_ms * 1_000_000
        if paused_ns > dead_ns // 2:
            for session in self.sessions.values():
                session.last_heard_ns = max(session.last_heard_ns, now_ns - dead_ns // 2)
        for session in list(self.sessions.values()):
            if now_ns - session.last_heard_ns > dead_ns:
                self._end_session(session, "silent")

    def _subscribe(self, session: Session, entry: al.Subscription, add: bool) -> None:
        pattern, ns = entry.pattern, entry.namespace_id
        result = {"request": "subscribe" if add else "unsubscribe", "sub_id": entry.sub_id,
                  "pattern": pattern, "accepted": True}
        guaranteed = entry.qos == QOS_GUARANTEED
        sid = session.session_id
        try:
            refused = self._subscribe_refused(session, entry, add)
            if refused is not None:
                result.update(accepted=False, reason=refused)
            elif add:
                if not session.ents.may_subscribe(pattern):
                    self._deny(session.identity, "subscribe", pattern)
                    result.update(accepted=False, reason=f"identity {session.identity!r} may "
                                  f"not subscribe to {pattern!r}")
                else:
                    if guaranteed and session.gport is None:
                        session.gport = self._client_port()
                        if session.gport is None:  # checked by _subscribe_refused
                            raise OffloadError("no egress port is free")
                        self.compiler.add_egress(f"g:{sid}", session.gport)
                    self.compiler.subscribe(f"g:{sid}" if guaranteed else f"c:{sid}", pattern,
                                            ns)
            else:  # an unsubscribe applies to both classes (the client keeps one list)
                self.compiler.unsubscribe(f"c:{sid}", pattern, ns)
                if session.gport is not None:
                    self.compiler.unsubscribe(f"g:{sid}", pattern, ns)
        except (TopicError, OffloadError) as exc:
            result.update(accepted=False, reason=str(exc))
        if result["accepted"]:
            if add:
                session.qos[(ns, pattern)] = QOS_NAMES.get(entry.qos, "best-effort")
            session.patterns = self._positive(f"c:{sid}")
            if session.gport is not None:
                session.gpatterns = self._positive(f"g:{sid}")
            if len(session.qos) > len(session.patterns) + len(session.gpatterns):
                session.qos = {k: q for k, q in session.qos.items()
                               if k in session.patterns or k in session.gpatterns}
            self._interest_dirty = True
            self._tables_dirty = True
            # answered once the tables with it are live: a message published after the
            # client heard "accepted" reaches it
            session.pending += 1
            self._replies_when_live.append((session, al.ControlKind.REQUEST_RESULT, result))
        else:
            self._reply(session, al.ControlKind.REQUEST_RESULT, result)

    def _subscribe_refused(self, session: Session, entry: al.Subscription, add: bool
                           ) -> str | None:
        """Why a (un)subscribe must be refused for a limit (counted ``refused_<limit>``), or
        None. May raise TopicError (the pattern is not one)."""
        cfg = self.cfg
        why = reason = None
        if session.pending >= cfg.max_pending_requests:
            why, reason = "pending", (f"{session.pending} requests of this session are still "
                                      "waiting for their answer (clients.max_pending_requests "
                                      f"= {cfg.max_pending_requests}); wait for them")
        elif add and entry.qos == QOS_GUARANTEED and session.gport is None:
            held = sum(1 for s in self.sessions.values() if s.gport is not None)
            if held >= cfg.max_guaranteed_sessions:
                why, reason = "guaranteed", (
                    f"all {cfg.max_guaranteed_sessions} guaranteed subscriber places of this "
                    "appliance are taken (clients.max_guaranteed_sessions)")
            elif len(self._free_ports) <= APPLIANCE_EGRESS_PORTS:
                why, reason = "ports", ("no egress port is free for another guaranteed "
                                        "subscriber on this appliance; retry later")
        if why is None:
            entries = self._list_entries(session)
            if entries + 2 > cfg.max_subscriptions and entries + self._list_growth(
                    session, entry, add) > cfg.max_subscriptions:
                why, reason = "subscriptions", (
                    f"the session's subscription lists hold {entries} entries, at most "
                    f"{cfg.max_subscriptions} (clients.max_subscriptions); unsubscribe "
                    "first")
        if why is None:
            return None
        self.counters[f"refused_{why}"] += 1
        return reason

    def _session_lists(self, session: Session) -> list[tuple[str, Any]]:
        """(egress name, egress) of the session's egresses (best-effort, guaranteed)."""
        egresses = self.compiler.egresses
        names = [f"c:{session.session_id}", f"g:{session.session_id}"]
        return [(name, egresses[name]) for name in names if name in egresses]

    def _list_entries(self, session: Session) -> int:
        """Entries of the session's subscription lists, both classes together."""
        return sum(len(lst) for _, egress in self._session_lists(session)
                   for lst in egress.lists.values())

    def _list_growth(self, session: Session, entry: al.Subscription, add: bool) -> int:
        """How many entries the request would add to the session's lists (tried on copies)."""
        target = f"{'g' if entry.qos == QOS_GUARANTEED else 'c'}:{session.session_id}"
        held = dict(self._session_lists(session))
        names = [target] if add else list(held)
        grow = 0
        for name in names:
            egress = held.get(name)
            lst = egress.lists.get(entry.namespace_id) if egress is not None else None
            trial = copy.deepcopy(lst) if lst is not None else SubscriptionList()
            before = len(trial)
            (trial.subscribe if add else trial.unsubscribe)(entry.pattern)
            grow += len(trial) - before
        return grow

    def _positive(self, egress: str) -> Counter:
        return Counter({(n, p): 1 for n, lst in self.compiler.egresses[egress].lists.items()
                        for p in lst.positive_patterns()})

    def _register(self, session: Session, entries: list) -> None:
        granted, results = [], []
        for entry in entries:
            result = {"request": "register", "topic": entry.topic,
                      "namespace": entry.namespace_id, "accepted": True}
            try:
                key = self.registry.key_of(entry.topic, entry.namespace_id)
                if key != entry.topic_key:
                    raise RegistryError(f"key {entry.topic_key:#x} is not the key of "
                                        f"{entry.topic!r}")
                limit = self.cfg.max_registrations
                if key not in session.registered and len(session.registered) >= limit:
                    self.counters["refused_registrations"] += 1
                    result.update(accepted=False, reason=f"the session registered {limit} "
                                  "topics, as many as one session may "
                                  "(clients.max_registrations)")
                elif not session.ents.may_publish(entry.topic):
                    self._deny(session.identity, "publish", entry.topic)
                    result.update(accepted=False, reason=f"identity {session.identity!r} may "
                                  f"not publish to {entry.topic!r}")
                else:
                    new = self._merge_registry([entry], None)
                    del new
                    granted.append(key)
                    session.registered.add(key)
            except (RegistryError, TopicError) as exc:
                result.update(accepted=False, reason=str(exc))
            results.append(result)
        if granted:  # before the replies: the data path allows the keys before a publish
            sid = session.session_id
            self.dp.commands.offer(lambda: self.dp.allow_keys(sid, granted))
        for result in results:
            self._reply(session, al.ControlKind.REQUEST_RESULT, result)

    def _resolve(self, session: Session, keys: list) -> None:
        records = []
        for key in keys[:4096]:
            found = self.registry.lookup(int(key))
            if found is not None:
                records.append(al.RegistryEntry(int(key), found[0], found[1]))
        if not records:
            return
        dest = session.session_id if session.channel == CLIENT_SHM else session.peer
        chunk: list = []
        size = 0
        for r in records:
            cost = 24 + len(r.topic.encode())
            if chunk and size + cost > REGISTRY_FRAME_BYTES:
                self._to_client((session.channel, dest), FrameType.REGISTRY_UPDATE, chunk,
                                {"version": self.registry.version}, session.session_id)
                chunk, size = [], 0
            chunk.append(r)
            size += cost
        self._to_client((session.channel, dest), FrameType.REGISTRY_UPDATE, chunk,
                        {"version": self.registry.version}, session.session_id)

    def logout_all(self) -> None:
        """Tell every client and neighbour the appliance is going away (shutdown)."""
        self.accepting = False
        for session in list(self.sessions.values()):
            self._reply(session, al.ControlKind.LOGOUT, {"reason": "appliance shutting down"})
        self._flood(al.ControlKind.LOGOUT, {"reason": "appliance shutting down"})

    # --- management commands ------------------------------------------------------------------
    def submit(self, command: str, args: dict, timeout_s: float) -> dict:
        done = threading.Event()
        out: dict = {}
        with self._requests_lock:
            self.requests.append((command, args, done, out))
        if not done.wait(timeout_s):
            return {"ok": False, "error": f"control: {command!r} not applied within "
                    f"{timeout_s} s; the appliance is busy or stopping"}
        return out

    def _run_requests(self) -> int:
        with self._requests_lock:
            requests, self.requests = self.requests, []
        for command, args, done, out in requests:
            try:
                out.update(self._command(command, args))
            except (KeyError, TypeError, ValueError) as exc:
                out.update(ok=False, error=f"control: {command}: bad arguments ({exc})")
            except Exception as exc:  # a command's failure is its answer, not the agent's end
                self.counters["command_failed"] += 1
                log.error("%s: command %r failed", self.cfg.name, command, exc_info=exc)
                out.update(ok=False, error=f"control: {command} failed "
                           f"({type(exc).__name__}: {exc})")
            done.set()
        return len(requests)

    def _node_named(self, name: object) -> int:
        for node, known in self.names.items():
            if known == name:
                return node
        raise ValueError(f"no appliance named {name!r}")

    def _command(self, command: str, args: dict) -> dict:
        if command == "disconnect_client":
            session = self.sessions.get(int(args["session"]))
            if session is None:
                return {"ok": False, "error": f"control: no client session {args['session']}"}
            self._reply(session, al.ControlKind.LOGOUT, {"reason": "disconnected by management"})
            self._end_session(session, "disconnected by management")
            return {"ok": True}
        if command in ("set_route", "clear_route"):
            if self.cfg.pm_mode != "embedded" or self.pm_doc is None:
                return {"ok": False, "error": f"control: {command} goes to the P&M appliance "
                        f"({(self.pm_doc or {}).get('pm', 'unknown')}): route overrides are "
                        "part of its document"}
            src, dst = self._node_named(args["source"]), self._node_named(args["destination"])
            routes = {(int(a), int(b)): tuple(p) for a, b, p in self.pm_doc.get("routes", [])}
            if command == "set_route":
                path = tuple(self._node_named(n) for n in args["path"])
                graph = getattr(self, "graph", {})
                if path[0] != src or path[-1] != dst or path_cost(graph, path) is None:
                    return {"ok": False, "error": "control: set_route: the path must go from "
                            "source to destination over links that are up"}
                routes[(src, dst)] = path
            else:
                routes.pop((src, dst), None)
            self.pm_doc = {**self.pm_doc, "version": max(int(self.pm_doc["version"]) + 1,
                                                         time.time_ns() // 1_000),
                           "routes": [[a, b, list(p)] for (a, b), p in sorted(routes.items())]}
            self._apply_pm(self.pm_doc)
            self._flood(al.ControlKind.PM_UPDATE, self.pm_doc)
            return {"ok": True, "pm_version": self.pm_doc["version"]}
        if command == "set_routes":  # a route table: appliance/control/route_apply.py
            return self.routes_ext.apply(args.get("table"))
        return {"ok": False, "error": f"control: unknown command {command!r}; known: "
                "disconnect_client, set_route, clear_route, set_routes"}

    # --- status -------------------------------------------------------------------------------
    def _build_status(self, now_ns: int) -> None:
        self._status_at = now_ns + STATUS_REFRESH_NS
        name = self.names.get
        published = self.dp.published
        dp_counters = published.get("counters", {})
        offload = dict(published.get("offload", {}))
        offload.setdefault("verdicts", {})
        offload.setdefault("malformed", {})
        offload["keys"] = len(self.registry)
        for k in ("off_path", "unknown_peer", "transit_frames", "unroutable", "parked_expired",
                  "publish_denied", "no_port"):
            offload[k] = int(dp_counters.get(k, 0))
        subs = []
        local: Counter = Counter()
        qos_of: dict = {}
        for s in self.sessions.values():
            for key in s.patterns:
                local[(*key, False)] += 1
                qos = s.qos.get(key, "best-effort")
                qos_of.setdefault((*key, False), "best-effort" if qos == "guaranteed" else qos)
            for key in s.gpatterns:
                local[(*key, True)] += 1
                qos_of[(*key, True)] = "guaranteed"
        for (ns, pattern, g), n in sorted(local.items()):
            subs.append({"origin": self.cfg.name, "pattern": pattern, "namespace": ns,
                         "qos": qos_of[(ns, pattern, g)], "clients": n})
        for origin, (_, _, patterns, gpatterns) in sorted(self.interest.items()):
            for ns, pattern in sorted(patterns):
                subs.append({"origin": name(origin, str(origin)), "pattern": pattern,
                             "namespace": ns, "qos": "best-effort", "clients": 0})
            for ns, pattern in sorted(gpatterns):
                subs.append({"origin": name(origin, str(origin)), "pattern": pattern,
                             "namespace": ns, "qos": "guaranteed", "clients": 0})
        sessions = published.get("sessions", {})
        self.status_snapshot = {
            "node": {"name": self.cfg.name, "id": self.node_id, "role": self.cfg.role,
                     "epoch": self.epoch, "uptime_s": (now_ns - self.start_ns) / 1e9,
                     "pm": (self.pm_doc or {}).get("pm")},
            "neighbours": [{
                "name": nb.config.name, "id": nb.node_id,
                "address": f"{nb.config.address[0]}:{nb.config.address[1]}",
                "state": "up" if nb.up else "down",
                "last_heard_ms": (now_ns - nb.last_heard_ns) / 1e6 if nb.last_heard_ns else None,
                "rtt_us": nb.rtt_us, "group": nb.config.group,
                "group_heard_ms": ((now_ns - nb.group_heard_ns) / 1e6 if nb.group_heard_ns
                                   else None)} for nb in self.neighbours.values()],
            "subscriptions": subs,
            "routes": [{"source": name(s, str(s)), "destination": name(d, str(d)),
                        "path": [name(x, str(x)) for x in path], "cost": cost}
                       for (s, d), (cost, path) in sorted(self.paths.items())],
            "channels": channel_rows(published.get("channels", [])),
            "offload": offload,
            "denials": [{"identity": i, "action": a, "pattern": p, "count": n}
                        for (i, a, p), n in sorted(self.denials.items())],
            "auth": {"rejected": dict(self.auth.rejected), "accepted": self.auth.accepted},
            "clients": [{"session": s.session_id, "identity": s.identity, "channel": s.channel,
                         "subscriptions": sorted({p for _, p in s.patterns}
                                                 | {p for _, p in s.gpatterns}),
                         "published": sessions.get(s.session_id, {}).get("published", 0),
                         "delivered": sessions.get(s.session_id, {}).get("delivered", 0)}
                        for s in self.sessions.values()],
            "counters": {**{k: int(v) for k, v in dp_counters.items()},
                         **{f"control_{k}": int(v) for k, v in self.counters.items()}},
            "jit": self.jit.status() if self.jit is not None else None,
        }


def _minimal(patterns: Any) -> frozenset[tuple[int, str]]:
    """(namespace, pattern) pairs with superset suppression per namespace."""
    by_ns: dict[int, list[str]] = {}
    for ns, pattern in patterns:
        by_ns.setdefault(ns, []).append(pattern)
    return frozenset((ns, p) for ns, found in by_ns.items() for p in minimal_patterns(found))


def _lsa_to_doc(lsa: Lsa) -> dict:
    return {"origin": lsa.origin, "name": lsa.name, "epoch": lsa.epoch, "seq": lsa.seq,
            "links": [list(x) for x in lsa.links]}
