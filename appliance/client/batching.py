"""``Client.publish_batch``: many messages of one topic packed into few frames in one call.

The payloads become one arena and a table of (offset, length) (a 2-D ``numpy.uint8`` array
is used in place: one message per row); the message records (key, sequences counting up
from the topic's next one, one publish time for the batch) are filled by numpy, and the
batch packer (``datapath.protocol.batch.pack_frames``, kernel ``_kernels._pack_frames``)
writes them into the client's publish frame, one full frame per call, each signed and sent
as ``publish`` sends its frames. Nothing is allocated per message. Best-effort and
last-value only (a guaranteed message has its own outcome: ``publish``); a payload larger
than one frame's room is refused (``publish`` segments it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.client.checks import MAX_NAMESPACE, MAX_SCHEMA_ID, check_int
from appliance.client.errors import ClientError
from appliance.client.messages import QOS
from appliance.client.settings import PUBLISH_BATCH_MESSAGES
from datapath.config import MAX_FRAME_BYTES
from datapath.protocol import frame_layout as fl
from datapath.protocol.batch import new_message_batch, pack_frames

if TYPE_CHECKING:
    from appliance.client.api import Client


def _arena(payloads: Any, room: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(arena bytes, offsets, lengths, count) of ``payloads``; ClientError when unusable."""
    if isinstance(payloads, np.ndarray):
        if payloads.ndim != 2 or payloads.dtype != np.uint8:
            raise ClientError(f"publish_batch: a numpy array of payloads is 2-D uint8 (one "
                              f"message per row), not {payloads.ndim}-D {payloads.dtype}")
        count, width = payloads.shape
        arena = np.ascontiguousarray(payloads).reshape(-1)
        if not arena.flags.writeable:  # the kernel is compiled for writable arrays only
            arena = arena.copy()
        offsets = np.arange(count, dtype=np.int64) * width
        lengths = np.full(count, width, np.int64)
        biggest = width if count else 0
    else:
        if isinstance(payloads, (bytes, bytearray, memoryview, str)) or not isinstance(
                payloads, Sequence):
            raise ClientError(f"publish_batch takes a sequence of payloads (bytes, bytearray "
                              f"or memoryview each) or a 2-D uint8 numpy array, not "
                              f"{type(payloads).__name__}")
        count = len(payloads)
        try:
            joined = b"".join(payloads)
        except TypeError:
            bad = next(p for p in payloads if not isinstance(p, (bytes, bytearray, memoryview)))
            hint = " (encode text first)" if isinstance(bad, str) else ""
            raise ClientError(f"publish_batch: a payload is bytes, bytearray or memoryview, "
                              f"not {type(bad).__name__}{hint}") from None
        arena = np.frombuffer(bytearray(joined), np.uint8)  # (writable: one kernel type)
        lengths = np.fromiter(map(len, payloads), np.int64, count)
        offsets = np.zeros(count, np.int64)
        if count > 1:
            np.cumsum(lengths[:-1], out=offsets[1:])
        biggest = int(lengths.max()) if count else 0
        if len(arena) != int(lengths.sum()):  # a memoryview of another item size
            raise ClientError("publish_batch: a memoryview payload must be of bytes "
                              "(format 'B'); cast it first")
    if biggest > room:
        raise ClientError(f"publish_batch: a payload of {biggest:,} bytes does not fit one "
                          f"frame (at most {room:,}); publish it alone with publish(), which "
                          "segments large messages")
    return arena, offsets, lengths, count


def publish_batch(client: Client, topic: str, payloads: Any, *, qos: str,
                  namespace: int, schema_id: int) -> int:
    """``Client.publish_batch`` (see there)."""
    if client.closed:
        raise ClientError("publish_batch on a closed client; connect again")
    client._check_usable()
    if qos not in QOS:
        raise ClientError(f"qos {qos!r} is not one of {', '.join(QOS)}")
    if qos == "guaranteed":
        raise ClientError("publish_batch sends best-effort or last-value messages; publish "
                          "guaranteed ones with publish() (each has its own Outcome)")
    check_int("namespace", namespace, MAX_NAMESPACE)
    check_int("schema_id", schema_id, MAX_SCHEMA_ID)
    arena, offsets, lengths, count = _arena(payloads, client._writer_room)
    key = client._key(topic, namespace)
    if count == 0:
        return client._seq.get(key, 0)
    records = client._batch_records
    if records is None:
        records = client._batch_records = new_message_batch(PUBLISH_BATCH_MESSAGES)
    capacity = (min(MAX_FRAME_BYTES, client.channel.max_frame_bytes)
                - fl.AUTH_TRAILER_BYTES) & ~7  # (pack_frames: a multiple of 8)
    one_offset = np.zeros(1, np.int64)
    one_length = np.zeros(1, np.int64)
    with client._pub_lock:
        client._flush_locked()  # what publish() left open goes first (sequence order)
        first_seq = client._seq.get(key, 0) + 1
        client._seq[key] = first_seq + count - 1
        now = time.time_ns()
        done = 0
        while done < count:
            part = min(count - done, PUBLISH_BATCH_MESSAGES)
            rec = records[:part]
            rec["topic_key"] = key
            rec["sequence"] = np.arange(first_seq + done, first_seq + done + part,
                                        dtype=np.uint64)
            rec["publish_ts_ns"] = now
            rec["namespace_id"] = namespace
            rec["schema_id"] = schema_id
            rec["qos"] = QOS[qos]
            rec["flags"] = 0
            rec["payload_offset"] = offsets[done : done + part]
            rec["payload_len"] = lengths[done : done + part]
            packed = 0
            while packed < part:
                result = pack_frames(records, part - packed, arena, client._pub_np[:capacity],
                                     one_offset, one_length, first=packed,
                                     source_session=client.session, stream_id=client.session,
                                     send_ts_ns=time.time_ns(), max_frame_bytes=capacity)
                if result.messages == 0:  # cannot happen: every payload fits a frame
                    raise ClientError("publish_batch: a message did not fit an empty frame")
                client._send_packed(int(one_length[0]), result.messages)
                packed += result.messages
            done += part
        client.published += count
    return first_seq + count - 1

