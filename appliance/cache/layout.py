"""The payload of a cache record: the message's header fields, its topic and its payload.

A ``StreamLog`` record carries (sequence, timestamp, payload); the cache's sequence is its
own count per log (``cache_seq``, what ``replay(from_sequence=)`` names) and the timestamp is
the message's publish time. The record's payload is this envelope (big-endian):

```
 0       8       16      20      24      28  30 31  32      34
 +-------+-------+-------+-------+-------+---+--+---+-------+------------+-----------+
 | seq   | key   |origin |stream | ns    |sch|q |fl |tlen   | topic      | payload   |
 | u64   | u64   | u32   | u32   | u32   |u16|u8|u8 | u16   | tlen bytes | the rest  |
 +-------+-------+-------+-------+-------+---+--+---+-------+------------+-----------+
```

``seq`` is the publisher's sequence number (per topic), ``key`` the topic key, ``origin``
the appliance where the message entered the fabric, ``stream`` the publishing session,
``fl`` the message flags its payload region has (``HEADERS``: the payload ends with the
message's header block, as on the wire; 0 in records written before headers were kept).
"""

from __future__ import annotations

import struct

from datapath.config import MAX_TOPIC_BYTES

ENVELOPE = struct.Struct(">QQIIIHBBH")
ENVELOPE_BYTES = ENVELOPE.size


def record_payload_bytes(message_payload_bytes: int) -> int:
    """The largest record payload that holds a message payload of this size."""
    return ENVELOPE_BYTES + MAX_TOPIC_BYTES + message_payload_bytes


def encode(seq: int, key: int, origin: int, stream: int, namespace: int, schema_id: int,
           qos: int, topic: bytes, payload: bytes, flags: int = 0) -> bytes:
    return ENVELOPE.pack(seq, key, origin, stream, namespace, schema_id, qos, flags,
                         len(topic)) + topic + payload


def decode(record: bytes) -> tuple[int, int, int, int, int, int, int, str, bytes] | None:
    """(seq, key, origin, stream, namespace, schema_id, qos, topic, payload), or None when
    the record is not an envelope (its CRC checked, so only a bug or another writer)."""
    if len(record) < ENVELOPE_BYTES:
        return None
    seq, key, origin, stream, ns, schema, qos, _, tlen = ENVELOPE.unpack_from(record)
    end = ENVELOPE_BYTES + tlen
    if end > len(record):
        return None
    try:
        topic = record[ENVELOPE_BYTES:end].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return seq, key, origin, stream, ns, schema, qos, topic, record[end:]
