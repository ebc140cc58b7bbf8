"""Message header layout of native protocol v1 (40 bytes, network byte order).

DATA and RETRANSMISSION frames carry ``msg_count`` messages back to back after the frame
header. Each message is this header, then ``payload_len`` payload bytes, then ``topic_len``
topic bytes (UTF-8; usually 0: only keys travel), then zero padding to a multiple of 8.
With the HEADERS or SEGMENT flag, the payload region ends with a header block and/or a
segment descriptor (extension_layout.py); ``payload_len`` counts them.
The payload therefore always starts at offset 40 of its message, so schema fields sit at
fixed offsets for the offload tables.

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                     topic_key (64 bits)                       |  0
    +                                                               +
    |                                                               |
    +---------------------------------------------------------------+
    |                 sequence (64 bits, per stream)                |  8
    +                                                               +
    |                                                               |
    +---------------------------------------------------------------+
    |                   publish_ts_ns (64 bits)                     | 16
    +                                                               +
    |                                                               |
    +---------------------------------------------------------------+
    |                         namespace_id                          | 24
    +-------------------------------+---------------+---------------+
    |           schema_id           |      qos      |     flags     | 28
    +-------------------------------+---------------+---------------+
    |                          payload_len                          | 32
    +-------------------------------+-------------------------------+
    |           topic_len           |        reserved (zero)        | 36
    +-------------------------------+-------------------------------+
    |  payload (payload_len) | topic (topic_len) | pad to 8         | 40
"""

from __future__ import annotations

import struct
from enum import IntEnum, IntFlag

import numpy as np

from datapath.config import MAX_FRAME_BYTES, MAX_TOPIC_BYTES
from datapath.protocol.frame_layout import FRAME_HEADER_BYTES, align8

TOPIC_KEY_OFFSET = 0
SEQUENCE_OFFSET = 8
PUBLISH_TS_OFFSET = 16
NAMESPACE_OFFSET = 24
SCHEMA_OFFSET = 28
QOS_OFFSET = 30
MSG_FLAGS_OFFSET = 31
PAYLOAD_LEN_OFFSET = 32
TOPIC_LEN_OFFSET = 36
RESERVED_OFFSET = 38
MESSAGE_HEADER_BYTES = 40
PAYLOAD_OFFSET = MESSAGE_HEADER_BYTES


class Qos(IntEnum):
    """Quality of service of a message (DESIGN.md: reliability)."""

    BEST_EFFORT = 0
    LAST_VALUE = 1
    GUARANTEED = 2


MAX_QOS = max(Qos)


class MessageFlags(IntFlag):
    """Message flag bits; every other bit is reserved and must be zero."""

    NONE = 0
    RETRANSMITTED = 0x01
    """A copy sent again in answer to a NAK (or replayed by the caching engine)."""
    PARTIAL = 0x02
    """The payload is a partial update (seed 002's partial publish): changed fields only."""
    HEADERS = 0x04
    """The payload region ends with a header block (user properties; extension_layout.py)."""
    SEGMENT = 0x08
    """The payload region ends with a segment descriptor: one part of a large message
    (extension_layout.py)."""


KNOWN_MESSAGE_FLAGS = int(MessageFlags.RETRANSMITTED | MessageFlags.PARTIAL
                          | MessageFlags.HEADERS | MessageFlags.SEGMENT)
APP_MESSAGE_FLAGS = int(MessageFlags.PARTIAL | MessageFlags.HEADERS | MessageFlags.SEGMENT)
"""The flags a publisher sets and every hop keeps (RETRANSMITTED is the hop's own)."""

MESSAGE_HEADER_STRUCT = struct.Struct(">QQQIHBBIHH")
"""topic_key, sequence, publish_ts_ns, namespace_id, schema_id, qos, flags, payload_len,
topic_len, reserved."""

MESSAGE_HEADER_DTYPE = np.dtype(
    {
        "names": [
            "topic_key", "sequence", "publish_ts_ns", "namespace_id", "schema_id", "qos",
            "flags", "payload_len", "topic_len", "reserved",
        ],
        "formats": [">u8", ">u8", ">u8", ">u4", ">u2", "u1", "u1", ">u4", ">u2", ">u2"],
        "offsets": [
            TOPIC_KEY_OFFSET, SEQUENCE_OFFSET, PUBLISH_TS_OFFSET, NAMESPACE_OFFSET,
            SCHEMA_OFFSET, QOS_OFFSET, MSG_FLAGS_OFFSET, PAYLOAD_LEN_OFFSET, TOPIC_LEN_OFFSET,
            RESERVED_OFFSET,
        ],
        "itemsize": MESSAGE_HEADER_BYTES,
    }
)
"""The header as a numpy structured dtype (wire byte order)."""

DECODED_MESSAGE_DTYPE = np.dtype(
    [
        ("topic_key", "u8"),
        ("sequence", "u8"),
        ("publish_ts_ns", "u8"),
        ("namespace_id", "u4"),
        ("schema_id", "u2"),
        ("qos", "u1"),
        ("flags", "u1"),
        ("payload_offset", "i8"),
        ("payload_len", "u4"),
        ("topic_len", "u2"),
        ("frame_index", "i4"),
    ]
)
"""One decoded message in native byte order, as batch decode writes it: the payload stays in
the receive buffer at ``payload_offset`` (the topic follows it); nothing is copied."""

MAX_PAYLOAD_BYTES = MAX_FRAME_BYTES - FRAME_HEADER_BYTES - MESSAGE_HEADER_BYTES
"""Largest payload of a message that travels alone in a frame."""

MAX_MESSAGES_PER_FRAME = (MAX_FRAME_BYTES - FRAME_HEADER_BYTES) // MESSAGE_HEADER_BYTES
"""A frame cannot hold more messages than this (all with empty payloads)."""

assert MESSAGE_HEADER_STRUCT.size == MESSAGE_HEADER_BYTES
assert MESSAGE_HEADER_DTYPE.itemsize == MESSAGE_HEADER_BYTES
assert MAX_TOPIC_BYTES < 2**16


def message_bytes(payload_len: int, topic_len: int = 0) -> int:
    """Bytes a message occupies in a frame, padding included."""
    return MESSAGE_HEADER_BYTES + align8(payload_len + topic_len)
