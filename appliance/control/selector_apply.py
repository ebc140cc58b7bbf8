"""Selectors in the appliance (docs/selectors.md, "In the fabric"): a SUBSCRIBE's selector
is checked when it arrives (it parses, and every identifier it names is one the appliance can
evaluate), kept as the session's rule (namespace, pattern, selector), and turned into what the
data path filters with: per session, the topic keys its selector rules guard and the texts
that guard each (``set_selectors``), handed over before the snapshot that could deliver them.
"""

from __future__ import annotations

from typing import Any

from appliance.config import MAX_SELECTORS_PER_SESSION
from appliance.control.state import QOS_GUARANTEED, Session
from datapath.protocol import admin_layout as al
from datapath.topics.algebra import TopicError, includes, matches, overlaps
from nic_offload.selectors import (
    HEADER_PREFIX,
    HEADER_PROPERTIES,
    SelectorError,
    compile_selector,
)

INTEREST_SELECTOR_BYTES = 32_768
"""Selector text an appliance advertises behind its interest at most (an INTEREST_SELECTORS
document must fit one CONTROL entry); a pattern whose selectors do not fit is advertised
without them: every message of it crosses the links, the delivering appliance filters."""

HEADER_NAMES = frozenset(HEADER_PREFIX + name for name in HEADER_PROPERTIES)
"""Message header properties a selector may read (``tw_*``)."""


def schema_fields(pm_doc: dict | None) -> frozenset[str]:
    """Names of the fields of every schema in P&M's document."""
    return frozenset(f["name"] for spec in (pm_doc or {}).get("schemas", ())
                     for f in spec.get("fields", ()) if isinstance(f, dict) and "name" in f)


def within(pattern: str, other: str) -> bool:
    """Whether ``pattern`` includes ``other`` (an unsubscribe withdraws it); False when the
    pair is too complex to decide (the rule stays: a guard on a pattern no longer in the
    lists filters nothing that would be delivered)."""
    try:
        return includes(pattern, other)
    except TopicError:
        return False


def _overlap(pattern: str, other: str) -> bool:
    """Whether the two patterns share a topic; True when too complex to decide (the
    pattern is then advertised without selectors: everything passes)."""
    try:
        return overlaps(pattern, other)
    except TopicError:
        return True


def selector_refusal(agent: Any, session: Session, entry: al.Subscription) -> str | None:
    """Why the selector of a SUBSCRIBE entry must be refused (counted
    ``refused_selector``), or None."""
    text = entry.selector
    reason = None
    try:
        selector = compile_selector(text)
    except SelectorError as exc:
        reason = str(exc)
    else:
        fields = schema_fields(agent.pm_doc)
        unknown = sorted(n for n in selector.identifiers
                         if n not in HEADER_NAMES and n not in fields)
        if unknown:
            reason = (f"selectors: the selector names {', '.join(map(repr, unknown))}, which "
                      "this appliance cannot evaluate: neither a field of a schema in P&M's "
                      "document nor a message header property "
                      f"({', '.join(sorted(HEADER_NAMES))}); fix the selector or add the "
                      "schema to P&M")
        elif entry.qos != QOS_GUARANTEED and len(session.rules) >= MAX_SELECTORS_PER_SESSION:
            reason = (f"selectors: the session holds {len(session.rules)} selector "
                      f"subscriptions, at most {MAX_SELECTORS_PER_SESSION} "
                      "(MAX_SELECTORS_PER_SESSION); unsubscribe first")
    if reason is not None:
        agent.counters["refused_selector"] += 1
    return reason


def ruled_sessions(agent: Any) -> list[Session]:
    """The sessions that hold selector rules (kept as rules come and go: no pass over every
    session once they are known); forgets the ended ones."""
    ruled = _ruled(agent)
    out = []
    for sid in list(ruled):
        session = agent.sessions.get(sid)
        if session is None or not session.rules:
            ruled.discard(sid)
        else:
            out.append(session)
    return out


def _ruled(agent: Any) -> set[int]:
    """The ids of the sessions with rules, found by one pass the first time."""
    ruled = agent.__dict__.get("_ruled_sessions")
    if ruled is None:
        ruled = agent._ruled_sessions = {sid for sid, s in agent.sessions.items() if s.rules}
    return ruled


def _note_rules(agent: Any, session: Session) -> None:
    ruled = _ruled(agent)
    if session.rules:
        ruled.add(session.session_id)
    else:
        ruled.discard(session.session_id)


def record(agent: Any, session: Session, entry: al.Subscription, add: bool) -> bool:
    """Keep an accepted (un)subscribe in the session's rules; whether the appliance filters
    this subscription's messages (a best-effort one with a selector)."""
    ns, pattern = entry.namespace_id, entry.pattern
    if not add:  # seed 000: withdraws the pattern and what it includes
        rules = [r for r in session.rules
                 if not (r[0] == ns and within(pattern, r[1]))]
        plain = {p for p in session.plain if not (p[0] == ns and within(pattern, p[1]))}
        if rules != session.rules or plain != session.plain:
            # (the plain patterns count only for a session with selectors: ``guards``)
            agent._selectors_dirty = agent._selectors_dirty or bool(session.rules)
            session.rules, session.plain = rules, plain
            _note_rules(agent, session)
        return False
    if entry.qos == QOS_GUARANTEED:
        return False  # its own egress, sequenced streams: the client evaluates
    if entry.selector:
        rule = (ns, pattern, entry.selector)
        if rule not in session.rules:
            session.rules.append(rule)
            agent._selectors_dirty = True
            _note_rules(agent, session)
        return True
    if (ns, pattern) not in session.plain:
        session.plain.add((ns, pattern))
        # (a session without selectors has no guards whatever its plain patterns: no pass
        # over every session for its plain subscribe)
        agent._selectors_dirty = agent._selectors_dirty or bool(session.rules)
    return False


