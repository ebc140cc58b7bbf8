"""MQTT metadata across a bridge (bridge.py, docs/mqtt.md "Bridges"): a message's 5.0
properties, message expiry and retain flag go both ways between the fabric's ``mqtt.``
headers (meta.py) and paho-mqtt's ``Properties``.

- **out** (fabric -> remote): the native message's headers are kept with a backlogged QoS 1
  entry as a native header block (``header_block``), read back when it is sent
  (``publish_properties``): the carried properties, the remaining Message Expiry Interval
  (``expired`` once it has passed: not sent), a native message's other headers as user
  properties (as for an MQTT subscriber of the edge), and the bridge's origin tag last.
- **in** (remote -> fabric): the paho message's properties and retain flag become the native
  publish's ``mqtt.`` headers (``fabric_headers``), so an MQTT subscriber anywhere in the
  fabric gets them as it would from a local publisher. Origin tags (``topicwire-origin``) are
  the bridges' own and are not carried.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.meta import MessageMeta, from_headers, meta_of, to_headers
from datapath.protocol.extensions import decode_headers, encode_headers

_PFI, _CT, _RT, _CD, _UP, _MEI = (codec.PROP[n] for n in (
    "payload_format_indicator", "content_type", "response_topic", "correlation_data",
    "user_property", "message_expiry_interval"))
_PAHO = ((_PFI, "PayloadFormatIndicator"), (_CT, "ContentType"), (_RT, "ResponseTopic"),
         (_CD, "CorrelationData"), (_MEI, "MessageExpiryInterval"))


def header_block(headers: Mapping[str, Any] | None) -> bytes:
    """A native message's headers as a block to keep with a backlog entry (b"" for none)."""
    return encode_headers(headers) if headers else b""


def meta_of_block(block: bytes, count: Callable[[str], None]) -> MessageMeta | None:
    """The MQTT metadata a kept header block carries (None: none)."""
    if not block:
        return None
    return from_headers(decode_headers(block), count)[0]


def expired(meta: MessageMeta | None) -> bool:
    return meta is not None and meta.expired(time.monotonic())


def publish_properties(meta: MessageMeta | None, origin_property: str, origin: str) -> Any:
    """paho ``Properties`` of a 5.0 PUBLISH to the remote: ``meta``'s carried properties and
    remaining expiry, then the origin tag."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.PUBLISH)
    users: list[tuple[str, str]] = []
    if meta is not None:
        names = dict(_PAHO)
        for ident, value in meta.props:
            if ident == _UP:
                users.append(value)  # type: ignore[arg-type]
            elif ident in names:
                setattr(props, names[ident], value)
        left = meta.remaining_s(time.monotonic())
        if left is not None:
            props.MessageExpiryInterval = max(1, left)
    users.append((origin_property, origin))
    props.UserProperty = users
    return props


def fabric_headers(message: Any, origin_property: str) -> dict[str, str | bytes]:
    """The native headers of a message from the remote: its ``mqtt.`` metadata (meta.py);
    ``MetadataTooLarge`` when they do not fit a header block."""
    props: codec.Props = []
    paho = getattr(message, "properties", None)
    if paho is not None:
        for ident, name in _PAHO:
            value = getattr(paho, name, None)
            if value is not None:
                props.append((ident, bytes(value) if ident == _CD else value))
        for pair in getattr(paho, "UserProperty", None) or []:
            if pair[0] != origin_property:
                props.append((_UP, (pair[0], pair[1])))
    return to_headers(meta_of(props, bool(message.retain)), min(int(message.qos), 2))
