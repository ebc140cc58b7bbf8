"""numba kernels of the native protocol codec: batch decode and batch pack, and the DATA
frame MAC (sign, check, replay window: datapath/protocol/frame_mac.py says what they do).

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

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from datapath.config import MAX_FRAME_BYTES
from datapath.protocol import frame_layout as fl
from datapath.protocol import frame_mac as fm
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


# --- the DATA frame MAC (datapath/protocol/frame_mac.py) -------------------------------

_MAC = fm.MAC_BYTES
_FLAGS_LOW = fl.FLAGS_OFFSET + 1
_TS = fl.SEND_TS_OFFSET
_LEN = fl.FRAME_LEN_OFFSET
_I64 = ir.IntType(64)
_I32 = ir.IntType(32)


@intrinsic
def _call8(typingctx: Any, fn: Any, a0: Any, a1: Any, a2: Any, a3: Any, a4: Any, a5: Any,
           a6: Any, a7: Any) -> Any:
    """``int fn(a0, ..., a7)`` at address ``fn`` with 64-bit integer arguments (x86-64 System
    V: six in registers, two on the stack; the callee's pointers and sizes are 64 bits)."""
    sig = types.int64(*([types.int64] * 9))

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fnty = ir.FunctionType(_I32, [_I64] * 8)
        f = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.sext(builder.call(f, list(args[1:])), _I64)
    return sig, codegen


@njit(inline="always")
def sorted_index(values, value):
    """Index of ``value`` in the sorted ``values`` (a binary search), or -1; also the
    appliance's pipeline kernel's."""
    lo = 0
    hi = values.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if values[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < values.shape[0] and values[lo] == value else -1


@njit(inline="always")
def _mac(buf, off, n, sender, receiver, ab, ac, key_addr, key_len):
    """MAC of ``buf[off:off + n]`` (send time read as zero) on link (sender, receiver) under
    the key at address ``key_addr`` into ``ab[B_MAC:B_MAC + 16]``."""
    _put32(ab, fm.B_SALT, sender)
    _put32(ab, fm.B_SALT + 4, receiver)
    _mac_at(buf, off, n, ab, ac, key_addr, key_len, fm.B_SALT, fm.B_PERSON)


@njit(inline="always")
def _mac_down(buf, off, n, ab, ac, key_addr, key_len):
    """MAC of a frame from an appliance to a client session (zero salt, ``DOWN_PERSON``)."""
    _mac_at(buf, off, n, ab, ac, key_addr, key_len, fm.B_ZERO, fm.B_DOWN_PERSON)


@njit(inline="always")
def _mac_at(buf, off, n, ab, ac, key_addr, key_len, salt_at, person_at):
    for k in range(8):
        ab[fm.B_TS + k] = buf[off + _TS + k]
        buf[off + _TS + k] = 0
    base = np.int64(ab.ctypes.data)
    _call8(ac[fm.A_FN], base + fm.B_MAC, _MAC, np.int64(buf.ctypes.data) + off, n,
           key_addr, key_len, base + salt_at, base + person_at)
    for k in range(8):
        buf[off + _TS + k] = ab[fm.B_TS + k]


@njit(inline="always")
def sign_frame(buf, off, length, room, receiver, now_ns, ab, ac):
    """Append a signed trailer to the frame at ``buf[off:off + length]`` (``room`` bytes in
    its slot) for ``receiver``, its send time stamped ``now_ns``: its new length, or -1 when
    it does not fit or is not a frame (left as it is, counted unsigned)."""
    end = length + _AUTH_BYTES
    if length < _HDR or end > room or end % 8 != 0:
        ac[fm.A_UNSIGNED] += 1
        return -1
    buf[off + _FLAGS_LOW] |= _AUTH
    _put32(buf, off + _LEN, end)
    put_be64(buf, off + _TS, now_ns)
    seq = ac[fm.A_SEQ] + 1
    ac[fm.A_SEQ] = seq
    t = off + length
    _put32(buf, t, ac[fm.A_KEY_ID])
    _put32(buf, t + 4, ac[fm.A_EPOCH])
    put_be64(buf, t + 8, seq)
    _mac(buf, off, end - _MAC, ac[fm.A_NODE], receiver, ab, ac,
         np.int64(ab.ctypes.data) + fm.B_KEY, ac[fm.A_KEY_LEN])
    buf[off + end - _MAC:off + end] = ab[fm.B_MAC:fm.B_MAC + _MAC]
    ac[fm.A_SIGNED] += 1
    return end


@njit(cache=True, nogil=True)
def sign_frames(buf, offsets, lengths, peer_ids, count, room, peers, receivers, group_link,
                now_ns, ab, ac):
    """Sign every frame of a batch that has no trailer yet (admin and reliable-stream frames
    come signed by their planes) for the receiver of its peer id (``peers`` sorted, their
    node ids in ``receivers``), or for ``group_link`` when it is >= 0 (a group's batch)."""
    for i in range(count):
        off = offsets[i]
        length = lengths[i]
        if length >= _HDR and buf[off + _FLAGS_LOW] & _AUTH:
            continue
        receiver = group_link
        if receiver < 0:
            r = sorted_index(peers, peer_ids[i])
            if r < 0:
                ac[fm.A_UNSIGNED] += 1
                continue
            receiver = receivers[r]
        got = sign_frame(buf, off, length, room, receiver, now_ns, ab, ac)
        if got > 0:
            lengths[i] = got


@njit(inline="always")
def check_frame(buf, off, length, sender, receiver, row, ab, ac, windows):
    """Check the trailer of the plain DATA frame at ``buf[off:off + length]`` from ``sender``
    to ``receiver`` under the key of ``ab`` with replay window ``windows[row]`` (``row`` < 0:
    none left for its link): its length without the trailer (the trailer removed: flag
    cleared, ``frame_len`` shrunk), or -1 (refused, counted by reason)."""
    if row < 0:
        ac[fm.A_LINKS_FULL] += 1
        return -1
    return _check(buf, off, length, sender, receiver, ab, ac, windows[row],
                  np.int64(ab.ctypes.data) + fm.B_KEY, ac[fm.A_KEY_LEN], ac[fm.A_KEY_ID], False)


@njit(cache=True, nogil=True)
def check_session_frame(buf, off, length, session, receiver, slot, ab, ac, keys, windows):
    """Check the trailer of a frame a client session sent (any frame type: every frame of
    a session with a key carries it) under the session's key ``keys[slot]`` (its length in
    byte 0, the key from byte ``fm.SESSION_KEY_AT``; key id 0) and window ``windows[slot]``
    (``check_frame``'s result)."""
    return _check(buf, off, length, session, receiver, ab, ac, windows[slot],
                  np.int64(keys.ctypes.data) + slot * keys.shape[1] + fm.SESSION_KEY_AT,
                  np.int64(keys[slot, 0]), 0, False)


@njit(inline="always")
def _check(buf, off, length, sender, receiver, ab, ac, w, key_addr, key_len, key_id, down):
    if (length < _HDR + _AUTH_BYTES or not buf[off + _FLAGS_LOW] & _AUTH
            or _be32(buf, off + _LEN) != length):
        ac[fm.A_NO_TRAILER] += 1
        return -1
    t = off + length - _AUTH_BYTES
    if _be32(buf, t) != key_id:
        ac[fm.A_UNKNOWN_KEY] += 1
        return -1
    if down:
        _mac_down(buf, off, length - _MAC, ab, ac, key_addr, key_len)
    else:
        _mac(buf, off, length - _MAC, sender, receiver, ab, ac, key_addr, key_len)
    diff = 0
    m = off + length - _MAC
    for k in range(_MAC):
        diff |= ab[fm.B_MAC + k] ^ buf[m + k]
    if diff:
        ac[fm.A_BAD_MAC] += 1
        return -1
    seq = np.int64(_be64(buf, t + 8))
    high = w[0]
    word = (seq >> 6) % fm.WINDOW_WORDS
    bit = np.int64(1) << (seq & 63)
    if high < 0 or seq > high:
        if high >= 0:  # clear the words the window slides over
            steps = min((seq >> 6) - (high >> 6), fm.WINDOW_WORDS)
            for k in range(steps):
                w[1 + ((high >> 6) + 1 + k) % fm.WINDOW_WORDS] = 0
        else:
            for k in range(fm.WINDOW_WORDS):
                w[1 + k] = 0
        w[0] = seq
        w[1 + word] |= bit
    elif (high >> 6) - (seq >> 6) >= fm.WINDOW_WORDS or w[1 + word] & bit:
        ac[fm.A_REPLAY] += 1
        return -1
    else:
        w[1 + word] |= bit
    ac[fm.A_ACCEPTED] += 1
    body = length - _AUTH_BYTES
    buf[off + _FLAGS_LOW] &= ~_AUTH & 0xFF
    _put32(buf, off + _LEN, body)
    return body


@njit(cache=True, nogil=True)
def check_frames(buf, offsets, lengths, peer_ids, frames, count, reliable_bit, peers, senders,
                 rows, receiver, ab, ac, windows, verdicts):
    """``check_frame`` over the frames ``frames[:count]`` of a burst from the fabric (plain
    DATA frames only: the others' planes check them), the sender and window row of each
    from its peer id (``peers`` sorted, ``senders``, ``rows``); ``verdicts[i]`` = OK (its
    length updated), NOT_SUBJECT or REFUSED."""
    for j in range(count):
        i = frames[j]
        verdicts[i] = check_burst_frame(buf, offsets, lengths, peer_ids, i, reliable_bit,
                                        peers, senders, rows, receiver, ab, ac, windows)


@njit(inline="always")
def is_plain_data(buf, off, length, reliable_bit):
    """Whether the frame is one the DATA MAC covers: a DATA frame not of a reliable stream."""
    if length < _HDR or buf[off + fl.TYPE_OFFSET] != _DATA:
        return False
    return not (_be32(buf, off + fl.STREAM_ID_OFFSET) & reliable_bit)


@njit(inline="always")
def check_burst_frame(buf, offsets, lengths, peer_ids, i, reliable_bit, peers, senders, rows,
                      receiver, ab, ac, windows):
    """The verdict of frame ``i`` of a fabric burst (see ``check_frames``). A frame from a
    peer that is no neighbour is NOT_SUBJECT: the caller drops it as it drops any frame from
    a stranger (counted there), unchecked."""
    off = offsets[i]
    length = lengths[i]
    if not is_plain_data(buf, off, length, reliable_bit):
        return fm.NOT_SUBJECT
    r = sorted_index(peers, peer_ids[i])
    if r < 0:
        return fm.NOT_SUBJECT
    got = check_frame(buf, off, length, senders[r], receiver, rows[r], ab, ac, windows)
    if got < 0:
        return fm.REFUSED
    lengths[i] = got
    return fm.OK


# --- frames from an appliance to a client session (frame_mac.py: DOWN_PERSON) ------------

@njit(inline="always")
def sign_session_frame(buf, off, length, room, slot, now_ns, ab, ac, keys):
    """Append the trailer of a frame to a client session under the session's key
    ``keys[slot]`` (``check_session_frame``'s layout) to the frame at ``buf[off:off +
    length]`` (``room`` bytes in its slot), its send time stamped ``now_ns``; the sequence
    is ``ac[A_SEQ]``'s next: its new length, or -1 (no room: left unsigned, counted)."""
    end = length + _AUTH_BYTES
    if length < _HDR or end > room or end % 8 != 0:
        ac[fm.A_UNSIGNED] += 1
        return -1
    buf[off + _FLAGS_LOW] |= _AUTH
    _put32(buf, off + _LEN, end)
    put_be64(buf, off + _TS, now_ns)
    seq = ac[fm.A_SEQ] + 1
    ac[fm.A_SEQ] = seq
    t = off + length
    _put32(buf, t, 0)
    _put32(buf, t + 4, 0)
    put_be64(buf, t + 8, seq)
    _mac_down(buf, off, end - _MAC, ab, ac,
              np.int64(keys.ctypes.data) + slot * keys.shape[1] + fm.SESSION_KEY_AT,
              np.int64(keys[slot, 0]))
    buf[off + end - _MAC:off + end] = ab[fm.B_MAC:fm.B_MAC + _MAC]
    ac[fm.A_SIGNED] += 1
    return end


@njit(inline="always")
def sign_session_queue(buf, offsets, lengths, peer_ids, count, room, peers, rows, slots,
                       now_ns, ab, ac, keys):
    """Sign every frame of an out queue without a trailer whose destination (peer id, or
    session id for shared memory) is a session with a key: ``peers`` sorted, the row of each
    in ``rows``, ``slots[row]`` its key's slot (-1: none, the
    frame is sent as it is)."""
    for i in range(count):
        off = offsets[i]
        length = lengths[i]
        if length >= _HDR and buf[off + _FLAGS_LOW] & _AUTH:
            continue
        r = sorted_index(peers, peer_ids[i])
        if r < 0:
            continue
        slot = slots[rows[r]]
        if slot < 0:
            continue
        got = sign_session_frame(buf, off, length, room, slot, now_ns, ab, ac, keys)
        if got > 0:
            lengths[i] = got


@njit(cache=True, nogil=True)
def sign_session_frames(buf, offsets, lengths, peer_ids, count, room, peers, rows, slots,
                        now_ns, ab, ac, keys):
    """``sign_session_queue`` as a call of its own (an out queue the data path sends)."""
    sign_session_queue(buf, offsets, lengths, peer_ids, count, room, peers, rows, slots,
                       now_ns, ab, ac, keys)


DOWN_OPEN, DOWN_LOGIN, DOWN_KEYED = 0, 1, 2
"""What a client takes (``check_down_frames``'s ``mode``): anything (a session without a
key), only CONTROL frames, unchecked, to answer its login (a login with a password before
its proof), frames with the session's MAC (after the proof)."""
UNVERIFIED = 3
"""A CONTROL frame taken unchecked: only a login's answer is read from it."""
_CONTROL = int(fl.FrameType.CONTROL)


@njit(cache=True, nogil=True)
def check_down_frames(buf, offsets, lengths, count, mode, login_pending, ab, ac, window,
                      verdicts):
    """The client's check of a received burst from its appliance: ``verdicts[i]`` = OK (its
    MAC passed under the session's key ``ab`` and the window ``window``: trailer removed,
    length updated), NOT_SUBJECT (``mode`` DOWN_OPEN: taken as it is), UNVERIFIED (an
    unsigned CONTROL frame while ``login_pending``, or any CONTROL frame in DOWN_LOGIN) or
    REFUSED (counted by reason in ``ac``)."""
    for i in range(count):
        off = offsets[i]
        length = lengths[i]
        if mode == DOWN_OPEN:
            verdicts[i] = fm.NOT_SUBJECT
            continue
        control = length >= _HDR and buf[off + fl.TYPE_OFFSET] == _CONTROL
        signed = length >= _HDR and buf[off + _FLAGS_LOW] & _AUTH
        if mode == DOWN_LOGIN or (not signed and login_pending):
            if control:
                verdicts[i] = UNVERIFIED
            else:
                ac[fm.A_NO_TRAILER if not signed else fm.A_UNKNOWN_KEY] += 1
                verdicts[i] = fm.REFUSED
            continue
        got = _check(buf, off, length, 0, 0, ab, ac, window, np.int64(ab.ctypes.data) + fm.B_KEY,
                     ac[fm.A_KEY_LEN], 0, True)
        if got < 0:
            verdicts[i] = fm.REFUSED
        else:
            lengths[i] = got
            verdicts[i] = fm.OK
