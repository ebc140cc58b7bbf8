"""The edge's retained messages: the last retained PUBLISH per topic, bounded in count and
bytes (``mqtt.max_retained``, ``mqtt.max_retained_bytes``). Held in memory by the MQTT
server's event-loop thread only, not shared with other edges (docs/mqtt.md). With
``mqtt.state_dir`` every change (set, replaced, cleared) is also recorded in the state store
(``on_change``, store.py) and the store is filled again from it at start; without, an edge
restart loses them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from appliance.edge.mqtt.topics import mqtt_matches


@dataclass(frozen=True, slots=True)
class Retained:
    topic: str
    payload: bytes
    qos: int
    meta: Any = None
    """Its ``meta.MessageMeta``: 5.0 properties and expiry (an expired one is dropped)."""


class RetainedStore:
    """Topic -> its retained message."""

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.messages: dict[str, Retained] = {}
        self.bytes = 0
        self.on_change: Callable[[str, bytes, int, int, Any], None] | None = None
        """Called with (topic, payload, qos, seq, meta) for each change kept (store.py)."""

    @staticmethod
    def _size(topic: str, payload: bytes) -> int:
        return len(topic.encode()) + len(payload)

    def set(self, topic: str, payload: bytes, qos: int, meta: Any = None, seq: int = 0) -> bool:
        """Keep ``payload`` as ``topic``'s retained message (an empty one clears it). False
        when the store's bounds refuse it (the old message, if any, stays). ``seq``: the
        state store's number of the publish that set it (0: a new one)."""
        old = self.messages.get(topic)
        old_size = self._size(topic, old.payload) if old else 0
        if not payload:
            if old is not None:
                del self.messages[topic]
                self.bytes -= old_size
                if self.on_change is not None:
                    self.on_change(topic, b"", 0, seq, None)
            return True
        size = self._size(topic, payload)
        if old is None and len(self.messages) >= self.max_messages:
            return False
        if self.bytes - old_size + size > self.max_bytes:
            return False
        self.messages[topic] = Retained(topic, bytes(payload), qos, meta)
        self.bytes += size - old_size
        if self.on_change is not None:
            self.on_change(topic, bytes(payload), qos, seq, meta)
        return True

    def matching(self, topic_filter: str) -> list[Retained]:
        """The retained messages a new subscription to ``topic_filter`` gets, by topic (those
        past their Message Expiry Interval are removed instead)."""
        now = time.monotonic()
        out = []
        for t, m in sorted(self.messages.items()):
            if mqtt_matches(topic_filter, t):
                if m.meta is not None and m.meta.expired(now):
                    self.set(t, b"", 0)
                else:
                    out.append(m)
        return out
