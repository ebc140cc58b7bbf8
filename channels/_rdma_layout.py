"""Layout of an RDMA channel packet: the bytes of one RDMA SEND (little-endian, both ends' CPUs).

Frames travel many to a packet, each in a record; a frame that does not fit the rest of a
packet (or any packet) is cut into segments, one record each, in consecutive packets, and
the receiver puts it back together (``_rdma_kernels``)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-------------------------------+---------------+---------------+
    |     magic 0x5452 "TR"         |  version = 1  |  flags = 0    |  0
    +-------------------------------+---------------+---------------+
    |          records              |          reserved = 0         |  4
    +-------------------------------+-------------------------------+
    |          sequence: packets sent on this queue pair, from 1    |  8
    +---------------------------------------------------------------+
    |          packet_bytes: header and records                     | 12
    +---------------------------------------------------------------+
    |  record 0 | record 1 | ...                                    | 16

    record (8-byte aligned):
    +---------------------------------------------------------------+
    |          segment_bytes: bytes of the frame in this record     |  0
    +---------------------------------------------------------------+
    |          frame_bytes: the whole frame's length                |  4
    +---------------------------------------------------------------+
    |  segment_bytes of the frame, zero-padded to a multiple of 8   |  8

A frame in one record has ``segment_bytes == frame_bytes``. Segments of one frame follow each
other with nothing between them; the receiver knows the first (no frame open) and the last
(``frame_bytes`` reached). The reliable connection (RC) delivers packets in order and whole,
so ``sequence`` only guards against a peer that speaks something else.
"""

from __future__ import annotations

PACKET_MAGIC = 0x5452
PACKET_VERSION = 1

MAGIC_OFFSET = 0
VERSION_OFFSET = 2
FLAGS_OFFSET = 3
RECORDS_OFFSET = 4
SEQUENCE_OFFSET = 8
PACKET_BYTES_OFFSET = 12
PACKET_HEADER_BYTES = 16

SEGMENT_BYTES_OFFSET = 0
FRAME_BYTES_OFFSET = 4
RECORD_HEADER_BYTES = 8
RECORD_ALIGNMENT_BYTES = 8

MIN_PACKET_BYTES = 256
"""Smallest packet a channel may be made with (header, a record header and some frame)."""


def record_bytes(segment_bytes: int) -> int:
    """Bytes a record of ``segment_bytes`` takes, header and padding included."""
    return RECORD_HEADER_BYTES + ((segment_bytes + RECORD_ALIGNMENT_BYTES - 1)
                                  & ~(RECORD_ALIGNMENT_BYTES - 1))


def packets_for_frame(frame_bytes: int, packet_bytes: int) -> int:
    """Packets a frame needs at most when it starts in an empty packet."""
    room = packet_bytes - PACKET_HEADER_BYTES - RECORD_HEADER_BYTES
    return max(1, -(-frame_bytes // room))
