"""Batch encode/decode of many messages between preallocated numpy buffers (the hot path).

A ``MessageBatch`` is a preallocated structured array of ``DECODED_MESSAGE_DTYPE``; payloads
stay where they are (in the receive buffer, or an arena for sending) and records point at
them. ``decode_frames`` fills a batch from many received frames at once;
``pack_frames`` writes a batch back out as frames. Kernels: ``_kernels._decode_frames``,
``_kernels._pack_frames``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datapath.config import MAX_FRAME_BYTES
from datapath.protocol import _kernels
from datapath.protocol.frame_layout import FRAME_HEADER_BYTES, MESSAGE_FRAME_TYPES, FrameType
from datapath.protocol.message_layout import DECODED_MESSAGE_DTYPE, MESSAGE_HEADER_BYTES

STATUS_NOT_PROCESSED = _kernels.STATUS_NOT_PROCESSED


def new_message_batch(capacity: int) -> np.ndarray:
    """A zeroed batch able to hold ``capacity`` messages."""
    if capacity < 1:
        raise ValueError("protocol: a message batch needs capacity >= 1")
    return np.zeros(capacity, dtype=DECODED_MESSAGE_DTYPE)


@dataclass(frozen=True, slots=True)
class DecodeResult:
    messages: int
    """Records written to the batch."""
    frames: int
    """Frames processed; fewer than given when the batch filled up (decode the rest next)."""


def _as_u8(buf: np.ndarray | bytes | bytearray | memoryview) -> np.ndarray:
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise ValueError("protocol: buffers are 1-D uint8 arrays")
        return buf
    return np.frombuffer(buf, dtype=np.uint8)


def decode_frames(buf: np.ndarray | bytes | bytearray | memoryview, frame_offsets: np.ndarray,
                  frame_lengths: np.ndarray, out: np.ndarray, status: np.ndarray,
                  frame_types: np.ndarray, *, exact: bool = True) -> DecodeResult:
    """Validate frames ``buf[off:off+len]`` and decode their messages into ``out``.

    ``status[i]`` receives frame i's ``MalformedReason`` value (0 = valid) and
    ``frame_types[i]`` its type byte; admin frames are validated up to their header only
    (decode their bodies with ``codec.decode_frame``). ``exact`` means each length is a
    datagram that must hold exactly one frame. Kernel: ``_kernels._decode_frames``.
    """
    if out.dtype != DECODED_MESSAGE_DTYPE:
        raise ValueError("protocol: out must be a batch from new_message_batch()")
    if not (len(frame_offsets) == len(frame_lengths) <= min(len(status), len(frame_types))):
        raise ValueError("protocol: offsets, lengths, status and frame_types disagree in size")
    n, frames = _kernels._decode_frames(
        _as_u8(buf), np.asarray(frame_offsets, dtype=np.int64),
        np.asarray(frame_lengths, dtype=np.int64), bool(exact), out, status, frame_types)
    return DecodeResult(int(n), int(frames))


@dataclass(frozen=True, slots=True)
class PackResult:
    frames: int
    messages: int
    end_offset: int


def pack_frames(batch: np.ndarray, count: int, arena: np.ndarray | bytes | bytearray,
                out: np.ndarray, frame_offsets: np.ndarray, frame_lengths: np.ndarray, *,
                first: int = 0, out_offset: int = 0, frame_type: FrameType = FrameType.DATA,
                source_session: int = 0, dest_session: int = 0, stream_id: int = 0,
                send_ts_ns: int = 0, max_frame_bytes: int = MAX_FRAME_BYTES) -> PackResult:
    """Write ``batch[first:first+count]`` as frames of at most ``max_frame_bytes``.

    Payloads are read from ``arena`` at each record's ``payload_offset`` (topics are not
    carried: the hot path sends keys only). Frame i lands at
    ``out[frame_offsets[i]:frame_offsets[i]+frame_lengths[i]]``. Stops early (see the
    result) when ``out`` or the offset arrays are full. Kernel: ``_kernels._pack_frames``.
    """
    if frame_type not in MESSAGE_FRAME_TYPES:
        raise ValueError(f"protocol: pack_frames writes message frames, not {frame_type!r}")
    if not FRAME_HEADER_BYTES + MESSAGE_HEADER_BYTES <= max_frame_bytes <= MAX_FRAME_BYTES:
        raise ValueError(f"protocol: max_frame_bytes must be in "
                         f"[{FRAME_HEADER_BYTES + MESSAGE_HEADER_BYTES}, {MAX_FRAME_BYTES}]")
    if max_frame_bytes % 8:
        raise ValueError("protocol: max_frame_bytes must be a multiple of 8")
    if not 0 <= first <= first + count <= len(batch):
        raise ValueError("protocol: first/count outside the batch")
    arena_u8 = _as_u8(arena)
    lens = batch["payload_len"][first : first + count].astype(np.int64)
    offs = batch["payload_offset"][first : first + count]
    if count and (offs.min() < 0 or (offs + lens).max() > len(arena_u8)):
        raise ValueError("protocol: a payload lies outside the arena")
    frames, written, end = _kernels._pack_frames(
        batch, first, count, arena_u8, out, out_offset, max_frame_bytes, int(frame_type),
        source_session, dest_session, stream_id, send_ts_ns, frame_offsets, frame_lengths)
    return PackResult(int(frames), int(written), int(end))


def warm_up() -> None:
    """Load (or, with a cold cache, compile) the batch decoder now, so that the first frames
    a process receives do not wait for it."""
    from datapath.protocol.codec import encode_data_frame

    frame = np.frombuffer(encode_data_frame([{"sequence": 1, "payload": b"x" * 16}]), np.uint8)
    decode_frames(frame, np.zeros(1, np.int64), np.array([len(frame)], np.int64),
                  new_message_batch(4), np.zeros(1, np.uint8), np.zeros(1, np.uint8))
