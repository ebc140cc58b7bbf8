"""Small wire helpers of the reliable transport: admin frames, raw message frames, walking.

Building NAK/LOSS/ACK/FLOW_CONTROL frames goes through ``codec.encode_admin`` (the admin path is
cold). RETRANSMISSION frames are assembled from stored message bytes by ``RawFrameBuilder``
(copy, set the RETRANSMITTED flag, write the header), without re-encoding each message.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence

from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol.codec import encode_admin

SEQ_STRUCT = struct.Struct(">Q")
LENGTHS_STRUCT = struct.Struct(">IH")
"""payload_len u32, topic_len u16 at message offset 32."""


def admin_frames(frame_type: fl.FrameType, entries: Sequence[object], per_frame: int, *,
                 source_session: int, dest_session: int, stream_id: int) -> list[bytearray]:
    """``entries`` split over as many admin frames as needed (``per_frame`` entries each)."""
    now = time.time_ns()
    return [encode_admin(frame_type, entries[i : i + per_frame], source_session=source_session,
                         dest_session=dest_session, stream_id=stream_id, send_ts_ns=now)
            for i in range(0, len(entries), per_frame)]


class RawFrameBuilder:
    """Packs stored messages (wire bytes) into message frames of at most ``max_frame_bytes``."""

    def __init__(self, max_frame_bytes: int, emit: Callable[[memoryview], None], *,
                 frame_type: fl.FrameType, source_session: int, dest_session: int,
                 stream_id: int, set_flags: int = 0) -> None:
        self._buf = bytearray(max_frame_bytes)
        self._view = memoryview(self._buf)
        self._max = max_frame_bytes
        self._emit = emit
        self._ids = (source_session, dest_session, stream_id)
        self._type = frame_type
        self._set_flags = set_flags
        self._pos = fl.FRAME_HEADER_BYTES
        self._count = 0
        self.frames = 0

    def add(self, message: memoryview) -> None:
        size = len(message)
        if self._pos + size > self._max or self._count == ml.MAX_MESSAGES_PER_FRAME:
            self.flush()
        pos = self._pos
        self._view[pos : pos + size] = message
        if self._set_flags:
            self._buf[pos + ml.MSG_FLAGS_OFFSET] |= self._set_flags
        self._pos = pos + size
        self._count += 1

    def flush(self) -> None:
        if not self._count:
            return
        src, dst, stream = self._ids
        fl.FRAME_HEADER_STRUCT.pack_into(self._buf, 0, fl.FRAME_MAGIC, fl.PROTOCOL_VERSION,
                                         self._type, 0, self._count, self._pos, src, dst,
                                         stream, time.time_ns())
        self._emit(self._view[: self._pos])
        self.frames += 1
        self._pos = fl.FRAME_HEADER_BYTES
        self._count = 0
