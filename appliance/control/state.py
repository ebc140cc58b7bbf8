"""The control agent's shared state types and constants: a neighbour, a client session, the
constants of the admin frames it sends, and small helpers every side uses."""


import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from appliance.config import (
    NeighbourConfig,
)
from appliance.control import pm as pmod
from appliance.control.routing import Lsa, MinimalSet, minimal_patterns
from datapath.protocol import admin_layout as al

log = logging.getLogger("topicwire.appliance")

ROLE = {"core": al.NodeRole.CORE, "edge": al.NodeRole.EDGE}
QOS_NAMES = {0: "best-effort", 1: "last-value", 2: "guaranteed"}
QOS_GUARANTEED = 2
REPLY_FRAME_BYTES = 16_000
"""Answers to one client packed into one CONTROL frame up to about this many bytes of
documents (``ControlAgent._reply_many``)."""
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
    discovery_reply_ns: int = -(1 << 62)
    """When we last answered its discovery HELLO (control/fabric.py)."""
    echo_sent_ns: int = -(1 << 62)
    """When we last echoed one of its HELLOs (its round-trip time, ``NEIGHBOUR_ECHO_NS``)."""


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
    server_signature: str | None = None
    """The appliance's proof to the client (hex) when the login proved a password: sent
    with every answer to the login, repeats included."""
    restored: list | None = None
    """The subscriptions made from the standby's mirror at its login ([namespace, pattern,
    QoS number], ``LOGIN_RESULT.restored``; control/mirror.py), or None."""
    standby: bool = False
    """The client said at login that it has a standby appliance to move to
    (``LOGIN.standby``): only such a session is asked to move (``move_clients``)."""
    client_id: str | None = None
    """The client id it logged in with (``LOGIN.client_id``; successor delivery,
    control/successor.py), or None."""
    registered: set[int] = field(default_factory=set)
    """Topic keys this session registered (at most ``clients.max_registrations``)."""
    pending: int = 0
    """Its answers waiting for the tables to be live (``clients.max_pending_requests``)."""
    rules: list = field(default_factory=list)
    """(namespace, pattern, selector text) of its best-effort subscriptions with a selector
    (at most MAX_SELECTORS_PER_SESSION; control/selector_apply.py)."""
    plain: set = field(default_factory=set)
    """(namespace, pattern) of its best-effort subscriptions without selector."""
    flow_policies: dict = field(default_factory=dict)
    """(namespace, pattern) -> the flow-control policy of each of its best-effort and
    last-value subscriptions (control/flow_apply.py)."""
    flow_policy: int = -1
    """The policy the data path applies to it (the strictest of ``flow_policies``; -1: not
    told yet)."""
    owned: tuple = field(default_factory=lambda: (set(), set()))
    """(namespace, pattern) of its best-effort / last-value subscriptions, and of its
    guaranteed ones, made with ``own_class`` (the SUBSCRIBE flag
    ``SUBSCRIPTION_FLAG_OWN_CLASS``) ..."""
    unowned: tuple = field(default_factory=lambda: (set(), set()))
    """... and made without it, until an unsubscribe withdraws them."""
    own_class: int = 0
    """What the data path was told (``set_own_class``): ``OWN_PLAIN`` when its best-effort
    subscriptions were all made with ``own_class``, ``OWN_GUARANTEED`` likewise for its
    guaranteed ones."""


def _minimal(patterns: Any) -> frozenset[tuple[int, str]]:
    """(namespace, pattern) pairs with superset suppression per namespace."""
    by_ns: dict[int, list[str]] = {}
    for ns, pattern in patterns:
        by_ns.setdefault(ns, []).append(pattern)
    return frozenset((ns, p) for ns, found in by_ns.items() for p in minimal_patterns(found))


class InterestSets:
    """The minimal (namespace, pattern) sets of all sessions' best-effort and guaranteed
    lists, kept across interest changes (``ControlAgent._advertise_interest``).

    A session's ``patterns``/``gpatterns`` Counter is replaced, never edited, when its lists
    change (control/clients.py), so ``update`` re-reads only the sessions whose Counter is
    another object than last time (and forgets the ended ones): the cost of one interest
    change is one pass over the sessions plus that session's patterns, not a pass over every
    pattern of every session. Each namespace's minimal set is a ``MinimalSet`` that follows
    the patterns as they come and go (a pattern without wildcards costs one index walk)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Any, Any]] = {}
        self._counts: tuple[Counter, Counter] = (Counter(), Counter())
        self._sets: tuple[dict[int, MinimalSet], dict[int, MinimalSet]] = ({}, {})
        self._changed = [False, False]
        self._union: list[frozenset] = [frozenset(), frozenset()]

    def update(self, sessions: dict[int, Session], changed: Any = None
               ) -> tuple[frozenset, frozenset]:
        """(best-effort, guaranteed) minimal sets of ``sessions`` now. ``changed``: the ids
        of the only sessions that may have come, gone or changed their patterns since the
        last update (no pass over the others); None: look at every session."""
        seen = self._seen
        if changed is None:
            gone = [sid for sid in seen if sid not in sessions]
            looked = sessions.items()
        else:
            gone = [sid for sid in changed if sid in seen and sid not in sessions]
            looked = [(sid, sessions[sid]) for sid in changed if sid in sessions]
        for sid in gone:
            self._apply(seen.pop(sid), (Counter(), Counter()))
        for sid, session in looked:
            held = seen.get(sid)
            now = (session.patterns, session.gpatterns)
            if held is None:
                self._apply((Counter(), Counter()), now)
            elif held[0] is not now[0] or held[1] is not now[1]:
                self._apply(held, now)
            else:
                continue
            seen[sid] = now
        return self._result(0), self._result(1)

    def _apply(self, old: tuple[Any, Any], new: tuple[Any, Any]) -> None:
        for kind in (0, 1):
            counts, sets = self._counts[kind], self._sets[kind]
            before, after = old[kind], new[kind]
            for key in before:
                if key not in after:
                    counts[key] -= 1
                    if counts[key] <= 0:
                        del counts[key]
                        sets[key[0]].remove(key[1])
                        self._changed[kind] = True
            for key in after:
                if key not in before:
                    counts[key] += 1
                    if counts[key] == 1:
                        sets.setdefault(key[0], MinimalSet()).add(key[1])
                        self._changed[kind] = True

    def _result(self, kind: int) -> frozenset[tuple[int, str]]:
        if self._changed[kind]:
            self._changed[kind] = False
            sets = self._sets[kind]
            for ns in [ns for ns, m in sets.items() if not m.held]:
                del sets[ns]
            self._union[kind] = frozenset((ns, p) for ns, m in sets.items()
                                          for p in m.minimal)
        return self._union[kind]


def _lsa_to_doc(lsa: Lsa) -> dict:
    return {"origin": lsa.origin, "name": lsa.name, "epoch": lsa.epoch, "seq": lsa.seq,
            "links": [list(x) for x in lsa.links]}
