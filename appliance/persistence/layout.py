"""The on-disk layout of a persistence log: records in segment files, and the sparse index.

A **record** (little-endian, 8-byte aligned; the file is the host's, not the wire's)::

     0        4        8                  16                 24
    +--------+--------+------------------+------------------+---------------------+-----+
    | crc32  | length | sequence (u64)   | timestamp_ns (u64)| payload (length B) | pad |
    +--------+--------+------------------+------------------+---------------------+-----+
    crc32 (CRC-32C, Castagnoli) covers bytes 4 .. 24 + length: length, sequence, timestamp,
    payload.
    The record takes 24 + length rounded up to 8 bytes; padding is zero.

A record is valid when its length fits what is left of the file, its CRC matches, and its
sequence is above the previous record's. An all-zero header is never valid (the CRC of 20 zero
bytes is not zero), so a zero-filled tail reads as the end. Whatever follows the last valid
record of the newest segment after a crash (a torn write) is cut at open, never read as data.

A **segment** is ``<base sequence, 20 digits>.log``: the records from ``base`` on. Its sparse
**index** ``<base>.idx`` (written when the segment is sealed; rebuilt by a scan if it is
missing or does not check) holds one entry per INDEX_INTERVAL_BYTES of records::

     0                  8                  16                 24
    +------------------+------------------+------------------+
    | sequence (u64)   | max_ts_ns (u64)  | position (u64)   |   x entries
    +------------------+------------------+------------------+
    then size, records, first sequence, last sequence, max timestamp, entry count (u64 each)
    and zlib's CRC-32 of all of it (u32). An index that does not check, or whose size is not
    its segment's, is ignored and the segment scanned.
    max_ts_ns: the highest timestamp of the records up to and including this one (the time
    index: timestamps need not grow, the running maximum does).
"""

from __future__ import annotations

import numpy as np

RECORD_HEADER_BYTES = 24
RECORD_ALIGN_BYTES = 8
CRC_OFFSET = 0
LENGTH_OFFSET = 4
SEQUENCE_OFFSET = 8
TIMESTAMP_OFFSET = 16
CRC_COVERS_FROM = LENGTH_OFFSET
"""The CRC covers the record from its length field to the end of its payload."""

RECORD_HEADER_DTYPE = np.dtype([("crc", "<u4"), ("length", "<u4"), ("sequence", "<u8"),
                                ("timestamp_ns", "<u8")])
INDEX_ENTRY_DTYPE = np.dtype([("sequence", "<u8"), ("max_ts_ns", "<u8"), ("position", "<u8")])
INDEX_ENTRY_BYTES = INDEX_ENTRY_DTYPE.itemsize
INDEX_CRC_BYTES = 4

SEGMENT_SUFFIX = ".log"
INDEX_SUFFIX = ".idx"
SEGMENT_NAME_DIGITS = 20


def record_bytes(payload_length: int) -> int:
    """Bytes one record of ``payload_length`` takes in a segment."""
    return RECORD_HEADER_BYTES + ((payload_length + RECORD_ALIGN_BYTES - 1)
                                  & ~(RECORD_ALIGN_BYTES - 1))


def segment_name(base_seq: int) -> str:
    return f"{base_seq:0{SEGMENT_NAME_DIGITS}d}{SEGMENT_SUFFIX}"


def index_name(base_seq: int) -> str:
    return f"{base_seq:0{SEGMENT_NAME_DIGITS}d}{INDEX_SUFFIX}"
