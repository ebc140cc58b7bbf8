"""Successor delivery (seed 004): a client names a successor; when it disconnects improperly
(its socket dropped, its keep-alive expired: no DISCONNECT), the messages that would have gone
to it go to the successor until it returns, then back to it (docs/mqtt.md, "Successor
delivery").

The exchange is four PUBLISHes of the client to reserved ``$successor/`` topics, taken by
the edge itself (never published into the fabric), each answered by a PUBLISH to the
requester alone (its 5.0 Response Topic, else ``$successor/reply/<verb>``, with its
Correlation Data) carrying a JSON document::

    $successor/announce    {"vendor": V}              I can be a successor (notifyAncestor)
    $successor/withdraw    {}                         I no longer can
    $successor/candidates  {"vendor": V}              who can be mine? (subscribeSuccessors)
                           -> {"ok": true, "candidates": [client ids]}        (successorData)
    $successor/set         {"successor": ID, "vendor": V}   ID is mine (setSuccessor)
    $successor/clear       {}                         I have none

The records are those of the seed's figure 4, one ``NodeRecord`` per client id (its vendor
id, whether it is alive, whether its last disconnect was improper, whether it offers itself
as a successor) and the ``successors`` table (ancestor id -> successor id). A candidate
must have announced the same vendor id and log in as the same P&M identity as its ancestor
(a successor receives the ancestor's messages, so it may not see more than the ancestor's
entitlements let it). Every refusal is an answer ``{"ok": false, "error": "successor: ..."}``
(5.0: PUBACK/PUBREC reason 0x83), never a closed connection. No client may subscribe to
``$successor/`` filters (0x80, 5.0 0x87: answers go to the requester alone, and nothing
published into the fabric under that prefix reaches an MQTT client).

Routing (``route``): a delivery to an ancestor whose last disconnect was improper and whose
successor is connected goes to the successor instead (its own topic, payload, QoS and 5.0
properties, and the user property ``successor-of`` naming the ancestor; the ancestor's
subscription identifiers stay behind). At the improper disconnect
the ancestor's unacknowledged and queued QoS 1/2 deliveries go to the successor too
(``hand_over``), so none waits for a return that may not come; a clean session is held
(offline, at most ``mqtt.max_session_expiry_s``) instead of ending, so its subscriptions
keep bringing its messages. When the ancestor returns it is alive again and its traffic is
its own again.

Bounds: ``MAX_NODES`` records (one more announce or set is refused), ``MAX_CANDIDATES``
ids per answer, ``MAX_VENDOR_BYTES`` per vendor id, ``MAX_REQUEST_BYTES`` per request.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType, Reason
from appliance.edge.mqtt.meta import MessageMeta
from appliance.edge.mqtt.state import Delivery
from appliance.edge.mqtt.topics import topic_problem

if TYPE_CHECKING:
    from appliance.edge.mqtt.connection import MqttConnection
    from appliance.edge.mqtt.sessions import SessionState

log = logging.getLogger("topicwire.edge.mqtt")

SUCCESSOR_PREFIX = "$successor/"
REPLY_PREFIX = SUCCESSOR_PREFIX + "reply/"
MAX_NODES = 4_096
"""Node records kept (clients that announced, asked or set a successor)."""
MAX_CANDIDATES = 64
"""Candidate ids in one answer."""
MAX_VENDOR_BYTES = 64
MAX_REQUEST_BYTES = 1_024
SUCCESSOR_OF = "successor-of"
"""The user property naming the ancestor on a message routed to its successor (5.0)."""
VERBS = ("announce", "withdraw", "candidates", "set", "clear")


@dataclass
class NodeRecord:
    """Figure 4's first structure: one client id (``node_id``)."""

    node_id: str
    identity: str
    vendor_id: str | None = None
    is_alive: bool = True
    dropped: bool = False
    """Its last disconnect was improper (then its deliveries go to its successor)."""
    candidate: bool = False
    """It announced itself as a successor (notifyAncestor)."""
    kept: bool = False
    """Its client is taking its connection over: the old session's end keeps the record."""


