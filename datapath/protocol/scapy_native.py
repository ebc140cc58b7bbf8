"""scapy layer of native protocol v1: a declaration of docs/protocol.md, nothing else.

``NativeFrame`` over UDP (bound to ``config.NATIVE_UDP_PORT``; ``bind_port`` adds another),
its messages (``NativeMessage``) and one entry class per admin frame type. Lengths, counts
and padding are computed when building and read when dissecting; golden vectors in
tests/datapath/protocol/golden hold this layer and the codec to the same bytes.
"""

from __future__ import annotations

from scapy.fields import (
    ByteEnumField,
    ByteField,
    ConditionalField,
    FieldLenField,
    FlagsField,
    IntField,
    LongField,
    PacketField,
    PacketListField,
    ShortField,
    StrFixedLenField,
    StrLenField,
    XLongField,
    XShortField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from datapath.config import NATIVE_UDP_PORT
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml

FRAME_TYPES = {t.value: t.name for t in fl.FrameType}
QOS_NAMES = {q.value: q.name for q in ml.Qos}
ROLE_NAMES = {r.value: r.name for r in al.NodeRole}


def _pad_len(*lengths: int) -> int:
    total = sum(lengths)
    return fl.align8(total) - total


class _Padded(Packet):
    """An 8-byte-aligned unit: ``pad`` is filled with zeros when building."""

    _text_fields: tuple[str, ...] = ()

    def _text_lengths(self) -> list[int]:
        return [len(getattr(self, name) or b"") for name in self._text_fields]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        return pkt + bytes(_pad_len(len(pkt))) + pay if self.pad in (None, b"") else pkt + pay

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s


def _pad_field(*length_fields: str) -> StrLenField:
    return StrLenField(
        "pad", b"", length_from=lambda p: _pad_len(*(getattr(p, f) or 0 for f in length_fields))
    )


class NativeMessage(_Padded):
    """One message; its payload field is ``data`` (scapy reserves ``payload``)."""

    name = "topicwire message"
    fields_desc = [
        XLongField("topic_key", 0),
        LongField("sequence", 0),
        LongField("publish_ts_ns", 0),
        IntField("namespace_id", 0),
        ShortField("schema_id", 0),
        ByteEnumField("qos", 0, QOS_NAMES),
        FlagsField("flags", 0, 8, ["RETRANSMITTED", "PARTIAL", "HEADERS", "SEGMENT"]),
        FieldLenField("payload_len", None, length_of="data", fmt="!I"),
        FieldLenField("topic_len", None, length_of="topic", fmt="!H"),
        ShortField("reserved", 0),
        StrLenField("data", b"", length_from=lambda p: p.payload_len),
        StrLenField("topic", b"", length_from=lambda p: p.topic_len),
        _pad_field("payload_len", "topic_len"),
    ]


class HelloEntry(_Padded):
    name = "topicwire hello"
    fields_desc = [
        LongField("node_id", 0),
        IntField("epoch", 0),
        IntField("interval_ms", 0),
        ByteEnumField("role", 0, ROLE_NAMES),
        FieldLenField("name_len", None, length_of="node_name", fmt="B"),
        ShortField("reserved", 0),
        IntField("load_permille", 0),
        StrLenField("node_name", b"", length_from=lambda p: p.name_len),
        _pad_field("name_len"),
    ]


class SubscriptionEntry(_Padded):
    name = "topicwire subscription"
    fields_desc = [
        IntField("sub_id", 0),
        IntField("namespace_id", 0),
        FieldLenField("pattern_len", None, length_of="pattern", fmt="!H"),
        ByteEnumField("qos", 0, QOS_NAMES),
        ByteField("sub_flags", 0),
        IntField("reserved", 0),
        StrLenField("pattern", b"", length_from=lambda p: p.pattern_len),
        _pad_field("pattern_len"),
    ]


class RegistryEntry(_Padded):
    name = "topicwire registry entry"
    fields_desc = [
        XLongField("topic_key", 0),
        IntField("namespace_id", 0),
        FieldLenField("topic_len", None, length_of="topic", fmt="!H"),
        ShortField("reserved", 0),
        StrLenField("topic", b"", length_from=lambda p: p.topic_len),
        _pad_field("topic_len"),
    ]


class RangeEntry(_Padded):
    name = "topicwire sequence range"
    fields_desc = [LongField("first_seq", 0), LongField("last_seq", 0), _pad_field()]


class FlowControlEntry(_Padded):
    name = "topicwire flow control"
    fields_desc = [
        ByteEnumField("state", 0, {s.value: s.name for s in al.FlowState}),
        ByteEnumField("policy", 0, {p.value: p.name for p in al.FlowPolicy}),
        ShortField("reserved", 0),
        IntField("queue_depth", 0),
        IntField("high_watermark", 0),
        IntField("low_watermark", 0),
        _pad_field(),
    ]


class SessionMoveEntry(_Padded):
    name = "topicwire session move"
    fields_desc = [
        IntField("session_id", 0),
        IntField("reserved", 0),
        LongField("from_node", 0),
        LongField("to_node", 0),
        LongField("resume_seq", 0),
        _pad_field(),
    ]


class SuccessorEntry(_Padded):
    name = "topicwire successor"
    fields_desc = [
        ByteEnumField("op", 1, {o.value: o.name for o in al.SuccessorOp}),
        ByteField("reserved", 0),
        FieldLenField("client_id_len", None, length_of="client_id", fmt="!H"),
        FieldLenField("successor_id_len", None, length_of="successor_id", fmt="!H"),
        ShortField("reserved2", 0),
        StrLenField("client_id", b"", length_from=lambda p: p.client_id_len),
        StrLenField("successor_id", b"", length_from=lambda p: p.successor_id_len),
        _pad_field("client_id_len", "successor_id_len"),
    ]


class AckEntry(_Padded):
    name = "topicwire ack"
    fields_desc = [LongField("ack_seq", 0), IntField("window_bytes", 0), IntField("reserved", 0),
                   _pad_field()]


class ControlEntry(_Padded):
    name = "topicwire control"
    fields_desc = [
        ByteEnumField("kind", 1, {k.value: k.name for k in al.ControlKind}),
        ByteField("reserved", 0),
        ShortField("reserved2", 0),
        FieldLenField("document_len", None, length_of="document", fmt="!I"),
        StrLenField("document", b"", length_from=lambda p: p.document_len),
        _pad_field("document_len"),
    ]


class AuthTrailer(Packet):
    name = "topicwire auth trailer"
    fields_desc = [
        IntField("key_id", 0),
        IntField("epoch", 0),
        LongField("auth_seq", 0),
        StrFixedLenField("mac", bytes(fl.AUTH_MAC_BYTES), fl.AUTH_MAC_BYTES),
    ]

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s


ENTRY_CLASSES: dict[int, type[Packet]] = {
    fl.FrameType.DATA: NativeMessage,
    fl.FrameType.RETRANSMISSION: NativeMessage,
    fl.FrameType.HELLO: HelloEntry,
    fl.FrameType.HEARTBEAT: HelloEntry,
    fl.FrameType.SUBSCRIBE: SubscriptionEntry,
    fl.FrameType.UNSUBSCRIBE: SubscriptionEntry,
    fl.FrameType.REGISTRY_UPDATE: RegistryEntry,
    fl.FrameType.NAK: RangeEntry,
    fl.FrameType.LOSS: RangeEntry,
    fl.FrameType.FLOW_CONTROL: FlowControlEntry,
    fl.FrameType.SESSION_MOVE: SessionMoveEntry,
    fl.FrameType.SUCCESSOR: SuccessorEntry,
    fl.FrameType.ACK: AckEntry,
    fl.FrameType.CONTROL: ControlEntry,
}
"""The entry class of each frame type (messages for DATA and RETRANSMISSION)."""


def _next_entry(pkt: Packet, done: list, cur: Packet | None, remain: bytes) -> type | None:
    parsed = len(done) + (cur is not None)
    if parsed >= (pkt.msg_count or 0) or not remain:
        return None
    return ENTRY_CLASSES.get(pkt.frame_type)


class NativeFrame(Packet):
    name = "topicwire frame"
    fields_desc = [
        XShortField("magic", fl.FRAME_MAGIC),
        ByteField("version", fl.PROTOCOL_VERSION),
        ByteEnumField("frame_type", fl.FrameType.DATA, FRAME_TYPES),
        FlagsField("flags", 0, 16, ["AUTH_TRAILER"]),
        FieldLenField("msg_count", None, count_of="entries", fmt="!H"),
        IntField("frame_len", None),
        IntField("source_session", 0),
        IntField("dest_session", 0),
        IntField("stream_id", 0),
        LongField("send_ts_ns", 0),
        ConditionalField(LongField("registry_version", 0),
                         lambda p: p.frame_type == fl.FrameType.REGISTRY_UPDATE),
        PacketListField("entries", [], next_cls_cb=_next_entry),
        ConditionalField(PacketField("auth", AuthTrailer(), AuthTrailer),
                         lambda p: int(p.flags) & fl.FrameFlags.AUTH_TRAILER),
    ]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.frame_len is None:
            pkt = pkt[: fl.FRAME_LEN_OFFSET] + len(pkt).to_bytes(4, "big") + pkt[
                fl.FRAME_LEN_OFFSET + 4 :]
        return pkt + pay

    def mysummary(self) -> str:
        return self.sprintf("topicwire %frame_type% count=%msg_count% len=%frame_len% "
                            "stream=%stream_id%")


def bind_port(port: int) -> None:
    """Dissect UDP traffic to or from ``port`` as native frames."""
    bind_layers(UDP, NativeFrame, dport=port)
    bind_layers(UDP, NativeFrame, sport=port)


bind_layers(UDP, NativeFrame, dport=NATIVE_UDP_PORT)
bind_layers(UDP, NativeFrame, sport=NATIVE_UDP_PORT)
