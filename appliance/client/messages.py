"""What a subscriber receives: a message, or the loss of messages of a guaranteed stream; the
QoS names and the guaranteed queues' bounds."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

QOS = {"best-effort": 0, "last-value": 1, "guaranteed": 2}
"""QoS names and their wire values (docs/protocol.md, message ``qos``)."""
GUARANTEED_QOS = QOS["guaranteed"]
"""A message's ``qos`` when it was published guaranteed (its class)."""


class Headers(Mapping[str, "str | bytes"]):
    """A message's headers, read-only: str -> str, or bytes for values published as bytes."""

    __slots__ = ("_items",)

    def __init__(self, items: dict[str, str | bytes]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> str | bytes:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


NO_HEADERS = Headers({})
"""``Message.headers`` of a message published without headers (one shared empty mapping)."""
GUARANTEED_QUEUE_MESSAGES = 1_000_000
"""Messages a guaranteed subscription queue holds; when full, the reliable receiver keeps
the next messages and offers them again later (back-pressure), nothing is dropped."""


@dataclass(frozen=True, slots=True)
class Message:
    """One received message."""

    topic: str
    payload: bytes
    topic_key: int
    sequence: int
    publish_ts_ns: int
    namespace: int
    schema_id: int
    qos: int
    origin: int
    """The appliance where the message entered the fabric (node id)."""
    stream: int
    """The publishing session at the origin."""
    received_ns: int
    guaranteed: bool = False
    """It came over a guaranteed (reliable) stream."""
    cache_seq: int = 0
    """A replayed message's sequence in its appliance's cache (``replay(from_sequence=)``
    takes it); 0 for a live message."""
    headers: Headers = NO_HEADERS
    """The message's headers (user properties) as published: str -> str, or str -> bytes for
    values published as bytes."""
    segments: int = 1
    """A large message put back together from segments: how many (on a guaranteed stream
    they took that many sequences, ``sequence`` being the last's)."""

    @property
    def latency_ns(self) -> int:
        """Receive time minus publish time (wall clock; same host or synchronised clocks)."""
        return self.received_ns - self.publish_ts_ns


@dataclass(frozen=True, slots=True)
class Loss:
    """Messages of a guaranteed stream that will never arrive (unrecoverable loss).

    The transport cannot tell which topics the lost messages had, so every guaranteed
    subscription of the client gets the event."""

    origin: int
    """The appliance where the stream entered the fabric (node id)."""
    stream: int
    """The publishing session."""
    first_seq: int
    last_seq: int
    """The range in the numbering of the hop where it was lost."""
    messages: int
    reason: str
    """``RECOVERY_TIMEOUT`` (NAKs unanswered within the recovery bound), ``SENDER_LOSS`` (no
    longer in the sender's retransmission buffer) or ``RESYNC``; for a durable subscription,
    what its appliance's cache did not keep or deleted: ``RETENTION``, ``CACHE_DISK_LIMIT``
    (``first_seq``..``last_seq`` in cache sequences), ``CACHE_QUEUE_FULL``,
    ``CACHE_TOO_LARGE``, ``CACHE_MISSED``, ``CACHE_LOST`` (docs/fault-tolerance.md,
    "Durable subscriptions")."""
    at: int
    """Node id of the appliance that saw the loss; 0: this client's own hop."""
    received_ns: int
    topic: str = ""
    """A durable subscription's loss: the topic of the lost messages when they had one, else
    the pattern they matched ("" for other losses: the topics are not known)."""
