"""Exactly once, for native subscribers, of MQTT QoS 2 publications across a crash of the
publishing edge.

An edge with ``mqtt.state_dir`` records every incoming QoS 2 PUBLISH before it acknowledges
it; when it crashes before the record is retired it publishes the message again at start,
with the same number (the ``mqtt.origin`` header; appliance/edge/mqtt/exactly_once.py). Its
MQTT subscribers' edges drop that copy; a native client does the same for its guaranteed
subscriptions: it remembers the (origin appliance, number) of the last ``REPUBLISH_WINDOW``
guaranteed messages published at QoS 2 it dispatched, and drops a message whose pair it
saw (``connection_counters()["republished_dropped"]``). A copy that comes back after more
than that many is dispatched again (at least once, as before).

No library keeps a bounded recency set; an ordered dict that forgets its oldest entry is
the whole mechanism (``RecentIds``, which the edge uses too).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

QOS_HEADER = "mqtt.qos"
"""The QoS an MQTT client published a message at (appliance/edge/mqtt/meta.py)."""
NUMBER_HEADER = "mqtt.origin"
"""The publishing edge's number of the message: its state-store record (never repeats)."""
REPUBLISH_WINDOW = 65_536
"""QoS 2 messages a native client remembers (``connect(..., republish_window=)``)."""
MAX_REPUBLISH_WINDOW = 1_000_000


class RecentIds:
    """The last ``capacity`` keys seen, oldest forgotten first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[tuple, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: tuple) -> bool:
        return key in self._keys

    def add(self, key: tuple) -> bool:
        """Remember ``key`` (nothing with a capacity of 0, nor when it is remembered
        already); True when the oldest key was forgotten to make room."""
        keys = self._keys
        if not self.capacity or key in keys:
            return False
        keys[key] = None
        if len(keys) > self.capacity:
            keys.popitem(last=False)
            return True
        return False

    def seen_before(self, key: tuple) -> bool:
        """True when ``key`` is among the last ``capacity`` keys; else it is added."""
        if not self.capacity:
            return False
        if key in self._keys:
            return True
        self.add(key)
        return False


class Republished:
    """A client's check of its guaranteed messages for a QoS 2 publication sent again."""

    def __init__(self, capacity: int = REPUBLISH_WINDOW) -> None:
        self.ids = RecentIds(capacity)
        self.dropped = 0

    def again(self, msg: Any) -> bool:
        """True (counted) when ``msg`` is a copy of a QoS 2 publication already dispatched."""
        headers = msg.headers
        if headers.get(QOS_HEADER) != "2":
            return False
        number = headers.get(NUMBER_HEADER)
        if number is None or not self.ids.seen_before((msg.origin, number)):
            return False
        self.dropped += 1
        return True
