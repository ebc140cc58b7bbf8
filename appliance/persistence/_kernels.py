"""numba kernels of the persistence log (the public API is ``log.StreamLog``).

``_crc32c``: CRC-32C (Castagnoli, as Kafka's record batches and iSCSI use), with the SSE4.2
``crc32`` instruction where the CPU has it (``HW_CRC``), else slicing-by-8 tables.
``_append`` validates and encodes a batch of records (layout.py) into the write buffer and
notes each in its segment's sparse index (``_note``); ``_scan`` walks records in a buffer,
checks each (length bound, CRC, rising sequence) and lists them, stopping at the end, at an
incomplete record or at the first bad one; ``_note_many`` indexes what a scan listed. No
Python runs per record. Their pure-Python twins live in tests/persistence/test_kernels.py.
"""

from __future__ import annotations

import platform
from pathlib import Path

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

SCAN_END = 0
"""``_scan`` stopped at the end of the buffer, or with its output arrays full."""
SCAN_INCOMPLETE = 1
"""A record's header or payload runs past the end of the buffer (more to read, or torn)."""
SCAN_CORRUPT = 2
"""A record's length is impossible, its CRC does not match or its sequence does not rise."""

APPEND_DONE = 0
APPEND_NO_ROOM = 1
"""The next record does not fit before ``limit`` (the buffer's end or the segment's)."""
APPEND_BAD_SEQUENCE = 2
APPEND_BAD_LENGTH = 3
APPEND_BAD_SOURCE = 4
APPEND_INDEX_FULL = 5

# meta: a segment's running state (uint64), updated by _note
META_INDEX_COUNT = 0
META_BUCKET = 1
"""1 + the INDEX_INTERVAL_BYTES bucket of the last index entry (0: none yet)."""
META_RECORDS = 2
META_FIRST = 3
META_LAST = 4
META_MAX_TS = 5
META_FIELDS = 6

_HEADER = 24
_MASK32 = 0xFFFFFFFF
_POLY = 0x82F63B78
"""CRC-32C, reflected."""


def _cpu_has_sse42() -> bool:
    """Whether this CPU has SSE4.2 and numba compiles for it: a portable target
    (``NUMBA_CPU_NAME=generic``, as appliance images and the soft-RoCE guest use) has no
    SSE4.2, and LLVM cannot compile the instruction for it (the process aborts)."""
    from numba.core import config

    if platform.machine() not in ("x86_64", "AMD64") or config.CPU_NAME not in (None, "host"):
        return False
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return "sse4_2" in line.split()
    except OSError:
        pass
    return False


HW_CRC = _cpu_has_sse42()
"""Whether ``_crc32c`` uses the SSE4.2 instruction."""


def crc_tables() -> np.ndarray:
    """The eight 256-entry tables of slicing-by-8 for CRC-32C, flat (table ``k`` at
    ``[256 k, 256 k + 256)``)."""
    t = np.zeros((8, 256), np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        t[0, i] = c
    for k in range(1, 8):
        for i in range(256):
            prev = int(t[k - 1, i])
            t[k, i] = (prev >> 8) ^ int(t[0, prev & 0xFF])
    return t.ravel()


TABLES = crc_tables()


def _sse42_crc(bits: int) -> object:
    """An intrinsic: the SSE4.2 ``crc32`` of a ``bits``-bit word into a running CRC-32C
    (64-bit words take and give the running value as 64 bits)."""
    acc = 64 if bits == 64 else 32
    name = f"llvm.x86.sse42.crc32.{acc}.{bits}"
    acc_type = types.uint64 if acc == 64 else types.uint32
    word_type = {8: types.uint8, 32: types.uint32, 64: types.uint64}[bits]

    @intrinsic
    def crc(typingctx, state, word):
        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.IntType(acc), [ir.IntType(acc), ir.IntType(bits)])
            return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name),
                                args)
        return acc_type(acc_type, word_type), codegen
    return crc


_sse42_crc8 = _sse42_crc(8)
_sse42_crc32 = _sse42_crc(32)
_sse42_crc64 = _sse42_crc(64)


