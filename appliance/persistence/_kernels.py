"""numba kernels of the persistence log (the public API is ``log.StreamLog``).

``_crc32`` is zlib's CRC-32 computed slicing-by-8 (eight table lookups per 8 bytes);
``_encode`` writes a batch of records (layout.py) into a buffer, checksums included;
``_scan`` walks records in a buffer, checks each (length bound, CRC, rising sequence) and
lists them, stopping at the end, at an incomplete record or at the first bad one. No Python
runs per record. Their pure-Python twins live in tests/persistence/test_kernels.py.
"""

from __future__ import annotations

import numba
import numpy as np

SCAN_END = 0
"""``_scan`` stopped at the end of the buffer, or with its output arrays full."""
SCAN_INCOMPLETE = 1
"""A record's header or payload runs past the end of the buffer (more to read, or torn)."""
SCAN_CORRUPT = 2
"""A record's length is impossible, its CRC does not match or its sequence does not rise."""

_HEADER = 24
_MASK32 = 0xFFFFFFFF


def crc_tables() -> np.ndarray:
    """The eight 256-entry tables of slicing-by-8 for CRC-32 (reflected 0xEDB88320), flat:
    table ``k`` at ``[256 k, 256 k + 256)``."""
    t = np.zeros((8, 256), np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t[0, i] = c
    for k in range(1, 8):
        for i in range(256):
            prev = int(t[k - 1, i])
            t[k, i] = (prev >> 8) ^ int(t[0, prev & 0xFF])
    return t.ravel()


TABLES = crc_tables()


@numba.njit(cache=True, nogil=True)
def _crc32(buf, start, end, t):
    """CRC-32 of ``buf[start:end]`` (equal to ``zlib.crc32``); ``start`` 4-aligned, ``buf``
    a whole array whose size is a multiple of 8 (it is read as 32-bit words)."""
    w = buf.view(np.uint32)
    crc = np.uint32(_MASK32)
    p = start
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


@numba.njit(cache=True, nogil=True)
def _encode(out, pos, seqs, stamps, src, offsets, lengths, t):
    """Records for messages ``i`` (``src[offsets[i]:offsets[i] + lengths[i]]``) from ``pos``
    (8-aligned) on; returns the position after the last. The caller checked that they fit
    (``out``: a whole array, its size a multiple of 8)."""
    w32 = out.view(np.uint32)
    w64 = out.view(np.uint64)
    for i in range(seqs.shape[0]):
        n = lengths[i]
        o = offsets[i]
        size = _HEADER + ((n + 7) & ~7)
        w32[(pos >> 2) + 1] = n
        w64[(pos >> 3) + 1] = seqs[i]
        w64[(pos >> 3) + 2] = stamps[i]
        out[pos + _HEADER : pos + _HEADER + n] = src[o : o + n]
        for k in range(pos + _HEADER + n, pos + size):
            out[k] = 0
        w32[pos >> 2] = _crc32(out, pos + 4, pos + _HEADER + n, t)
        pos += size
    return pos


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
            return count, pos, 0
        if end - pos < _HEADER:
            return count, pos, 1
        n = np.int64(w32[(pos >> 2) + 1])
        if n > max_payload:
            return count, pos, 2
        size = _HEADER + ((n + 7) & ~7)
        if end - pos < size:
            return count, pos, 1
        if _crc32(buf, pos + 4, pos + _HEADER + n, t) != w32[pos >> 2]:
            return count, pos, 2
        seq = w64[(pos >> 3) + 1]
        if seq <= prev_seq:
            return count, pos, 2
        prev_seq = seq
        seqs[count] = seq
        stamps[count] = w64[(pos >> 3) + 2]
        offsets[count] = pos
        lengths[count] = n
        count += 1
        pos += size
    return count, pos, 0
