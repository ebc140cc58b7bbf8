"""Applying route tables: P&M pushes them, cores switch paths without loss, duplication mode.

The control agent owns one ``RouteExtension`` (small hooks in appliance/control/agent.py); the
data-path agent uses ``other_route`` (transit frames that are not on the current path),
``Deduplicator`` (duplicated frames at their destination) and ``DUP_DEST_BIT``.

P&M (the embedded one) applies a route table — the route job's ``--out`` document — either
when the file named by ``routes.table`` changes (looked at every ``routes.poll_ms``) or on the
``set_routes`` command (``{"table": DOC}``). The table's best paths become the document's
route overrides (all pairs at once, one new version), its backup paths the document's
``backups``, and ``routes.duplicate`` its ``duplicate`` patterns; the document floods as
before, and every appliance computes the same forwarding from it.

**Lossless switch (make before break, then drain).** When P&M's document changes a pair's
path, its source keeps sending on the old first hop for ``routes.switch_hold_ms`` (the
document reaches the appliances of the new path meanwhile, so they forward the pair before
its first frame arrives), then switches. Every appliance that forwarded the pair on the old
path keeps that entry for ``routes.switch_grace_ms`` as a *grace* entry:
a frame of the pair that arrives from the old path's previous hop is still forwarded (along
the new path where this appliance is on it, else along the old one) instead of being dropped
as off-path. New frames take the new path at once, the frames in flight on the old one
drain, so nothing is lost to the switch. Guaranteed streams are delivered in sequence order
by their reliable receivers (a frame that overtakes another is held until the gap fills),
so they are neither lost nor reordered; best-effort frames may arrive out of order for the
drain's duration.

**Duplication.** For topics matching a ``duplicate`` pattern, the ingress sends every message
for a destination D on the current path *and* on the backup path of (self, D) when that
backup shares no link with the current path. Both copies carry ``dest_session`` = D |
``DUP_DEST_BIT``; an appliance on the way tells the two apart by the hop they came from
(link-disjoint paths enter an appliance over different links). D passes each message once:
``Deduplicator`` keeps, per (source, stream, topic key), the highest sequence number seen
and the ones seen within ``DEDUP_WINDOW`` below it, drops what it has seen
(``duplicates_dropped``) and delivers the first copy to arrive. Guaranteed streams are not
duplicated (they recover losses themselves).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from dataclasses import replace
from typing import Any

from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml

log = logging.getLogger("topicwire.appliance")

DUP_DEST_BIT = 0x8000_0000
"""Set in ``dest_session`` of both copies of a duplicated frame (node ids are < 2**31)."""
DEDUP_WINDOW = 4_096
"""Sequence numbers per (source, stream, topic key) remembered below the highest seen."""
DEDUP_MAX_STREAMS = 65_536
"""(source, stream, topic key) entries kept; the oldest is forgotten beyond."""

_MSG = struct.Struct(">QQ")
"""topic_key, sequence at the start of a message."""
_LENS = struct.Struct(">IH")
"""payload_len, topic_len at PAYLOAD_LEN_OFFSET."""
_COUNT = struct.Struct(">H")
_LEN = struct.Struct(">I")


# --- data path -----------------------------------------------------------------------------------
def other_route(tables: Any, src: int, dst: int, prev: int, now_ns: int
                ) -> tuple[int, int | None] | None:
    """The (previous hop, next peer or None) for a frame of (src, dst) from ``prev`` that is
    not on the pair's current path here: a duplicated copy on the primary or backup path, or
    a frame still draining from the old path (grace); None: off path."""
    if dst & DUP_DEST_BIT:
        pair = (src, dst & ~DUP_DEST_BIT)
        for table in (tables.transit, tables.alt_transit):
            route = table.get(pair)
            if route is not None and route[0] == prev:
                return route
        return None
    grace = tables.grace.get((src, dst))
    if grace is None or grace[0] != prev or now_ns >= grace[2]:
        return None
    current = tables.transit.get((src, dst))
    return (prev, current[1]) if current is not None else (prev, grace[1])


class Deduplicator:
    """Passes each message of duplicated frames once (see the module docstring)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int, int], tuple[int, set[int]]] = {}
        self.dropped = 0
        self.passed = 0

    def admit(self, buf: Any, off: int, length: int, src: int, stream: int) -> int:
        """Drop the messages of the frame at ``buf[off:off+length]`` seen before, compacting
        the frame in place; returns its new length (0: nothing left).

        The frame has not been validated yet (the software NIC does that next): one whose
        messages do not exactly fill ``length`` (none, one running past the end, bytes
        after the last) is returned whole and untouched, for the NIC to refuse and count."""
        count = _COUNT.unpack_from(buf, off + fl.MSG_COUNT_OFFSET)[0]
        end = off + length
        sizes = []
        pos = off + fl.FRAME_HEADER_BYTES
        for _ in range(count):
            if pos + ml.MESSAGE_HEADER_BYTES > end:
                return length
            payload, topic = _LENS.unpack_from(buf, pos + ml.PAYLOAD_LEN_OFFSET)
            size = ml.MESSAGE_HEADER_BYTES + ((payload + topic + 7) & ~7)
            sizes.append(size)
            pos += size
        if not sizes or pos != end:
            return length
        view = memoryview(buf)
        pos = write = off + fl.FRAME_HEADER_BYTES
        kept = 0
        for size in sizes:
            key, seq = _MSG.unpack_from(buf, pos)
            if self._new(src, stream, key, seq):
                if write != pos:
                    view[write : write + size] = bytes(view[pos : pos + size])
                write += size
                kept += 1
            else:
                self.dropped += 1
            pos += size
        self.passed += kept
        if kept == 0:
            return 0
        _COUNT.pack_into(buf, off + fl.MSG_COUNT_OFFSET, kept)
        _LEN.pack_into(buf, off + fl.FRAME_LEN_OFFSET, write - off)
        return write - off

    def _new(self, src: int, stream: int, key: int, seq: int) -> bool:
        ident = (src, stream, key)
        state = self.seen.get(ident)
        if state is None:
            if len(self.seen) >= DEDUP_MAX_STREAMS:
                self.seen.pop(next(iter(self.seen)))
            self.seen[ident] = (seq, {seq})
            return True
        highest, recent = state
        if seq in recent or seq <= highest - DEDUP_WINDOW:
            return False
        recent.add(seq)
        if seq > highest:
            highest = seq
            if len(recent) > 2 * DEDUP_WINDOW:
                recent = {s for s in recent if s > highest - DEDUP_WINDOW}
        self.seen[ident] = (highest, recent)
        return True


