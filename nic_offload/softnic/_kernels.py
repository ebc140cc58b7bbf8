"""numba kernels of the software NIC: key table build/update, and the per-burst pipeline.

Private: arrays and scalars only; the callers (``tables.py``, ``pipeline.py``) check types
and sizes. Layouts are in ``layout.py``. The pure-Python twins live in
tests/nic_offload/twins.py and randomized tests hold the two to identical tables, decisions
and counters. Unsigned arithmetic stays in uint64 (numba turns uint64 mixed with int64 into
float64, so every mix is cast explicitly).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from nic_offload.model import AclAction, DigestReason, KeyAction
from nic_offload.softnic import layout as L

_GOLD = np.uint64(L.HASH_MULTIPLIER)
_U8 = np.uint64(8)
_ROW_SHIFT = np.uint64(L.ROW_SHIFT)
_ACTION_SHIFT = np.uint64(L.ACTION_SHIFT)
_ACTION_MASK = np.uint64(L.ACTION_MASK)
_CLASS_SHIFT = np.uint64(L.CLASS_SHIFT)
_CLASS_MASK = np.uint64(L.CLASS_MASK)
_TARGET_MASK = np.uint64(L.TARGET_MASK)

_MHDR = ml.MESSAGE_HEADER_BYTES
_DATA = int(fl.FrameType.DATA)
_RETX = int(fl.FrameType.RETRANSMISSION)
_STATUS_OK = 0

_DROP = int(KeyAction.DROP)
_FORWARD = int(KeyAction.FORWARD)
_FORWARD_GROUP = int(KeyAction.FORWARD_GROUP)
_PUNT = int(KeyAction.PUNT)
_REJECT = int(AclAction.REJECT)
_LOG = int(AclAction.LOG)

_V_FORWARDED = int(L.MessageVerdict.FORWARDED)
_V_LOGGED = int(L.MessageVerdict.LOGGED)
_V_DROPPED = int(L.MessageVerdict.DROPPED)
_V_PUNTED = int(L.MessageVerdict.PUNTED)
_V_UNKNOWN = int(L.MessageVerdict.UNKNOWN_KEY)
_V_REJECTED = int(L.MessageVerdict.ACL_REJECTED)
_V_SHORT = int(L.MessageVerdict.ACL_SHORT_PAYLOAD)

_C_FRAMES = int(L.Counter.FRAMES)
_C_ADMIN = int(L.Counter.ADMIN_FRAMES)
_C_MALFORMED = int(L.Counter.MALFORMED_FRAMES)
_C_MESSAGES = int(L.Counter.MESSAGES)
_C_DIGESTS = int(L.Counter.DIGESTS)
_C_DIGEST_DROPS = int(L.Counter.DIGEST_DROPS)

_R_UNKNOWN = int(DigestReason.UNKNOWN_KEY)
_R_PUNT = int(DigestReason.PUNT)
_R_LOG = int(DigestReason.ACL_LOG)

_PORT = int(L.DescriptorKind.PORT)
_GROUP = int(L.DescriptorKind.GROUP)


@njit(inline="always")
def _home(key, shift):
    return np.int64((key * _GOLD) >> np.uint64(shift))


@njit(cache=True, nogil=True)
def _build_key_table(slots, shift, keys, values):
    """Insert ``keys[i] -> values[i]`` in order into an empty table; return the longest probe
    sequence (slots looked at for one key)."""
    mask = (slots.shape[0] // 2) - 1
    longest = 0
    for i in range(keys.shape[0]):
        key = keys[i]
        s = _home(key, shift)
        probes = 1
        while slots[2 * s] != 0 and slots[2 * s] != key:
            s = (s + 1) & mask
            probes += 1
        slots[2 * s] = key
        slots[2 * s + 1] = values[i]
        if probes > longest:
            longest = probes
    return longest


@njit(inline="always")
def _lookup(slots, shift, key):
    """The value word of ``key``, or 0 (no valid value is 0: actions start at 1)."""
    mask = (slots.shape[0] // 2) - 1
    s = _home(key, shift)
    while True:
        k = slots[2 * s]
        if k == key:
            return slots[2 * s + 1]
        if k == 0:
            return np.uint64(0)
        s = (s + 1) & mask


@njit(cache=True, nogil=True)
def _lookup_many(slots, shift, keys, out):
    """``out[i]`` = value word of ``keys[i]`` (0 when absent); for tests and tools."""
    for i in range(keys.shape[0]):
        key = keys[i]
        out[i] = np.uint64(0) if key == 0 else _lookup(slots, shift, key)


@njit(inline="always")
def _read_be(buf, off, width):
    if width == 4:  # the common width, without a loop
        return ((np.uint64(buf[off]) << np.uint64(24)) | (np.uint64(buf[off + 1]) << np.uint64(16))
                | (np.uint64(buf[off + 2]) << _U8) | np.uint64(buf[off + 3]))
    v = np.uint64(0)
    for j in range(width):
        v = (v << _U8) | np.uint64(buf[off + j])
    return v


@njit(inline="always")
def _acl(buf, payload_offset, result, group_start, group_field, bound_lo, bound_result,
         field_offset, field_width):
    """The ACL verdict (ACCEPT, REJECT or LOG) from the class's root ``result`` word."""
    while result >= 0:
        g = result
        k = group_field[g]
        v = _read_be(buf, payload_offset + field_offset[k], field_width[k])
        lo = group_start[g]
        n = group_start[g + 1] - lo
        # the last start <= v (starts[lo] is 0, so one exists); branch-free steps whose count
        # depends on n only, so random field values cost no mispredicted branches
        while n > 1:
            half = n >> 1
            lo = lo + half if bound_lo[lo + half] <= v else lo
            n -= half
        result = bound_result[lo]
    return -result


