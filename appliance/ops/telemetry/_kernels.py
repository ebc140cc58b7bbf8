"""numba kernels of the telemetry recorder (the public API is ``windows.WindowRecorder``).

``_record_frames`` reads each received frame's header once and updates the window arrays of
the frame's peer: frame/byte/message counters, the latency bucket counts, the RFC 3550
jitter, probe sequence accounting, NAK and retransmission counts. No Python runs per frame.
Its pure-Python twin lives in tests/telemetry/test_windows.py.
"""

from __future__ import annotations

import numba
import numpy as np

# Columns of the recorder's per-peer ``stats`` array (int64).
FRAMES = 0
MESSAGES = 1
BYTES = 2
LAT_COUNT = 3
LAT_NEGATIVE = 4
LAT_OVERFLOW = 5
LAT_MIN = 6
LAT_MAX = 7
EXPECTED = 8
LOST = 9
LATE = 10
NAKS = 11
RETRANSMISSIONS = 12
STATS = 13

EMPTY = np.iinfo(np.int64).min
"""An unused slot of the peer table."""
NO_MIN = np.iinfo(np.int64).max
NO_MAX = np.iinfo(np.int64).min
JITTER_GAIN = 16.0
"""RFC 3550: J += (|D| - J) / 16."""

_DATA = 1
_NAK = 7
_RETX = 8
_AUTH = 1
"""The frame flag AUTH_TRAILER (low byte of the flags)."""
_RELIABLE = 0x8000_0000
"""A reliable stream's bit in ``stream_id`` (appliance/dataplane/guaranteed.py)."""


@numba.njit(cache=True, nogil=True)
def _bit_length(v):
    n = 0
    while v >= 65536:
        v >>= 16
        n += 16
    while v:
        v >>= 1
        n += 1
    return n


@numba.njit(cache=True, nogil=True)
def _bucket_of(value_ns, unit_shift, sub_shift):
    """Log-linear bucket of a latency >= 0 (windows.py documents the layout)."""
    q = value_ns >> unit_shift
    e = _bit_length(q) - sub_shift - 1
    if e < 0:
        e = 0
    return (e << sub_shift) + (q >> e)


@numba.njit(cache=True, nogil=True)
def _slot_of(keys, key):
    """The slot of ``key`` in the open-addressing table ``keys`` (claimed if new); -1 full."""
    mask = len(keys) - 1
    slot = ((key * np.int64(-7046029254386353131)) >> 40) & mask
    for _ in range(len(keys)):
        k = keys[slot]
        if k == key:
            return slot
        if k == EMPTY:
            keys[slot] = key
            return slot
        slot = (slot + 1) & mask
    return -1


@numba.njit(cache=True, nogil=True)
def _u(buf, o, n):
    v = np.int64(0)
    for b in range(n):
        v = (v << 8) | np.int64(buf[o + b])
    return v


@numba.njit(cache=True, nogil=True)
def _record_frames(buf, offsets, lengths, peer_ids, recv_ts_ns, count, keys, counts, stats,
                   jitter, last_transit, next_seq, probe_stream, restart_gap, unit_shift,
                   sub_shift):
    """Record ``count`` received frames; returns frames of peers the table had no room for.

    Timed frames: DATA and RETRANSMISSION with a nonzero ``send_ts_ns`` (the sending channel
    stamps it with its wall clock). A probe (DATA, no messages, ``stream_id`` ==
    ``probe_stream``, a u64 sequence body) also counts expected/lost/late probes. The data
    path records a burst after it checked its plain DATA frames: one that still carries its
    trailer was refused (forged, replayed) and is not recorded.
    """
    untracked = 0
    n_buckets = counts.shape[1]
    for i in range(count):
        length = lengths[i]
        if length < 32:
            continue
        o = offsets[i]
        if buf[o] != 0x54 or buf[o + 1] != 0x57 or buf[o + 2] != 1:
            continue
        slot = _slot_of(keys, peer_ids[i])
        if slot < 0:
            untracked += 1
            continue
        ftype = buf[o + 3]
        if ftype == _DATA and buf[o + 5] & _AUTH and not _u(buf, o + 20, 4) & _RELIABLE:
            continue  # refused by the frame MAC: as if it never came
        st = stats[slot]
        st[FRAMES] += 1
        st[BYTES] += length
        if ftype == _NAK:
            st[NAKS] += 1
            continue
        if ftype != _DATA and ftype != _RETX:
            continue
        msgs = _u(buf, o + 6, 2)
        st[MESSAGES] += msgs
        if ftype == _RETX:
            st[RETRANSMISSIONS] += msgs
        elif msgs == 0 and length >= 40 and _u(buf, o + 20, 4) == probe_stream:
            seq = _u(buf, o + 32, 8)
            nxt = next_seq[slot]
            if nxt < 0 or seq >= nxt or nxt - seq > restart_gap:
                gap = 0 if nxt < 0 or seq < nxt else seq - nxt
                st[EXPECTED] += gap + 1
                st[LOST] += gap
                next_seq[slot] = seq + 1
            else:
                st[LATE] += 1
        sent = _u(buf, o + 24, 8)
        if sent <= 0:
            continue
        transit = recv_ts_ns[i] - sent
        if transit < st[LAT_MIN]:
            st[LAT_MIN] = transit
        if transit > st[LAT_MAX]:
            st[LAT_MAX] = transit
        if transit < 0:
            st[LAT_NEGATIVE] += 1
        else:
            b = _bucket_of(transit, unit_shift, sub_shift)
            if b >= n_buckets:
                st[LAT_OVERFLOW] += 1
            else:
                counts[slot, b] += 1
                st[LAT_COUNT] += 1
        # RFC 3550 interarrival jitter: only changes of the transit time matter, so a clock
        # offset between hosts cancels out.
        if last_transit[slot] == EMPTY:
            last_transit[slot] = transit
        else:
            d = transit - last_transit[slot]
            if d < 0:
                d = -d
            jitter[slot] += (d - jitter[slot]) / JITTER_GAIN
            last_transit[slot] = transit
    return untracked
