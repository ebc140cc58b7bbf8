"""MQTT-only metadata of messages published through this edge: 5.0 message properties
(payload format, content type, response topic, correlation data, user properties), the
message expiry deadline and the retain flag.

The native protocol carries a topic and a payload, not these. The edge remembers them beside
the native publish and finds them again when the message comes back from the fabric to its
MQTT subscribers on this edge. The key is exact without touching the wire: a message carries
its publishing session (``stream``) and its publish time (``publish_ts_ns``, taken inside
``Client.publish``), and one connection publishes one message at a time, so the interval
[before the publish call, after it] of one session holds the publish time of exactly one
message. Messages from other appliances or native clients have no entry (no properties).

Bounded: at most ``mqtt.max_metadata_messages`` entries of ``mqtt.max_metadata_bytes`` in
all, ``META_TTL_NS`` old; beyond, the oldest are forgotten (``metadata_evicted``: such a
message is delivered without its properties). Used by the event-loop thread only.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from appliance.edge.mqtt import codec

CARRIED_PROPS = frozenset({codec.PROP["payload_format_indicator"], codec.PROP["content_type"],
                           codec.PROP["response_topic"], codec.PROP["correlation_data"],
                           codec.PROP["user_property"]})
"""The PUBLISH properties forwarded unchanged to subscribers (MQTT 5.0 3.3.2.3)."""
META_TTL_NS = 60 * 1_000_000_000
"""Entries older than this are forgotten: a message reaches this edge's subscribers within
milliseconds of its publish, or not at all."""


@dataclass(frozen=True, slots=True)
class MessageMeta:
    props: codec.Props
    """The carried properties, in arrival order."""
    expires_at: float | None = None
    """``time.monotonic()`` after which the message is not delivered (None: never)."""
    retain: bool = False
    origin: int = 0
    """With a state store: the number of the publish's ``INBOUND`` record (store.py), by
    which a message published again after a restart is not queued twice to a session."""

    def size(self) -> int:
        """Bytes of its property values (what the table's byte bound counts)."""
        return sum(len(v) if isinstance(v, str | bytes) else
                   sum(map(len, v)) if isinstance(v, tuple) else 4 for _, v in self.props) + 16

    def remaining_s(self, now: float) -> int | None:
        """Whole seconds left of the Message Expiry Interval (None: no expiry)."""
        if self.expires_at is None:
            return None
        return max(0, int(self.expires_at - now + 0.999))

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


def meta_of(props: codec.Props, retain: bool) -> MessageMeta | None:
    """The metadata of an incoming PUBLISH (or will); None when there is nothing to carry."""
    carried = [(i, v) for i, v in props if i in CARRIED_PROPS]
    expiry = codec.prop(props, "message_expiry_interval")
    if not carried and expiry is None and not retain:
        return None
    deadline = None if expiry is None else time.monotonic() + int(expiry)  # type: ignore[arg-type]
    return MessageMeta(carried, deadline, retain)


class MetaTable:
    """Publishing session -> [t0, t1, meta] entries, in publish order."""

    def __init__(self, max_entries: int, max_bytes: int, count: object) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._count = count
        self._by_stream: dict[int, deque[list]] = {}
        self._order: deque[tuple[int, list]] = deque()

    def __len__(self) -> int:
        return len(self._order)

    def begin(self, stream: int, meta: MessageMeta) -> list | None:
        """Before ``stream`` publishes a message with ``meta``: its entry, closed by
        ``end`` right after the publish call (a message may come back before that)."""
        size = meta.size()
        if self.max_entries == 0:
            return None
        if size > self.max_bytes:
            self._count("metadata_refused_size")  # type: ignore[operator]
            return None
        now = time.time_ns()
        entry = [now, None, meta]
        self.bytes += size
        self._by_stream.setdefault(stream, deque()).append(entry)
        self._order.append((stream, entry))
        while self._order:
            head = self._order[0][1]
            by_size = len(self._order) > self.max_entries or self.bytes > self.max_bytes
            if not by_size and (head[1] is None or head[1] >= now - META_TTL_NS):
                break
            old_stream, _ = self._order.popleft()
            entries = self._by_stream[old_stream]
            self.bytes -= entries.popleft()[2].size()  # (each session's entries are in
            # the global order too)
            if not entries:
                del self._by_stream[old_stream]
            if by_size:
                self._count("metadata_evicted")  # type: ignore[operator]
        return entry

    @staticmethod
    def end(entry: list | None) -> None:
        if entry is not None:
            entry[1] = time.time_ns()

    def find(self, stream: int, publish_ts_ns: int) -> MessageMeta | None:
        """The metadata of the message ``stream`` published at ``publish_ts_ns``, if any."""
        entries = self._by_stream.get(stream)
        if not entries:
            return None
        for t0, t1, meta in reversed(entries):  # recent messages first
            if t0 <= publish_ts_ns and (t1 is None or publish_ts_ns <= t1):
                return meta
            if t0 < publish_ts_ns:
                return None
        return None
