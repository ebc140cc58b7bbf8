"""The edge's retained messages: the last retained PUBLISH per topic, bounded in count and
bytes (``mqtt.max_retained``, ``mqtt.max_retained_bytes``). Held in memory by the MQTT
server's event-loop thread only; shared with other edges only with
``mqtt.retained_namespace`` (retain_share.py: ``set_shared`` and the stamps). With
``mqtt.state_dir`` every change (set, replaced, cleared) is also recorded in the state store
(``on_change``, store.py) and the store is filled again from it at start; without, an edge
restart loses them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
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
        self.node_id = 0
        """The edge's node id: the second part of a local change's stamp."""
        self.stamps: dict[str, tuple[int, int]] = {}
        """Topic -> (ns, node id) of when and where its message was set (retain_share.py)."""
        self.cleared: OrderedDict[str, tuple[int, int]] = OrderedDict()
        """Stamps of clears, at most ``max_messages``, the oldest forgotten first."""

    @staticmethod
    def _size(topic: str, payload: bytes) -> int:
        return len(topic.encode()) + len(payload)

    def set(self, topic: str, payload: bytes, qos: int, meta: Any = None, seq: int = 0,
            stamp: tuple[int, int] | None = None) -> bool:
        """Keep ``payload`` as ``topic``'s retained message (an empty one clears it). False
        when the store's bounds refuse it (the old message, if any, stays). ``seq``: the
        state store's number of the publish that set it (0: a new one); ``stamp``: when and
        where it was set (default: now, here)."""
        if stamp is None:
            stamp = (time.time_ns(), self.node_id)
        old = self.messages.get(topic)
        old_size = self._size(topic, old.payload) if old else 0
        if not payload:
            self.stamps.pop(topic, None)
            self.cleared[topic] = stamp
            self.cleared.move_to_end(topic)
            while len(self.cleared) > max(1, self.max_messages):
                self.cleared.popitem(last=False)
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
        self.stamps[topic] = stamp
        self.cleared.pop(topic, None)
        self.bytes += size - old_size
        if self.on_change is not None:
            self.on_change(topic, bytes(payload), qos, seq, meta)
        return True

    def set_shared(self, topic: str, payload: bytes, qos: int, meta: Any,
                   stamp: tuple[int, int]) -> bool | None:
        """Another edge's change (retain_share.py): None when what is held (or its clear)
        was set later, else as ``set``."""
        held = self.stamps.get(topic) or self.cleared.get(topic)
        if held is not None and held >= stamp:
            return None
        return self.set(topic, payload, qos, meta, 0, stamp)

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