@numba.njit(cache=True, nogil=True)
def _crc32c_hw(buf, w32, w, start, end, t):
    """CRC-32C of ``buf[start:end]`` with the SSE4.2 instruction (``w32``, ``w``: ``buf`` as
    32- and 64-bit words; ``t`` unused)."""
    crc = np.uint32(_MASK32)
    p = start
    while p < end and p & 3:
        crc = _sse42_crc8(crc, buf[p])
        p += 1
    if p & 4 and end - p >= 4:
        crc = _sse42_crc32(crc, w32[p >> 2])
        p += 4
    wide = np.uint64(crc)
    while end - p >= 8:
        wide = _sse42_crc64(wide, w[p >> 3])
        p += 8
    crc = np.uint32(wide)
    if end - p >= 4:
        crc = _sse42_crc32(crc, w32[p >> 2])
        p += 4
    while p < end:
        crc = _sse42_crc8(crc, buf[p])
        p += 1
    return crc ^ np.uint32(_MASK32)


@numba.njit(cache=True, nogil=True)
def _crc32c_sw(buf, w, w64, start, end, t):
    """CRC-32C of ``buf[start:end]``, slicing-by-8 over the tables ``t`` (``w``, ``w64``:
    ``buf`` as 32- and 64-bit words)."""
    crc = np.uint32(_MASK32)
    p = start
    while p < end and p & 3:
        crc = (crc >> np.uint32(8)) ^ t[(crc ^ buf[p]) & 0xFF]
        p += 1
    while end - p >= 8:
        one = w[p >> 2] ^ crc
        two = w[(p >> 2) + 1]
        crc = (t[1792 + (one & 0xFF)] ^ t[1536 + ((one >> 8) & 0xFF)]
               ^ t[1280 + ((one >> 16) & 0xFF)] ^ t[1024 + (one >> 24)]
               ^ t[768 + (two & 0xFF)] ^ t[512 + ((two >> 8) & 0xFF)]
               ^ t[256 + ((two >> 16) & 0xFF)] ^ t[two >> 24])
        p += 8
    while p < end:
        crc = (crc >> np.uint32(8)) ^ t[(crc ^ buf[p]) & 0xFF]
        p += 1
    return crc ^ np.uint32(_MASK32)


_crc32c = _crc32c_hw if HW_CRC else _crc32c_sw
"""What the kernels below checksum with (``buf``: a whole array, its size a multiple of 8,
and its word views made once by the caller: a view per call costs more than the CRC)."""


@numba.njit(cache=True, nogil=True, inline="always")
def _header_and_padding(w32, w64, pos, seq, ts, length):
    size = _HEADER + ((length + 7) & ~7)
    w32[(pos >> 2) + 1] = length
    w64[(pos >> 3) + 1] = seq
    w64[(pos >> 3) + 2] = ts
    if size > _HEADER:
        w64[(pos + size - 8) >> 3] = 0  # the padding: the last word, before the payload


@numba.njit(cache=True, nogil=True)
def _write_record_sw(out, w32, w64, pos, seq, ts, src, s64, o, length, t):
    """One record at ``pos``: header, payload, padding, then its CRC over the buffer
    (``w32``, ``w64``, ``s64``: ``out`` and ``src`` as words)."""
    _header_and_padding(w32, w64, pos, seq, ts, length)
    body = pos + _HEADER
    for j in range(length):
        out[body + j] = src[o + j]
    w32[pos >> 2] = _crc32c_sw(out, w32, w64, pos + 4, body + length, t)


@numba.njit(cache=True, nogil=True)
def _write_record_hw(out, w32, w64, pos, seq, ts, src, s64, o, length, t):
    """One record at ``pos``; the payload is checksummed as it is copied (a word at a time
    when ``src`` is 8-aligned there), with the SSE4.2 instruction."""
    _header_and_padding(w32, w64, pos, seq, ts, length)
    crc = np.uint64(_sse42_crc32(np.uint32(_MASK32), np.uint32(length)))
    crc = _sse42_crc64(crc, seq)
    crc = _sse42_crc64(crc, ts)
    body = pos + _HEADER
    j = 0
    if o & 7 == 0 and s64.shape[0] > 0:
        base = o >> 3
        words = length >> 3
        for q in range(words):
            v = s64[base + q]
            w64[(body >> 3) + q] = v
            crc = _sse42_crc64(crc, v)
        j = words << 3
    c32 = np.uint32(crc)
    while j < length:
        b = src[o + j]
        out[body + j] = b
        c32 = _sse42_crc8(c32, b)
        j += 1
    w32[pos >> 2] = c32 ^ np.uint32(_MASK32)


_write_record = _write_record_hw if HW_CRC else _write_record_sw


