"""MQTT 3.1.1 and 5.0 packets: decode (a packet or a counted ``Refusal``, never an exception)
and encode.

Why hand-written: no codec on PyPI is broker-side and covers both 3.1.1 and 5.0 (paho-mqtt,
gmqtt and aiomqtt are clients; amqtt is a 3.1.1 broker; ``mqtt5`` is 5.0 only), see
docs/mqtt.md. This one is plain Python and the reference: the connection's read loop has
the hot path's packets (PUBLISH, PUBACK/PUBREC/PUBREL/PUBCOMP) framed and decoded by a
compiled kernel (fastcodec.py, held to this module by tests/edge/test_fastcodec.py), and
hands every other packet to ``decode``.

Every MQTT control packet::

    +--------+--------+-----+---------------------------------------------+
    | type:4 | flags:4| remaining length: 1..4 bytes, 7 bits each, LSB first |
    +--------+--------+-----+---------------------------------------------+
    | variable header (packet id, 5.0 properties ...) | payload ...        |
    +-------------------------------------------------+--------------------+

The fixed header is read by the framing kernel (``read_remaining_length`` is its reference:
the length is bounded before the body is read); ``decode(first_byte, body, version)`` takes
the rest. 5.0 properties are
``(identifier, value)`` pairs in arrival order (``Props``); each packet accepts only the
identifiers the standard allows it, once each (user properties and subscription
identifiers may repeat).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum

# --- constants ---------------------------------------------------------------------------------
PROTOCOL_NAME = b"MQTT"
V311 = 4
V5 = 5
MAX_REMAINING_LENGTH = 268_435_455
"""The largest remaining length four bytes can say."""


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class Reason(IntEnum):
    """MQTT 5.0 reason codes the edge uses."""

    SUCCESS = 0x00
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_SUBSCRIPTION_EXISTED = 0x11
    UNSPECIFIED = 0x80
    MALFORMED = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_ID_NOT_VALID = 0x85
    BAD_USERNAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_ID_IN_USE = 0x91
    PACKET_ID_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    QUOTA_EXCEEDED = 0x97
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    SUBSCRIPTION_IDS_NOT_SUPPORTED = 0xA1


class ConnackV3(IntEnum):
    """MQTT 3.1.1 CONNACK return codes."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USERNAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


SUBACK_FAILURE_V3 = 0x80
AUTH_REASONS = frozenset({Reason.SUCCESS, Reason.CONTINUE_AUTHENTICATION,
                          Reason.RE_AUTHENTICATE})


# --- 5.0 properties ------------------------------------------------------------------------------
BYTE, U16, U32, VARINT, UTF8, BINARY, PAIR = range(7)

PROPERTIES: dict[int, tuple[str, int]] = {
    0x01: ("payload_format_indicator", BYTE), 0x02: ("message_expiry_interval", U32),
    0x03: ("content_type", UTF8), 0x08: ("response_topic", UTF8),
    0x09: ("correlation_data", BINARY), 0x0B: ("subscription_identifier", VARINT),
    0x11: ("session_expiry_interval", U32), 0x12: ("assigned_client_identifier", UTF8),
    0x13: ("server_keep_alive", U16), 0x15: ("authentication_method", UTF8),
    0x16: ("authentication_data", BINARY), 0x17: ("request_problem_information", BYTE),
    0x18: ("will_delay_interval", U32), 0x19: ("request_response_information", BYTE),
    0x1A: ("response_information", UTF8), 0x1C: ("server_reference", UTF8),
    0x1F: ("reason_string", UTF8), 0x21: ("receive_maximum", U16),
    0x22: ("topic_alias_maximum", U16), 0x23: ("topic_alias", U16),
    0x24: ("maximum_qos", BYTE), 0x25: ("retain_available", BYTE),
    0x26: ("user_property", PAIR), 0x27: ("maximum_packet_size", U32),
    0x28: ("wildcard_subscription_available", BYTE),
    0x29: ("subscription_identifier_available", BYTE),
    0x2A: ("shared_subscription_available", BYTE),
}
PROP = {name: ident for ident, (name, _) in PROPERTIES.items()}
REPEATABLE = {0x26, 0x0B}
_ONCE = {("subscribe", 0x0B)}
"""(packet kind, property) given at most once there though repeatable elsewhere (a SUBSCRIBE
carries one Subscription Identifier, MQTT 5.0 3.8.2.1.2)."""
_MESSAGE_PROPS = {0x01, 0x02, 0x03, 0x08, 0x09, 0x26}
ALLOWED: dict[str, set[int]] = {
    "connect": {0x11, 0x15, 0x16, 0x17, 0x19, 0x21, 0x22, 0x26, 0x27},
    "will": _MESSAGE_PROPS | {0x18},
    "publish": _MESSAGE_PROPS | {0x0B, 0x23},
    "ack": {0x1F, 0x26},
    "subscribe": {0x0B, 0x26},
    "unsubscribe": {0x26},
    "disconnect": {0x11, 0x1F, 0x26, 0x1C},
    "auth": {0x15, 0x16, 0x1F, 0x26},
    "connack": {0x11, 0x12, 0x13, 0x1A, 0x1C, 0x1F, 0x21, 0x22, 0x24, 0x25, 0x26, 0x27, 0x28,
                0x29, 0x2A, 0x15, 0x16},
}

