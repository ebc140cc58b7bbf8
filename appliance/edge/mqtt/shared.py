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
router tells the view when its groups or their members' connections change.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

from appliance.dataplane.guaranteed import RELIABLE_STREAM_BIT
from appliance.edge.mqtt.state import Delivery
from appliance.edge.mqtt.topics import SHARED_PREFIX

if TYPE_CHECKING:
    from appliance.edge.mqtt.sessions import SessionState

SHARED_SEEN_MESSAGES = 65_536
"""Recent messages remembered to recognise a shared subscription's repeated arrivals."""


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
        self._seen: set[tuple] = set()
        self._seen_order: deque[tuple] = deque()
        self._count = count
        self.since: dict[str, float] = {}
        """Group -> when its first member joined (monotonic s; shared_view.JOIN_GRACE_S)."""
        self.view: Any = None
        """With ``mqtt.shared_namespace``: the ``SharedView`` (shared_view.py)."""

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
        """``state`` leaves the group; what it had not acknowledged goes to another member."""
        members = self.groups.get(key, [])
        if state in members:
            self._hand_over(state, lambda d: d.group == key, connected_only=False)
            members.remove(state)
        if not members:
            self.groups.pop(key, None)
            self._next.pop(key, None)
            self.since.pop(key, None)
        self.changed()

    def leave_all(self, state: SessionState) -> None:
        for key in [k for k, members in self.groups.items() if state in members]:
            self.leave(key, state)

    def take_back(self, state: SessionState) -> None:
        """``state``'s connection ended: its unacknowledged shared deliveries go to another
        connected member (kept when there is none)."""
        self._hand_over(state, lambda d: d.group is not None, connected_only=True)
        self.changed()

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
        if ident in self._seen:
            self._count("shared_duplicates")
            return
        self._seen.add(ident)
        self._seen_order.append(ident)
        if len(self._seen_order) > SHARED_SEEN_MESSAGES:
            self._seen.discard(self._seen_order.popleft())
        if self.view is not None and not self.view.owns(key, self.flag(key), msg):
            self._count("shared_remote_owner")
            return
        member = self._choose(key)
        if member is None:
            self._count("shared_no_member")
            return
        self._give(member, key, Delivery(msg.topic, msg.payload, qos, False, meta))

    def _give(self, member: SessionState, key: str, d: Delivery) -> None:
        options = member.filters.get(SHARED_PREFIX + key)
        if options is None:
            return
        qos = min(d.qos, options.qos)
        retain = options.retain_as_published and d.meta is not None and d.meta.retain
        self._count("shared_delivered")
        member.deliver(Delivery(d.topic, d.payload, qos, retain, d.meta,
                                (options.sub_id,) if options.sub_id else (), key))

    def _hand_over(self, state: SessionState, which: Any, connected_only: bool) -> None:
        moving = [(pid, d) for pid, d in state.inflight.items()
                  if which(d) and d.awaiting != "pubcomp"]
        moving += [(None, d) for d in state.queued if which(d)]
        for pid, d in moving:
            assert d.group is not None
            other = self._choose(d.group, exclude=state, connected_only=connected_only)
            if other is None:
                continue
            if pid is None:
                state.queued.remove(d)
            else:
                del state.inflight[pid]
            state.forget(d)
            self._count("shared_redelivered")
            self._give(other, d.group, d)
        if moving and state.conn is not None:
            state.drain()  # (its freed slots)
