"""numba kernels of the cache's replay pages (the public API is ``store.CacheStore.page``).

``_record_keys`` reads the topic key of each log record (the cache envelope,
appliance/cache/layout.py) so the pattern is matched once per distinct topic, not per
record; ``_encode`` turns the matching records of a log batch into native message records
in page frames (datapath/protocol/replay_layout.py), each frame closed with its page
descriptor. No Python runs per record.
"""

from __future__ import annotations

import numba
import numpy as np

_REC_PAYLOAD = 24
"""A log record's payload (the cache envelope) starts this far into the record."""
_ENV = 34
"""The cache envelope's fixed part (layout.ENVELOPE_BYTES)."""
_MSG = 40
_FRAME_HDR = 32
_DESC_HEAD = 16
_DESC_ENTRY = 16
_RETRANSMITTED = 0x01
_EXTENSIONS = 0x0C
"""HEADERS | SEGMENT: the envelope's flag byte keeps these."""

# state (int64) of the page being built, kept between calls
ST_FRAMES = 0
"""Frames closed."""
ST_START = 1
"""Where the open frame starts in ``out`` (-1: none open)."""
ST_POS = 2
"""Bytes of the open frame so far (its header included)."""
ST_COUNT = 3
"""Messages in the open frame."""
ST_MESSAGES = 4
"""Messages in the page."""
ST_END = 5
"""Bytes of ``out`` used."""
ST_WORDS = 6


@numba.njit(cache=True, nogil=True, inline="always")
def _get(buf, at, n):
    v = np.uint64(0)
    for i in range(n):
        v = (v << np.uint64(8)) | np.uint64(buf[at + i])
    return v


@numba.njit(cache=True, nogil=True, inline="always")
def _put(buf, at, n, value):
    v = np.uint64(value)
    for i in range(n - 1, -1, -1):
        buf[at + i] = np.uint8(v & np.uint64(0xFF))
        v >>= np.uint64(8)


@numba.njit(cache=True, nogil=True)
def _record_keys(buf, offsets, lengths, keys):
    """``keys[i]``: the topic key of record ``i``; 0 for a record too short to be an
    envelope, or whose topic runs past it (such a record is never replayed)."""
    for i in range(len(offsets)):
        at = offsets[i] + _REC_PAYLOAD
        if lengths[i] < _ENV or _ENV + _get(buf, at + 32, 2) > lengths[i]:
            keys[i] = np.uint64(0)
        else:
            keys[i] = _get(buf, at + 8, 8)


@numba.njit(cache=True, nogil=True)
def _close(out, st, ext, request_id, page):
    """Write the open frame's descriptor message (its header is written by the caller)."""
    start = st[ST_START]
    pos = st[ST_POS]
    n = st[ST_COUNT]
    at = start + pos
    plen = _DESC_HEAD + _DESC_ENTRY * n
    for i in range(_MSG):
        out[at + i] = 0
    _put(out, at + 32, 4, plen)
    d = at + _MSG
    _put(out, d, 4, request_id)
    _put(out, d + 4, 4, page)
    _put(out, d + 8, 2, st[ST_FRAMES])
    _put(out, d + 10, 2, n)
    _put(out, d + 12, 4, 0)
    out[d + _DESC_HEAD : d + plen] = ext[: _DESC_ENTRY * n]
    pos += _MSG + plen  # plen is a multiple of 8
    st[ST_POS] = pos
    st[ST_END] = start + pos
    st[ST_FRAMES] += 1
    st[ST_START] = -1
    st[ST_COUNT] = 0


