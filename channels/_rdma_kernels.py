# ruff: noqa: ANN001, ANN202 - numba kernels take only arrays and scalars (CONVENTIONS.md #4)
"""numba kernels of the RDMA channel: pack frames into packets, unpack packets into a batch.

Both run once per call over many frames, so no Python runs per frame on the RDMA hot path
(layout: ``channels._rdma_layout``; slow twins and differential tests:
``tests/channels/test_rdma_kernels.py``).
"""

from __future__ import annotations

import numba
import numpy as np

from channels._rdma_layout import (
    FRAME_BYTES_OFFSET,
    MAGIC_OFFSET,
    PACKET_BYTES_OFFSET,
    PACKET_HEADER_BYTES,
    PACKET_MAGIC,
    PACKET_VERSION,
    RECORD_HEADER_BYTES,
    RECORDS_OFFSET,
    SEGMENT_BYTES_OFFSET,
    SEQUENCE_OFFSET,
    VERSION_OFFSET,
)

# out[] of _pack
PACK_TAKEN = 0
PACK_PACKETS = 1
PACK_REFUSED = 2
PACK_BYTES = 3
# out[] of _unpack
UNPACK_FRAMES = 0
UNPACK_CURSOR = 1
UNPACK_TORN = 2
UNPACK_OVERSIZED = 3
UNPACK_BAD_PACKET = 4
# state[] of _unpack (a frame being put back together)
STATE_FILL = 0
STATE_FRAME_BYTES = 1


@numba.njit(cache=True, nogil=True)
def _put_u32(buf, at, value):
    buf[at] = value & 0xFF
    buf[at + 1] = (value >> 8) & 0xFF
    buf[at + 2] = (value >> 16) & 0xFF
    buf[at + 3] = (value >> 24) & 0xFF


@numba.njit(cache=True, nogil=True)
def _get_u32(buf, at):
    return (np.int64(buf[at]) | (np.int64(buf[at + 1]) << 8) | (np.int64(buf[at + 2]) << 16)
            | (np.int64(buf[at + 3]) << 24))


@numba.njit(cache=True, nogil=True)
def _put_record(dst, at, src, src_at, segment, frame_bytes):
    """Write one record at ``dst[at]``; return the bytes it takes (padding zeroed)."""
    _put_u32(dst, at + SEGMENT_BYTES_OFFSET, segment)
    _put_u32(dst, at + FRAME_BYTES_OFFSET, frame_bytes)
    d = at + RECORD_HEADER_BYTES
    dst[d : d + segment] = src[src_at : src_at + segment]
    padded = (segment + 7) & ~7
    for k in range(segment, padded):
        dst[d + k] = 0
    return RECORD_HEADER_BYTES + padded


@numba.njit(cache=True, nogil=True)
def _close_packet(dst, base, records, sequence, used):
    dst[base + MAGIC_OFFSET] = PACKET_MAGIC & 0xFF
    dst[base + MAGIC_OFFSET + 1] = PACKET_MAGIC >> 8
    dst[base + VERSION_OFFSET] = PACKET_VERSION
    dst[base + VERSION_OFFSET + 1] = 0
    _put_u32(dst, base + RECORDS_OFFSET, records)
    _put_u32(dst, base + SEQUENCE_OFFSET, sequence & 0xFFFFFFFF)
    _put_u32(dst, base + PACKET_BYTES_OFFSET, used)


@numba.njit(cache=True, nogil=True)
def _pack(src, offsets, lengths, count, dst, slot_first, ring_slots, packet_bytes,
          max_packets, sequence_first, max_frame_bytes, packet_lengths, out):
    """Pack frames ``[0, count)`` into at most ``max_packets`` packets.

    Packet k goes to ring slot ``(slot_first + k) % ring_slots`` (``dst`` offset
    ``slot * packet_bytes``) with sequence ``sequence_first + k``; its length goes to
    ``packet_lengths[k]``. A frame is taken whole or not at all: packing stops at the first
    frame whose records would need more packets than allowed. Frames longer than
    ``max_frame_bytes`` are taken and refused. ``out`` = [frames taken, packets used, frames
    refused, bytes of the frames packed].
    """
    room = packet_bytes - PACKET_HEADER_BYTES - RECORD_HEADER_BYTES  # an empty packet's
    packets = 0
    used = 0
    records = 0
    base = 0
    taken = 0
    refused = 0
    nbytes = 0
    for i in range(count):
        length = lengths[i]
        if length < 0 or length > max_frame_bytes:
            refused += 1
            taken += 1
            continue
        space = packet_bytes - used - RECORD_HEADER_BYTES if packets > 0 else -1
        if length <= space:  # the open packet takes it whole
            used += _put_record(dst, base + used, src, offsets[i], length, length)
            records += 1
        elif length <= room:  # whole in a new packet
            if packets + 1 > max_packets:
                break
            if packets > 0:
                _close_packet(dst, base, records, sequence_first + packets - 1, used)
                packet_lengths[packets - 1] = used
            base = ((slot_first + packets) % ring_slots) * packet_bytes
            packets += 1
            used = PACKET_HEADER_BYTES
            used += _put_record(dst, base + used, src, offsets[i], length, length)
            records = 1
        else:  # segments: the rest of the open packet, then full packets
            first = space if space > 0 else 0
            more = (length - first + room - 1) // room
            if packets + more > max_packets:
                break
            done = 0
            if first > 0:
                used += _put_record(dst, base + used, src, offsets[i], first, length)
                records += 1
                done = first
            while done < length:
                if packets > 0:
                    _close_packet(dst, base, records, sequence_first + packets - 1, used)
                    packet_lengths[packets - 1] = used
                base = ((slot_first + packets) % ring_slots) * packet_bytes
                packets += 1
                used = PACKET_HEADER_BYTES
                segment = min(room, length - done)
                used += _put_record(dst, base + used, src, offsets[i] + done, segment, length)
                records = 1
                done += segment
        taken += 1
        nbytes += length
    if packets > 0:
        _close_packet(dst, base, records, sequence_first + packets - 1, used)
        packet_lengths[packets - 1] = used
    out[PACK_TAKEN] = taken
    out[PACK_PACKETS] = packets
    out[PACK_REFUSED] = refused
    out[PACK_BYTES] = nbytes


