"""Admin frame bodies of native protocol v1: one table of declarations.

An admin body is an optional fixed body header, then ``msg_count`` entries (at least one).
Each entry is a fixed part (below, network byte order) followed by its text fields (UTF-8,
lengths given in the fixed part) and zero padding to a multiple of 8.

    type             body header         entry fixed part                         text
    HELLO/HEARTBEAT  -                   node_id u64, epoch u32, interval_ms u32,  name
                                         role u8, name_len u8, reserved u16,
                                         load_permille u32                 (24 B)
    SUBSCRIBE/       -                   sub_id u32, namespace_id u32,             pattern,
    UNSUBSCRIBE                          pattern_len u16, qos u8, flags u8,        selector
                                         selector_len u32                  (16 B)
    REGISTRY_UPDATE  version u64 (8 B)   topic_key u64, namespace_id u32,          topic
                                         topic_len u16, reserved u16       (16 B)
    NAK, LOSS        -                   first_seq u64, last_seq u64       (16 B)
    FLOW_CONTROL     -                   state u8, policy u8, reserved u16,
                                         queue_depth u32, high_watermark u32,
                                         low_watermark u32                 (16 B)
    SESSION_MOVE     -                   session_id u32, reserved u32, from_node u64,
                                         to_node u64, resume_seq u64       (32 B)
    SUCCESSOR        -                   op u8, reserved u8, client_len u16,       client_id,
                                         successor_len u16, reserved u16    (8 B)  successor_id
    ACK              -                   ack_seq u64, window_bytes u32,
                                         reserved u32                      (16 B)
    CONTROL          -                   kind u8, reserved u8, reserved u16,      document
                                         document_len u32                   (8 B)

The NAK/LOSS/ACK stream is the frame header's ``stream_id``; ranges are inclusive.
A CONTROL entry carries one JSON document (UTF-8) whose meaning its ``kind`` gives
(docs/appliance.md: link state, interest, P&M updates, client login and replies); the
codec checks only its length and encoding.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from datapath.config import MAX_TOPIC_BYTES
from datapath.protocol.frame_layout import (
    AUTH_TRAILER_BYTES,
    MAX_BODY_BYTES,
    FrameType,
)


class NodeRole(IntEnum):
    """Who sent a HELLO/HEARTBEAT."""

    CLIENT = 0
    CORE = 1
    EDGE = 2
    PM = 3
    CACHE = 4


class FlowState(IntEnum):
    OFF = 0
    ON = 1


class FlowPolicy(IntEnum):
    """What the sender does while flow control is on (seed 002, figure 7)."""

    THROTTLE = 0
    DROP_OLDEST = 1
    CONFLATE = 2


class SuccessorOp(IntEnum):
    """Successor control (seed 004)."""

    SET_SUCCESSOR = 1
    NOTIFY_ANCESTOR = 2
    SUBSCRIBE_SUCCESSORS = 3
    SUCCESSOR_DATA = 4


class ControlKind(IntEnum):
    """What the JSON document of a CONTROL entry is (docs/appliance.md)."""

    LSA = 1
    """Link-state advertisement: origin, sequence, live neighbours and link costs."""
    INTEREST = 2
    """The full set of patterns an origin appliance advertises (newest sequence wins)."""
    PM_UPDATE = 3
    """P&M's versioned document: entitlements, namespaces, schemas, route overrides."""
    LOGIN = 4
    """A client logs in: identity, reply ring."""
    LOGIN_RESULT = 5
    """The appliance's answer to LOGIN: accepted with a session id, or refused."""
    REQUEST_RESULT = 6
    """The answer to a client request (subscribe, unsubscribe, topic registration)."""
    RESOLVE = 7
    """A client asks for the topics of keys it received (answered by REGISTRY_UPDATE)."""
    LOGOUT = 8
    """A client session ends (either side)."""
    ECHO = 9
    """A neighbour echoes a heartbeat's send time back (round-trip time)."""
    REPLAY = 10
    """A client asks for one page of the messages its appliance's cache keeps (a pattern,
    from a cache sequence or a publish time)."""
    REPLAY_RESULT = 11
    """The answer to REPLAY: one bounded page of stored messages and where the next begins,
    or the refusal."""
    INTEREST_SELECTORS = 12
    """The selectors behind an origin's interest (of the INTEREST of the same epoch and
    seq): patterns every subscription of which holds a selector, with those selectors. Sent
    in a frame of its own (an older appliance drops the unknown kind, not the INTEREST)."""
    POLICY_DROPS = 13
    """An appliance tells a client session how many messages of which topic keys its
    flow-control policy dropped or conflated since the last report (docs/flow-control.md)."""
    RENDEZVOUS_COUNTS = 14
    """Rendezvous content routing: an origin's attribute counts of the events published at
    it, and its routes (the patterns and routing keys it holds registrations under)."""
    RENDEZVOUS_REGISTER = 15
    """Rendezvous content routing: the selector rules an origin registers at one target
    core (flooded; only the target keeps them; an empty list withdraws)."""
    PERSISTED = 16
    """A caching appliance tells its neighbour which guaranteed messages of that
    neighbour's publishers its cache holds on disk: per publishing stream, the positions on
    the reliable stream between them (docs/fault-tolerance.md, "Persisted by a neighbour's
    cache")."""
    REMOTE_REPLAY = 17
    """An appliance forwards a client's REPLAY (a replay page or a durable subscription's
    request) to the neighbour whose cache serves it (``cache.serve_from``), naming the
    client's identity and session and a forward id (docs/fault-tolerance.md, "Replay and
    durable subscriptions from a neighbour's cache")."""
    REMOTE_REPLAY_RESULT = 18
    """The serving cache's REPLAY_RESULT to a forwarded request (by its forward id), which
    the forwarding appliance relays to the client's session."""
    REMOTE_REPLAY_PART = 19
    """One part of one page frame of the answer to a forwarded request (base64: a page frame
    is larger than a frame on the link), put together and relayed by the forwarding
    appliance."""
    SESSION_MIRROR = 20
    """An appliance mirrors to its standby neighbour (``clients.mirror_to``) the
    subscriptions of its client sessions whose client has a standby, and the sessions that
    ended, so a session that moves there finds them made at its login
    (docs/fault-tolerance.md, "The standby's mirror")."""
    SUCCESSOR = 21
    """Successor delivery (seed 004) for native clients: a client's request (announce,
    withdraw, candidates, set, clear) and the appliance's answer, and the appliance's notice
    to a successor that an ancestor's messages now come to it (``route``) or no longer
    (``unroute``) (appliance/control/successor.py; docs/appliance.md, "Successor delivery")."""


