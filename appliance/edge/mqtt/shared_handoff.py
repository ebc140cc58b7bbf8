"""Hand-offs of a shared group's QoS 1/2 messages between edges (``mqtt.shared_namespace``,
docs/mqtt.md "Shared subscriptions across edges", "Hand-off").

An edge that holds a QoS 1/2 message of a group it owns but has no member left to give it
to publishes it as a **hand-off** on ``HANDOFF_TOPIC`` in the shared namespace, through the
view's own native session (shared_view.py), after the announcement of its new state:

- the unacknowledged in-flight and queued deliveries of the group's last member at this
  edge when it leaves (UNSUBSCRIBE, a session's end: a clean DISCONNECT, a dropped socket),
  or of its last connected member going offline while another edge has a connected one;
- for ``HANDOFF_GRACE_S`` after this edge's announced state of a group dropped (withdrawn,
  or its last member went offline), the messages of the group that arrive here and that
  this edge would have owned in that earlier state (the other edges may still have held it
  when they decided them, and left them to this edge). To receive them, a ``GroupTail``
  holds the last member's native pattern that long (identities.py ``keep``).

A hand-off carries the message's identity used for ownership (origin, publishing session,
publish time, topic), its group, QoS, MQTT metadata (meta.py's headers) and payload. Each
edge that receives one computes the owner among the group's candidates without the handing
edge; only the owner delivers it (shared.py ``SharedRouter.handed``).

Payload (network byte order)::

    magic   4s   b"TWH1"
    origin  Q    the publishing appliance
    stream  Q    the publishing session (its reliable-stream bit cleared)
    ts      q    publish time (ns)
    qos     B    1 or 2
    klen    H    group key length (UTF-8 ``GROUP/FILTER``)
    tlen    H    topic length (UTF-8)
    hlen    H    header block length (0: none; datapath/protocol/extensions.py)
    key, topic, header block, then the message's payload (the rest)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from appliance.client.messages import GUARANTEED_QOS
from appliance.dataplane.guaranteed import RELIABLE_STREAM_BIT
from appliance.edge.mqtt.state import SubOptions
from appliance.edge.mqtt.topics import SHARED_PREFIX, filter_problem, mqtt_matches, topic_problem
from datapath.protocol import extension_layout as xl
from datapath.protocol.extensions import ExtensionError, decode_headers, encode_headers

if TYPE_CHECKING:
    from appliance.edge.mqtt.shared import SharedRouter

HANDOFF_TOPIC = "handoff"
"""The hand-offs' topic in the shared namespace (beside shared_view.ANNOUNCE_TOPIC)."""
HANDOFF_MAGIC = b"TWH1"
HANDOFF_MAX_BYTES = xl.MAX_MESSAGE_BYTES
"""A hand-off's payload, at most (a native message's bound): a message too large to fit one
with its fields is not handed off (``shared_handoffs_too_large``); a larger one received is
refused (``shared_handoffs_bad``)."""
HANDOFF_PENDING = 4_096
"""Hand-offs waiting for the view's session to send them, at most (beyond:
``shared_handoffs_dropped_full``)."""
HANDOFF_PENDING_BYTES = 64 * 1024 * 1024
"""Their payloads' bytes, at most (beyond: ``shared_handoffs_dropped_full``)."""
HANDOFF_GRACE_S = 6.0
"""How long after this edge's announced state of a group dropped its messages that it would
have owned before are still handed off (shared_view.EXPIRY_S: by then no other edge counts
the earlier state, which it drops when the next announcement arrives or, that lost, when it
expires)."""
_HEAD = struct.Struct(">4sQQqBHHH")


@dataclass(frozen=True, slots=True)
class Handoff:
    """One message handed from one edge to the others."""

    key: str
    """The group (``GROUP/FILTER``)."""
    origin: int
    stream: int
    publish_ts_ns: int
    topic: str
    qos: int
    headers: dict[str, str | bytes] = field(default_factory=dict)
    """Its MQTT metadata as native headers (meta.py)."""
    payload: bytes = b""

    @property
    def ident(self) -> tuple:
        """Its identity in a group, as shared.py ``SharedRouter`` keeps it."""
        return (self.key, self.origin, self.stream & ~RELIABLE_STREAM_BIT, self.publish_ts_ns,
                self.topic)


