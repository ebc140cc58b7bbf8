"""numba kernels of the software NIC: key table build/update, and the fused burst pipeline.

Private: arrays and scalars only; the callers (``tables.py``, ``pipeline.py``) check types
and sizes. Layouts are in ``layout.py``. The pure-Python twins live in ``twin.py`` (the
benchmark runs them too) and randomized tests (tests/nic_offload/softnic) hold the two to
identical tables, decisions and counters. Unsigned arithmetic stays in uint64 (numba turns
uint64 mixed with int64 into float64, so every mix is cast explicitly).

``_run`` is the whole data path of the software NIC in one call: a ring of frames in bursts,
each burst validated, parsed, looked up, counted, filtered and turned into descriptors
without leaving machine code. Frame validation mirrors ``datapath.protocol._kernels.
_decode_frames`` (and so ``codec.decode_frame``) check for check and reason for reason; the
tests hold the two to identical statuses and decoded records on mutated frames. It is
repeated here rather than called because the fused loop hashes and prefetches each key the
moment it is parsed, and because numba's cache does not notice a change in another module's
kernel (constants taken from other modules are frozen the same way: touch this file when
they change).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from datapath.config import MAX_FRAME_BYTES
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol.errors import MalformedReason as R
from nic_offload.model import AclAction, DigestReason, KeyAction
from nic_offload.softnic import layout as L

_GOLD = np.uint64(L.HASH_MULTIPLIER)
_ZERO = np.uint64(0)
_EMPTY = np.uint64(L.EMPTY_KEY)
_BUCKET_SLOTS = L.SLOTS_PER_BUCKET
_BUCKET_WORDS = np.uint64(L.WORDS_PER_BUCKET)
_U1 = np.uint64(1)
_U2 = np.uint64(2)
_U3 = np.uint64(3)
_U8 = np.uint64(8)
_U32 = np.uint64(32)
_ROW_SHIFT = np.uint64(L.ROW_SHIFT)
_ACTION_SHIFT = np.uint64(L.ACTION_SHIFT)
_ACTION_MASK = np.uint64(L.ACTION_MASK)
_CLASS_SHIFT = np.uint64(L.CLASS_SHIFT)
_CLASS_MASK = np.uint64(L.CLASS_MASK)
_TARGET_MASK = np.uint64(L.TARGET_MASK)

# frame validation (the same constants as datapath.protocol._kernels)
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
_NOT_PROCESSED = L.STATUS_NOT_PROCESSED

_DROP = np.uint64(KeyAction.DROP)
_FORWARD = np.uint64(KeyAction.FORWARD)
_FORWARD_GROUP = np.uint64(KeyAction.FORWARD_GROUP)
_PUNT = np.uint64(KeyAction.PUNT)
_ACCEPT_RESULT = L.terminal_result(int(AclAction.ACCEPT))
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

_GROUP_WORDS = np.uint64(L.GROUP_WORDS)
_FIXED_SEARCH_MAX = np.uint64(1 << L.ACL_FIXED_SEARCH_STEPS)
_FIXED_STEPS = tuple(np.uint64(1 << k) for k in range(L.ACL_FIXED_SEARCH_STEPS - 1, -1, -1))

_R_DONE = 0
_R_FRAMES = 1
_R_MESSAGES = 2
_R_DESCRIPTORS = 3
_R_BURSTS = 4
RUN_RESULT_WORDS = 5
"""``_run`` writes [stopped early?, frames, messages, descriptors, bursts] into ``result``."""


@intrinsic
def _prefetch(typingctx, array, index):
    """Hint the CPU to bring ``array[index]`` into the caches (``llvm.prefetch``, read,
    high locality). No effect on results; an index past the array is harmless (a prefetch
    never faults), but callers stay in bounds anyway."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None
    sig = types.void(array, index)

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        data = context.make_array(array_type)(context, builder, args[0])
        at = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = cgutils.get_item_pointer(context, builder, array_type, data, [at],
                                       wraparound=False)
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, byte_ptr), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def _home(key, shift):
    """The home bucket of ``key`` (unsigned: indices stay free of wraparound code)."""
    return (key * _GOLD) >> np.uint64(shift)