MAX_CONTROL_DOCUMENT_BYTES = MAX_BODY_BYTES - 8 - AUTH_TRAILER_BYTES
"""Largest CONTROL document: one entry filling an authenticated frame."""

SUBSCRIPTION_FLAG_NONE = 0
SUBSCRIPTION_FLAG_POLICY_MASK = 0x03
"""The low two bits of a SUBSCRIBE entry's ``flags``: the flow-control policy the subscriber
asked for, as ``FlowPolicy + 1`` (0: none asked; P&M's identity or global policy applies, then
the QoS's default: docs/flow-control.md)."""
SUBSCRIPTION_FLAG_OWN_CLASS = 0x04
"""Bit 2 of a SUBSCRIBE entry's ``flags``: the subscription takes only the messages of its own
class (``Client.subscribe(..., own_class=True)``): a best-effort or last-value one not the
guaranteed messages its session's guaranteed subscriptions take, a guaranteed one not the
other messages its session's best-effort subscriptions take, so a session subscribed to a
pattern in both classes receives each message once (docs/appliance.md, "One class per
message"). An appliance built before it ignores the bit (the other bits of ``flags`` were
never checked); the client library then drops the second copy itself."""

SESSION_FLOW_STREAM = 0
"""The ``stream_id`` of a FLOW_CONTROL frame between a client and its appliance about the
session's plain (best-effort, last-value) delivery, not a reliable stream: from a subscriber
its receive queue's state, from the appliance "hold your publishes" (throttle)."""

MAX_SELECTOR_BYTES = MAX_TOPIC_BYTES
"""Longest selector text in a SUBSCRIBE entry (UTF-8 bytes; the entry's text limit)."""


@dataclass(frozen=True, slots=True)
class Hello:
    node_id: int
    epoch: int
    interval_ms: int
    role: NodeRole
    load_permille: int
    name: str


@dataclass(frozen=True, slots=True)
class Subscription:
    sub_id: int
    namespace_id: int
    qos: int
    flags: int
    pattern: str
    selector: str = ""
    """JMS selector text (docs/selectors.md); empty: none. Its length was a reserved u32,
    written as zero before selectors travelled, so old frames decode with no selector."""


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    topic_key: int
    namespace_id: int
    topic: str


