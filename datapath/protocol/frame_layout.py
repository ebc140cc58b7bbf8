"""Frame header layout of native protocol v1 (32 bytes, network byte order).

Every frame starts with this header; ``frame_len`` covers the header, the body and the
optional authentication trailer, and is always a multiple of 8.

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-------------------------------+---------------+---------------+
    |        magic 0x5457 "TW"      |  version = 1  |  frame_type   |  0
    +-------------------------------+---------------+---------------+
    |            flags              |           msg_count           |  4
    +-------------------------------+-------------------------------+
    |                           frame_len                           |  8
    +---------------------------------------------------------------+
    |                        source_session                         | 12
    +---------------------------------------------------------------+
    |                         dest_session                          | 16
    +---------------------------------------------------------------+
    |                           stream_id                           | 20
    +---------------------------------------------------------------+
    |                     send_ts_ns (64 bits)                      | 24
    +                                                               +
    |                                                               |
    +---------------------------------------------------------------+
    |  body: msg_count messages (DATA, RETRANSMISSION) or an admin  | 32
    |  body (docs/protocol.md), then the auth trailer if flagged    |
"""

from __future__ import annotations

import struct
from enum import IntEnum, IntFlag

import numpy as np

from datapath.config import MAX_FRAME_BYTES

FRAME_MAGIC = 0x5457
PROTOCOL_VERSION = 1
FRAME_ALIGNMENT_BYTES = 8

MAGIC_OFFSET = 0
VERSION_OFFSET = 2
TYPE_OFFSET = 3
FLAGS_OFFSET = 4
MSG_COUNT_OFFSET = 6
FRAME_LEN_OFFSET = 8
SOURCE_SESSION_OFFSET = 12
DEST_SESSION_OFFSET = 16
STREAM_ID_OFFSET = 20
SEND_TS_OFFSET = 24
FRAME_HEADER_BYTES = 32

AUTH_TRAILER_BYTES = 32
"""key_id u32, epoch u32, auth_seq u64, mac 16 bytes; present when FrameFlags.AUTH_TRAILER."""
AUTH_MAC_BYTES = 16
AUTH_TRAILER_STRUCT = struct.Struct(">IIQ")
"""key_id, epoch, auth_seq; the MAC follows."""


class FrameType(IntEnum):
    """What the body of a frame holds."""

    DATA = 1
    HELLO = 2
    HEARTBEAT = 3
    SUBSCRIBE = 4
    UNSUBSCRIBE = 5
    REGISTRY_UPDATE = 6
    NAK = 7
    RETRANSMISSION = 8
    FLOW_CONTROL = 9
    SESSION_MOVE = 10
    SUCCESSOR = 11
    ACK = 12
    LOSS = 13
    CONTROL = 14


MESSAGE_FRAME_TYPES = frozenset({FrameType.DATA, FrameType.RETRANSMISSION})
"""Frame types whose body is a batch of messages (message_layout)."""

MAX_FRAME_TYPE = max(FrameType)


class FrameFlags(IntFlag):
    """Frame flag bits; every other bit is reserved and must be zero."""

    NONE = 0
    AUTH_TRAILER = 0x0001
    """The last AUTH_TRAILER_BYTES of the frame are an authentication trailer."""


KNOWN_FRAME_FLAGS = int(FrameFlags.AUTH_TRAILER)

FRAME_HEADER_STRUCT = struct.Struct(">HBBHHIIIIQ")
"""magic, version, frame_type, flags, msg_count, frame_len, source_session, dest_session,
stream_id, send_ts_ns."""

FRAME_HEADER_DTYPE = np.dtype(
    {
        "names": [
            "magic", "version", "frame_type", "flags", "msg_count", "frame_len",
            "source_session", "dest_session", "stream_id", "send_ts_ns",
        ],
        "formats": [">u2", "u1", "u1", ">u2", ">u2", ">u4", ">u4", ">u4", ">u4", ">u8"],
        "offsets": [
            MAGIC_OFFSET, VERSION_OFFSET, TYPE_OFFSET, FLAGS_OFFSET, MSG_COUNT_OFFSET,
            FRAME_LEN_OFFSET, SOURCE_SESSION_OFFSET, DEST_SESSION_OFFSET, STREAM_ID_OFFSET,
            SEND_TS_OFFSET,
        ],
        "itemsize": FRAME_HEADER_BYTES,
    }
)
"""The header as a numpy structured dtype (wire byte order), for views over frame slots."""

MAX_BODY_BYTES = MAX_FRAME_BYTES - FRAME_HEADER_BYTES

assert FRAME_HEADER_STRUCT.size == FRAME_HEADER_BYTES
assert FRAME_HEADER_DTYPE.itemsize == FRAME_HEADER_BYTES
assert MAX_FRAME_BYTES % FRAME_ALIGNMENT_BYTES == 0


def align8(n: int) -> int:
    """Round ``n`` up to the frame alignment."""
    return (n + FRAME_ALIGNMENT_BYTES - 1) & ~(FRAME_ALIGNMENT_BYTES - 1)