class SuccessorRefused(Exception):
    """Internal: a request is refused (``why`` counted, the message answered)."""

    def __init__(self, why: str, message: str) -> None:
        super().__init__(message)
        self.why = why


class SuccessorTable:
    """The records (figure 4) and the routing decisions; used on the MQTT server's loop."""

    def __init__(self, count: Any, max_nodes: int = MAX_NODES) -> None:
        self.nodes: dict[str, NodeRecord] = {}
        self.successors: dict[str, str] = {}
        """Figure 4's second structure: ancestor node id -> successor node id."""
        self.max_nodes = max_nodes
        self._count = count

    # --- the exchange --------------------------------------------------------------------------
    def request(self, node_id: str, identity: str, verb: str, doc: dict) -> dict:
        """Apply one request of client ``node_id`` (logged in as ``identity``); the answer."""
        try:
            if verb not in VERBS:
                raise SuccessorRefused("unknown_verb", f"unknown request {verb!r}; one of "
                                       + ", ".join(VERBS))
            answer = getattr(self, "_" + verb)(node_id, identity, doc)
        except SuccessorRefused as refused:
            self._count("successor_refused_" + refused.why)
            return {"ok": False, "request": verb, "why": refused.why,
                    "error": f"successor: {verb}: {refused}"}
        self._count("successor_" + verb)
        return {"ok": True, "request": verb, **answer}

    def _record(self, node_id: str, identity: str) -> NodeRecord:
        rec = self.nodes.get(node_id)
        if rec is None:
            if len(self.nodes) >= self.max_nodes:
                raise SuccessorRefused("full", f"{self.max_nodes} clients recorded already; "
                                       "try again when some have gone")
            rec = self.nodes[node_id] = NodeRecord(node_id, identity)
        return rec

    def _announce(self, node_id: str, identity: str, doc: dict) -> dict:
        vendor = _vendor(doc)
        rec = self._record(node_id, identity)
        rec.vendor_id, rec.candidate = vendor, True
        return {"vendor": vendor}

    def _withdraw(self, node_id: str, identity: str, doc: dict) -> dict:
        rec = self.nodes.get(node_id)
        if rec is not None:
            rec.candidate = False
        return {}

    def _candidates(self, node_id: str, identity: str, doc: dict) -> dict:
        vendor = _vendor(doc)
        rec = self._record(node_id, identity)
        rec.vendor_id = vendor
        found = [r.node_id for r in self.nodes.values()
                 if r.candidate and r.is_alive and r.node_id != node_id
                 and r.vendor_id == vendor and r.identity == identity]
        return {"vendor": vendor, "candidates": sorted(found)[:MAX_CANDIDATES]}

    def _set(self, node_id: str, identity: str, doc: dict) -> dict:
        successor = doc.get("successor")
        if not isinstance(successor, str) or not successor:
            raise SuccessorRefused("bad_request", 'needs "successor": a client id')
        vendor = _vendor(doc)
        if successor == node_id:
            raise SuccessorRefused("self", "a client cannot be its own successor")
        cand = self.nodes.get(successor)
        if cand is None or not cand.candidate:
            raise SuccessorRefused("unknown_client", f"{successor!r} has not announced itself "
                                   "as a successor (it publishes $successor/announce first)")
        if cand.vendor_id != vendor:
            raise SuccessorRefused("vendor_mismatch", f"{successor!r} announced another "
                                   f"vendor id than {vendor!r}; vendor ids must match")
        if cand.identity != identity:
            raise SuccessorRefused("other_identity", f"{successor!r} logs in as another "
                                   "identity; a successor receives its ancestor's messages, "
                                   "so both log in as the same identity")
        rec = self._record(node_id, identity)
        rec.vendor_id = vendor
        self.successors[node_id] = successor
        return {"successor": successor, "vendor": vendor}

    def _clear(self, node_id: str, identity: str, doc: dict) -> dict:
        self.successors.pop(node_id, None)
        return {}

    # --- sessions come and go ----------------------------------------------------------------
    def taking_over(self, node_id: str) -> None:
        """A CONNECT takes over ``node_id``'s connection (its own return, seen before the old
        connection's end): the old session's end keeps the records."""
        rec = self.nodes.get(node_id)
        if rec is not None:
            rec.kept = True

    def on_attach(self, state: SessionState) -> None:
        """``state``'s client is connected (again): its own traffic is its own; ancestors
        that dropped while it was away hand it what waits for them."""
        rec = self.nodes.get(state.client_id)
        if rec is None:
            return
        rec.kept = False
        if rec.identity != state.identity:  # the client id now logs in as another identity
            self._forget(state.client_id)
            return
        if rec.dropped and state.client_id in self.successors:
            self._count("successor_returns")
        rec.is_alive, rec.dropped = True, False
        for ancestor_id, successor_id in self.successors.items():
            if successor_id == state.client_id:
                ancestor = state.server.sessions.get(ancestor_id)
                if ancestor is not None and ancestor.conn is None:
                    self.hand_over(ancestor)

    def on_detach(self, state: SessionState, improper: bool) -> bool:
        """``state``'s connection ended; True when the session must be held for its
        successor (an improper disconnect of an ancestor): then what it has not had
        acknowledged goes to the successor."""
        rec = self.nodes.get(state.client_id)
        if rec is None:
            return False
        rec.is_alive, rec.dropped = False, improper
        if not improper or state.client_id not in self.successors:
            return False
        self._count("successor_improper_disconnects")
        log.info("mqtt: %r disconnected improperly: its messages go to its successor %r",
                 state.client_id, self.successors[state.client_id])
        self.hand_over(state)
        return True

    def on_end(self, state: SessionState, why: str) -> None:
        """``state`` ended: its records go, unless the same client is coming back now
        (a clean start, a takeover) or another session of its id is current."""
        if why in ("clean_start", "raced"):
            return
        current = state.server.sessions.get(state.client_id)
        if current is not None and current is not state:
            return
        rec = self.nodes.get(state.client_id)
        if rec is not None and rec.kept:
            rec.kept = False
            return
        self._forget(state.client_id)

    def _forget(self, node_id: str) -> None:
        self.nodes.pop(node_id, None)
        self.successors.pop(node_id, None)
        for ancestor_id in [a for a, s in self.successors.items() if s == node_id]:
            del self.successors[ancestor_id]

    # --- routing -------------------------------------------------------------------------------
    def target(self, state: SessionState) -> SessionState | None:
        """The connected successor of ``state`` when its deliveries go there, else None."""
        rec = self.nodes.get(state.client_id)
        if rec is None or rec.is_alive or not rec.dropped:
            return None
        successor_id = self.successors.get(state.client_id)
        succ = None if successor_id is None else state.server.sessions.get(successor_id)
        if succ is None or succ.ended or succ.conn is None or succ.conn.closing or (
                succ.identity != state.identity):
            return None
        return succ

    def route(self, state: SessionState, d: Delivery) -> bool:
        """Send ``d`` (for ``state``) to its successor instead; whether it did."""
        succ = self.target(state)
        if succ is None:
            return False
        self._count("successor_routed")
        succ.deliver(for_successor(d, state.client_id))
        return True

    def hand_over(self, state: SessionState) -> None:
        """``state``'s unacknowledged (not past PUBREC) and queued deliveries go to its
        successor, when one is connected."""
        succ = self.target(state)
        if succ is None:
            return
        moving = [d for d in state.inflight.values() if d.awaiting != "pubcomp"]
        moving += list(state.queued)
        state.inflight = {pid: d for pid, d in state.inflight.items()
                          if d.awaiting == "pubcomp"}
        state.queued.clear()
        for d in moving:
            state.forget(d)
            self._count("successor_handed_over")
            succ.deliver(for_successor(d, state.client_id))

    def status(self) -> dict[str, Any]:
        return {"nodes": len(self.nodes), "successors": len(self.successors),
                "candidates": sum(1 for r in self.nodes.values() if r.candidate),
                "dropped": sum(1 for r in self.nodes.values() if r.dropped)}


