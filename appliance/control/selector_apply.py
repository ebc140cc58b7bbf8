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
from datapath.topics.algebra import includes, matches
from nic_offload.selectors import (
    HEADER_PREFIX,
    HEADER_PROPERTIES,
    SelectorError,
    compile_selector,
)

HEADER_NAMES = frozenset(HEADER_PREFIX + name for name in HEADER_PROPERTIES)
"""Message header properties a selector may read (``tw_*``)."""


def schema_fields(pm_doc: dict | None) -> frozenset[str]:
    """Names of the fields of every schema in P&M's document."""
    return frozenset(f["name"] for spec in (pm_doc or {}).get("schemas", ())
                     for f in spec.get("fields", ()) if isinstance(f, dict) and "name" in f)


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


def record(agent: Any, session: Session, entry: al.Subscription, add: bool) -> bool:
    """Keep an accepted (un)subscribe in the session's rules; whether the appliance filters
    this subscription's messages (a best-effort one with a selector)."""
    ns, pattern = entry.namespace_id, entry.pattern
    if not add:  # seed 000: withdraws the pattern and what it includes
        rules = [r for r in session.rules
                 if not (r[0] == ns and includes(pattern, r[1]))]
        plain = {p for p in session.plain if not (p[0] == ns and includes(pattern, p[1]))}
        if rules != session.rules or plain != session.plain:
            session.rules, session.plain = rules, plain
            agent._selectors_dirty = True
        return False
    if entry.qos == QOS_GUARANTEED:
        return False  # its own egress, sequenced streams: the client evaluates
    if entry.selector:
        rule = (ns, pattern, entry.selector)
        if rule not in session.rules:
            session.rules.append(rule)
            agent._selectors_dirty = True
        return True
    if (ns, pattern) not in session.plain:
        session.plain.add((ns, pattern))
        agent._selectors_dirty = True
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


def sync(agent: Any) -> None:
    """Hand the data path every session's guards and P&M's schemas when the rules, the
    registry or P&M's schemas changed (before the snapshot built with them)."""
    schemas = (agent.pm_doc or {}).get("schemas", [])
    state = (agent.registry.version, id(agent.pm_doc))
    if not agent._selectors_dirty and state == agent._selectors_synced:
        return
    agent._selectors_dirty = False
    agent._selectors_synced = state
    records = agent.registry.entries()
    maps = {sid: g for sid, s in agent.sessions.items() if s.rules
            for g in (guards(s, records),) if g}
    if maps or agent._selectors_sent:
        agent.dp.command("set_selectors", maps, list(schemas))
        agent._selectors_sent = bool(maps)