@njit(cache=True, nogil=True)
def _build_key_table(slots, shift, keys, values):
    """Insert ``keys[i] -> values[i]`` in order (a key already present gets the new value in
    its slot); return the longest probe sequence (buckets looked at for one key). The table
    never fills: the caller keeps the load under ``KEY_TABLE_MAX_LOAD``."""
    mask = np.uint64((slots.shape[0] // _BUCKET_WORDS) - 1)
    longest = 0
    for i in range(keys.shape[0]):
        key = keys[i]
        b = _home(key, shift)
        probes = 1
        while True:
            at = -1
            for j in range(_BUCKET_SLOTS):  # the first slot holding the key, or free
                w = np.int64(_BUCKET_WORDS * b) + 2 * j
                if slots[w] == key or slots[w] == _EMPTY:
                    at = w
                    break
            if at >= 0:
                break
            b = (b + _U1) & mask
            probes += 1
        slots[at] = key
        slots[at + 1] = values[i]
        if probes > longest:
            longest = probes
    return longest


@njit(inline="always")
def _lookup(slots, shift, key):
    """The value word of ``key``, or 0 (no valid value is 0: actions start at 1)."""
    return _probe(slots, _home(key, shift), key)


@njit(inline="always")
def _probe(slots, b, key):
    """The value word of ``key`` (never 0) searched from its home bucket ``b``, or 0.

    The four keys of a bucket (one cache line) are compared at once and the matching slot's
    index is computed from the comparisons, not branched on (a bucket holds a key once):
    only a full bucket without the key goes on to the next one, which is rare, so the one
    branch that waits for the line is nearly always predicted right and the CPU keeps many
    lookups in flight."""
    mask = np.uint64((slots.shape[0] // _BUCKET_WORDS) - 1)
    while True:
        w = _BUCKET_WORDS * b
        k1 = slots[w + _U2]
        k2 = slots[w + np.uint64(4)]
        k3 = slots[w + np.uint64(6)]
        hit0 = np.uint64(slots[w] == key)
        hit1 = np.uint64(k1 == key)
        hit2 = np.uint64(k2 == key)
        hit3 = np.uint64(k3 == key)
        at = w + _U1 + _U2 * (hit1 + _U2 * hit2 + _U3 * hit3)
        v = slots[at] & (_ZERO - (hit0 | hit1 | hit2 | hit3))
        if v != _ZERO or k3 == _EMPTY:
            return v
        b = (b + _U1) & mask


@njit(cache=True, nogil=True)
def _lookup_many(slots, shift, keys, out):
    """``out[i]`` = value word of ``keys[i]`` (0 when absent); for tests and tools."""
    for i in range(keys.shape[0]):
        key = keys[i]
        out[i] = np.uint64(0) if key == 0 else _lookup(slots, shift, key)


@njit(inline="always")
def _read_be(buf, off, width):
    """The unsigned big-endian integer of ``width`` bytes at ``buf[off]`` (``off`` unsigned:
    no negative-index wraparound code in the chain)."""
    if width == 4:  # the common width, without a loop
        return ((np.uint64(buf[off]) << np.uint64(24))
                | (np.uint64(buf[off + _U1]) << np.uint64(16))
                | (np.uint64(buf[off + _U2]) << _U8) | np.uint64(buf[off + _U3]))
    v = np.uint64(0)
    for j in range(width):
        v = (v << _U8) | np.uint64(buf[off + np.uint64(j)])
    return v


@njit(inline="always")
def _hop(buf, payload_offset, result, groups, bound_lo, bound_result):
    """One ACL hop: the result word of the interval of group ``result`` holding the
    message's field.

    A hop is one chain of dependent loads (group words, field bytes, the search, the
    result), so indices are unsigned (numba adds wraparound code to signed ones) and
    small groups take a fixed number of branch-free steps: the last step's target is
    clamped to the group's last interval, whose start is <= the value exactly when the
    value lies in it."""
    g = np.uint64(result) * _GROUP_WORDS
    lo = np.uint64(groups[g])
    end = np.uint64(groups[g + _U1])
    v = _read_be(buf, np.uint64(payload_offset) + np.uint64(groups[g + _U2]),
                 groups[g + _U3])
    if end - lo <= _FIXED_SEARCH_MAX:
        last = end - _U1
        for step in _FIXED_STEPS:
            at = min(lo + step, last)
            lo = at if bound_lo[at] <= v else lo
    else:
        n = end - lo
        while n > _U1:
            half = n >> _U1
            lo = lo + half if bound_lo[lo + half] <= v else lo
            n -= half
    return bound_result[lo]


@njit(inline="always")
def _acl(buf, payload_offset, result, groups, bound_lo, bound_result):
    """The ACL verdict (ACCEPT, REJECT or LOG) from the class's root ``result`` word, one
    message alone (``_run`` advances many messages a hop at a time instead)."""
    while result >= 0:
        result = _hop(buf, payload_offset, result, groups, bound_lo, bound_result)
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


# --- validation and parsing ----------------------------------------------------------------
@njit(inline="always")
def _byte(b, o):
    """``b[o]`` for an offset the caller checked to be >= 0: indexed unsigned, so numba adds
    no wraparound code and LLVM can merge neighbouring byte loads into one wide load."""
    return np.int64(b[np.uint64(o)])


@njit(inline="always")
def _be16(b, o):
    return (_byte(b, o) << 8) | _byte(b, o + 1)


@njit(inline="always")
def _be32(b, o):
    return (_be16(b, o) << 16) | _be16(b, o + 2)


@njit(inline="always")
def _be64(b, o):
    return (np.uint64(_be32(b, o)) << _U32) | np.uint64(_be32(b, o + 4))


@njit(inline="always")
def _frame_header(buf, off, avail, exact):
    """(status, frame_type, msg_count, body_end) of the frame at ``off``; the checks and their
    order of ``datapath.protocol._kernels._check_header``."""
    if avail < _HDR:
        return _TOO_SHORT, 0, 0, 0
    if _be16(buf, off) != _MAGIC:
        return _BAD_MAGIC, 0, 0, 0
    if _byte(buf, off + 2) != _VERSION:
        return _BAD_VERSION, 0, 0, 0
    ftype = _byte(buf, off + 3)
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


@njit(inline="always")
def _decode(buf, frame_offsets, frame_lengths, first, end, exact, batch, status, frame_types,
            homes, slots, shift):
    """Validate frames ``first .. end-1`` and parse their messages into ``batch[0:n]``
    (status and type of frame i at ``i - first``); each key's home slot goes to ``homes``
    and is prefetched at once. Returns (n, the first frame not processed): a frame whose
    messages do not fit in ``batch`` stops the burst before it."""
    n = 0
    cap = batch.shape[0]
    for i in range(first, end):
        status[i - first] = _NOT_PROCESSED
    for i in range(first, end):
        j = i - first
        off = frame_offsets[i]
        avail = frame_lengths[i]
        if off < 0 or avail < 0 or off + avail > buf.shape[0]:
            status[j] = _TOO_SHORT
            frame_types[j] = 0
            continue
        st, ftype, count, body_end = _frame_header(buf, off, avail, exact)
        frame_types[j] = ftype
        if st != _OK:
            status[j] = st
            continue
        if ftype != _DATA and ftype != _RETX:
            status[j] = _OK
            continue
        if count == 0 or count > _MAX_MSGS:
            status[j] = _BAD_COUNT
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
            qos = _byte(buf, pos + 30)
            if qos > _MAX_QOS:
                st = _BAD_QOS
                break
            mflags = _byte(buf, pos + 31)
            if mflags & ~_KNOWN_MSG_FLAGS:
                st = _UNKNOWN_FLAGS
                break
            payload_len = _be32(buf, pos + 32)
            topic_len = _be16(buf, pos + 36)
            size = _MHDR + ((payload_len + topic_len + 7) & ~7)
            if pos + size > body_end:
                st = _MESSAGE_OVERRUN
                break
            key = _be64(buf, pos)
            home = _home(key, shift)
            _prefetch(slots, _BUCKET_WORDS * home)
            homes[n] = home
            rec = batch[n]
            rec.topic_key = key
            rec.sequence = _be64(buf, pos + 8)
            rec.publish_ts_ns = _be64(buf, pos + 16)
            rec.namespace_id = _be32(buf, pos + 24)
            rec.schema_id = _be16(buf, pos + 28)
            rec.qos = qos
            rec.flags = mflags
            rec.payload_offset = pos + _MHDR
            rec.payload_len = payload_len
            rec.topic_len = topic_len
            rec.frame_index = j
            n += 1
            pos += size
        if st == _OK and pos != body_end:
            st = _TRAILING_BYTES
        if st != _OK:
            n = start
        status[j] = st
    return n, end


@njit(inline="always")
def _prefetch_next(buf, frame_offsets, frame_lengths, first, end, slots, shift):
    """Prefetch the home bucket of the first message of frames ``first .. end-1`` (the next
    burst), so that their cache misses overlap this burst's ACL work instead of stalling
    the next decode; frames too short to hold a message are skipped (decode judges them)."""
    for i in range(first, end):
        off = frame_offsets[i]
        if off >= 0 and frame_lengths[i] >= _HDR + _MHDR and off + _HDR + 8 <= buf.shape[0]:
            _prefetch(slots, _BUCKET_WORDS * _home(_be64(buf, off + _HDR), shift))


# --- the pipeline ------------------------------------------------------------------------
@njit(cache=True, nogil=True, _nrt=False)
def _run(buf, frame_offsets, frame_lengths, exact, burst_frames, max_bursts, batch, status,
         frame_types, homes, values, acl_results, payloads, pending, slots, shift, class_root,
         groups,
         bound_lo, bound_result, fields_end, key_counts, counters, malformed, desc, verdicts,
         digests, digest_state, result):
    """Run frames through the tables, ``burst_frames`` at a time, at most ``max_bursts``
    bursts; write [stopped early, frames, messages, descriptors, bursts] into ``result``.

    Per burst, in passes over the burst's messages (each a short loop whose iterations do
    not wait on each other, so the CPU overlaps their cache misses and dependent loads):

    1. ``_decode`` parses the frames into ``batch`` (scratch: the burst's messages only) and
       prefetches each key's home bucket; frames are counted by status;
    2. every key is looked up (``values``) and its per-row counter line prefetched; a
       forward whose key has an ACL class and whose payload holds the ACL fields gets its
       class's root result in ``acl_results``, anything else the ACCEPT verdict;
    3. the ACLs advance a hop at a time: each round takes one hop for every message whose
       ACL is still undecided (``pending``), so the hops of a round are independent and
       the CPU overlaps their chains of dependent loads (a message alone would wait on
       each load of each hop in turn); ``acl_results`` ends as minus the AclAction;
    4. each message is counted per row (``key_counts[2 row]`` packets, ``[2 row + 1]``
       bytes) and decided: unknown key -> punt + digest; drop; punt + digest; forward,
       unless the payload is too short for the ACL fields or the ACL rejects (LOG forwards
       and queues a digest). A forwarded message gets one descriptor.

    ``verdicts``, descriptor ``index`` and digest ``index`` number messages from the first
    of the call. A burst whose messages do not fit in ``verdicts``/``desc`` is not run: the
    call stops before it (``result[0]`` = 1). ``status``/``frame_types`` hold the last
    burst's frames (scratch of ``burst_frames``)."""
    n_frames = frame_offsets.shape[0]
    frame = 0
    out = 0
    n_desc = 0
    bursts = 0
    stopped = 0
    frames = 0
    admin = 0
    bad = 0
    forwarded = 0
    logged = 0
    dropped = 0
    punted = 0
    unknown = 0
    rejected = 0
    short = 0
    while frame < n_frames and bursts < max_bursts:
        end = min(frame + burst_frames, n_frames)
        n, reached = _decode(buf, frame_offsets, frame_lengths, frame, end, exact, batch,
                             status, frame_types, homes, slots, shift)
        if reached == frame or out + n > verdicts.shape[0] or n_desc + n > desc.shape[0]:
            stopped = 1  # a frame larger than the batch, or the outputs are full
            break
        for j in range(reached - frame):
            st = status[j]
            if st != _OK:
                bad += 1
                malformed[st] += 1
            elif frame_types[j] != _DATA and frame_types[j] != _RETX:
                admin += 1
        frames += reached - frame
        for m in range(n):  # 2: lookups
            rec = batch[m]
            key = rec.topic_key
            value = _ZERO if key == _ZERO else _probe(slots, homes[m], key)
            values[m] = value
            root = _ACCEPT_RESULT
            if value != _ZERO:
                _prefetch(key_counts, _U2 * (value >> _ROW_SHIFT))
                acl_class = (value >> _CLASS_SHIFT) & _CLASS_MASK
                action = (value >> _ACTION_SHIFT) & _ACTION_MASK
                if acl_class != _ZERO and (action == _FORWARD or action == _FORWARD_GROUP) \
                        and np.int64(rec.payload_len) >= fields_end:
                    root = class_root[acl_class]
            acl_results[m] = root
            payloads[m] = np.uint64(rec.payload_offset)
        _prefetch_next(buf, frame_offsets, frame_lengths, reached,
                       min(reached + burst_frames, n_frames), slots, shift)
        waiting = 0
        for m in range(n):  # 3: ACLs, all messages a hop at a time
            pending[waiting] = m
            waiting += acl_results[m] >= 0
        while waiting > 0:
            still = 0
            for i in range(waiting):
                m = pending[i]
                r = _hop(buf, payloads[m], acl_results[m], groups, bound_lo, bound_result)
                acl_results[m] = r
                pending[still] = m
                still += r >= 0
            waiting = still
        for m in range(n):  # 4: counters, verdicts, descriptors, digests
            rec = batch[m]
            value = values[m]
            index = out + m
            payload_len = np.int64(rec.payload_len)
            size = _MHDR + ((payload_len + np.int64(rec.topic_len) + 7) & ~7)
            if value == _ZERO:
                verdicts[index] = _V_UNKNOWN
                unknown += 1
                _digest(digests, digest_state, counters, _R_UNKNOWN, rec, 0, index)
                continue
            row = _U2 * (value >> _ROW_SHIFT)
            key_counts[row] += 1
            key_counts[row + _U1] += size
            action = (value >> _ACTION_SHIFT) & _ACTION_MASK
            if action == _DROP:
                verdicts[index] = _V_DROPPED
                dropped += 1
                continue
            if action == _PUNT:
                verdicts[index] = _V_PUNTED
                punted += 1
                _digest(digests, digest_state, counters, _R_PUNT, rec, 0, index)
                continue
            acl_class = (value >> _CLASS_SHIFT) & _CLASS_MASK
            outcome = -acl_results[m]
            if acl_class != _ZERO and payload_len < fields_end:
                verdicts[index] = _V_SHORT
                short += 1
                continue
            if outcome == _REJECT:
                verdicts[index] = _V_REJECTED
                rejected += 1
                continue
            verdict = _V_FORWARDED
            if outcome == _LOG:
                verdict = _V_LOGGED
                logged += 1
                _digest(digests, digest_state, counters, _R_LOG, rec, acl_class, index)
            else:
                forwarded += 1
            verdicts[index] = verdict
            d = desc[n_desc]
            d.offset = rec.payload_offset - _MHDR
            d.length = size
            d.target = np.uint32(value & _TARGET_MASK)
            d.kind = _GROUP if action == _FORWARD_GROUP else _PORT
            d.index = index
            n_desc += 1
        out += n
        frame = reached
        bursts += 1
    counters[_C_FRAMES] += frames
    counters[_C_ADMIN] += admin
    counters[_C_MALFORMED] += bad
    counters[_C_MESSAGES] += out
    counters[_V_FORWARDED] += forwarded
    counters[_V_LOGGED] += logged
    counters[_V_DROPPED] += dropped
    counters[_V_PUNTED] += punted
    counters[_V_UNKNOWN] += unknown
    counters[_V_REJECTED] += rejected
    counters[_V_SHORT] += short
    result[_R_DONE] = stopped
    result[_R_FRAMES] = frame
    result[_R_MESSAGES] = out
    result[_R_DESCRIPTORS] = n_desc
    result[_R_BURSTS] = bursts
