"""MQTT-only metadata of messages: 5.0 message properties (payload format, content type,
response topic, correlation data, user properties), the message expiry deadline, the retain
flag and the publish QoS, carried through the fabric as native **headers** under the
reserved prefix ``mqtt.`` (docs/mqtt.md, "Translation"; the header block:
``datapath/protocol/extension_layout.py``).

The edge that takes an MQTT PUBLISH (or will) into the fabric gives the native message these
headers (``to_headers``); every edge that delivers a native message to an MQTT subscriber
reads them back (``from_headers``), whichever edge or native client published it. Keys:

    mqtt.qos                 "0" | "1" | "2": the MQTT publish QoS (on every MQTT message)
    mqtt.retain              "1": the PUBLISH had the retain flag (absent: it had not)
    mqtt.payload_format      "0" | "1": Payload Format Indicator
    mqtt.content_type        text: Content Type
    mqtt.response_topic      text: Response Topic
    mqtt.correlation_data    bytes: Correlation Data
    mqtt.expires_at_ms       text, decimal: the Message Expiry deadline, Unix time in ms
                             (the publishing edge's clock)
    mqtt.user.<i>.<name>     text: the i-th (0, 1, ...) user property ``name`` = value;
                             the index keeps their order and repeated names
    mqtt.origin              text, decimal: the publishing edge's state-store record
                             (store.py); meaningful to that edge only
    mqtt.sender              text, decimal: the publishing MQTT session's number on its
                             edge, set only when that session holds a No Local filter
                             matching the topic (identities.py); meaningful to that edge only
    mqtt.retain_stamp        text, decimal: on a retained message's copy shared across
                             edges, when it was set, ns of the setting edge's clock
                             (retain_share.py)

A header of a native message that is not under ``mqtt.`` becomes a 5.0 user property
(name = key), after the carried ones; one whose value is not an MQTT string (bytes that are
not UTF-8, or U+0000) is left out (``headers_not_mapped``). Other ``mqtt.`` keys, and carried
values that do not parse, are ignored (``headers_malformed``).

A message whose metadata does not fit the header block's limits (32 headers, 1,024 bytes,
keys of 255 bytes) raises ``MetadataTooLarge`` from ``to_headers``: the edge refuses that
publish (handle_publish.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from appliance.client.exactly_once import NUMBER_HEADER
from appliance.edge.mqtt import codec
from datapath.protocol.extensions import ExtensionError, encode_headers

CARRIED_PROPS = frozenset({codec.PROP["payload_format_indicator"], codec.PROP["content_type"],
                           codec.PROP["response_topic"], codec.PROP["correlation_data"],
                           codec.PROP["user_property"]})
"""The PUBLISH properties forwarded unchanged to subscribers (MQTT 5.0 3.3.2.3)."""
PREFIX = "mqtt."
"""The reserved header prefix: MQTT metadata."""
USER_PREFIX = PREFIX + "user."
SENDER_HEADER = PREFIX + "sender"
"""The publishing session of this edge, for No Local (identities.py)."""
ORIGIN_HEADER = NUMBER_HEADER
"""The publishing edge's state-store record (store.py; native clients read it too)."""
STAMP_HEADER = PREFIX + "retain_stamp"
"""When a retained message shared across edges was set (retain_share.py)."""
_PFI, _CT, _RT, _CD, _UP = (codec.PROP[n] for n in (
    "payload_format_indicator", "content_type", "response_topic", "correlation_data",
    "user_property"))
_SCALARS = ((_PFI, "mqtt.payload_format"), (_CT, "mqtt.content_type"),
            (_RT, "mqtt.response_topic"), (_CD, "mqtt.correlation_data"))
_BY_KEY = {key: ident for ident, key in _SCALARS}
# the canonical order of the carried properties when they are read back
_ORDER = {_PFI: 0, _CT: 1, _RT: 2, _CD: 3, _UP: 4}


class MetadataTooLarge(ValueError):
    """The message's MQTT metadata does not fit a native header block."""


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


