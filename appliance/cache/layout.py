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

A **loss marker** stands in a log where the cache did not keep messages its pattern matches
(its queue was full, a message was too large, the hop to the cache's session lost some):
topic key 0 (no topic has it, so a replay page never takes it as a message), ``fl``
``LOSS_MARKER``, no topic, and a JSON payload saying what was not kept (``reason``,
``messages``, ``origin``, ``stream``, ``first_seq``, ``last_seq``, ``topics``: topic ->
count, or null when the topics are not known). A durable subscription reading past it gets
a loss event (appliance/cache/agent.py).
"""

from __future__ import annotations

import json
import struct

from datapath.config import MAX_TOPIC_BYTES

ENVELOPE = struct.Struct(">QQIIIHBBH")
ENVELOPE_BYTES = ENVELOPE.size
LOSS_MARKER = 0x80
"""The envelope flag of a loss marker (key 0)."""


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


def encode_marker(origin: int, stream: int, loss: dict) -> bytes:
    """A loss marker's record payload (``loss``: the JSON document above)."""
    return encode(0, 0, origin, stream, 0, 0, 0, b"",
                  json.dumps(loss, separators=(",", ":")).encode(), LOSS_MARKER)


def decode_marker(record: bytes) -> dict | None:
    """A loss marker's document, or None when the record is not one."""
    if len(record) < ENVELOPE_BYTES:
        return None
    _, key, _, _, _, _, _, flags, tlen = ENVELOPE.unpack_from(record)
    if key or not flags & LOSS_MARKER:
        return None
    try:
        doc = json.loads(record[ENVELOPE_BYTES + tlen:])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