@numba.njit(cache=True, nogil=True)
def _note(seq, ts, position, interval, meta, idx_seq, idx_ts, idx_pos):
    """Account for one record at ``position`` of its segment: first/last sequence, running
    max timestamp, and an index entry when it opens a new ``interval`` bucket."""
    if meta[META_RECORDS] == 0:
        meta[META_FIRST] = seq
    meta[META_RECORDS] += np.uint64(1)
    meta[META_LAST] = seq
    if ts > meta[META_MAX_TS]:
        meta[META_MAX_TS] = ts
    bucket = np.uint64(position // interval + 1)
    if bucket > meta[META_BUCKET]:
        c = meta[META_INDEX_COUNT]
        idx_seq[c] = seq
        idx_ts[c] = meta[META_MAX_TS]
        idx_pos[c] = position
        meta[META_INDEX_COUNT] = c + np.uint64(1)
        meta[META_BUCKET] = bucket


@numba.njit(cache=True, nogil=True)
def _append(out, pos, limit, seqs, stamps, src, offsets, lengths, i, prev_seq, max_payload,
            segment_pos, interval, meta, idx_seq, idx_ts, idx_pos, t):
    """Records ``i``, ``i + 1``, ... (payload ``src[offsets[i]:offsets[i] + lengths[i]]``)
    into ``out`` from ``pos`` (8-aligned) while they fit before ``limit``; ``out[0]`` lies at
    ``segment_pos`` in the segment. Returns (next record, position after the last, status)."""
    n = seqs.shape[0]
    cap = idx_seq.shape[0]
    w32 = out.view(np.uint32)
    w64 = out.view(np.uint64)
    s64 = src[: src.shape[0] & ~7].view(np.uint64)  # empty unless src holds a word
    while i < n:
        length = lengths[i]
        o = offsets[i]
        if length < 0 or length > max_payload:
            return i, pos, APPEND_BAD_LENGTH
        if o < 0 or o + length > src.shape[0]:
            return i, pos, APPEND_BAD_SOURCE
        seq = seqs[i]
        if seq <= prev_seq:
            return i, pos, APPEND_BAD_SEQUENCE
        size = _HEADER + ((length + 7) & ~7)
        if pos + size > limit:
            return i, pos, APPEND_NO_ROOM
        if meta[META_INDEX_COUNT] >= cap:
            return i, pos, APPEND_INDEX_FULL
        _write_record(out, w32, w64, pos, seq, stamps[i], src, s64, o, length, t)
        _note(seq, stamps[i], segment_pos + pos, interval, meta, idx_seq, idx_ts, idx_pos)
        prev_seq = seq
        pos += size
        i += 1
    return i, pos, APPEND_DONE


@numba.njit(cache=True, nogil=True)
def _note_many(seqs, stamps, positions, count, interval, meta, idx_seq, idx_ts, idx_pos):
    """``_note`` for the first ``count`` records a scan listed; False when the index is full."""
    cap = idx_seq.shape[0]
    for j in range(count):
        if meta[META_INDEX_COUNT] >= cap:
            return False
        _note(seqs[j], stamps[j], positions[j], interval, meta, idx_seq, idx_ts, idx_pos)
    return True


@numba.njit(cache=True, nogil=True)
def _scan(buf, start, end, prev_seq, max_payload, t, seqs, stamps, offsets, lengths):
    """Records of ``buf[start:end]`` (``start`` 8-aligned) into the output arrays (sequence,
    timestamp, record offset in ``buf``, payload length); returns (count, position after the
    last, status)."""
    w32 = buf.view(np.uint32)
    w64 = buf.view(np.uint64)
    pos = start
    count = 0
    cap = seqs.shape[0]
    while count < cap:
        if pos == end:
            return count, pos, SCAN_END
        if end - pos < _HEADER:
            return count, pos, SCAN_INCOMPLETE
        n = np.int64(w32[(pos >> 2) + 1])
        if n > max_payload:
            return count, pos, SCAN_CORRUPT
        size = _HEADER + ((n + 7) & ~7)
        if end - pos < size:
            return count, pos, SCAN_INCOMPLETE
        if _crc32c(buf, w32, w64, pos + 4, pos + _HEADER + n, t) != w32[pos >> 2]:
            return count, pos, SCAN_CORRUPT
        seq = w64[(pos >> 3) + 1]
        if seq <= prev_seq:
            return count, pos, SCAN_CORRUPT
        prev_seq = seq
        seqs[count] = seq
        stamps[count] = w64[(pos >> 3) + 2]
        offsets[count] = pos
        lengths[count] = n
        count += 1
        pos += size
    return count, pos, SCAN_END
