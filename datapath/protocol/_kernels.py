"""numba kernels of the native protocol codec: batch decode and batch pack.

Private: they take only arrays and scalars and trust their caller (``batch.py``) for types
and sizes; ``write_frame_header`` and ``put_be64`` are also called from other kernels (the
appliance's express kernel, the fabric bench's publisher). Decisions and their order
mirror ``codec.decode_frame`` exactly; the tests hold the two to the same verdicts on random
and mutated frames. Every read is bounds-checked
against the frame before it happens (numba itself does not check). Module-level constants
taken from other modules (``_MAX_TYPE``...) are frozen into the cached machine code: numba's
cache follows this file only, so a change to them must touch this file too (frame type 14,
CONTROL, was added that way).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from datapath.config import MAX_FRAME_BYTES
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol.errors import MalformedReason as R

_HDR = fl.FRAME_HEADER_BYTES
_MHDR = ml.MESSAGE_HEADER_BYTES
_MAGIC = fl.FRAME_MAGIC
_VERSION = fl.PROTOCOL_VERSION
_MAX_TYPE = int(fl.MAX_FRAME_TYPE)
_KNOWN_FRAME_FLAGS = fl.KNOWN_FRAME_FLAGS
_AUTH = int(fl.FrameFlags.AUTH_TRAILER)
_AUTH_BYTES = fl.AUTH_TRAILER_BYTES
_DATA = int(fl.FrameType.DATA)
_RETX = int(fl.FrameType.RETRANSMISSION)
_MAX_QOS = int(ml.MAX_QOS)
_KNOWN_MSG_FLAGS = ml.KNOWN_MESSAGE_FLAGS
_MAX_MSGS = ml.MAX_MESSAGES_PER_FRAME
_MAX_FRAME = MAX_FRAME_BYTES

_OK = int(R.OK)
_TOO_SHORT = int(R.TOO_SHORT)
_BAD_MAGIC = int(R.BAD_MAGIC)
_BAD_VERSION = int(R.BAD_VERSION)
_UNKNOWN_TYPE = int(R.UNKNOWN_TYPE)
_UNKNOWN_FLAGS = int(R.UNKNOWN_FLAGS)
_BAD_FRAME_LENGTH = int(R.BAD_FRAME_LENGTH)
_LENGTH_MISMATCH = int(R.LENGTH_MISMATCH)
_BAD_COUNT = int(R.BAD_COUNT)
_MESSAGE_OVERRUN = int(R.MESSAGE_OVERRUN)
_TRAILING_BYTES = int(R.TRAILING_BYTES)
_BAD_QOS = int(R.BAD_QOS)

STATUS_NOT_PROCESSED = 255
"""Status of a frame the kernel did not reach (the output batch was full)."""


@njit(inline="always")
def _be16(b, o):
    return (np.int64(b[o]) << 8) | np.int64(b[o + 1])


@njit(inline="always")
def _be32(b, o):
    return (_be16(b, o) << 16) | _be16(b, o + 2)


@njit(inline="always")
def _be64(b, o):
    return (np.uint64(_be32(b, o)) << np.uint64(32)) | np.uint64(_be32(b, o + 4))


@njit(inline="always")
def _put16(b, o, v):
    b[o] = (v >> 8) & 0xFF
    b[o + 1] = v & 0xFF


@njit(inline="always")
def _put32(b, o, v):
    _put16(b, o, (v >> 16) & 0xFFFF)
    _put16(b, o + 2, v & 0xFFFF)


@njit(inline="always")
def put_be64(b, o, v):
    """``v`` as a big-endian u64 at ``b[o:o + 8]`` (also the fabric bench's stamp)."""
    v = np.uint64(v)
    _put32(b, o, np.int64(v >> np.uint64(32)))
    _put32(b, o + 4, np.int64(v & np.uint64(0xFFFFFFFF)))


@njit(cache=True, nogil=True)
def _check_header(buf, off, avail, exact):
    """Return (status, frame_type, msg_count, body_end) for the frame at ``off``."""
    if avail < _HDR:
        return _TOO_SHORT, 0, 0, 0
    if _be16(buf, off) != _MAGIC:
        return _BAD_MAGIC, 0, 0, 0
    if buf[off + 2] != _VERSION:
        return _BAD_VERSION, 0, 0, 0
    ftype = np.int64(buf[off + 3])
    if ftype < 1 or ftype > _MAX_TYPE:
        return _UNKNOWN_TYPE, ftype, 0, 0
    flags = _be16(buf, off + 4)
    if flags & ~_KNOWN_FRAME_FLAGS:
        return _UNKNOWN_FLAGS, ftype, 0, 0
    frame_len = _be32(buf, off + 8)
    if frame_len < _HDR or frame_len % 8 != 0 or frame_len > _MAX_FRAME or frame_len > avail:
        return _BAD_FRAME_LENGTH, ftype, 0, 0
    if exact and frame_len != avail:
        return _LENGTH_MISMATCH, ftype, 0, 0
    body_end = off + frame_len
    if flags & _AUTH:
        if frame_len < _HDR + _AUTH_BYTES:
            return _BAD_FRAME_LENGTH, ftype, 0, 0
        body_end -= _AUTH_BYTES
    return _OK, ftype, _be16(buf, off + 6), body_end


@njit(cache=True, nogil=True)
def _decode_frames(buf, frame_offsets, frame_lengths, exact, out, status,
                   frame_types):
    """Validate frames and write each message's decoded header into ``out``.

    Returns (messages written, frames processed). A frame whose messages do not all fit in
    ``out`` stops the batch before it (status STATUS_NOT_PROCESSED from there on). Admin
    frames are validated up to their header and leave no messages.
    """
    n = 0
    nframes = frame_offsets.shape[0]
    cap = out.shape[0]
    for i in range(nframes):
        status[i] = STATUS_NOT_PROCESSED
    for i in range(nframes):
        off = frame_offsets[i]
        avail = frame_lengths[i]
        if off < 0 or avail < 0 or off + avail > buf.shape[0]:
            status[i] = _TOO_SHORT
            frame_types[i] = 0
            continue
        st, ftype, count, body_end = _check_header(buf, off, avail, exact)
        frame_types[i] = ftype
        if st != _OK:
            status[i] = st
            continue
        if ftype != _DATA and ftype != _RETX:
            status[i] = _OK
            continue
        if count == 0 or count > _MAX_MSGS:
            status[i] = _BAD_COUNT
            continue
        if n + count > cap:
            return n, i
        start = n
        pos = off + _HDR
        st = _OK
        for _ in range(count):
            if pos + _MHDR > body_end:
                st = _MESSAGE_OVERRUN
                break
            qos = buf[pos + 30]
            if qos > _MAX_QOS:
                st = _BAD_QOS
                break
            mflags = buf[pos + 31]
            if mflags & ~_KNOWN_MSG_FLAGS:
                st = _UNKNOWN_FLAGS
                break
            payload_len = _be32(buf, pos + 32)
            topic_len = _be16(buf, pos + 36)
            size = _MHDR + ((payload_len + topic_len + 7) & ~7)
            if pos + size > body_end:
                st = _MESSAGE_OVERRUN
                break
            rec = out[n]
            rec.topic_key = _be64(buf, pos)
            rec.sequence = _be64(buf, pos + 8)
            rec.publish_ts_ns = _be64(buf, pos + 16)
            rec.namespace_id = _be32(buf, pos + 24)
            rec.schema_id = _be16(buf, pos + 28)
            rec.qos = qos
            rec.flags = mflags
            rec.payload_offset = pos + _MHDR
            rec.payload_len = payload_len
            rec.topic_len = topic_len
            rec.frame_index = i
            n += 1
            pos += size
        if st == _OK and pos != body_end:
            st = _TRAILING_BYTES
        if st != _OK:
            n = start
        status[i] = st
    return n, nframes


@njit(cache=True, nogil=True)
def _pack_frames(batch, first, count, arena, out, out_offset, max_frame_bytes,
                 frame_type, source_session, dest_session, stream_id, send_ts_ns,
                 frame_offsets, frame_lengths):
    """Pack ``batch[first:first+count]`` (payloads in ``arena``) into frames in ``out``.

    A new frame starts when the next message does not fit in ``max_frame_bytes``. Returns
    (frames written, messages written, end offset in ``out``); stops early when ``out`` or
    ``frame_offsets`` is full. A message that cannot fit even an empty frame stops the pack.
    """
    pos = out_offset
    frames = 0
    written = 0
    frame_start = -1
    in_frame = 0
    for k in range(first, first + count):
        rec = batch[k]
        plen = np.int64(rec.payload_len)
        size = _MHDR + ((plen + 7) & ~7)
        if frame_start >= 0 and (pos - frame_start + size > max_frame_bytes
                                 or in_frame == _MAX_MSGS):
            write_frame_header(out, frame_start, pos, in_frame, frame_type, source_session,
                               dest_session, stream_id, send_ts_ns)
            frame_offsets[frames] = frame_start
            frame_lengths[frames] = pos - frame_start
            frames += 1
            frame_start = -1
        if frame_start < 0:
            if frames == frame_offsets.shape[0] or _HDR + size > max_frame_bytes:
                break
            if pos + _HDR + size > out.shape[0]:
                break
            frame_start = pos
            pos += _HDR
            in_frame = 0
        elif pos + size > out.shape[0]:
            break
        put_be64(out, pos, rec.topic_key)
        put_be64(out, pos + 8, rec.sequence)
        put_be64(out, pos + 16, rec.publish_ts_ns)
        _put32(out, pos + 24, np.int64(rec.namespace_id))
        _put16(out, pos + 28, np.int64(rec.schema_id))
        out[pos + 30] = rec.qos
        out[pos + 31] = rec.flags
        _put32(out, pos + 32, plen)
        _put32(out, pos + 36, 0)
        src = rec.payload_offset
        for j in range(plen):
            out[pos + _MHDR + j] = arena[src + j]
        for j in range(plen, (plen + 7) & ~7):
            out[pos + _MHDR + j] = 0
        pos += size
        in_frame += 1
        written += 1
    if frame_start >= 0:
        write_frame_header(out, frame_start, pos, in_frame, frame_type, source_session,
                           dest_session, stream_id, send_ts_ns)
        frame_offsets[frames] = frame_start
        frame_lengths[frames] = pos - frame_start
        frames += 1
    return frames, written, pos


@njit(cache=True, nogil=True)
def write_frame_header(out, start, end, count, frame_type, source_session, dest_session,
                       stream_id, send_ts_ns):
    """The header of the frame at ``out[start:end]`` (``count`` messages, flags 0); also the
    appliance's express kernel's (appliance/dataplane/_kernels.py)."""
    _put16(out, start, _MAGIC)
    out[start + 2] = _VERSION
    out[start + 3] = frame_type
    _put16(out, start + 4, 0)
    _put16(out, start + 6, count)
    _put32(out, start + 8, end - start)
    _put32(out, start + 12, source_session)
    _put32(out, start + 16, dest_session)
    _put32(out, start + 20, stream_id)
    put_be64(out, start + 24, send_ts_ns)
