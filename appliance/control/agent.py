"""The control agent: neighbours, link state, paths, interest, P&M, client sessions, the compiler.

It runs on its own thread (an ``AgentRunner`` with a sleeping idle strategy: it runs timers
and admin frames, not the hot path). It owns the routing state, the ``OffloadCompiler`` and
the P&M document; it reaches the data path only through the data path's port: commands
(``command``), admin frames both ways (``offer_admin``, ``inbox``), ``publish_snapshot`` and
the counters it publishes; the port is the same whether the data path runs on a thread of
this process or in a process of its own (appliance/dataplane/process.py). Wire behaviour:
docs/appliance.md ("Control plane", "Clients").
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from typing import Any

from appliance.config import (
    AUTH_LOG_INTERVAL_NS,
    CONTROL_PENDING_POLL_NS,
    CONTROL_TABLES_INTERVAL_NS,
    LOG_SOURCES_KEPT,
    LSA_MAX_AGE_REFRESHES,
    STATUS_COST_SHARE,
    STATUS_IDLE_REFRESH_NS,
    STATUS_REFRESH_NS,
    ApplianceConfig,
)
from appliance.control import acl_apply, rendezvous, route_apply, selector_apply
from appliance.control import auth as auth_mod
from appliance.control import pm as pmod
from appliance.control.auth import FabricAuth, epoch_of, group_link_id, hello_link_id
from appliance.control.clients import ClientSide
from appliance.control.documents import DocumentError
from appliance.control.fabric import FabricSide
from appliance.control.management import ManagementSide
from appliance.control.mirror import Mirror
from appliance.control.port_pool import PortPool
from appliance.control.remote_replay import Forwarder, send_answers
from appliance.control.replay import ReplaySide
from appliance.control.routing import Lsa
from appliance.control.state import (
    INBOX_PER_CYCLE,
    REPLY_FRAME_BYTES,
    Neighbour,
    Session,
    log,
)
from appliance.control.successor import Successors
from appliance.dataplane.agent import (
    CLIENT_SHM,
    FABRIC,
    GROUP_RX,
    DataPlaneAgent,
)
from appliance.dataplane.frame_auth import DataAuth
from appliance.dataplane.names import CACHE_NAK_CHANNEL, GROUP_TX, PERSISTED_CHANNEL
from appliance.dataplane.remote_persist import PERSISTED_BEACON_NS
from channels.udp import peer_id_of
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.codec import encode_admin
from datapath.protocol.errors import ProtocolError
from datapath.protocol.frame_layout import FrameType
from datapath.topics.registry import KeyRegistry
from nic_offload.compiler import OffloadCompiler
from nic_offload.model import CPU_PORT, MAX_EGRESS_PORT

__all__ = ["ControlAgent", "Neighbour", "Session"]

_HEARTBEAT_TYPES = frozenset((int(FrameType.HELLO), int(FrameType.HEARTBEAT)))
"""Admin frames that are no news for the status (a neighbour's or a client's heartbeat)."""


_COMPACT_JSON = json.JSONEncoder(separators=(",", ":")).encode
"""``json.dumps(doc, separators=(",", ":"))`` without a new encoder per call (a registration
of 100,000 topics makes 100,000 answers)."""


class ControlAgent(FabricSide, ClientSide, ReplaySide, ManagementSide):
    """See the module docstring. Its methods live in three files by responsibility, one class
    each, which it inherits: ``control/fabric.py`` (``FabricSide``: neighbours, link state,
    interest, tables), ``control/clients.py`` (``ClientSide``: sessions, subscriptions,
    registrations), ``control/replay.py`` (``ReplaySide``: replay requests to the cache) and
    ``control/management.py`` (``ManagementSide``: commands, status); this
    file holds its state, its duty cycle, its timers and the sending and logging helpers."""

    name = "control"

    def __init__(self, config: ApplianceConfig, dp: DataPlaneAgent,
                 compiler: OffloadCompiler, registry: KeyRegistry) -> None:
        """``dp``: the data path's port (``DataPlaneAgent`` on a thread of this process, or
        ``DataPathProcess``, its stand-in for a data path in a process of its own): commands,
        admin frames both ways, snapshots, its published counters."""
        self.cfg = config
        self.node_id = config.node_id
        self.dp = dp
        self.wakeup = threading.Event()
        """Set by whoever hands the agent work (the data path's inbox, management requests):
        it ends the agent's idle wait (``WakeableIdle``)."""
        dp.control_wakeup = self.wakeup
        self.compiler = compiler
        self.registry = registry
        self.start_ns = time.monotonic_ns()
        start_ns = auth_mod.wall_clock_ns()
        self.epoch = epoch_of(start_ns)
        """This incarnation's start time in ms (64 bits: it never wraps); orders its link
        state and interest after a restart (control/auth.py)."""
        self.auth = FabricAuth(config.fabric_key, config.fabric_key_id, self.epoch, start_ns)
        if config.fabric_key is not None:  # the data path signs its frames to neighbours
            dp_auth = FabricAuth(config.fabric_key, config.fabric_key_id, self.epoch, start_ns)
            dp.command("use_guaranteed_auth", dp_auth)
            groups = {nb.group for nb in config.neighbours if nb.group}
            data_auth = DataAuth(config.fabric_key, config.fabric_key_id, self.epoch,
                                 config.node_id, start_ns,
                                 {prefix + g: group_link_id(g) for g in groups
                                  for prefix in (GROUP_RX, GROUP_TX)})
            dp.command("use_data_auth", data_auth)
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
        self.asked_to_move: dict[int, str] = {}
        """Session -> identity of the sessions asked to move (``move_clients``), until their
        standby tells of the move (SESSION_MOVE); the newest ASKED_MOVES_KEPT."""
        self.trusted_login_token = os.urandom(32).hex()
        """The proof a login of this appliance's own process gives instead of a password:
        the MQTT edge, which authenticated its client itself (password or certificate)."""
        self._challenges: dict[tuple[str, int], tuple[str, str, str, int]] = {}
        """(channel, peer) -> (identity, client nonce, server nonce, expiry ns) of the logins
        waiting for the proof of a password (ClientSide._credential)."""
        self.counters: Counter[str] = Counter()
        self.dest_egress: dict[tuple[str, int], tuple[int, frozenset[tuple[int, str]]]] = {}
        """("n" or "g", node) -> (port, patterns): an appliance's best-effort and guaranteed
        interest as egresses ``n:NODE`` and ``g:NODE``."""
        self.gadvertised: frozenset[tuple[int, str]] = frozenset()
        self._free_ports = PortPool(1, MAX_EGRESS_PORT, CPU_PORT)
        self._quarantine: list[int] = []
        self._retired: dict[int, tuple[str, int]] = {}
        """Quarantined ports -> what they led to: the forwarding tables keep them until the
        snapshot that no longer uses them is published (its predecessor may still run)."""
        self._interest_changed: set[int] = set()
        """Sessions whose patterns changed, or that ended, since the interest was last
        computed (``InterestSets.update`` looks at these only)."""
        self._port_changes: dict[int, tuple[str, int] | None] = {}
        """Client sessions' ports ("client"/"gclient") changed since the last table build:
        port -> what it leads to, None once it is free again. They reach the data path as a
        ``set_ports`` command (a patch) at the next build; the forwarding tables themselves
        carry only the destination appliances' ports, so a login or logout costs no pass
        over every session (``_install_tables``)."""
        self._topology_dirty = True
        self._interest_dirty = True
        self._tables_dirty = True
        self._selectors_dirty = False
        self._selectors_synced: tuple = ()
        self._selectors_sent = False
        self.advertised_selective: dict = {}
        """This appliance's selective interest (control/selector_apply.py)."""
        self.interest_selectors: dict = {}
        """Origin -> ((epoch, seq) of its interest, {(ns, pattern): selector texts})."""
        """Selector guards handed to the data path (control/selector_apply.py)."""
        self._installed_tables: Any = None
        """The forwarding tables last given to the data path (an equal set is not sent)."""
        self._tables_at_ns = 0
        """When the tables may be compiled again (``CONTROL_TABLES_INTERVAL_NS``)."""
        self._lsa_due = True
        self._heartbeat_at = 0
        self._timers_ran_ns = time.monotonic_ns()
        self._refresh_at = 0
        self._status_at = 0
        self._status_quiet = False
        """Whether nothing but heartbeats and timers ran since the status was last built (it
        is then rebuilt every ``STATUS_IDLE_REFRESH_NS``, not every ``STATUS_REFRESH_NS``)."""
        self._status_built_ns = 0
        self._status_gap_ns = STATUS_REFRESH_NS
        """The busy pace of the status: ``STATUS_REFRESH_NS``, or ``STATUS_COST_SHARE`` times
        what the last build took when that is longer (a status of 10,000 sessions took
        0.3 s on a loaded host: rebuilt every 250 ms it held the control thread)."""
        self._status_published: object = None
        """The data path's publish the status was built from (a new one is news)."""
        self._persist_checked: object = None
        """The data path's published state last checked for sessions to end (clients.py)."""
        self._rows_cache: tuple[dict, list] | None = None
        """(the data path's publish, the status's channel rows worked out from it)."""
        self._log_at: dict[tuple[str, int], int] = {}
        """(channel, peer) -> when it may be logged again (at most LOG_SOURCES_KEPT)."""
        self._log_full_at = 0
        self._pending_snapshot = None
        self._installed_snapshot: Any = compiler.snapshot
        """The snapshot the data path has (the compiler hands the same one back when a
        change leaves the tables as they were: nothing is sent then)."""
        self._replies_when_live: list[tuple[Session, al.ControlKind, dict]] = []
        """Replies held until the tables they depend on are live in the data path."""
        self.successors = Successors()
        """Successor delivery's records and routes (control/successor.py)."""
        self.mirror = Mirror(config.mirror_to)
        """The standby's mirror: the sessions sent to ``clients.mirror_to`` and those kept
        for neighbours (control/mirror.py)."""
        self._synced_registry = registry.version
        self.requests: list[tuple[str, dict, threading.Event, dict]] = []
        self._requests_lock = threading.Lock()
        self.accepting = True
        self.status_snapshot: dict[str, Any] = {}
        self.jit: Any = None
        """The process's ``datapath.jit.JitWatch`` (set by the appliance once it preloaded)."""
        self.cache = None
        self._persisted_beacon_at = 0
        self._remote_patterns: frozenset | None = None
        """``cache.remote``: the patterns that neighbour's cache keeps (its beacon)."""
        self._remote_ready = False
        self.internal_logins = {}
        self.forwarder = (Forwarder(self, config.cache_serve_from)
                          if config.cache_serve_from is not None else None)
        """``cache.serve_from``: replay requests no cache here keeps go to that neighbour's
        cache (control/remote_replay.py)."""
        self.acl_ids: dict[str, int] = {}
        """Content ACL class name -> its id in the tables (control/acl_apply.py)."""
        acl_apply.apply_acl(self, self.pm_doc)
        self.rdv = (rendezvous.Rendezvous(self) if config.routing_content == "rendezvous"
                    else None)
        """Rendezvous content routing (control/rendezvous.py); None in flood mode."""
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
            if channel == CACHE_NAK_CHANNEL:  # the data path's request (not a frame)
                if self.cache is not None:
                    self.cache.on_nak_request(data)
                continue
            if channel == PERSISTED_CHANNEL:  # the data path's report for a neighbour
                self._send_persisted(data)
                continue
            if len(data) <= fl.TYPE_OFFSET or data[fl.TYPE_OFFSET] not in _HEARTBEAT_TYPES:
                self._status_news(now_ns)
            try:
                self._on_admin(channel, peer, data, now_ns)
            except Exception as exc:  # whatever a frame does, it ends here: the agent goes on
                self._bad_admin(channel, peer, exc, now_ns)
        requests = self._run_requests()
        work += requests + self._timers(now_ns)
        if self.forwarder is not None:
            work += self.forwarder.expire(now_ns)
        if self.cache is not None and self.cache.relay_out:  # answers to forwarded requests
            work += send_answers(self)
        if self.cache is not None or self.cfg.persist_remote is not None:
            self._persisted_timers(now_ns)
        if self.mirror.target is not None:
            self.mirror.timers(self, now_ns)
        routed = self.routes_ext.do_work(now_ns)
        work += routed
        if self.rdv is not None:
            work += self.rdv.do_work(now_ns)
        if requests or routed or self._topology_dirty or self._tables_dirty \
                or self.dp.published is not self._status_published:
            self._status_news(now_ns)
        if self.dp.published is not self._persist_checked:
            self._persist_checked = self.dp.published
            self._end_unpersisted_sessions(self._persist_checked)
        if self.registry.version != self._synced_registry:
            self._tables_dirty = True
        if self._topology_dirty:
            self._recompute_topology()
            work += 1
        if self._interest_dirty:
            self._advertise_interest()
            work += 1
        if self._tables_dirty and now_ns >= self._tables_at_ns:
            self._tables_at_ns = now_ns + CONTROL_TABLES_INTERVAL_NS
            self._sync_destinations()
            self._build_snapshot()
            work += 1
        if self._pending_snapshot is not None and self.dp.commands_pending() == 0:
            if self._pending_snapshot is not self._installed_snapshot:  # else: nothing changed
                self.dp.publish_snapshot(self._pending_snapshot)
                self._installed_snapshot = self._pending_snapshot
            self._pending_snapshot = None
            for port in self._quarantine:
                self._free_ports.append(port)
                what = self._retired.get(port)
                if what is not None and what[0] in ("client", "gclient"):
                    self._port_changes[port] = None  # out of the data path's map
            self._quarantine.clear()
            self._retired.clear()
        if self._replies_when_live and not self._tables_dirty and self._pending_snapshot is None:
            by_session: dict[int, tuple[Session, al.ControlKind, list[dict]]] = {}
            for session, kind, doc in self._replies_when_live:
                session.pending = 0
                held = by_session.get(id(session))
                if held is None or held[1] is not kind:
                    if held is not None:
                        self._reply_many(*held)
                    held = by_session[id(session)] = (session, kind, [])
                held[2].append(doc)
            for held in by_session.values():  # packed: one frame answers many subscribes
                self._reply_many(*held)
            self._replies_when_live.clear()
        if now_ns >= self._status_at:
            began = time.monotonic_ns()
            self._build_status(now_ns)
            self._status_gap_ns = max(STATUS_REFRESH_NS,
                                      STATUS_COST_SHARE * (time.monotonic_ns() - began))
            self._status_at = now_ns + self._status_gap_ns
            self._status_built_ns, self._status_published = now_ns, self.dp.published
            if self._status_quiet:
                self._status_at = now_ns + max(STATUS_IDLE_REFRESH_NS, self._status_gap_ns)
            self._status_quiet = True
        return work

    def _status_news(self, now_ns: int) -> None:
        """Something other than a heartbeat happened: the status is rebuilt at the busy pace
        (within ``STATUS_REFRESH_NS`` of the last build)."""
        if self._status_quiet:
            self._status_quiet = False
            self._status_at = min(self._status_at, self._status_built_ns + self._status_gap_ns)

    def wake_at_ns(self, now_ns: int) -> int:
        """When the agent next has work if nobody hands it any: soon while it waits for the
        data path (a snapshot or replies held until the commands before them ran), when
        changed tables may be compiled (``CONTROL_TABLES_INTERVAL_NS``), else its next timer
        (heartbeats, LSA refresh, status, route-table hold and poll)."""
        tables = max(self._tables_at_ns, now_ns) if self._tables_dirty else 1 << 62
        if (self.dp.inbox or self.requests or self._pending_snapshot is not None
                or self._replies_when_live
                or (self.cache is not None and self.cache.relay_out)):
            return min(now_ns + CONTROL_PENDING_POLL_NS, tables)
        forwards = self.forwarder.wake_at_ns() if self.forwarder is not None else None
        return min(tables, self._heartbeat_at, self._refresh_at, self._status_at,
                   self.routes_ext.wake_at_ns(now_ns),
                   forwards if forwards is not None else 1 << 62)

    def on_close(self) -> None:
        return None

    # --- sending ------------------------------------------------------------------------------
    def _signed(self, ftype: FrameType, entries: list, body_header: dict | None = None,
                dest: int = 0) -> bytes:
        """A signed admin frame for the link to ``dest`` (a neighbour's node id, a group's
        ``group_link_id``, or a neighbour's ``hello_link_id`` for a discovery HELLO)."""
        frame = encode_admin(ftype, entries, body_header=body_header,
                             source_session=self.node_id, dest_session=dest,
                             send_ts_ns=time.time_ns(), auth=self.auth.next_auth())
        return bytes(self.auth.sign(frame))

    def _to_neighbour(self, nb: Neighbour, ftype: FrameType, entries: list,
                      body_header: dict | None = None) -> None:
        if self.cfg.fabric_key is None:
            return
        dest = nb.node_id
        if dest is None:  # only a discovery HELLO goes before we know its node id
            if ftype is not FrameType.HELLO:
                self.counters["neighbour_not_known"] += 1
                return
            dest = hello_link_id(nb.config.name)
        try:
            frame = self._signed(ftype, entries, body_header, dest)
        except ValueError as exc:  # a document larger than one frame: refused, not fatal
            self.counters["frame_too_large"] += 1
            log.error("%s: cannot send %s to %s: %s", self.cfg.name, ftype.name,
                      nb.config.name, exc)
            return
        self.dp.offer_admin(FABRIC, nb.peer, frame)

    def _persisted_timers(self, now_ns: int) -> None:
        """Persisted acknowledgements across the fabric (docs/fault-tolerance.md,
        "Persisted by a neighbour's cache"). A caching appliance whose cache has subscribed
        (``acknowledge = "persisted"``) tells its up neighbours every
        ``PERSISTED_BEACON_NS`` which patterns it keeps (a PERSISTED document with no
        streams). At the appliance with ``cache.remote``, the data path takes publishes
        only while that neighbour is up and its interest here holds those patterns as
        guaranteed (``remote_ready``): otherwise nothing would be routed to its cache and
        the messages would be acknowledged on receipt."""
        cache = self.cache
        if (cache is not None and cache.persisted_acks and cache.ready.is_set()
                and now_ns >= self._persisted_beacon_at):
            self._persisted_beacon_at = now_ns + PERSISTED_BEACON_NS
            doc = {"streams": [], "patterns": list(cache.settings.patterns)}
            for nb in self.neighbours.values():
                if nb.up:
                    self._to_neighbour(nb, FrameType.CONTROL, [self._control(
                        al.ControlKind.PERSISTED, doc)])
        name = self.cfg.persist_remote
        if name is None:
            return
        nb = self.neighbours.get(name)
        ready = False
        if (nb is not None and nb.up and nb.node_id is not None
                and self._remote_patterns is not None):
            held = self.interest.get(nb.node_id)
            ready = held is not None and self._remote_patterns <= held[3]
        if ready and not self._remote_ready and (self._tables_dirty or
                                                  self._pending_snapshot is not None):
            return  # told once the tables routing to its cache are the data path's (their
            # snapshot goes first): a publish routed before them would not wait for it
        if ready != self._remote_ready:
            self._remote_ready = ready
            self.counters["persisted_remote_ready_changes"] += 1
            log.info("%s: the cache of %s is %s for this appliance's publishers", self.cfg.name,
                     name, "ready" if ready else "not ready (down, or its guaranteed interest "
                     "not known here): their guaranteed publishes fail until it is")
            self.dp.command("remote_ready", ready)

    def _send_persisted(self, data: bytes) -> None:
        """What this appliance's cache persisted of a neighbour's publishers (the data
        path's report, appliance/dataplane/remote_persist.py) to that neighbour, as a
        signed CONTROL ``PERSISTED`` entry; a node that is not an up neighbour is counted."""
        doc = json.loads(data)
        node = doc["to"]
        for nb in self.neighbours.values():
            if nb.up and nb.node_id == node:
                self._to_neighbour(nb, FrameType.CONTROL, [self._control(
                    al.ControlKind.PERSISTED, {"streams": doc["streams"]})])
                self.counters["persisted_reports_sent"] += 1
                return
        self.counters["persisted_reports_unroutable"] += 1

    def _control(self, kind: al.ControlKind, doc: dict) -> al.Control:
        return al.Control(kind, _COMPACT_JSON(doc))

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

    def _reply_many(self, session: Session, kind: al.ControlKind,
                    docs: list[dict] | list[dict | str]) -> None:
        """``_reply`` of each of ``docs`` (a str: a document already encoded), packed into
        CONTROL frames of up to REPLY_FRAME_BYTES (a client takes every entry of a frame): a
        registration of 100,000 topics is answered in about 700 frames, not 100,000."""
        dest = session.session_id if session.channel == CLIENT_SHM else session.peer
        chunk: list = []
        size = 0
        for doc in docs:
            entry = al.Control(kind, doc) if isinstance(doc, str) else self._control(kind, doc)
            cost = len(entry.document) + 16
            if chunk and size + cost > REPLY_FRAME_BYTES:
                self._to_client((session.channel, dest), FrameType.CONTROL, chunk,
                                dest_session=session.session_id)
                chunk, size = [], 0
            chunk.append(entry)
            size += cost
        if chunk:
            self._to_client((session.channel, dest), FrameType.CONTROL, chunk,
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


    def _timers(self, now_ns: int) -> int:
        work = 0
        cfg = self.cfg
        if now_ns >= self._heartbeat_at:
            interval_ns = cfg.heartbeat_interval_ms * 1_000_000
            self._heartbeat_at = now_ns + interval_ns
            dead_ns = cfg.neighbour_dead_ms * 1_000_000
            # After a stall of this process (its control or data-path thread did not run for
            # half the dead interval: a busy host), heartbeats may sit unread in the socket:
            # judge neighbours once both threads have run again, not now. The timers run once
            # an interval by design, so only their lateness beyond it is a pause.
            paused_ns = max(now_ns - self._timers_ran_ns - interval_ns,
                            now_ns - self.dp.cycle_ns)
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
            if any(nb.up for nb in self.neighbours.values()):  # (else nobody to tell)
                self._flood(al.ControlKind.INTEREST, self._interest_doc())
            if self.advertised_selective:
                self._flood(al.ControlKind.INTEREST_SELECTORS,
                            selector_apply.selective_doc(self))
            if cfg.pm_mode == "embedded" and self.pm_doc is not None:
                self._flood(al.ControlKind.PM_UPDATE, self.pm_doc)
            max_age = LSA_MAX_AGE_REFRESHES * cfg.lsa_refresh_ms * 1_000_000
            for origin, heard in list(self.lsa_heard_ns.items()):
                if now_ns - heard > max_age:
                    del self.lsa_heard_ns[origin]
                    self.lsdb.pop(origin, None)
                    self._topology_dirty = True
                    if self._hold_guaranteed_interest(origin):
                        continue
                    self.interest.pop(origin, None)
                    self.interest_selectors.pop(origin, None)
                    if self.rdv is not None:
                        self.rdv.forget(origin)
                    if all(nb.node_id != origin for nb in self.neighbours.values()):
                        self.names.pop(origin, None)
            work += 1
        if self._lsa_due:
            self._lsa_due = False
            self.lsa_seq += 1
            self._flood(al.ControlKind.LSA, self._lsa_doc())
            work += 1
        return work


