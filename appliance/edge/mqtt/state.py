"""What the MQTT connection, its session state and the packet handlers share: a
subscription's options, one delivery to a client, and the ``Closed`` signal that ends a
connection (counted by its reason)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from appliance.edge.mqtt.codec import Reason


@dataclass
class SubOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    sub_id: int = 0
    """The 5.0 Subscription Identifier (0: none)."""
    match: str = ""
    """The filter messages are matched against (a shared subscription's, without
    ``$share/GROUP/``)."""
    group: str | None = None
    """A shared subscription's key in ``MqttServer.shared`` (``GROUP/FILTER``)."""
    seq: int = 0
    """Its place in the session's ordered list, beside its carve-outs (partial unsubscribes):
    of a filter and a carve-out that both match a topic, the newer decides."""


@dataclass(slots=True)
class Delivery:
    """One message on its way to one client (queued, in flight, or sent again)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool = False
    meta: Any = None
    """Its ``meta.MessageMeta`` (5.0 properties, expiry), or None."""
    sub_ids: tuple[int, ...] = ()
    group: str | None = None
    """The shared subscription that chose this client for it (sent to another member
    when this client goes away before acknowledging it)."""
    awaiting: str = field(default="")
    """In flight: the acknowledgement awaited (``puback``, ``pubrec``, ``pubcomp``)."""
    stored: int = 0
    """Its record's sequence number in the edge's state store (store.py; 0: not recorded)."""
    ident: tuple | None = None
    """A shared delivery's message identity in its group (shared.py: group, origin,
    publishing session, publish time, topic), by which it is handed to another edge when
    this edge has no member left for it (None: not recorded with a restored delivery)."""


class Closed(Exception):
    """Internal: the connection ends (``reason`` counted, ``code`` sent in 5.0)."""

    def __init__(self, reason: str, code: int = Reason.UNSPECIFIED, will: bool = True,
                 detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.code, self.will, self.detail = reason, code, will, detail
