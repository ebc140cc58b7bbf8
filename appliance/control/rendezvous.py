"""Content routing by attribute popularity in the appliances (``[routing] content =
"rendezvous"``; docs/routing.md, "Content routing by attribute popularity").

The control agent's part (``Rendezvous``, ``agent.rdv``; None in flood mode):

- **Ring.** ``RendezvousRing`` over the names of the appliances in link state (this one and
  every one it has a path to); every core computes the same ring from the same link state.
- **Popularity.** The data path counts the attributes of the events published here (the
  selector events it builds anyway at ingress); every ``routing.counts_interval_ms`` this
  appliance floods its counts (CONTROL kind ``RENDEZVOUS_COUNTS``, at most
  ``RENDEZVOUS_MAX_COUNTED_ATTRIBUTES`` names) with its *routes*: the (pattern, attributes)
  under which it holds registrations. Every core merges the latest counts of every origin and
  derives the same popular set (``AttributeCounts.popular(routing.popular_share)``).
- **Registration.** A session's selector rule that requires an attribute (not a ``tw_*``
  header property) is not advertised in this appliance's INTEREST: it is registered at the
  rendezvous core of ``rendezvous_key(...)`` (CONTROL kind ``RENDEZVOUS_REGISTER``, one
  document per target core, flooded; only the target keeps it). Rules that require no
  attribute and plain subscriptions are advertised and flooded as in flood mode.
- **Tables.** For each destination appliance D and topic key the data path gets
  ``(interest, rdv_texts, reg_texts)``: whether D's own interest covers the key (then the
  flood-mode guard applies), the ``ATTR IS NOT NULL`` texts of D's routing keys (an event
  carrying one goes to D, its rendezvous core), and the selectors D registered here (this
  core matches them for the events published here and for the first copy of an event it
  receives, and sends D one copy; appliance/dataplane/delivery.py ``_rdv_wanted``).
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

from appliance.config import (
    RENDEZVOUS_MAX_COUNTED_ATTRIBUTES,
    RENDEZVOUS_MAX_REGISTRATIONS,
)
from appliance.control.content_routing import AttributeCounts, RendezvousRing, rendezvous_key
from appliance.control.state import log
from datapath.protocol import admin_layout as al
from datapath.topics.algebra import TopicError, matches
from nic_offload.selectors import HEADER_PREFIX, SelectorError, compile_selector
from nic_offload.selectors.required import required_attributes

REGISTRATION_BYTES = 32_768
"""Selector and pattern text one registration document (one target core) carries at most,
so that it fits one CONTROL entry; the rules beyond are flooded as in flood mode."""


@functools.lru_cache(maxsize=16_384)
def required_of(text: str) -> frozenset[str]:
    """The attributes (not ``tw_*`` header properties) every event ``text`` selects carries."""
    try:
        return frozenset(a for a in required_attributes(compile_selector(text))
                         if not a.startswith(HEADER_PREFIX))
    except SelectorError:
        return frozenset()


def key_text(attribute: str) -> str:
    """The selector an event carrying routing key ``attribute`` satisfies."""
    return f"{attribute} IS NOT NULL"


def _match(pattern: str, topic: str) -> bool:
    try:
        return matches(pattern, topic)
    except TopicError:
        return False


class Rendezvous:
    """Ring, popularity, registrations and routes of one appliance in rendezvous mode."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.counts_interval_ns = agent.cfg.counts_interval_ms * 1_000_000
        self.share = agent.cfg.popular_share
        self.counts: dict[int, tuple[tuple[int, int], int, Counter]] = {}
        """Origin -> ((epoch, seq), events, attribute counts) of its latest counts."""
        self.routes: dict[int, dict[tuple[int, str], tuple[str, ...]]] = {}
        """Origin -> (namespace, pattern) -> the routing keys registered there under it."""
        self.held: dict[int, tuple[tuple[int, int], tuple]] = {}
        """Subscriber appliance -> ((epoch, seq), ((ns, pattern, selector, key), ...)) of
        the rules it registered at this core."""
        self.seen: dict[tuple[int, int], tuple[int, int]] = {}
        """(origin, target) -> version of the registration document last flooded on."""
        self.sent: dict[int, tuple] = {}
        """Target core -> the rules this appliance registered there."""
        self.seq = 0
        self.ring: RendezvousRing | None = None
        self.ring_names: tuple[str, ...] = ()
        self.popular: frozenset[str] = frozenset()
        self.merged = AttributeCounts()
        self._share_at = 0
        self._refresh_at = 0
        self.counters: Counter[str] = Counter()
        self.unplaced: frozenset[tuple[int, str, str]] = frozenset()
        """Rules beyond ``REGISTRATION_BYTES`` of their target's document: advertised and
        flooded as in flood mode instead (counted ``rendezvous_rules_flooded``)."""

    # --- what this appliance advertises -------------------------------------------------------
    def registered(self, ns: int, pattern: str, selector: str) -> bool:
        """Whether a rule is registered at a rendezvous core: it requires an attribute and
        its target's document had room for it (else it is advertised as in flood mode)."""
        return bool(required_of(selector)) and (ns, pattern, selector) not in self.unplaced

    def advertised_patterns(self, session: Any) -> list[tuple[int, str]]:
        """The session's patterns this appliance advertises in its INTEREST: all but those
        only its registered selector rules hold."""
        out = []
        for key in session.patterns:
            if key in session.plain:
                out.append(key)
                continue
            rules = [r for r in session.rules if (r[0], r[1]) == key]
            if not rules or not all(self.registered(*r) for r in rules):
                out.append(key)
        return out

    def extra_patterns(self, origin: int) -> frozenset[tuple[int, str]]:
        """Patterns an egress towards ``origin`` must cover besides its interest: the
        routes it holds as a rendezvous core and the rules it registered here."""
        out = set(self.routes.get(origin, {}))
        held = self.held.get(origin)
        if held is not None:
            out.update((ns, p) for ns, p, _, _ in held[1])
        return frozenset(out)

    # --- duty cycle -----------------------------------------------------------------------------
    def do_work(self, now_ns: int) -> int:
        if now_ns < self._share_at:
            return 0
        self._share_at = now_ns + self.counts_interval_ns
        agent = self.agent
        self._take_own_counts()
        self._flood_counts()
        changed = self._derive()
        refresh = now_ns >= self._refresh_at
        if refresh:
            self._refresh_at = now_ns + agent.cfg.lsa_refresh_ms * 1_000_000
        self.register(force=refresh or changed)
        return 1

    def _take_own_counts(self) -> None:
        agent = self.agent
        mine = (agent.dp.published or {}).get("attribute_counts") or {}
        self.counts[agent.node_id] = ((agent.epoch, 0), int(mine.get("events", 0)),
                                      Counter(mine.get("counts", {})))

    def counts_doc(self) -> dict:
        agent = self.agent
        _, events, counts = self.counts.get(agent.node_id, ((0, 0), 0, Counter()))
        routes: dict[tuple[int, str], set[str]] = {}
        for _, rules in self.held.values():
            for ns, pattern, _, key in rules:
                routes.setdefault((ns, pattern), set()).add(key)
        return {"origin": agent.node_id, "epoch": agent.epoch, "seq": self.seq,
                "events": events,
                "counts": [[a, c] for a, c in counts.most_common(
                    RENDEZVOUS_MAX_COUNTED_ATTRIBUTES)],
                "routes": [[ns, p, sorted(keys)] for (ns, p), keys in sorted(routes.items())]}

    def _flood_counts(self) -> None:
        self.seq += 1
        doc = self.counts_doc()
        self.agent._flood(al.ControlKind.RENDEZVOUS_COUNTS, doc)
        self.counters["rendezvous_counts_sent"] += 1
        mine = {(ns, p): tuple(keys) for ns, p, keys in doc["routes"]}
        if self.routes.get(self.agent.node_id) != mine:
            self.routes[self.agent.node_id] = mine
            self.agent._tables_dirty = True
            self.agent._selectors_dirty = True

    def _derive(self) -> bool:
        """Ring and popular set from link state and the merged counts; whether they moved."""
        agent = self.agent
        reachable = {dst for (src, dst) in agent.paths if src == agent.node_id}
        names = tuple(sorted({agent.cfg.name} | {agent.names[n] for n in reachable
                                                 if n in agent.names}))
        merged = AttributeCounts()
        for _, events, counts in self.counts.values():
            merged.events += events
            merged.counts.update(counts)
        popular = merged.popular(self.share)
        changed = names != self.ring_names or popular != self.popular
        if names != self.ring_names:
            self.ring = RendezvousRing(names)
            self.ring_names = names
            self.counters["rendezvous_ring_changes"] += 1
        self.merged, self.popular = merged, popular
        return changed

    def register(self, force: bool = False) -> None:
        """Send each target core the rules this appliance registers there (a document to a
        core whose rules changed, or to every one when ``force``; an empty one withdraws)."""
        agent = self.agent
        if self.ring is None:
            return
        by_name = {name: node for node, name in agent.names.items()}
        wanted: dict[int, list] = {}
        for session in agent.sessions.values():
            for ns, pattern, selector in session.rules:
                required = required_of(selector)
                if not required:
                    continue
                key = rendezvous_key(required, self.popular, self.merged.counts,
                                     (ns, pattern, selector))
                target = by_name.get(self.ring.core_of(key))
                if target is not None:
                    wanted.setdefault(target, []).append([ns, pattern, selector, key])
        unplaced = set()
        for target, rules_at in wanted.items():
            budget, kept = REGISTRATION_BYTES, []
            for rule in sorted(rules_at):
                cost = len(rule[1].encode()) + len(rule[2].encode()) + len(rule[3]) + 16
                if cost > budget:
                    unplaced.add(tuple(rule[:3]))
                    continue
                budget -= cost
                kept.append(rule)
            wanted[target] = kept
        if frozenset(unplaced) != self.unplaced:
            self.unplaced = frozenset(unplaced)
            self.counters["rendezvous_rules_flooded"] = len(unplaced)
            agent._interest_dirty = True  # they go into the interest instead
        targets = set(wanted) | {t for t, rules in self.sent.items() if rules}
        for target in targets:
            rules = tuple(sorted({tuple(r) for r in wanted.get(target, [])}))
            if rules == self.sent.get(target) and not force:
                continue
            if rules != self.sent.get(target):
                self.counters["rendezvous_registrations_sent"] += len(rules)
            self.sent[target] = rules
            self.seq += 1
            doc = {"origin": agent.node_id, "epoch": agent.epoch, "seq": self.seq,
                   "target": target, "rules": [list(r) for r in rules]}
            if target == agent.node_id:
                self.on_register(doc)
            else:
                agent._flood(al.ControlKind.RENDEZVOUS_REGISTER, doc)

    # --- documents from neighbours ----------------------------------------------------------------
    def on_counts(self, doc: dict) -> bool:
        """An origin's counts and routes; whether newer (then flooded on)."""
        origin = doc["origin"]
        version = (doc["epoch"], doc["seq"])
        old = self.counts.get(origin)
        if origin == self.agent.node_id or (old is not None and version <= old[0]):
            return False
        self.counts[origin] = (version, doc["events"], Counter(dict(
            (a, c) for a, c in doc["counts"])))
        routes = {(ns, p): tuple(keys) for ns, p, keys in doc["routes"]}
        if self.routes.get(origin) != routes:
            self.routes[origin] = routes
            self.agent._tables_dirty = True
            self.agent._selectors_dirty = True
        return True

    def on_register(self, doc: dict) -> bool:
        """A registration document; whether it is to be flooded on (not for this core)."""
        agent = self.agent
        origin, target = doc["origin"], doc["target"]
        version = (doc["epoch"], doc["seq"])
        if target != agent.node_id:
            if origin == agent.node_id or self.seen.get((origin, target), (-1, -1)) >= version:
                return False
            self.seen[(origin, target)] = version
            return True
        old = self.held.get(origin)
        if old is not None and version <= old[0]:
            return False
        rules = tuple(tuple(r) for r in doc["rules"])
        others = sum(len(r) for o, (_, r) in self.held.items() if o != origin)
        if others + len(rules) > RENDEZVOUS_MAX_REGISTRATIONS:
            self.counters["rendezvous_registrations_refused"] += len(rules)
            log.warning("%s: rendezvous: refused %d registrations of %s (at most %d held)",
                        agent.cfg.name, len(rules), agent.names.get(origin, origin),
                        RENDEZVOUS_MAX_REGISTRATIONS)
            return False
        if old is None or old[1] != rules:
            agent._tables_dirty = True
            agent._selectors_dirty = True
        self.held[origin] = (version, rules)
        return False

    def forget(self, origin: int) -> None:
        """An appliance left link state: its counts, routes and registrations go."""
        for table in (self.counts, self.routes, self.held):
            table.pop(origin, None)

    def full_state(self) -> list[tuple[al.ControlKind, dict]]:
        """Documents a neighbour that came up gets: this appliance's counts and routes."""
        return [(al.ControlKind.RENDEZVOUS_COUNTS, self.counts_doc())]

    # --- tables ---------------------------------------------------------------------------------
    def data_path_routes(self, dests: frozenset[int], records: list
                         ) -> dict[int, dict[int, tuple[bool, tuple, tuple]]]:
        """Destination -> topic key -> (its interest covers it, routing-key texts, texts it
        registered here) for the keys its routes or registrations here cover."""
        agent = self.agent
        out: dict[int, dict[int, tuple[bool, tuple, tuple]]] = {}
        for dest in dests:
            routes = self.routes.get(dest, {})
            held = self.held.get(dest, ((0, 0), ()))[1]
            if not routes and not held:
                continue
            interest = agent.interest.get(dest)
            patterns = interest[2] if interest is not None else frozenset()
            per: dict[int, tuple[bool, tuple, tuple]] = {}
            for rec in records:
                ns, topic = rec.namespace_id, rec.topic
                rdv = sorted({key_text(k) for (n, p), keys in routes.items()
                              if n == ns and _match(p, topic) for k in keys})
                reg = sorted({sel for n, p, sel, _ in held if n == ns and _match(p, topic)})
                if rdv or reg:
                    covered = any(n == ns and _match(p, topic) for n, p in patterns)
                    per[rec.topic_key] = (covered, tuple(rdv), tuple(reg))
            if per:
                out[dest] = per
        return out

    def status(self) -> dict:
        return {"ring": list(self.ring_names), "popular": sorted(self.popular),
                "events_counted": self.merged.events,
                "registrations_held": sum(len(r) for _, r in self.held.values()),
                "registrations_placed": sum(len(r) for r in self.sent.values()),
                "routing_keys": sorted({k for routes in self.routes.values()
                                        for keys in routes.values() for k in keys})}
