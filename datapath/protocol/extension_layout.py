"""Message extensions of native protocol v1: the header block (user properties) and the
segment descriptor, both at the **end** of a message's payload region.

A message whose ``flags`` have ``HEADERS`` (0x04) and/or ``SEGMENT`` (0x08) set carries them
inside its ``payload_len`` bytes, after the application's payload, so every walker that
sizes a message (``40 + align8(payload_len + topic_len)``: the batch kernels, the software
NIC, the reliable transport, the P4 program) is unchanged, and the application's payload
still starts at offset 40 (schema fields stay at fixed offsets). A message with neither flag
is byte for byte a message without extensions. Read from the end of the payload region:

    payload region = application payload | header block (HEADERS) | segment descriptor (SEGMENT)

Header block (``block_len`` bytes, the tail included; at most ``MAX_HEADER_BLOCK_BYTES``)::

    entry*  =  value_kind u8 (0 text, 1 bytes) | key_len u8 | value_len u16 | key | value
    tail    =  count u16 | block_len u16

Keys are 1..255 bytes of UTF-8, unique within a message; text values are UTF-8. There is no
padding inside the block (the message's padding follows the topic as always).

Segment descriptor (16 bytes, the last bytes of the payload region)::

    segment_id u32 | total_len u32 | offset u32 | index u16 | count u16

One large message published as ``count`` segment messages (``index`` 0..count-1, in order,
each carrying bytes ``[offset, offset + chunk)`` of the ``total_len``-byte payload);
``segment_id`` names the message within its publishing session. Only segment 0 carries the
header block (``HEADERS`` is set on it alone). The subscribing client reassembles
(``datapath/protocol/segments.py``).
"""

from __future__ import annotations

import struct
from enum import IntEnum

HEADER_ENTRY_STRUCT = struct.Struct(">BBH")
"""value_kind, key_len, value_len."""
HEADER_ENTRY_FIELDS = ("value_kind", "key_len", "value_len")
HEADER_TAIL_STRUCT = struct.Struct(">HH")
"""count, block_len."""
HEADER_TAIL_FIELDS = ("count", "block_len")
SEGMENT_STRUCT = struct.Struct(">IIIHH")
"""segment_id, total_len, offset, index, count."""
SEGMENT_FIELDS = ("segment_id", "total_len", "offset", "index", "count")

HEADER_ENTRY_BYTES = HEADER_ENTRY_STRUCT.size
HEADER_TAIL_BYTES = HEADER_TAIL_STRUCT.size
SEGMENT_DESCRIPTOR_BYTES = SEGMENT_STRUCT.size



class ValueKind(IntEnum):
    """How a header's value is typed: given as ``str``, delivered as ``str`` (UTF-8 on the
    wire); given as ``bytes``, delivered as ``bytes``."""

    TEXT = 0
    BYTES = 1


HEADER_TEXT = int(ValueKind.TEXT)
HEADER_BYTES_VALUE = int(ValueKind.BYTES)

MAX_HEADERS = 32
"""Headers (user properties) one message carries."""
MAX_HEADER_KEY_BYTES = 255
"""UTF-8 bytes of one header's key."""
MAX_HEADER_BLOCK_BYTES = 1_024
"""Bytes of a message's header block, entries and tail: it rides in the first segment, which
fits a 1,472-byte guaranteed frame with room for the payload."""

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Largest payload a client publishes (segmented above one frame's room)."""
MAX_SEGMENTS = 0xFFFF
"""Segments of one message (``count`` is a u16)."""

assert HEADER_ENTRY_BYTES == 4 and HEADER_TAIL_BYTES == 4 and SEGMENT_DESCRIPTOR_BYTES == 16