Props = list[tuple[int, object]]


def prop(props: Props, name: str, default: object = None) -> object:
    """The first value of property ``name`` (None/``default`` when absent)."""
    ident = PROP[name]
    for i, v in props:
        if i == ident:
            return v
    return default


# --- decoded packets -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Refusal:
    """A packet that is not accepted: ``reason`` names the counter, ``code`` the 5.0 reason
    code of the DISCONNECT (or CONNACK) that closes the connection."""

    reason: str
    code: int = Reason.MALFORMED
    detail: str = ""


@dataclass(frozen=True)
class Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    props: Props = field(default_factory=list)


@dataclass(frozen=True)
class Connect:
    version: int
    clean_start: bool
    keep_alive_s: int
    client_id: str
    username: str | None
    password: bytes | None
    will: Will | None
    props: Props = field(default_factory=list)
    protocol_name: bytes = PROTOCOL_NAME


@dataclass(frozen=True)
class Publish:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int
    props: Props = field(default_factory=list)


@dataclass(frozen=True)
class Ack:
    """PUBACK, PUBREC, PUBREL or PUBCOMP."""

    type: PacketType
    packet_id: int
    reason: int = 0
    props: Props = field(default_factory=list)


@dataclass(frozen=True)
class Subscribe:
    packet_id: int
    filters: list[tuple[str, int]]
    """(filter, options byte: QoS bits 0-1, no-local 2, retain-as-published 3, retain
    handling 4-5)."""
    props: Props = field(default_factory=list)


@dataclass(frozen=True)
class Unsubscribe:
    packet_id: int
    filters: list[str]
    props: Props = field(default_factory=list)


@dataclass(frozen=True)
class Simple:
    """PINGREQ (or PINGRESP)."""

    type: PacketType


@dataclass(frozen=True)
class Disconnect:
    reason: int = 0
    props: Props = field(default_factory=list)


@dataclass(frozen=True)
class Auth:
    """5.0 AUTH (enhanced authentication, MQTT 5.0 3.15): a reason (0x00 success, 0x18
    continue, 0x19 re-authenticate) and its properties (method, data)."""

    reason: int = 0
    props: Props = field(default_factory=list)


Packet = Connect | Publish | Ack | Subscribe | Unsubscribe | Simple | Disconnect | Auth


