"""Successor delivery (seed 004) for native clients, in the control plane of one appliance.

A client that logs in with a ``client_id`` (``connect(..., client_id=)``) may announce itself
as a successor candidate with a vendor id, ask for the candidates of a vendor id, and set its
successor (a candidate of the same vendor id and the same P&M identity: a successor receives
its ancestor's messages, so it may not see more than that identity's entitlements allow).
The records are the seed's figure 4, per appliance: one node record per client id (vendor id,
alive flag, whether it offers itself, its ended session's subscriptions) and the successor
table (ancestor -> successor), at most ``MAX_NODES`` records.

When an ancestor's session ends improperly (its client went silent for
``clients.session_dead_ms``: no LOGOUT) and its successor is logged in, the ancestor's
subscriptions as they were at its end are made on the successor's session, in the same
class (``SuccessorRoute``), and the successor is told (a SUCCESSOR ``route`` notice, sent
once those tables are live): its client hands the messages matching them to its successor
handler, marked ``successor_of``. When the ancestor logs in again with the same client id,
or the successor sets another, clears or ends, they are withdrawn (``unroute``). No
data-plane change: the data path delivers to the successor's session like to any other.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from appliance.control.state import QOS_GUARANTEED, QOS_NAMES
from datapath.protocol import admin_layout as al

log = logging.getLogger("topicwire.successor")

MAX_NODES = 4_096
"""Node records an appliance keeps at most; a request that needs one more is refused
(``full``)."""
MAX_CANDIDATES = 64
IMPROPER = frozenset({"silent"})
"""The ``_end_session`` reasons that are an improper end (no LOGOUT: the client went
silent). A LOGOUT, a new login replacing the session, a move, the appliance's own decisions
are not."""


@dataclass
class Node:
    """One node record (the seed's figure 4: node id = the client id)."""

    client_id: str
    identity: str
    vendor: str | None = None
    candidate: bool = False
    alive: bool = True
    improper: bool = False
    returned: bool = False
    """It logged in again after an improper end and has not subscribed yet: its routes to
    its successor stay until its first subscription, made in the same table change (no gap,
    no message to both)."""
    session_id: int | None = None
    patterns: dict = field(default_factory=dict)
    """(namespace, pattern) -> QoS name of its session's subscriptions at its improper end."""


class Successors:
    """The records and the routes of one appliance (used on the control agent's thread)."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.successor_of: dict[str, str] = {}
        """ancestor client id -> successor client id"""
        self.taking_over: str | None = None
        """The client id a login being made takes over (a session of it that ends meanwhile
        keeps its record)."""
        self.routes: dict[str, tuple[int, list]] = {}
        """ancestor client id -> (successor's session id, [(ns, pattern, qos name)] made)"""

    # --- sessions ----------------------------------------------------------------------------
    def login_refusal(self, agent: Any, identity: str, client_id: str) -> str | None:
        """Why a login of ``identity`` may not take ``client_id`` (a live session or a
        record of another identity holds it), or None."""
        node = self.nodes.get(client_id)
        held = node is not None and node.identity != identity
        held = held or any(getattr(s, "client_id", None) == client_id and s.identity != identity
                           for s in agent.sessions.values())
        return (f"client id {client_id!r} belongs to a client of another identity at this "
                "appliance; pick another") if held else None

    def logged_in(self, agent: Any, session: Any, client_id: str) -> None:
        """A session logged in with ``client_id``: a live session of the same client id
        is ended (a takeover, not improper); a record of it is alive again (an ancestor's
        return takes its traffic back)."""
        self.taking_over = client_id
        try:
            for other in list(agent.sessions.values()):
                if other is not session and getattr(other, "client_id", None) == client_id \
                        and other.identity == session.identity:
                    agent._end_session(other, "replaced by a new login of its client id")
        finally:
            self.taking_over = None
        node = self.nodes.get(client_id)
        if node is not None and node.identity == session.identity:  # (login_refusal)
            if not node.alive:
                agent.counters["successor_returns"] += 1
                node.returned = node.improper and node.client_id in self.routes
            if not node.returned:
                node.improper, node.patterns = False, {}
            node.alive, node.session_id = True, session.session_id
        self.reroute(agent)

    def subscribed(self, agent: Any, session: Any) -> None:
        """``session`` made a subscription: a returned ancestor's traffic is its own from
        this table change on."""
        node = self.nodes.get(getattr(session, "client_id", None) or "")
        if node is not None and node.returned and node.session_id == session.session_id:
            node.returned, node.improper, node.patterns = False, False, {}
            self.reroute(agent)

    def ended(self, agent: Any, session: Any, why: str) -> None:
        client_id = getattr(session, "client_id", None)
        if client_id is None:
            return
        node = self.nodes.get(client_id)
        if node is None or node.session_id != session.session_id \
                or client_id == self.taking_over:
            return  # (a takeover keeps the record: the new session is the client's)
        if why in IMPROPER:
            agent.counters["successor_improper_ends"] += 1
            if not node.returned:  # (a returned one that ends again keeps its first patterns)
                node.patterns = dict(session.qos)
            node.alive, node.improper, node.returned, node.session_id = False, True, False, None
        else:  # a clean end: the record goes, with every entry naming it
            self._forget(client_id)
        self.reroute(agent)

    def _forget(self, client_id: str) -> None:
        self.nodes.pop(client_id, None)
        self.successor_of.pop(client_id, None)
        for ancestor in [a for a, s in self.successor_of.items() if s == client_id]:
            del self.successor_of[ancestor]

    # --- requests ----------------------------------------------------------------------------
    def request(self, agent: Any, session: Any, doc: dict) -> None:
        op = doc["op"]
        answer: dict[str, Any] = {"op": op, "req": doc.get("req", 0)}
        try:
            answer.update(self._request(agent, session, op, doc) or {})
            answer["ok"] = True
            agent.counters[f"successor_{op}"] += 1
        except _Refused as exc:
            answer.update(ok=False, why=exc.why, error=f"successor: {op}: {exc}")
            agent.counters[f"successor_refused_{exc.why}"] += 1
        agent._reply(session, al.ControlKind.SUCCESSOR, answer)
        self.reroute(agent)

    def _request(self, agent: Any, session: Any, op: str, doc: dict) -> dict | None:
        me = getattr(session, "client_id", None)
        if op in ("route", "unroute"):
            raise _Refused("unknown_op", "route and unroute are the appliance's notices")
        if me is None:
            raise _Refused("no_client_id", "this session logged in without a client id "
                           "(connect(..., client_id=...))")
        if op == "candidates":
            vendor = _vendor(doc)
            return {"vendor": vendor, "candidates": sorted(
                n.client_id for n in self.nodes.values()
                if n.candidate and n.alive and n.vendor == vendor
                and n.identity == session.identity and n.client_id != me)[:MAX_CANDIDATES]}
        node = self._node(session, me)
        if op == "announce":
            node.vendor, node.candidate = _vendor(doc), True
            return {"vendor": node.vendor}
        if op == "withdraw":
            node.candidate = False
            return None
        if op == "clear":
            self.successor_of.pop(me, None)
            return None
        # set
        vendor, name = _vendor(doc), doc.get("successor")
        if not name:
            raise _Refused("bad_request", "set needs 'successor' (a client id)")
        other = self.nodes.get(name)
        if name == me:
            raise _Refused("self", "a client cannot be its own successor")
        if other is None or not other.candidate:
            raise _Refused("unknown_client", f"no client {name!r} announced itself as a "
                           "successor at this appliance")
        if other.identity != session.identity:
            raise _Refused("other_identity", f"{name!r} logs in as another identity (a "
                           "successor must have its ancestor's identity)")
        if other.vendor != vendor:
            raise _Refused("vendor_mismatch", f"{name!r} announced vendor {other.vendor!r}, "
                           f"not {vendor!r}")
        if node.vendor is not None and node.vendor != vendor:
            raise _Refused("vendor_mismatch", f"this client announced vendor {node.vendor!r}, "
                           f"not {vendor!r}")
        self.successor_of[me] = name
        return {"successor": name, "vendor": vendor}

    def _node(self, session: Any, client_id: str) -> Node:
        node = self.nodes.get(client_id)
        if node is None:
            if len(self.nodes) >= MAX_NODES:
                raise _Refused("full", f"this appliance keeps at most {MAX_NODES} successor "
                               "records")
            node = self.nodes[client_id] = Node(client_id, session.identity,
                                                session_id=session.session_id)
        return node

    # --- routes ------------------------------------------------------------------------------
    def reroute(self, agent: Any) -> None:
        """Make the routes what the records say: an ancestor that ended improperly, whose
        successor is logged in, has its subscriptions on the successor's session."""
        want: dict[str, int] = {}
        for ancestor, successor in self.successor_of.items():
            a, s = self.nodes.get(ancestor), self.nodes.get(successor)
            if (a is not None and a.improper and (not a.alive or a.returned) and s is not None
                    and s.alive and s.session_id in agent.sessions):
                want[ancestor] = s.session_id
        for ancestor, (sid, made) in list(self.routes.items()):
            if want.get(ancestor) != sid:
                del self.routes[ancestor]
                session = agent.sessions.get(sid)
                if session is not None:  # told once the tables without them are live
                    self._withdraw(agent, session, made)
                    session.pending += 1
                    agent._replies_when_live.append((session, al.ControlKind.SUCCESSOR,
                                                     {"op": "unroute", "ancestor": ancestor}))
                agent.counters["successor_unrouted"] += 1
        for ancestor, sid in want.items():
            if ancestor in self.routes:
                continue
            session = agent.sessions[sid]
            made = self._install(agent, session, self.nodes[ancestor].patterns)
            self.routes[ancestor] = (sid, made)
            agent.counters["successor_routed"] += 1
            log.warning("%s: client %r ended improperly: its %d subscriptions go to its "
                        "successor %r (session %d)", agent.cfg.name, ancestor, len(made),
                        self.successor_of[ancestor], sid)
            session.pending += 1  # told once the tables with them are live
            agent._replies_when_live.append((session, al.ControlKind.SUCCESSOR, {
                "op": "route", "ancestor": ancestor,
                "patterns": [[ns, p] for ns, p, _ in made]}))

    def _install(self, agent: Any, session: Any, patterns: dict) -> list:
        guaranteed_name = QOS_NAMES[QOS_GUARANTEED]
        sid, made = session.session_id, []
        for (ns, pattern), qos in sorted(patterns.items()):
            if not session.ents.may_subscribe(pattern) or not session.ents.may_use(ns):
                continue  # (the same identity: only after a P&M change)
            if qos == guaranteed_name:
                if session.gport is None:
                    session.gport = agent._client_port()
                    if session.gport is None:
                        agent.counters["successor_refused_ports"] += 1
                        continue
                    agent.compiler.add_egress(f"g:{sid}", session.gport)
                    agent._port_changes[session.gport] = ("gclient", sid)  # (to the data path)
                agent.compiler.subscribe(f"g:{sid}", pattern, ns)
            else:
                agent.compiler.subscribe(f"c:{sid}", pattern, ns)
            made.append((ns, pattern, qos))
        self._changed(agent, session)
        return made

    def _withdraw(self, agent: Any, session: Any, made: list) -> None:
        sid = session.session_id
        for ns, pattern, qos in made:
            if (ns, pattern) in session.qos:
                continue  # the successor's own subscription of the same pattern stays
            egress = f"g:{sid}" if qos == QOS_NAMES[QOS_GUARANTEED] else f"c:{sid}"
            if egress in agent.compiler.egresses:
                agent.compiler.unsubscribe(egress, pattern, ns)
        self._changed(agent, session)

    def _changed(self, agent: Any, session: Any) -> None:
        agent._patterns_changed(session)  # (its pattern sets, the interest's changed sessions)
        agent._interest_dirty = True
        agent._tables_dirty = True

    def status(self) -> dict:
        return {"nodes": len(self.nodes), "successors": len(self.successor_of),
                "routed": len(self.routes),
                "candidates": sum(1 for n in self.nodes.values() if n.candidate)}


class _Refused(Exception):
    def __init__(self, why: str, text: str) -> None:
        super().__init__(text)
        self.why = why


def _vendor(doc: dict) -> str:
    vendor = doc.get("vendor")
    if not vendor:
        raise _Refused("bad_vendor", "a vendor id is needed (1..64 printable characters)")
    return vendor
