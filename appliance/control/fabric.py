"""The control agent's fabric side: neighbours (hellos, liveness), link state and paths,
P&M and registry flooding, subscription interest, and the tables built from them
(``FabricSide``, one part of ``ControlAgent``; docs/appliance.md, "Control plane")."""


import time

from appliance.config import (
    DISCOVERY_HELLO_REPLY_NS,
    FABRIC_MAX_ORIGINS,
    NEIGHBOUR_ECHO_NS,
)
from appliance.control import acl_apply, remote_replay, selector_apply
from appliance.control import pm as pmod
from appliance.control.auth import EPOCH_MASK, group_link_id, hello_link_id
from appliance.control.documents import DocumentError, validate
from appliance.control.routing import Lsa, all_paths, graph_of
from appliance.control.state import (
    ADMIN_FRAME_OVERHEAD_BYTES,
    ROLE,
    InterestSets,
    Neighbour,
    _lsa_to_doc,
    _minimal,
    log,
)
from appliance.dataplane.agent import (
    FABRIC,
    GROUP_RX,
    GROUP_TX,
    ForwardingTables,
)
from datapath.protocol import admin_layout as al
from datapath.protocol.codec import decode_frame
from datapath.protocol.errors import ProtocolError
from datapath.protocol.frame_layout import FrameType
from datapath.topics.algebra import TopicError
from datapath.topics.registry import RegistryError
from nic_offload.errors import OffloadError