def encode_handoff(h: Handoff) -> bytes:
    """The payload of hand-off ``h``; ``ValueError`` when it does not fit one (a field over
    its bound, headers over the header block's, the whole over ``HANDOFF_MAX_BYTES``)."""
    key, topic = h.key.encode(), h.topic.encode()
    try:
        block = encode_headers(h.headers) if h.headers else b""
    except ExtensionError as exc:
        raise ValueError(str(exc)) from None
    if len(key) > 0xFFFF or len(topic) > 0xFFFF or h.qos not in (1, 2):
        raise ValueError("a hand-off's group or topic over 65,535 bytes, or QoS not 1 or 2")
    head = _HEAD.pack(HANDOFF_MAGIC, h.origin & (2**64 - 1),
                      (h.stream & ~RELIABLE_STREAM_BIT) & (2**64 - 1), h.publish_ts_ns,
                      h.qos, len(key), len(topic), len(block))
    out = b"".join((head, key, topic, block, h.payload))
    if len(out) > HANDOFF_MAX_BYTES:
        raise ValueError(f"a hand-off of {len(out):,} bytes; at most {HANDOFF_MAX_BYTES:,}")
    return out


def parse_handoff(payload: bytes | bytearray | memoryview) -> Handoff | None:
    """The hand-off in ``payload``; None when it is not one: too large or short, another
    magic, QoS not 1 or 2, a group that is not ``GROUP/FILTER`` with a valid filter, a topic
    that is not a valid topic name or does not match the filter, headers that do not
    parse."""
    n = len(payload)
    if n < _HEAD.size or n > HANDOFF_MAX_BYTES:
        return None
    data = bytes(payload)
    magic, origin, stream, ts, qos, klen, tlen, hlen = _HEAD.unpack_from(data)
    at = _HEAD.size
    if magic != HANDOFF_MAGIC or qos not in (1, 2) or at + klen + tlen + hlen > n:
        return None
    try:
        key = data[at:at + klen].decode()
        topic = data[at + klen:at + klen + tlen].decode()
        headers = decode_headers(data[at + klen + tlen:at + klen + tlen + hlen]) if hlen else {}
    except (UnicodeDecodeError, ExtensionError):
        return None
    group, sep, match = key.partition("/")
    if (not sep or not group or "+" in group or "#" in group or filter_problem(match)
            is not None or topic_problem(topic) is not None
            or not mqtt_matches(match, topic)):
        return None
    return Handoff(key, origin, stream, ts, topic, qos, headers,
                   data[at + klen + tlen + hlen:])


class GroupTail:
    """The native pattern of a group whose last member left this edge, held for
    ``HANDOFF_GRACE_S`` as if by an MQTT session of the member's identity (identities.py
    hands it the pattern's messages like a session's: ``from_fabric``): what arrives
    meanwhile goes to the router, which hands off what this edge owed (shared.py)."""

    def __init__(self, router: SharedRouter, key: str, ident: Any) -> None:
        self.router = router
        self.key = key
        self.ident = ident
        """The identity's native session (identities.IdentitySession) holding the pattern."""
        self.ref = SHARED_PREFIX + key
        self.filters = {self.ref: SubOptions(2, match=key.partition("/")[2], group=key)}
        """As an MQTT session's (what identities.py releases when the tail leaves)."""
        self.ended = False
        self.timer: Any = None

    def from_fabric(self, msg: Any, keys: list[str], meta: Any, published_qos: int | None,
                    sender: int, groups: set[str]) -> None:
        """A native message of the pattern (identities.py, on the loop)."""
        if self.ended or self.key in groups:
            return
        groups.add(self.key)
        guaranteed = msg.qos == GUARANTEED_QOS
        qos = 0 if not guaranteed else 2 if published_qos is None else min(published_qos, 2)
        self.router.offer(self.key, msg, meta, qos)