def for_successor(d: Delivery, ancestor_id: str) -> Delivery:
    """``d`` as its ancestor's successor gets it: the same topic, payload, QoS and 5.0
    properties, plus the user property ``successor-of`` = the ancestor's client id (5.0
    successors see it); not the ancestor's subscription identifiers."""
    meta = d.meta
    mark = (codec.PROP["user_property"], (SUCCESSOR_OF, ancestor_id))
    if meta is None:
        meta = MessageMeta([mark])
    else:
        meta = MessageMeta([*meta.props, mark], meta.expires_at, meta.retain)
    return Delivery(d.topic, d.payload, d.qos, d.retain, meta)


def _vendor(doc: dict) -> str:
    vendor = doc.get("vendor")
    if not isinstance(vendor, str) or not vendor or len(vendor.encode()) > MAX_VENDOR_BYTES \
            or not vendor.isprintable():
        raise SuccessorRefused("bad_vendor", 'needs "vendor": a printable vendor id of 1 to '
                               f"{MAX_VENDOR_BYTES} bytes")
    return vendor


def parse_request(payload: bytes) -> dict | str:
    """The request's JSON object, or why it is not one."""
    if len(payload) > MAX_REQUEST_BYTES:
        return f"larger than {MAX_REQUEST_BYTES} bytes"
    if not payload:
        return {}
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return "not JSON"
    return doc if isinstance(doc, dict) else "not a JSON object"


