"""Shared subscriptions (``$share/GROUP/FILTER``, MQTT 5.0 4.8.2; 3.1.1 clients may use them
too, as mosquitto allows): each message matching FILTER goes to one member of GROUP on this
edge, round robin, preferring members that are connected.

Every member's native session subscribes FILTER itself (so P&M's entitlements apply to each,
and a member leaving leaves no gap), so a message reaches the edge once per member; the first
arrival picks the member and the others are recognised by the message's identity (origin,
publishing session, publish time, topic) among the last ``SHARED_SEEN_MESSAGES`` and dropped
(``shared_duplicates``). A message in flight or queued to a member whose connection ends, or
who leaves the group, goes to another (connected) member (``shared_redelivered``) instead of
waiting for it. Groups are per edge (members on two edges each get a copy) unless the edges
share them (``mqtt.shared_namespace``, shared_view.py): then only the edge that owns a
message by the fabric-wide view delivers it (``shared_remote_owner`` at the others), and the
router tells the view when its groups or their members' connections change. A QoS 1/2
message of a group with no member left here to take it is handed to the other edges
(shared_handoff.py): the owner among them delivers it (``handed``). With the view, the
identities of the messages this edge delivered to a group's members are remembered (the last
``SHARED_SEEN_MESSAGES``): a hand-off, or a message arriving again, that this edge delivered
already is dropped and counted.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from appliance.client.exactly_once import RecentIds
from appliance.dataplane.guaranteed import RELIABLE_STREAM_BIT
from appliance.edge.mqtt.shared_handoff import HANDOFF_GRACE_S, GroupTail, Handoff
from appliance.edge.mqtt.state import Delivery
from appliance.edge.mqtt.topics import SHARED_PREFIX

if TYPE_CHECKING:
    from appliance.edge.mqtt.sessions import SessionState

SHARED_SEEN_MESSAGES = 65_536
"""Recent messages remembered to recognise a shared subscription's repeated arrivals, and
(with the view) recent messages delivered to a group's members (``shared_delivered_forgotten``
counts those forgotten to make room)."""


def split_shared(topic_filter: str) -> tuple[str, str] | None:
    """``$share/GROUP/FILTER`` -> (GROUP, FILTER); None when the group name is not valid (empty,
    or holding a wildcard) or the filter is missing."""
    rest = topic_filter[len(SHARED_PREFIX):]
    group, sep, inner = rest.partition("/")
    if not sep or not group or not inner or "+" in group or "#" in group:
        return None
    return group, inner


class SharedRouter:
    """Group key (``GROUP/FILTER``) -> its members, in joining order."""

    def __init__(self, count: Any) -> None:
        self.groups: dict[str, list[SessionState]] = {}
        self._next: dict[str, int] = {}
        self._seen = RecentIds(SHARED_SEEN_MESSAGES)
        self._count = count
        self.since: dict[str, float] = {}
        """Group -> when its first member joined (monotonic s; shared_view.JOIN_GRACE_S)."""
        self.view: Any = None
        """With ``mqtt.shared_namespace``: the ``SharedView`` (shared_view.py)."""
        self._delivered = RecentIds(SHARED_SEEN_MESSAGES)
        self.tails: dict[str, GroupTail] = {}
        """Groups whose last member left, their pattern held for ``HANDOFF_GRACE_S``."""

    def changed(self) -> None:
        """The groups, or their members' connections, changed (tell the view)."""
        if self.view is not None:
            self.view.local_changed()

    def flag(self, key: str) -> int | None:
        """1: a member of ``key`` is connected here; 0: members, none connected; None: none."""
        members = self.groups.get(key)
        if not members:
            return None
        return 1 if any(m.conn is not None and not m.ended for m in members) else 0

    def flags(self) -> dict[str, int]:
        """Every group of this edge -> its ``flag``."""
        return {key: self.flag(key) or 0 for key in self.groups}

    def join(self, key: str, state: SessionState) -> None:
        if key not in self.groups:
            self.since[key] = time.monotonic()
        members = self.groups.setdefault(key, [])
        if state not in members:
            members.append(state)
            self.changed()

    def leave(self, key: str, state: SessionState) -> None:
        """``state`` leaves the group; what it had not acknowledged goes to another member
        (of this edge, else, with the view, to the other edges: after the announcement of
        this edge's new state)."""
        members = self.groups.get(key, [])
        orphans: list[Delivery] = []
        if state in members:
            orphans = self._hand_over(state, lambda d: d.group == key, connected_only=False)
            members.remove(state)
            if not members:
                self._keep_tail(key, state)
        if not members:
            self.groups.pop(key, None)
            self._next.pop(key, None)
            self.since.pop(key, None)
        self.changed()
        self._hand_off(orphans, "shared_handoffs_left")

    def leave_all(self, state: SessionState) -> None:
        for key in [k for k, members in self.groups.items() if state in members]:
            self.leave(key, state)

    def take_back(self, state: SessionState) -> None:
        """``state``'s connection ended: its unacknowledged shared deliveries go to another
        connected member (of this edge, else of another edge; kept when there is none)."""
        orphans = self._hand_over(state, lambda d: d.group is not None, connected_only=True)
        self.changed()
        self._hand_off(orphans, "shared_handoffs_left")

    def _choose(self, key: str, exclude: SessionState | None = None,
                connected_only: bool = False) -> SessionState | None:
        members = self.groups.get(key, [])
        n = len(members)
        start = self._next.get(key, 0)
        for want_connected in (True, False):
            if not want_connected and connected_only:
                break
            for i in range(n):
                m = members[(start + i) % n]
                if m is exclude or m.ended or (want_connected and m.conn is None):
                    continue
                self._next[key] = (start + i + 1) % n
                return m
        return None

    def offer(self, key: str, msg: Any, meta: Any, qos: int) -> None:
        """A message for the group (from one member's native session), at most at ``qos``
        (0 for a best-effort message, else its MQTT publish QoS, 2 when it carries none)."""
        ident = (key, msg.origin, msg.stream & ~RELIABLE_STREAM_BIT, msg.publish_ts_ns,
                 msg.topic)
        if self._seen.seen_before(ident):
            self._count("shared_duplicates")
            return
        view = self.view
        if view is not None and not view.owns(key, self.flag(key), msg):
            if qos and view.owed(key, msg):  # (left to this edge, which has no member now)
                self._hand_off([Delivery(msg.topic, msg.payload, qos, False, meta, (), key,
                                         ident=ident)], "shared_handoffs_owed")
            else:
                self._count("shared_remote_owner")
            return
        if ident in self._delivered:  # (handed here by another edge before it came)
            self._count("shared_dropped_delivered")
            return
        member = self._choose(key)
        if member is None:
            self._count("shared_no_member")
            return
        self._give(member, key, Delivery(msg.topic, msg.payload, qos, False, meta,
                                         ident=ident))

    def handed(self, sender: int, h: Handoff) -> None:
        """(the loop) Edge ``sender`` handed off message ``h``: delivered here when this
        edge owns it among the group's candidates without ``sender`` and did not deliver it
        already."""
        from dataclasses import replace

        from appliance.edge.mqtt.meta import from_headers

        self._count("shared_handoffs_received")
        view = self.view
        if view is None:
            return
        ident = h.ident
        if ident in self._delivered:
            self._count("shared_handoffs_dropped_duplicate")
            return
        if not view.owns(h.key, self.flag(h.key), h, exclude=sender):
            self._count("shared_handoffs_remote_owner")
            return
        member = self._choose(h.key)
        if member is None:
            self._count("shared_handoffs_no_member")
            return
        meta, qos = from_headers(h.headers, self._count)
        if meta is not None and meta.origin:
            meta = replace(meta, origin=0)  # (the handing edge's state store's only)
        self._count("shared_handoffs_delivered")
        self._give(member, h.key, Delivery(h.topic, h.payload, min(h.qos, qos or h.qos),
                                           False, meta, ident=ident))

    def _give(self, member: SessionState, key: str, d: Delivery) -> None:
        options = member.filters.get(SHARED_PREFIX + key)
        if options is None:
            return
        qos = min(d.qos, options.qos)
        retain = options.retain_as_published and d.meta is not None and d.meta.retain
        self._count("shared_delivered")
        if d.ident is not None and self.view is not None and self._delivered.add(d.ident):
            self._count("shared_delivered_forgotten")
        member.deliver(Delivery(d.topic, d.payload, qos, retain, d.meta,
                                (options.sub_id,) if options.sub_id else (), key,
                                ident=d.ident))

    def _hand_over(self, state: SessionState, which: Any,
                   connected_only: bool) -> list[Delivery]:
        """``state``'s deliveries ``which`` (unacknowledged, queued) go to another member
        of this edge; those with none (and, ``connected_only``, another edge having a
        connected member) are taken from ``state`` and returned, to hand off."""
        moving = [(pid, d) for pid, d in state.inflight.items()
                  if which(d) and d.awaiting != "pubcomp"]
        moving += [(None, d) for d in state.queued if which(d)]
        orphans: list[Delivery] = []
        view = self.view
        for pid, d in moving:
            assert d.group is not None
            other = self._choose(d.group, exclude=state, connected_only=connected_only)
            if other is None and (view is None or d.ident is None or d.qos == 0 or (
                    connected_only and not view.connected_elsewhere(d.group))):
                continue
            if pid is None:
                state.queued.remove(d)
            else:
                del state.inflight[pid]
            state.forget(d)
            if other is None:
                orphans.append(d)
                continue
            self._count("shared_redelivered")
            self._give(other, d.group, d)
        if moving and state.conn is not None:
            state.drain()  # (its freed slots)
        return orphans

    def _hand_off(self, orphans: list[Delivery], why: str) -> None:
        """Hand ``orphans`` (QoS 1/2 deliveries with their identity) to the other edges
        (the view's session sends them after the announcement of this edge's state)."""
        for d in orphans:
            if self.view is not None and self.view.hand_off(d):
                self._count(why)

    def _keep_tail(self, key: str, state: SessionState) -> None:
        """The last member ``state`` of ``key`` leaves: its native pattern is held for
        ``HANDOFF_GRACE_S`` (shared_handoff.GroupTail), so the messages the other edges
        left to this edge meanwhile still come, to be handed off."""
        view, ident = self.view, state.ident
        if view is None or ident is None or view.stopped() or view.server.stopping:
            return
        tail = GroupTail(self, key, ident)
        if not ident.keep(tail, tail.ref, tail.filters[tail.ref].match, state):
            return
        old, self.tails[key] = self.tails.get(key), tail
        tail.timer = view.server.loop.call_later(HANDOFF_GRACE_S, self._end_tail, tail)
        self._count("shared_tails")
        if old is not None:
            self._end_tail(old)

    def _end_tail(self, tail: GroupTail) -> None:
        """``tail``'s grace is over (or a newer one took its place): its pattern goes."""
        if tail.ended:
            return
        tail.ended = True
        if tail.timer is not None:
            tail.timer.cancel()
        if self.tails.get(tail.key) is tail:
            del self.tails[tail.key]
        self.view.server.spawn(tail.ident.leave(tail))