@numba.njit(cache=True, nogil=True)
def _encode(buf, offsets, lengths, seqs, stamps, take, first, out, frame_offsets,
            frame_lengths, frame_counts, st, ext, max_frame, max_frames, max_messages,
            max_bytes, request_id, page):
    """Encode records ``take[first:]`` (indexes into the batch) into page frames of at most
    ``max_frame`` bytes in ``out``; stop before a record that would open a frame past
    ``max_frames``, pass ``max_messages``, or (after the first) ``max_bytes``. Frame ``f``
    is at ``frame_offsets[f]``, ``frame_lengths[f]`` bytes with ``frame_counts[f]``
    messages besides its descriptor (its 32-byte header is left to the caller). Returns the
    position in ``take`` of the first record not encoded. ``_finish`` closes the last
    frame."""
    j = first
    while j < len(take):
        r = take[j]
        at = offsets[r] + _REC_PAYLOAD
        length = lengths[r]
        tlen = np.int64(_get(buf, at + 32, 2))
        plen = length - _ENV - tlen
        body = (plen + tlen + 7) & ~7
        size = _MSG + body
        if st[ST_MESSAGES] >= max_messages:
            return j
        if st[ST_MESSAGES] > 0 and st[ST_END] + size > max_bytes:
            return j
        n = st[ST_COUNT]
        if st[ST_START] >= 0 and (
                st[ST_POS] + size + _MSG + _DESC_HEAD + _DESC_ENTRY * (n + 1) > max_frame
                or n >= 1_500):
            f = st[ST_FRAMES]
            frame_offsets[f] = st[ST_START]
            frame_counts[f] = n
            _close(out, st, ext, request_id, page)
            frame_lengths[f] = st[ST_END] - frame_offsets[f]
        if st[ST_START] < 0:
            if st[ST_FRAMES] >= max_frames:
                return j
            if _FRAME_HDR + size + _MSG + _DESC_HEAD + _DESC_ENTRY > max_frame:
                return j  # cannot be: kept messages fit a frame (CACHE_MAX_PAYLOAD_BYTES)
            st[ST_START] = st[ST_END]
            st[ST_POS] = _FRAME_HDR
            st[ST_COUNT] = 0
            n = 0
        m = st[ST_START] + st[ST_POS]
        _put(out, m, 8, _get(buf, at + 8, 8))          # topic key
        _put(out, m + 8, 8, _get(buf, at, 8))          # the publisher's sequence
        _put(out, m + 16, 8, stamps[r])                # publish time
        _put(out, m + 24, 4, _get(buf, at + 24, 4))    # namespace
        _put(out, m + 28, 2, _get(buf, at + 28, 2))    # schema
        out[m + 30] = buf[at + 30]                     # qos
        out[m + 31] = np.uint8((buf[at + 31] & _EXTENSIONS) | _RETRANSMITTED)
        _put(out, m + 32, 4, plen)
        _put(out, m + 36, 2, tlen)
        out[m + 38] = 0
        out[m + 39] = 0
        p = m + _MSG
        src = at + _ENV
        out[p : p + plen] = buf[src + tlen : src + tlen + plen]
        out[p + plen : p + plen + tlen] = buf[src : src + tlen]
        for k in range(plen + tlen, body):
            out[p + k] = 0
        e = _DESC_ENTRY * n
        _put(ext, e, 8, seqs[r])
        _put(ext, e + 8, 4, _get(buf, at + 16, 4))     # origin
        _put(ext, e + 12, 4, _get(buf, at + 20, 4))    # stream
        st[ST_POS] += size
        st[ST_END] = st[ST_START] + st[ST_POS]
        st[ST_COUNT] = n + 1
        st[ST_MESSAGES] += 1
        j += 1
    return j


@numba.njit(cache=True, nogil=True)
def _finish(out, frame_offsets, frame_lengths, frame_counts, st, ext, request_id, page):
    """Close the open frame, if any."""
    if st[ST_START] >= 0:
        f = st[ST_FRAMES]
        frame_offsets[f] = st[ST_START]
        frame_counts[f] = st[ST_COUNT]
        _close(out, st, ext, request_id, page)
        frame_lengths[f] = st[ST_END] - frame_offsets[f]