class _Bad(Exception):
    """Internal: what ``decode`` turns into a ``Refusal``."""

    def __init__(self, reason: str, detail: str, code: int = Reason.MALFORMED) -> None:
        super().__init__(detail)
        self.reason, self.detail, self.code = reason, detail, code


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        if n > len(self.data) - self.pos:
            raise _Bad("truncated", f"{n} bytes wanted, {len(self.data) - self.pos} left")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "big")

    def varint(self) -> int:
        value, shift = 0, 0
        for i in range(4):
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                if i and b == 0:
                    raise _Bad("bad_varint", "a variable byte integer not in its shortest form")
                return value
            shift += 7
        raise _Bad("bad_varint", "a variable byte integer longer than 4 bytes")

    def binary(self) -> bytes:
        return self.take(self.u16())

    def utf8(self) -> str:
        raw = self.binary()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Bad("bad_utf8", "a string that is not well-formed UTF-8") from None
        if "\x00" in text:
            raise _Bad("bad_utf8", "a string holding U+0000")
        return text

    def props(self, kind: str) -> Props:
        length = self.varint()
        end = self.pos + length
        if end > len(self.data):
            raise _Bad("truncated", "properties longer than the packet")
        out: Props = []
        seen: set[int] = set()
        allowed = ALLOWED[kind]
        while self.pos < end:
            ident = self.varint()
            spec = PROPERTIES.get(ident)
            if spec is None or ident not in allowed:
                raise _Bad("bad_property", f"property 0x{ident:02x} not allowed in {kind}")
            if ident in seen and (ident not in REPEATABLE or (kind, ident) in _ONCE):
                raise _Bad("bad_property", f"property {spec[0]} given twice",
                           Reason.PROTOCOL_ERROR)
            seen.add(ident)
            kind_of = spec[1]
            if kind_of == BYTE:
                value: object = self.byte()
            elif kind_of == U16:
                value = self.u16()
            elif kind_of == U32:
                value = self.u32()
            elif kind_of == VARINT:
                value = self.varint()
            elif kind_of == UTF8:
                value = self.utf8()
            elif kind_of == BINARY:
                value = self.binary()
            else:
                value = (self.utf8(), self.utf8())
            if self.pos > end:
                raise _Bad("bad_property", "a property runs past the property length")
            if ident == 0x01 and value not in (0, 1):
                raise _Bad("bad_property", f"Payload Format Indicator {value} (0 or 1)",
                           Reason.PROTOCOL_ERROR)
            if ident == 0x08 and ("+" in value or "#" in value):  # type: ignore[operator]
                raise _Bad("bad_property", "a Response Topic with a wildcard",
                           Reason.PROTOCOL_ERROR)
            out.append((ident, value))
        return out