@njit(inline="always")
def _digest(digests, digest_state, counters, reason, rec, acl_class, index):
    cap = digests.shape[0]
    head = digest_state[0]
    tail = digest_state[1]
    if tail - head >= cap:
        counters[_C_DIGEST_DROPS] += 1
        return
    d = digests[tail & (cap - 1)]
    d.reason = reason
    d.acl_class = acl_class
    d.namespace_id = rec.namespace_id
    d.topic_key = rec.topic_key
    d.sequence = rec.sequence
    d.index = index
    digest_state[1] = tail + 1
    counters[_C_DIGESTS] += 1


@njit(cache=True, nogil=True)
def _process(buf, msgs, n_msgs, status, frame_types, n_frames, slots, shift, class_root,
             group_start, group_field, bound_lo, bound_result, field_offset, field_width,
             fields_end, key_counts, counters, malformed, desc, verdicts, values, digests,
             digest_state):
    """Run decoded messages ``msgs[:n_msgs]`` through the tables; return descriptors written.

    Counts frames by status first (``status``/``frame_types`` as decode_frames left them).
    Per message: key lookup (miss: punt + digest), per-row counters ``key_counts[2 row]``
    (packets) and ``[2 row + 1]`` (bytes), drop / punt / forward, then the ACL of the key's
    class; a forwarded message gets one descriptor. ``values`` is scratch (one word per
    message). Lookups and counters run as separate passes first: each is a short loop of
    independent memory accesses, so the CPU overlaps the cache misses of many messages (the
    key table and the counters are far larger than the caches) instead of waiting for each
    in turn behind the long decision code.
    """
    for i in range(n_frames):
        counters[_C_FRAMES] += 1
        st = status[i]
        if st != _STATUS_OK:
            counters[_C_MALFORMED] += 1
            malformed[st] += 1
        elif frame_types[i] != _DATA and frame_types[i] != _RETX:
            counters[_C_ADMIN] += 1
    for m in range(n_msgs):  # pass 1: every key lookup
        key = msgs[m].topic_key
        values[m] = np.uint64(0) if key == 0 else _lookup(slots, shift, key)
    for m in range(n_msgs):  # pass 2: per-row packets and bytes
        value = values[m]
        if value != 0:
            rec = msgs[m]
            row = np.int64(value >> _ROW_SHIFT)
            key_counts[2 * row] += 1
            key_counts[2 * row + 1] += _MHDR + (
                (np.int64(rec.payload_len) + np.int64(rec.topic_len) + 7) & ~7)
    n_desc = 0
    for m in range(n_msgs):
        rec = msgs[m]
        value = values[m]
        payload_len = np.int64(rec.payload_len)
        size = _MHDR + ((payload_len + np.int64(rec.topic_len) + 7) & ~7)
        counters[_C_MESSAGES] += 1
        if value == 0:
            verdicts[m] = _V_UNKNOWN
            counters[_V_UNKNOWN] += 1
            _digest(digests, digest_state, counters, _R_UNKNOWN, rec, 0, m)
            continue
        action = np.int64((value >> _ACTION_SHIFT) & _ACTION_MASK)
        if action == _DROP:
            verdicts[m] = _V_DROPPED
            counters[_V_DROPPED] += 1
            continue
        if action == _PUNT:
            verdicts[m] = _V_PUNTED
            counters[_V_PUNTED] += 1
            _digest(digests, digest_state, counters, _R_PUNT, rec, 0, m)
            continue
        acl_class = np.int64((value >> _CLASS_SHIFT) & _CLASS_MASK)
        verdict = _V_FORWARDED
        if acl_class != 0:
            if payload_len < fields_end:
                verdicts[m] = _V_SHORT
                counters[_V_SHORT] += 1
                continue
            outcome = _acl(buf, rec.payload_offset, class_root[acl_class], group_start,
                           group_field, bound_lo, bound_result, field_offset, field_width)
            if outcome == _REJECT:
                verdicts[m] = _V_REJECTED
                counters[_V_REJECTED] += 1
                continue
            if outcome == _LOG:
                verdict = _V_LOGGED
                _digest(digests, digest_state, counters, _R_LOG, rec, acl_class, m)
        verdicts[m] = verdict
        counters[verdict] += 1
        d = desc[n_desc]
        d.offset = rec.payload_offset - _MHDR
        d.length = size
        d.target = np.uint32(value & _TARGET_MASK)
        d.kind = _GROUP if action == _FORWARD_GROUP else _PORT
        d.index = m
        n_desc += 1
    return n_desc