class FabricSide:
    """Neighbours, link state, interest, registry and P&M flooding, table builds. Its methods
    run on the control agent's thread with the agent's state (``ControlAgent`` inherits
    them)."""

    def _on_group(self, channel: str, peer: int, data: bytes, now_ns: int) -> None:
        """An admin frame on a fabric group: only HELLO/HEARTBEAT, which map the sender's
        group address to its node (the data path accepts group frames from mapped peers)."""
        try:
            frame = decode_frame(data)
        except ProtocolError as exc:
            self.auth.reject("malformed")
            self._log_once(channel, peer, f"rejected a malformed admin frame ({exc})", now_ns)
            return
        group = channel[len(GROUP_RX):]
        reason = self.auth.check(frame, link=group_link_id(group))
        if reason is not None:
            self._log_once(channel, peer, f"rejected an admin frame: {reason}", now_ns)
            return
        if frame.header.frame_type not in (FrameType.HELLO, FrameType.HEARTBEAT):
            self.counters["group_unexpected_admin"] += 1
            return
        _, entries = frame.admin()
        hello = entries[0]
        nb = self.neighbours.get(hello.name)
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
        ftype = frame.header.frame_type
        reason = self.auth.check(frame, link=self.node_id, hello_link=(
            hello_link_id(self.cfg.name) if ftype is FrameType.HELLO else None))
        if reason is not None:
            self._log_once(FABRIC, peer, f"rejected an admin frame: {reason}", now_ns)
            return
        _, entries = frame.admin()
        source = frame.header.source_session
        if ftype in (FrameType.HELLO, FrameType.HEARTBEAT):
            hello = entries[0]
            if hello.node_id != source:
                self.counters["neighbour_id_mismatch"] += 1
                return
            if frame.header.dest_session != self.node_id:  # a discovery HELLO
                self._on_discovery_hello(nb, hello, now_ns)
            else:
                self._on_hello(nb, hello, frame.header.send_ts_ns, now_ns)
            return
        if source != nb.node_id:  # signed by another node than the one at this address
            self.counters["neighbour_id_mismatch"] += 1
            return
        if ftype is FrameType.CONTROL:
            for entry in entries:
                try:
                    doc = validate(entry.kind, entry.document, "neighbour")
                except DocumentError as exc:
                    self._bad_document(FABRIC, peer, exc, now_ns)
                    continue
                self._on_fabric_control(nb, entry.kind, doc, now_ns)
        elif ftype is FrameType.REGISTRY_UPDATE:
            self._merge_registry(entries, nb)
        elif ftype is FrameType.SESSION_MOVE:
            for entry in entries:
                self._on_session_move(nb, entry)  # type: ignore[attr-defined]
        else:
            self.counters["unexpected_admin"] += 1

    def _on_discovery_hello(self, nb: Neighbour, hello: al.Hello, now_ns: int) -> None:
        """A HELLO from a neighbour that does not know our node id yet (it started, or
        restarted), bound to our name: it says which node id to answer, never that the
        neighbour is up (a replayed one must not keep a dead neighbour alive). We answer with
        a HELLO bound to that id, at most every DISCOVERY_HELLO_REPLY_NS; the neighbour's
        HELLOs bound to our node id then bring it up here."""
        if hello.name != nb.config.name:
            self.counters["neighbour_name_mismatch"] += 1
            return
        if nb.up and nb.node_id != hello.node_id:
            self.counters["neighbour_id_mismatch"] += 1
            return
        nb.node_id = hello.node_id
        if now_ns - nb.discovery_reply_ns >= DISCOVERY_HELLO_REPLY_NS:
            nb.discovery_reply_ns = now_ns
            self._send_hello(nb, FrameType.HELLO)

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
            if hello.name == self.cfg.persist_remote:  # its cache's reports hold our ACKs
                self.dp.command("persist_remote", hello.node_id, hello.name)
                self._remote_ready = False  # told again once its interest is known
                self.dp.command("remote_ready", False)
            self._lsa_due = True
            self._topology_dirty = True
            self._send_hello(nb, FrameType.HELLO)
            self._send_full_state(nb)
        if now_ns - nb.echo_sent_ns >= NEIGHBOUR_ECHO_NS:
            nb.echo_sent_ns = now_ns
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
                self._selectors_dirty = True  # its selectors are of the old one now
                self._flood(kind, doc, skip=nb)
        elif kind is al.ControlKind.INTEREST_SELECTORS:
            origin = doc["origin"]
            if origin != self.node_id and origin in self.interest and \
                    selector_apply.on_selective(self, doc):
                self._tables_dirty = True
                self._flood(kind, doc, skip=nb)
        elif kind is al.ControlKind.RENDEZVOUS_COUNTS:
            if self.rdv is None or self._new_origin_refused(doc["origin"], self.rdv.counts):
                self.counters["rendezvous_documents_ignored"] += self.rdv is None
                return
            if self.rdv.on_counts(doc):
                self._flood(kind, doc, skip=nb)
        elif kind is al.ControlKind.RENDEZVOUS_REGISTER:
            if self.rdv is None or self._new_origin_refused(doc["origin"], self.rdv.held):
                self.counters["rendezvous_documents_ignored"] += self.rdv is None
                return
            if self.rdv.on_register(doc):
                self._flood(kind, doc, skip=nb)
        elif kind is al.ControlKind.PM_UPDATE:
            if self.cfg.pm_mode == "remote" and pmod.is_newer(doc, self.pm_doc):
                self.pm_doc = doc
                self._apply_pm(doc)
                self._flood(kind, doc, skip=nb)
        elif kind is al.ControlKind.LOGOUT:  # the neighbour is shutting down
            if nb.config.name == self.cfg.persist_remote:  # it comes back a new incarnation
                self.dp.command("remote_gone", "stopped (it said goodbye)")
            if nb.up:
                nb.up = False
                log.info("%s: neighbour %s said goodbye", self.cfg.name, nb.config.name)
                self._lsa_due = True
                self._topology_dirty = True
        elif kind is al.ControlKind.PERSISTED:
            if nb.config.name != self.cfg.persist_remote:  # not the cache we wait for
                self.counters["persisted_reports_refused"] += 1
                return
            self.counters["persisted_reports_received"] += 1
            if "patterns" in doc:  # its beacon: the patterns its cache keeps
                self._remote_patterns = frozenset((0, p) for p in doc["patterns"])
            if doc["streams"]:
                self.dp.command("remote_persisted", doc["streams"])
        elif kind is al.ControlKind.SESSION_MIRROR:
            self.mirror.on_document(self, nb.node_id, doc, now_ns)
        elif kind is al.ControlKind.REMOTE_REPLAY:  # a neighbour's client asks our cache
            remote_replay.serve(self, nb, doc)
        elif kind is al.ControlKind.REMOTE_REPLAY_PART:
            if self.forwarder is None:
                self.counters["replay_forward_parts_refused"] += 1
            else:
                self.forwarder.on_part(nb, doc)
        elif kind is al.ControlKind.REMOTE_REPLAY_RESULT:
            if self.forwarder is None:
                self.counters["replay_forward_answers_refused"] += 1
            else:
                self.forwarder.on_result(nb, doc)
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
        self._reentitle(doc)  # control/clients.py: sessions get the new entitlements
        acl_apply.apply_acl(self, doc)  # content ACL classes: tables, data path, sessions
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
        hello = al.Hello(self.node_id, self.epoch & EPOCH_MASK, self.cfg.heartbeat_interval_ms,
                         ROLE[self.cfg.role], 0, self.cfg.name)
        self._to_neighbour(nb, ftype, [hello])

    def _group_hellos(self) -> None:
        """A HEARTBEAT to each fabric group in use, from its send-only channel: members learn
        which group address is this appliance."""
        if self.cfg.fabric_key is None or not self._groups_in_use:
            return
        hello = al.Hello(self.node_id, self.epoch & EPOCH_MASK, self.cfg.heartbeat_interval_ms,
                         ROLE[self.cfg.role], 0, self.cfg.name)
        for group in self._groups_in_use:
            self.dp.offer_admin(GROUP_TX + group, 0, self._signed(
                FrameType.HEARTBEAT, [hello], dest=group_link_id(group)))

    def _send_full_state(self, nb: Neighbour) -> None:
        entries = [self._control(al.ControlKind.LSA, self._lsa_doc())]
        for lsa in self.lsdb.values():
            entries.append(self._control(al.ControlKind.LSA, _lsa_to_doc(lsa)))
        entries.append(self._control(al.ControlKind.INTEREST, self._interest_doc()))
        if self.advertised_selective:
            entries.append(self._control(al.ControlKind.INTEREST_SELECTORS,
                                         selector_apply.selective_doc(self)))
        for origin, (epoch, seq, patterns, gpatterns) in self.interest.items():
            entries.append(self._control(al.ControlKind.INTEREST, {
                "origin": origin, "epoch": epoch, "seq": seq,
                "patterns": sorted([ns, p] for ns, p in patterns),
                "guaranteed": sorted([ns, p] for ns, p in gpatterns)}))
            held = self.interest_selectors.get(origin)
            if held is not None and held[0] == (epoch, seq) and held[1]:
                entries.append(self._control(al.ControlKind.INTEREST_SELECTORS, {
                    "origin": origin, "epoch": epoch, "seq": seq,
                    "selective": [[ns, p, list(t)] for (ns, p), t in sorted(held[1].items())]}))
        if self.rdv is not None:
            entries.extend(self._control(k, d) for k, d in self.rdv.full_state())
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
        """This appliance's interest document, built once per (epoch, seq): it sorts every
        advertised pattern, and the refresh sends it again every ``lsa_refresh_ms``."""
        key = (self.node_id, self.epoch, self.interest_seq)
        cached = self.__dict__.get("_interest_cached")
        if cached is None or cached[0] != key:
            cached = (key, {"origin": self.node_id, "epoch": self.epoch,
                            "seq": self.interest_seq,
                            "patterns": sorted([ns, p] for ns, p in self.advertised),
                            "guaranteed": sorted([ns, p] for ns, p in self.gadvertised)})
            self._interest_cached = cached
        return cached[1]

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
        changes = self._port_changes
        if changes:  # the client sessions' ports: a patch, before the tables and snapshot
            self._port_changes = {}
            self.dp.command("set_ports", changes)
        ports: dict[int, tuple[str, int]] = {  # the destination appliances' ports
            port: what for port, what in self._retired.items() if what[0] in ("node", "gnode")}
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
                                  dict(peer_node), group_direct, group_peers, epochs,
                                  rendezvous=self.rdv is not None)
        tables = self.routes_ext.extend(tables)
        if tables != self._installed_tables:  # (a new subscription seldom changes them)
            self._installed_tables = tables
            self.dp.command("set_tables", tables)

    def _sync_destinations(self) -> None:
        """One destination egress per appliance and class with interest: ``n:NODE``
        (best-effort and last-value) while NODE is reachable, ``g:NODE`` (guaranteed) as long
        as its interest is known, through a partition too (``_hold_guaranteed_interest``):
        the messages go on into the reliable sender towards NODE, which keeps them until a
        path returns and the receiver recovers them (or declares them lost once the sender's
        buffer has let them go)."""
        reachable = {dst for (src, dst) in self.paths if src == self.node_id}
        wanted = {}
        rdv = self.rdv
        origins = set(self.interest)
        if rdv is not None:  # rendezvous cores' routes, rules registered here
            origins |= (set(rdv.routes) | set(rdv.held)) - {self.node_id}
        for origin in origins:
            _, _, patterns, gpatterns = self.interest.get(origin, (0, 0, frozenset(),
                                                                   frozenset()))
            if rdv is not None:
                patterns = patterns | rdv.extra_patterns(origin)
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

    def _hold_guaranteed_interest(self, origin: int) -> bool:
        """``origin``'s link state aged out (not heard for LSA_MAX_AGE_REFRESHES periods):
        True when its interest is kept all the same because it holds guaranteed patterns.

        Unreachable is not gone: a transit appliance restarting, or a partition, silences an
        appliance's LSAs exactly as its end would. Its ``g:`` egress and the reliable senders
        towards it (``GuaranteedPlane``) must live on, so that every guaranteed message for it
        is kept (the senders' buffers bound what is, and what they let go reaches it as a loss
        notice) and its stream numbering goes on where its receivers are: forgetting them here
        restarted the streams at sequence 1, which the destination's receivers, still in the
        middle of those streams, dropped as duplicates and then took as their continuation,
        losing everything between without a loss event. The interest is replaced when the
        appliance is heard again (a newer document; a new epoch when it restarted, whose
        receivers start from 1 and whose senders are made anew)."""
        held = self.interest.get(origin)
        if held is None or not held[3]:
            return False
        self.counters["guaranteed_interest_held"] += 1
        log.info("%s: %s is unreachable and its link state aged out; its guaranteed interest "
                 "is kept (messages for it wait in the reliable senders towards it)",
                 self.cfg.name, self.names.get(origin, origin))
        return True

    def _build_snapshot(self) -> None:
        self._tables_dirty = False
        self._synced_registry = self.registry.version
        selector_apply.sync(self)  # the guards reach the data path before the keys do
        self._install_tables()
        try:
            self._pending_snapshot = self.compiler.build()
            built = getattr(self.dp, "built_snapshot", None)  # (a data path in a process)
            if built is not None:
                built(self._pending_snapshot)
        except OffloadError as exc:
            self.counters["compile_failed"] += 1
            log.error("%s: compiling tables failed: %s", self.cfg.name, exc)

    def _advertise_interest(self) -> None:
        self._interest_dirty = False
        self._interest_runs = self.__dict__.get("_interest_runs", 0) + 1  # (status)
        if self.rdv is not None:  # registered rules go to their rendezvous cores instead
            self.rdv.register()
            advertised = _minimal(p for s in self.sessions.values()
                                  for p in self.rdv.advertised_patterns(s))
        else:
            advertised = None
        sets = self.__dict__.get("_interest_sets")
        changed, self._interest_changed = self._interest_changed, set()
        if sets is None:
            sets, changed = InterestSets(), None  # the first: every session
            self._interest_sets = sets
        best_effort, gadvertised = sets.update(self.sessions, changed)
        if advertised is None:
            advertised = best_effort
        old = self.advertised
        self.advertised = advertised
        selective = selector_apply.selective_interest(self)
        self.advertised = old
        if advertised != self.advertised or gadvertised != self.gadvertised or (
                selective != self.advertised_selective):
            self.advertised = advertised
            self.gadvertised = gadvertised
            self.advertised_selective = selective
            self.interest_seq += 1
            if not any(nb.up for nb in self.neighbours.values()):
                return  # nobody to tell (the document sorts every pattern): a neighbour
                # coming up gets the interest in its full state (_send_full_state)
            self._flood(al.ControlKind.INTEREST, self._interest_doc())
            if selective:  # its own frame: an older neighbour drops only this one
                self._flood(al.ControlKind.INTEREST_SELECTORS,
                            selector_apply.selective_doc(self))