def guards(session: Session, records: list) -> dict[int, tuple[str, ...]]:
    """Topic key -> the selector texts that guard its delivery to ``session`` (keys a
    subscription without selector also matches are not guarded: everything passes)."""
    out: dict[int, tuple[str, ...]] = {}
    if not session.rules:
        return out
    rule_ns = {r[0] for r in session.rules}
    for rec in records:
        ns, topic = rec.namespace_id, rec.topic
        if ns not in rule_ns:
            continue
        texts = {sel for n, p, sel in session.rules if n == ns and matches(p, topic)}
        if not texts or any(n == ns and matches(p, topic) for n, p in session.plain):
            continue
        out[rec.topic_key] = tuple(sorted(texts))
    return out


def selective_interest(agent: Any) -> dict[tuple[int, str], tuple[str, ...]]:
    """(namespace, pattern) of this appliance's advertised interest -> the selectors of
    every subscription within it, for the patterns no subscription without selector
    overlaps (a session's pattern counts as without selector unless it is exactly one of its
    selector rules' and no plain subscription's: what is not known passes). At most
    INTEREST_SELECTOR_BYTES of text; the patterns beyond are left out. In rendezvous mode
    the rules registered at rendezvous cores are left out (they are matched there)."""
    rules: list[tuple[int, str, str]] = []
    plain: set[tuple[int, str]] = set()
    rdv = getattr(agent, "rdv", None)  # rendezvous mode: registered rules are matched there
    for s in ruled_sessions(agent):
        rules.extend(r for r in s.rules if rdv is None or not rdv.registered(*r))
    out: dict[tuple[int, str], tuple[str, ...]] = {}
    if not rules:  # the usual case: no pass over every session's patterns
        return out
    for s in agent.sessions.values():
        ruled = {(n, p) for n, p, _ in s.rules}
        plain.update(k for k in s.patterns if k in s.plain or k not in ruled)
    budget = INTEREST_SELECTOR_BYTES
    for ns, pattern in sorted(agent.advertised):
        if any(n == ns and _overlap(pattern, q) for n, q in plain):
            continue
        texts = tuple(sorted({t for n, r, t in rules if n == ns and _overlap(pattern, r)}))
        size = len(pattern) + sum(len(t.encode("utf-8")) + 4 for t in texts)
        if not texts or size > budget:
            continue
        budget -= size
        out[(ns, pattern)] = texts
    return out


def selective_doc(agent: Any) -> dict:
    """This appliance's INTEREST_SELECTORS document (of its current interest)."""
    return {"origin": agent.node_id, "epoch": agent.epoch, "seq": agent.interest_seq,
            "selective": [[ns, p, list(texts)]
                          for (ns, p), texts in sorted(agent.advertised_selective.items())]}


def on_selective(agent: Any, doc: dict) -> bool:
    """An origin's INTEREST_SELECTORS; whether it is newer than what is kept (then it is
    kept and flooded on)."""
    origin = doc["origin"]
    version = (doc["epoch"], doc["seq"])
    old = agent.interest_selectors.get(origin)
    if old is not None and version <= old[0]:
        return False
    agent.interest_selectors[origin] = (version, {(ns, p): tuple(texts)
                                                  for ns, p, texts in doc["selective"]})
    agent._selectors_dirty = True
    return True


def node_guards(agent: Any, origin: int, records: list) -> dict[int, tuple[str, ...]]:
    """Topic key -> the selectors one of which must be TRUE for a message to be sent towards
    appliance ``origin``: for the keys every advertised pattern of which that matches is
    selective there. Nothing (everything is sent) unless the selectors kept are of the
    interest kept (same epoch and seq)."""
    interest = agent.interest.get(origin)
    held = agent.interest_selectors.get(origin)
    if interest is None or held is None or held[0] != tuple(interest[:2]) or not held[1]:
        return {}
    selective = held[1]
    patterns = interest[2]
    out: dict[int, tuple[str, ...]] = {}
    for rec in records:
        ns, topic = rec.namespace_id, rec.topic
        found = [k for k in patterns if k[0] == ns and matches(k[1], topic)]
        if found and all(k in selective for k in found):
            out[rec.topic_key] = tuple(sorted({t for k in found for t in selective[k]}))
    return out


def sync(agent: Any) -> None:
    """Hand the data path every session's and every destination appliance's guards and
    P&M's schemas when the rules, the interest, the registry or P&M's schemas changed
    (before the snapshot built with them)."""
    schemas = (agent.pm_doc or {}).get("schemas", [])
    dests = frozenset(o for kind, o in agent.dest_egress if kind == "n")
    state = (agent.registry.version, id(agent.pm_doc), dests)
    if not agent._selectors_dirty and state == agent._selectors_synced:
        return
    agent._selectors_dirty = False
    agent._selectors_synced = state
    ruled = ruled_sessions(agent)
    selective = [o for o in dests if o in agent.interest_selectors]
    # the registry's records are listed only when someone has guards to compute from them
    # (a copy of 1,000,000 records at each registration's table build otherwise)
    records = (agent.registry.entries() if ruled or selective or agent.rdv is not None
               else [])
    maps = {s.session_id: g for s in ruled for g in (guards(s, records),) if g}
    nodes = {o: g for o in selective for g in (node_guards(agent, o, records),) if g}
    routes = (agent.rdv.data_path_routes(dests, records) if agent.rdv is not None else {})
    if maps or nodes or routes or agent._selectors_sent:
        extra = (routes,) if agent.rdv is not None else ()  # rendezvous mode only
        agent.dp.command("set_selectors", maps, list(schemas), nodes, *extra)
        agent._selectors_sent = bool(maps or nodes or routes)