@numba.njit(cache=True, nogil=True)
def _unpack(src, base, received_bytes, cursor, sequence, max_frame_bytes, dst, slot_bytes,
            lengths, first, capacity, reassembly, state, out):
    """Copy the frames of the packet at ``src[base:]`` into batch slots ``first..capacity-1``.

    ``cursor`` is where the next record starts in the packet (0: the header is still to be
    checked against ``received_bytes`` and ``sequence``). Whole frames go straight into their
    slot; segments collect in ``reassembly`` (``state`` = [bytes so far, frame bytes])
    until the last one. Frames longer than ``slot_bytes`` are dropped (oversized). ``out`` =
    [frames delivered, new cursor (== the packet's bytes when it is used up), torn records,
    oversized frames, bad packet (1: the header was wrong, the packet was skipped)].
    """
    torn = 0
    oversized = 0
    n = 0
    out[UNPACK_BAD_PACKET] = 0
    if cursor == 0:
        end = _get_u32(src, base + PACKET_BYTES_OFFSET)
        magic = np.int64(src[base + MAGIC_OFFSET]) | (np.int64(src[base + MAGIC_OFFSET + 1])
                                                       << 8)
        if (received_bytes < PACKET_HEADER_BYTES or magic != PACKET_MAGIC
                or src[base + VERSION_OFFSET] != PACKET_VERSION or end != received_bytes
                or _get_u32(src, base + SEQUENCE_OFFSET) != (sequence & 0xFFFFFFFF)):
            out[UNPACK_FRAMES] = 0
            out[UNPACK_CURSOR] = received_bytes
            out[UNPACK_TORN] = 0
            out[UNPACK_OVERSIZED] = 0
            out[UNPACK_BAD_PACKET] = 1
            return
        cursor = PACKET_HEADER_BYTES
    end = received_bytes
    while cursor < end:
        if cursor + RECORD_HEADER_BYTES > end:
            torn += 1
            state[STATE_FILL] = 0
            cursor = end
            break
        at = base + cursor
        segment = _get_u32(src, at + SEGMENT_BYTES_OFFSET)
        frame_bytes = _get_u32(src, at + FRAME_BYTES_OFFSET)
        taken = RECORD_HEADER_BYTES + ((segment + 7) & ~7)
        if cursor + taken > end or segment > frame_bytes or frame_bytes > max_frame_bytes:
            torn += 1
            state[STATE_FILL] = 0
            cursor = end
            break
        fill = state[STATE_FILL]
        if fill > 0 and (frame_bytes != state[STATE_FRAME_BYTES]
                         or fill + segment > frame_bytes):
            torn += 1  # the open frame never ended: drop it, read this record afresh
            state[STATE_FILL] = 0
            continue
        data = at + RECORD_HEADER_BYTES
        if fill == 0 and segment == frame_bytes:  # a whole frame
            if first + n >= capacity:
                break
            if frame_bytes > slot_bytes:
                oversized += 1
            else:
                d = (first + n) * slot_bytes
                dst[d : d + frame_bytes] = src[data : data + frame_bytes]
                lengths[first + n] = frame_bytes
                n += 1
            cursor += taken
            continue
        last = fill + segment == frame_bytes
        if last and first + n >= capacity:
            break  # no slot for it yet: the record waits
        if fill == 0:
            state[STATE_FRAME_BYTES] = frame_bytes
        reassembly[fill : fill + segment] = src[data : data + segment]
        fill += segment
        cursor += taken
        if last:
            state[STATE_FILL] = 0
            if frame_bytes > slot_bytes:
                oversized += 1
            else:
                d = (first + n) * slot_bytes
                dst[d : d + frame_bytes] = reassembly[:frame_bytes]
                lengths[first + n] = frame_bytes
                n += 1
        else:
            state[STATE_FILL] = fill
    out[UNPACK_FRAMES] = n
    out[UNPACK_CURSOR] = cursor
    out[UNPACK_TORN] = torn
    out[UNPACK_OVERSIZED] = oversized


def warm_up() -> None:
    """Compile (or load from numba's cache) both kernels."""
    src = np.zeros(64, np.uint8)
    ring = np.zeros(512, np.uint8)
    one = np.zeros(1, np.int64)
    lengths = np.full(1, 40, np.int64)
    plen = np.zeros(2, np.int64)
    out = np.zeros(5, np.int64)
    _pack(src, one, lengths, 1, ring, 0, 2, 256, 2, 1, 65_504, plen, out)
    state = np.zeros(2, np.int64)
    _unpack(ring, 0, int(plen[0]), 0, 1, 65_504, src, 64, one.copy(), 0, 1, np.zeros(64, np.uint8),
            state, out)