def to_headers(meta: MessageMeta | None, qos: int, sender: int = 0) -> dict[str, str | bytes]:
    """The native headers that carry an MQTT message's metadata (module docstring), and
    ``mqtt.sender`` when ``sender``; ``MetadataTooLarge`` naming the limit when they do not
    fit a header block."""
    if meta is None and not sender:  # the common case: one header, checked once
        return _PLAIN_HEADERS[qos]
    headers: dict[str, str | bytes] = {"mqtt.qos": str(qos)}
    if sender:
        headers[SENDER_HEADER] = str(sender)
    if meta is not None:
        if meta.retain:
            headers["mqtt.retain"] = "1"
        n = 0
        for ident, value in meta.props:
            if ident == _UP:
                name, text = value  # type: ignore[misc]
                headers[f"{USER_PREFIX}{n}.{name}"] = text
                n += 1
            elif ident == _PFI:
                headers["mqtt.payload_format"] = str(value)
            elif ident == _CD:
                headers["mqtt.correlation_data"] = bytes(value)  # type: ignore[arg-type]
            else:
                headers[_SCALAR_KEY[ident]] = value  # type: ignore[assignment]
        if meta.expires_at is not None:
            wall = time.time() + meta.expires_at - time.monotonic()
            headers["mqtt.expires_at_ms"] = str(int(wall * 1000))
        if meta.origin:
            headers["mqtt.origin"] = str(meta.origin)
    try:
        encode_headers(headers)
    except ExtensionError as exc:
        raise MetadataTooLarge(str(exc)) from None
    return headers


_SCALAR_KEY = dict(_SCALARS)
_PLAIN_HEADERS: dict[int, dict[str, str | bytes]] = {q: {"mqtt.qos": str(q)} for q in (0, 1, 2)}
"""``to_headers`` of a message with no metadata and no sender, per QoS (shared: read only)."""


def _mqtt_string(value: str | bytes) -> str | None:
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None if "\x00" in value else value


def from_headers(headers: Mapping[str, str | bytes],
                 count: Callable[[str], None]) -> tuple[MessageMeta | None, int | None]:
    """(the metadata, the MQTT publish QoS) a native message's headers carry; (None, None)
    for a message without headers. ``count`` is told of headers left out."""
    if not headers:
        return None, None
    scalars: list[tuple[int, object]] = []
    users: list[tuple[int, tuple[str, str]]] = []
    native: list[tuple[int, object]] = []
    qos = expires_at = None
    retain = False
    origin = 0
    for key, value in headers.items():
        if not key.startswith(PREFIX):
            name, text = _mqtt_string(key), _mqtt_string(value)
            if name is None or text is None:
                count("headers_not_mapped")
            else:
                native.append((_UP, (name, text)))
            continue
        try:
            if key.startswith(USER_PREFIX):
                index, _, name = key[len(USER_PREFIX):].partition(".")
                text = _mqtt_string(value)
                if not index.isdigit() or text is None:
                    raise ValueError(key)
                users.append((int(index), (name, text)))
            elif key in _BY_KEY:
                ident = _BY_KEY[key]
                if ident == _PFI:
                    v: object = int(value)
                    if v not in (0, 1):
                        raise ValueError(key)
                elif ident == _CD:
                    v = value if isinstance(value, bytes) else value.encode()
                else:
                    v = _mqtt_string(value)
                    if v is None:
                        raise ValueError(key)
                scalars.append((ident, v))
            elif key == "mqtt.qos":
                qos = int(value)
                if qos not in (0, 1, 2):
                    raise ValueError(key)
            elif key == "mqtt.retain":
                retain = value in ("1", b"1")
            elif key == "mqtt.expires_at_ms":
                left = int(value) / 1000 - time.time()
                expires_at = time.monotonic() + left
            elif key == "mqtt.origin":
                origin = int(value)
            elif key in (SENDER_HEADER, STAMP_HEADER):  # (identities.py, retain_share.py)
                continue
            else:
                raise ValueError(key)
        except ValueError:
            count("headers_malformed")
            qos = None if key == "mqtt.qos" else qos
    scalars.sort(key=lambda p: _ORDER[p[0]])
    users.sort(key=lambda p: p[0])
    props = [*scalars, *((_UP, pair) for _, pair in users), *native]
    if not props and expires_at is None and not retain and not origin:
        return None, qos
    return MessageMeta(props, expires_at, retain, origin), qos