# --- control agent -------------------------------------------------------------------------------
def table_routes(doc: dict[str, Any], node_named: Any) -> tuple[list, list, list[str]]:
    """(routes, backups, problems) of a route table: ``[[src id, dst id, [ids]], ...]``."""
    routes, backups, problems = [], [], []
    for entry in doc.get("routes", []):
        try:
            path = [node_named(n) for n in entry["path"]]
            src, dst = node_named(entry["source"]), node_named(entry["destination"])
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"{entry!r}: {exc}")
            continue
        if len(path) < 2 or path[0] != src or path[-1] != dst:
            problems.append(f"{entry['source']}->{entry['destination']}: the path does not "
                            "go from source to destination")
            continue
        routes.append([src, dst, path])
        if entry.get("backup"):
            try:
                backup = [node_named(n) for n in entry["backup"]]
            except (TypeError, ValueError) as exc:
                problems.append(f"backup of {entry['source']}->{entry['destination']}: {exc}")
                continue
            if backup[0] == src and backup[-1] == dst:
                backups.append([src, dst, backup])
    return routes, backups, problems


class RouteExtension:
    """The control agent's part (see the module docstring); the agent's thread only."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        settings = getattr(agent.cfg, "routes", None)
        from appliance.ops.telemetry.settings import RouteSettings

        self.settings = settings if settings is not None else RouteSettings()
        self.backups: dict[tuple[int, int], tuple[int, ...]] = {}
        self.duplicate: tuple[tuple[int, str], ...] = ()
        self.grace: dict[tuple[int, int], tuple[int, int | None, int]] = {}
        self.alt_transit: dict[tuple[int, int], tuple[int, int | None]] = {}
        self.alt_next_hop: dict[int, int] = {}
        self._dup_keys: frozenset[int] = frozenset()
        self._dup_version: tuple = ()
        self._poll_at_ns = 0
        self._routes_seen: object = None
        self._hold_until_ns = 0
        self.held: dict[int, int] = {}
        """Destination -> the old first hop kept until ``_hold_until_ns`` (make before break)."""
        self._table_stamp: tuple[int, int] | None = None
        self.tables_applied = 0
        self.table_problems = 0
        doc = agent.pm_doc
        if agent.cfg.pm_mode == "embedded" and doc is not None and self.settings.duplicate:
            namespaces = list(agent.cfg.namespaces)
            agent.pm_doc = {**doc, "duplicate": [[ns, p] for ns in namespaces
                                                 for p in self.settings.duplicate]}
            self.on_pm(agent.pm_doc)

    # --- P&M ----------------------------------------------------------------------------------
    def wake_at_ns(self, now_ns: int) -> int:
        """When ``do_work`` next has something to do: a switch hold's end, the next poll of
        the route table file (far in the future when neither applies)."""
        at = now_ns + 3_600_000_000_000
        if self.held:
            at = min(at, self._hold_until_ns)
        if self.settings.table is not None and self.agent.cfg.pm_mode == "embedded":
            at = min(at, self._poll_at_ns)
        return at

    def reconfigure(self, settings: Any) -> None:
        """New ``[routes]`` settings (a reload, docs/appliance.md "Reload (SIGHUP)"): the
        switch hold and grace apply to the next path change; a new ``table`` path (or poll
        period) is looked at on the next duty cycle and applied if it holds a table. Routes
        already applied stay in P&M's document until a table or a command changes them."""
        old, self.settings = self.settings, settings
        if (settings.table, settings.poll_ns) != (old.table, old.poll_ns):
            self._table_stamp = None
            self._poll_at_ns = 0

    def do_work(self, now_ns: int) -> int:
        """Every appliance: end a switch hold; P&M: apply the route table file when it
        changed."""
        if self.held and now_ns >= self._hold_until_ns:
            self.held = {}
            self.agent._tables_dirty = True  # switch to the new first hops now
        path = self.settings.table
        if path is None or now_ns < self._poll_at_ns or self.agent.cfg.pm_mode != "embedded":
            return 0
        self._poll_at_ns = now_ns + self.settings.poll_ns
        try:
            st = os.stat(path)
        except OSError:
            return 0
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._table_stamp:
            return 0
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            self.table_problems += 1
            log.warning("%s: route table %s not applied: %s", self.agent.cfg.name, path, exc)
            return 1
        self._table_stamp = stamp
        out = self.apply(doc)
        if not out.get("ok"):
            log.warning("%s: route table %s not applied: %s", self.agent.cfg.name, path,
                        out.get("error"))
        return 1

    def apply(self, table: dict[str, Any]) -> dict[str, Any]:
        """Make a route table P&M's document's routes and backups (one version, flooded)."""
        agent = self.agent
        if agent.cfg.pm_mode != "embedded" or agent.pm_doc is None:
            return {"ok": False, "error": "control: set_routes goes to the P&M appliance "
                    f"({(agent.pm_doc or {}).get('pm', 'unknown')})"}
        if not isinstance(table, dict) or not isinstance(table.get("routes"), list):
            return {"ok": False, "error": "control: set_routes: give {\"table\": a route "
                    "table} (topicwire routes compute --out)"}
        routes, backups, problems = table_routes(table, agent._node_named)
        self.table_problems += len(problems)

        doc = agent.pm_doc
        agent.pm_doc = {**doc, "version": max(int(doc["version"]) + 1, time.time_ns() // 1_000),
                        "routes": sorted(routes), "backups": sorted(backups)}
        agent._apply_pm(agent.pm_doc)
        from datapath.protocol import admin_layout as al

        agent._flood(al.ControlKind.PM_UPDATE, agent.pm_doc)
        self.tables_applied += 1
        agent.counters["route_tables_applied"] += 1
        agent.counters["route_table_refused_entries"] += len(problems)
        log.info("%s: applied a route table: %d routes, %d backups%s", agent.cfg.name,
                 len(routes), len(backups), f", {len(problems)} entries refused"
                 if problems else "")
        return {"ok": True, "pm_version": agent.pm_doc["version"], "routes": len(routes),
                "backups": len(backups), "refused": problems}

    def on_pm(self, doc: dict[str, Any]) -> None:
        """Every appliance: take backups and duplicate patterns from P&M's document."""
        self.backups = {(int(a), int(b)): tuple(int(x) for x in p)
                        for a, b, p in doc.get("backups", [])}
        routes = doc.get("routes", [])
        if self._routes_seen is not None and routes != self._routes_seen:
            self._hold_until_ns = time.monotonic_ns() + self.settings.switch_hold_ns
        self._routes_seen = routes
        self.duplicate = tuple((int(ns), str(p)) for ns, p in doc.get("duplicate", []))

    # --- forwarding ---------------------------------------------------------------------------
    def on_topology(self, old_fwd: tuple, new_fwd: tuple) -> None:
        """After the paths were recomputed: grace entries for pairs whose forwarding here
        changed, backup-path forwarding for duplication."""
        from appliance.control.routing import path_cost

        agent = self.agent
        now = time.monotonic_ns()
        grace_ns = self.settings.switch_grace_ns
        grace = {pair: g for pair, g in self.grace.items() if g[2] > now}
        if grace_ns > 0:
            old_transit, new_transit = old_fwd[1], new_fwd[1]
            for pair, (prev, nxt) in old_transit.items():
                if new_transit.get(pair) != (prev, nxt):
                    grace[pair] = (prev, nxt, now + grace_ns)
        self.grace = grace
        me = agent.node_id
        peer_of = {nb.node_id: nb.peer for nb in agent.neighbours.values() if nb.up}
        up_peers = set(peer_of.values())
        if now < self._hold_until_ns:  # P&M moved routes: keep the old first hops a moment
            for dst, hop in old_fwd[0].items():
                if new_fwd[0].get(dst) not in (None, hop) and hop in up_peers:
                    self.held.setdefault(dst, hop)
        else:
            self.held = {}
        graph = getattr(agent, "graph", {})
        alt_transit: dict[tuple[int, int], tuple[int, int | None]] = {}
        alt_next: dict[int, int] = {}
        for (src, dst), path in self.backups.items():
            current = agent.paths.get((src, dst))
            if current is None or me not in path or path_cost(graph, path) is None:
                continue
            if set(zip(path, path[1:])) & set(zip(current[1], current[1][1:])):
                continue  # not link-disjoint: copies could not be told apart
            i = path.index(me)
            if i == 0:
                hop = peer_of.get(path[1])
                if hop is not None:
                    alt_next[dst] = hop
            else:
                nxt = None if i == len(path) - 1 else peer_of.get(path[i + 1])
                if i == len(path) - 1 or nxt is not None:
                    alt_transit[(src, dst)] = (path[i - 1], nxt)
        self.alt_transit, self.alt_next_hop = alt_transit, alt_next

    def dup_keys(self) -> frozenset[int]:
        """Topic keys of registered topics that match a duplicate pattern."""
        if not self.duplicate:
            return frozenset()
        registry = self.agent.registry
        version = (registry.version, self.duplicate)
        if version != self._dup_version:
            from datapath.topics.algebra import matches

            self._dup_keys = frozenset(
                r.topic_key for r in registry.entries()
                if any(ns == r.namespace_id and matches(p, r.topic) for ns, p in self.duplicate))
            self._dup_version = version
        return self._dup_keys

    def extend(self, tables: Any) -> Any:
        """The forwarding tables with the grace, backup and duplication entries."""
        next_hop = {**tables.next_hop, **self.held} if self.held else tables.next_hop
        return replace(tables, next_hop=next_hop, grace=dict(self.grace),
                       alt_transit=dict(self.alt_transit),
                       alt_next_hop=dict(self.alt_next_hop), dup_keys=self.dup_keys())

    def counters(self) -> dict[str, int]:
        return {"route_tables_applied": self.tables_applied,
                "route_table_problems": self.table_problems,
                "held_pairs": len(self.held), "grace_pairs": len(self.grace),
                "backup_pairs": len(self.alt_transit) + len(self.alt_next_hop)}