@dataclass(frozen=True, slots=True)
class SeqRange:
    first_seq: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class FlowControl:
    state: FlowState
    policy: FlowPolicy
    queue_depth: int
    high_watermark: int
    low_watermark: int


@dataclass(frozen=True, slots=True)
class SessionMove:
    session_id: int
    from_node: int
    to_node: int
    resume_seq: int


@dataclass(frozen=True, slots=True)
class Successor:
    op: SuccessorOp
    client_id: str
    successor_id: str


@dataclass(frozen=True, slots=True)
class Ack:
    ack_seq: int
    window_bytes: int


@dataclass(frozen=True, slots=True)
class Control:
    kind: ControlKind
    document: str


@dataclass(frozen=True, slots=True)
class AdminLayout:
    """How one admin frame type is laid out.

    ``fields`` names the fixed part's struct members in order; names starting with ``_`` are
    reserved (written as zero, ignored on read); names ending in ``_len`` give the byte length
    of the text field named in ``texts`` at the same rank.
    """

    entry_type: type
    entry_struct: struct.Struct
    fields: tuple[str, ...]
    texts: tuple[str, ...] = ()
    body_header: struct.Struct | None = None
    enums: tuple[tuple[str, type[IntEnum]], ...] = ()
    text_limit_bytes: int = MAX_TOPIC_BYTES


_HELLO = AdminLayout(
    Hello, struct.Struct(">QIIBBHI"),
    ("node_id", "epoch", "interval_ms", "role", "name_len", "_r", "load_permille"),
    texts=("name",), enums=(("role", NodeRole),), text_limit_bytes=255,
)
_SUBSCRIPTION = AdminLayout(
    Subscription, struct.Struct(">IIHBBI"),
    ("sub_id", "namespace_id", "pattern_len", "qos", "flags", "selector_len"),
    texts=("pattern", "selector"),
)
_RANGE = AdminLayout(SeqRange, struct.Struct(">QQ"), ("first_seq", "last_seq"))

ADMIN_LAYOUTS: dict[FrameType, AdminLayout] = {
    FrameType.HELLO: _HELLO,
    FrameType.HEARTBEAT: _HELLO,
    FrameType.SUBSCRIBE: _SUBSCRIPTION,
    FrameType.UNSUBSCRIBE: _SUBSCRIPTION,
    FrameType.REGISTRY_UPDATE: AdminLayout(
        RegistryEntry, struct.Struct(">QIHH"), ("topic_key", "namespace_id", "topic_len", "_r"),
        texts=("topic",), body_header=struct.Struct(">Q"),
    ),
    FrameType.NAK: _RANGE,
    FrameType.LOSS: _RANGE,
    FrameType.FLOW_CONTROL: AdminLayout(
        FlowControl, struct.Struct(">BBHIII"),
        ("state", "policy", "_r", "queue_depth", "high_watermark", "low_watermark"),
        enums=(("state", FlowState), ("policy", FlowPolicy)),
    ),
    FrameType.SESSION_MOVE: AdminLayout(
        SessionMove, struct.Struct(">IIQQQ"),
        ("session_id", "_r", "from_node", "to_node", "resume_seq"),
    ),
    FrameType.SUCCESSOR: AdminLayout(
        Successor, struct.Struct(">BBHHH"),
        ("op", "_r", "client_id_len", "successor_id_len", "_r2"),
        texts=("client_id", "successor_id"), enums=(("op", SuccessorOp),), text_limit_bytes=255,
    ),
    FrameType.ACK: AdminLayout(Ack, struct.Struct(">QII"), ("ack_seq", "window_bytes", "_r")),
    FrameType.CONTROL: AdminLayout(
        Control, struct.Struct(">BBHI"), ("kind", "_r", "_r2", "document_len"),
        texts=("document",), enums=(("kind", ControlKind),),
        text_limit_bytes=MAX_CONTROL_DOCUMENT_BYTES,
    ),
}
"""Every admin frame type and its layout; DATA and RETRANSMISSION use message_layout."""

BODY_HEADER_FIELDS: dict[FrameType, tuple[str, ...]] = {FrameType.REGISTRY_UPDATE: ("version",)}
"""Names of the body header's fields, for the types that have one."""

for _layout in ADMIN_LAYOUTS.values():
    assert _layout.entry_struct.size % 8 == 0
    assert len(_layout.fields) == len(_layout.entry_struct.format.lstrip(">"))