# --- over MQTT -------------------------------------------------------------------------------
def on_successor_publish(conn: MqttConnection, topic: str, pkt: codec.Publish) -> bool:
    """A PUBLISH of the connection's client to ``$successor/VERB``: apply and answer it (the
    caller acknowledges the PUBLISH); whether it was accepted."""
    state = conn.state
    assert state is not None
    table = conn.server.successors
    verb = topic[len(SUCCESSOR_PREFIX):]
    doc = parse_request(pkt.payload)
    if isinstance(doc, str):
        conn.count("successor_refused_bad_request")
        answer = {"ok": False, "request": verb, "why": "bad_request",
                  "error": f"successor: {verb}: the payload is {doc}"}
    else:
        answer = table.request(state.client_id, state.identity, verb, doc)
    props: codec.Props = []
    reply = REPLY_PREFIX + verb if verb in VERBS else REPLY_PREFIX + "error"
    if conn.version == codec.V5:
        asked = codec.prop(pkt.props, "response_topic")
        if isinstance(asked, str) and topic_problem(asked) is None:
            reply = asked
        correlation = codec.prop(pkt.props, "correlation_data")
        if correlation is not None:
            props.append((codec.PROP["correlation_data"], correlation))
    payload = json.dumps(answer).encode()
    conn.send(codec.encode_publish(reply, payload, 0, False, False, 0, conn.version, props))
    return bool(answer["ok"])


def ack_successor_publish(conn: MqttConnection, pkt: codec.Publish, ok: bool) -> None:
    """Acknowledge a ``$successor/`` PUBLISH (5.0: 0x83 when refused)."""
    reason = 0 if ok else Reason.IMPLEMENTATION_SPECIFIC
    if pkt.qos == 1:
        conn.send(codec.encode_ack(PacketType.PUBACK, pkt.packet_id, conn.version, reason))
    elif pkt.qos == 2:
        assert conn.state is not None
        if ok:  # (a refused PUBREC ends the flow: no PUBREL follows)
            conn.state.awaiting_rel.add(pkt.packet_id)
        conn.send(codec.encode_ack(PacketType.PUBREC, pkt.packet_id, conn.version, reason))