# --- decoding ------------------------------------------------------------------------------------
def read_remaining_length(data: bytes) -> tuple[int, int] | None | Refusal:
    """The remaining length at the start of ``data`` and how many bytes it took; None when
    more bytes are needed; a ``Refusal`` for a length longer than 4 bytes."""
    value, shift = 0, 0
    for i in range(min(4, len(data))):
        b = data[i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i + 1
        shift += 7
    if len(data) >= 4:
        return Refusal("bad_remaining_length", Reason.MALFORMED,
                       "a remaining length longer than 4 bytes")
    return None


_FLAGS_0010 = {PacketType.PUBREL, PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE}
# the reason codes MQTT 5.0 defines for each acknowledgement (3.4.2.1, 3.5.2.1, 3.6.2.1, 3.7.2.1)
_ACK_REASONS = {PacketType.PUBACK: {0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99},
                PacketType.PUBREL: {0x00, 0x92}}
_ACK_REASONS[PacketType.PUBREC] = _ACK_REASONS[PacketType.PUBACK]
_ACK_REASONS[PacketType.PUBCOMP] = _ACK_REASONS[PacketType.PUBREL]


def decode(first: int, body: bytes, version: int) -> Packet | Refusal:
    """One packet from its first byte and its body (the remaining length's bytes). ``version``
    is the connection's protocol level (0 before CONNECT). Never raises."""
    if first >> 4 == 3 and version == V311:  # the hot path's packet, inline
        fast = _publish_311(first, body)
        if fast is not None:
            return fast
    try:
        return _decode(first, body, version)
    except _Bad as bad:
        return Refusal(bad.reason, bad.code, str(bad))
    except (ValueError, IndexError, OverflowError) as exc:  # a decoder bug must not escape
        return Refusal("malformed", Reason.MALFORMED, f"{type(exc).__name__}: {exc}")


def _decode(first: int, body: bytes, version: int) -> Packet:
    try:
        ptype = PacketType(first >> 4)
    except ValueError:
        raise _Bad("bad_packet_type", "packet type 0 is reserved") from None
    flags = first & 0x0F
    if ptype != PacketType.PUBLISH:
        want = 0b0010 if ptype in _FLAGS_0010 else 0
        if flags != want:
            raise _Bad("bad_flags", f"{ptype.name} with fixed-header flags {flags:04b}")
    r = _Reader(body)
    if ptype == PacketType.CONNECT:
        packet: Packet = _connect(r)
    elif ptype == PacketType.PUBLISH:
        packet = _publish(r, flags, version)
    elif ptype in (PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL, PacketType.PUBCOMP):
        packet_id = r.u16()
        if packet_id == 0:  # it answers a packet that needs a non-zero one (MQTT-2.2.1-3)
            raise _Bad("bad_packet_id", f"{ptype.name} with packet identifier 0",
                       Reason.PROTOCOL_ERROR)
        reason, props = 0, []
        if version == V5 and r.left():
            reason = r.byte()
            if reason not in _ACK_REASONS[ptype]:
                raise _Bad("bad_reason_code", f"{ptype.name} with reason code {reason:#04x}",
                           Reason.PROTOCOL_ERROR)
            if r.left():
                props = r.props("ack")
        packet = Ack(ptype, packet_id, reason, props)
    elif ptype == PacketType.SUBSCRIBE:
        packet = _subscribe(r, version)
    elif ptype == PacketType.UNSUBSCRIBE:
        packet_id = r.u16()
        props = r.props("unsubscribe") if version == V5 else []
        filters = []
        while r.left():
            filters.append(r.utf8())
        if not filters:
            raise _Bad("protocol_error", "UNSUBSCRIBE without a topic filter",
                       Reason.PROTOCOL_ERROR)
        packet = Unsubscribe(packet_id, filters, props)
    elif ptype in (PacketType.PINGREQ, PacketType.PINGRESP):
        packet = Simple(ptype)
    elif ptype == PacketType.DISCONNECT:
        reason, props = 0, []
        if version == V5 and r.left():
            reason = r.byte()
            if r.left():
                props = r.props("disconnect")
        packet = Disconnect(reason, props)
    elif ptype == PacketType.AUTH:
        if version != V5:
            raise _Bad("auth_unsupported", "AUTH is an MQTT 5.0 packet (enhanced "
                       "authentication)", Reason.PROTOCOL_ERROR)
        reason, props = 0, []
        if r.left():  # (no body: success, no properties; MQTT 5.0 3.15.2.1)
            reason = r.byte()
            if reason not in AUTH_REASONS:
                raise _Bad("bad_reason_code", f"AUTH with reason code {reason:#04x}",
                           Reason.PROTOCOL_ERROR)
            if r.left():
                props = r.props("auth")
        packet = Auth(reason, props)
    else:  # CONNACK, SUBACK, UNSUBACK: server-to-client packets
        raise _Bad("protocol_error", f"{ptype.name} is sent by servers, not clients",
                   Reason.PROTOCOL_ERROR)
    if r.left():
        raise _Bad("trailing_bytes", f"{r.left()} bytes after the {ptype.name} packet")
    return packet


def _connect(r: _Reader) -> Connect:
    name = r.binary()
    level = r.byte()
    if name != PROTOCOL_NAME or level not in (V311, V5):
        # answered with CONNACK "unacceptable protocol" (the connection knows which form)
        r.take(r.left())
        return Connect(level, True, 0, "", None, None, None, [], name)
    flags = r.byte()
    if flags & 0x01:
        raise _Bad("bad_flags", "CONNECT's reserved flag is set")
    keep_alive = r.u16()
    props = r.props("connect") if level == V5 else []
    client_id = r.utf8()
    will = None
    will_qos = (flags >> 3) & 0x03
    if flags & 0x04:
        will_props = r.props("will") if level == V5 else []
        topic = r.utf8()
        payload = r.binary()
        if will_qos == 3:
            raise _Bad("bad_flags", "will QoS 3")
        will = Will(topic, payload, will_qos, bool(flags & 0x20), will_props)
    elif will_qos or flags & 0x20:
        raise _Bad("bad_flags", "will QoS or retain without the will flag")
    username = r.utf8() if flags & 0x80 else None
    password = r.binary() if flags & 0x40 else None
    if level == V311 and password is not None and username is None:
        raise _Bad("bad_flags", "a password without a username (3.1.1)")
    return Connect(level, bool(flags & 0x02), keep_alive, client_id, username, password,
                   will, props)


def _publish_311(first: int, body: bytes) -> Publish | None:
    """A well-formed 3.1.1 PUBLISH decoded without the general reader (the same result as
    ``_publish``); None for anything else, which the general decoder then refuses."""
    flags = first & 0x0F
    qos = (flags >> 1) & 0x03
    if qos == 3 or (qos == 0 and flags & 0x08) or len(body) < 2:
        return None
    end = 2 + (body[0] << 8 | body[1])
    start = end + 2 if qos else end
    if start > len(body):
        return None
    try:
        topic = body[2:end].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\x00" in topic:
        return None
    packet_id = 0
    if qos:
        packet_id = body[end] << 8 | body[end + 1]
        if packet_id == 0:
            return None
    return Publish(topic, body[start:], qos, bool(flags & 0x01), bool(flags & 0x08), packet_id,
                   [])


def _publish(r: _Reader, flags: int, version: int) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise _Bad("bad_qos", "PUBLISH with QoS 3")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise _Bad("bad_flags", "PUBLISH with DUP set at QoS 0")
    topic = r.utf8()
    packet_id = 0
    if qos:
        packet_id = r.u16()
        if packet_id == 0:
            raise _Bad("bad_packet_id", "packet identifier 0", Reason.PROTOCOL_ERROR)
    props = r.props("publish") if version == V5 else []
    return Publish(topic, r.take(r.left()), qos, bool(flags & 0x01), dup, packet_id, props)


def _subscribe(r: _Reader, version: int) -> Subscribe:
    packet_id = r.u16()
    if packet_id == 0:
        raise _Bad("bad_packet_id", "packet identifier 0", Reason.PROTOCOL_ERROR)
    props = r.props("subscribe") if version == V5 else []
    filters = []
    while r.left():
        topic = r.utf8()
        options = r.byte()
        reserved = 0xC0 if version == V5 else 0xFC
        if options & reserved or options & 0x03 == 3 or (version == V5 and
                                                         (options >> 4) & 0x03 == 3):
            raise _Bad("bad_subscription_options",
                       f"subscription options 0x{options:02x} use reserved values")
        filters.append((topic, options))
    if not filters:
        raise _Bad("protocol_error", "SUBSCRIBE without a topic filter", Reason.PROTOCOL_ERROR)
    return Subscribe(packet_id, filters, props)


# --- encoding ------------------------------------------------------------------------------------
def varint(value: int) -> bytes:
    if not 0 <= value <= MAX_REMAINING_LENGTH:
        raise ValueError(f"{value} does not fit a variable byte integer")
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _str(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack(">H", len(raw)) + raw


def encode_props(props: Props) -> bytes:
    out = bytearray()
    for ident, value in props:
        kind = PROPERTIES[ident][1]
        out += varint(ident)
        if kind == BYTE:
            out.append(int(value))  # type: ignore[call-overload]
        elif kind == U16:
            out += struct.pack(">H", value)
        elif kind == U32:
            out += struct.pack(">I", value)
        elif kind == VARINT:
            out += varint(int(value))  # type: ignore[call-overload]
        elif kind in (UTF8, BINARY):
            out += _str(value)  # type: ignore[arg-type]
        else:
            key, val = value  # type: ignore[misc]
            out += _str(key) + _str(val)
    return varint(len(out)) + bytes(out)


def packet(ptype: PacketType, flags: int, body: bytes) -> bytes:
    return bytes([(ptype << 4) | flags]) + varint(len(body)) + body


def encode_connack(version: int, code: int, session_present: bool = False,
                   props: Props | None = None) -> bytes:
    body = bytes([1 if session_present else 0, code])
    if version == V5:
        body += encode_props(props or [])
    return packet(PacketType.CONNACK, 0, body)


_PUBLISH_HEAD = struct.Struct(">BBH")
"""A PUBLISH's first byte, a one-byte remaining length and its topic's length."""
_U16 = struct.Struct(">H")


def encode_publish(topic: str | bytes, payload: bytes, qos: int = 0, retain: bool = False,
                   dup: bool = False, packet_id: int = 0, version: int = V311,
                   props: Props | None = None) -> bytes:
    """A PUBLISH, built in one join (a delivery on the hot path; a compiled encoder called
    per packet was measured slower, docs/mqtt.md)."""
    raw = topic.encode() if isinstance(topic, str) else topic
    tlen = len(raw)
    pid = _U16.pack(packet_id) if qos else b""
    block = b"" if version != V5 else encode_props(props) if props else b"\x00"
    size = 2 + tlen + len(pid) + len(block) + len(payload)
    first = 0x30 | (0x08 if dup else 0) | (qos << 1) | (0x01 if retain else 0)
    if size < 128:
        head = _PUBLISH_HEAD.pack(first, size, tlen)
    else:
        head = bytes((first,)) + varint(size) + _U16.pack(tlen)
    return b"".join((head, raw, pid, block, payload))


_ACK_FIRST = {PacketType.PUBACK: 0x40, PacketType.PUBREC: 0x50, PacketType.PUBREL: 0x62,
              PacketType.PUBCOMP: 0x70}
"""Each acknowledgement's first byte (PUBREL's flags are 0010)."""


def encode_ack(ptype: PacketType, packet_id: int, version: int = V311, reason: int = 0) -> bytes:
    """PUBACK, PUBREC, PUBREL (flags 0010) or PUBCOMP; 5.0 omits a success reason."""
    first = _ACK_FIRST[ptype]
    if version == V5 and reason:
        return bytes((first, 3, packet_id >> 8, packet_id & 0xFF, reason))
    return bytes((first, 2, packet_id >> 8, packet_id & 0xFF))


def encode_suback(packet_id: int, codes: list[int], version: int = V311) -> bytes:
    body = struct.pack(">H", packet_id)
    if version == V5:
        body += encode_props([])
    return packet(PacketType.SUBACK, 0, body + bytes(codes))


def encode_unsuback(packet_id: int, codes: list[int], version: int = V311) -> bytes:
    body = struct.pack(">H", packet_id)
    if version == V5:
        body += encode_props([]) + bytes(codes)
    return packet(PacketType.UNSUBACK, 0, body)


PINGRESP = packet(PacketType.PINGRESP, 0, b"")


def encode_disconnect(reason: int, version: int = V5) -> bytes:
    """A server's DISCONNECT (5.0 only: 3.1.1 servers just close). Without properties the
    property length is left out (MQTT 5.0 3.14.2.2.1), as mosquitto does: its conformance
    vectors expect ``e0 01 <reason>``."""
    return packet(PacketType.DISCONNECT, 0, bytes([reason]))


def encode_auth(reason: int, props: Props | None = None) -> bytes:
    """A 5.0 AUTH (both directions: the server's challenges, the tests' clients)."""
    return packet(PacketType.AUTH, 0, bytes([reason]) + encode_props(props or []))


# client-side encoders: the tests' hostile peers and golden vectors use them
def encode_connect(client_id: str, *, version: int = V311, clean: bool = True,
                   keep_alive_s: int = 60, username: str | None = None,
                   password: bytes | None = None, will: Will | None = None,
                   props: Props | None = None, protocol_name: bytes = PROTOCOL_NAME) -> bytes:
    flags = (0x02 if clean else 0) | (0x80 if username is not None else 0) | (
        0x40 if password is not None else 0)
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    body = _str(protocol_name) + bytes([version, flags]) + struct.pack(">H", keep_alive_s)
    if version == V5:
        body += encode_props(props or [])
    body += _str(client_id)
    if will is not None:
        if version == V5:
            body += encode_props(will.props)
        body += _str(will.topic) + _str(will.payload)
    if username is not None:
        body += _str(username)
    if password is not None:
        body += _str(password)
    return packet(PacketType.CONNECT, 0, body)


def encode_subscribe(packet_id: int, filters: list[tuple[str, int]], version: int = V311,
                     props: Props | None = None) -> bytes:
    body = struct.pack(">H", packet_id)
    if version == V5:
        body += encode_props(props or [])
    for topic, options in filters:
        body += _str(topic) + bytes([options])
    return packet(PacketType.SUBSCRIBE, 0b0010, body)


def connack_props(body: bytes) -> Props:
    """The properties of a 5.0 CONNACK's body (the tests' peers read them)."""
    return _Reader(body[2:]).props("connack")
