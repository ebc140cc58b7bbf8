"""The edge's retained messages: the last retained PUBLISH per topic, bounded in count and
bytes (``mqtt.max_retained``, ``mqtt.max_retained_bytes``). Held in memory by the MQTT
server's event-loop thread only; not persisted and not shared with other edges (docs/edge.md).
"""

from __future__ import annotations

import time
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

    @staticmethod
    def _size(topic: str, payload: bytes) -> int:
        return len(topic.encode()) + len(payload)

    def set(self, topic: str, payload: bytes, qos: int, meta: Any = None) -> bool:
        """Keep ``payload`` as ``topic``'s retained message (an empty one clears it). False
        when the store's bounds refuse it (the old message, if any, stays)."""
        old = self.messages.get(topic)
        old_size = self._size(topic, old.payload) if old else 0
        if not payload:
            if old is not None:
                del self.messages[topic]
                self.bytes -= old_size
            return True
        size = self._size(topic, payload)
        if old is None and len(self.messages) >= self.max_messages:
            return False
        if self.bytes - old_size + size > self.max_bytes:
            return False
        self.messages[topic] = Retained(topic, bytes(payload), qos, meta)
        self.bytes += size - old_size
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
