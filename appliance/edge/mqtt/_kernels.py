"""The MQTT edge's compiled framing kernel (numba): every complete packet of one or many
connections' input, PUBLISH and PUBACK/PUBREC/PUBREL/PUBCOMP decoded to offsets
(``frame_packets``; ``frame_one`` takes one connection's segment as plain arguments).

``frame_packets(buf, segs, out)``: ``buf`` holds the input (uint8); each row of ``segs`` is
one connection's segment of it: columns ``SEG_START`` .. ``SEG_MAX_PACKET`` are given
(where its unread bytes start and end, its protocol level, ``mqtt.max_packet_bytes``), the
kernel writes the others (``SEG_POS``: where its first unframed byte is; ``SEG_FIRST`` and
``SEG_COUNT``: its rows of ``out``; ``SEG_ERROR``, ``SEG_AUX1``, ``SEG_AUX2``: its first
error, 0 for none). One row of ``out`` per framed packet (``OUT_*`` columns, absolute
offsets into ``buf``):

- ``KIND_PUBLISH``: a PUBLISH without 5.0 properties (3.1.1, or a property length of 0):
  flags checked (QoS 3, DUP at QoS 0), topic as well-formed UTF-8 without U+0000 (Python's
  strict decoder: no overlong forms, surrogates or code points above U+10FFFF), a non-zero
  packet id at QoS 1/2, payload offsets;
- ``KIND_PUBLISH_PROPS``: the same, 5.0, with a property length that is not the one byte
  0: ``OUT_PROPS`` is where the properties' length starts; Python reads them (codec.py);
- ``KIND_ACK``: PUBACK/PUBREC/PUBREL/PUBCOMP: fixed-header flags (0010 for PUBREL, else
  0), a non-zero packet id, the 5.0 reason code among those MQTT defines for it, no
  trailing bytes; with 5.0 properties after the reason it is ``KIND_SLOW`` instead;
- ``KIND_SLOW``: any other packet, framed only (``codec.decode`` takes it).

A segment stops at its first error (its packets before it are framed), when its bytes end
in an incomplete packet, after a CONNECT (the protocol level it sets decides how the next
packets decode), or when ``out`` is full. Errors are those ``codec`` gives (fastcodec.py
maps each to its ``Refusal``): ``ERR_RESERVED_TYPE``, ``ERR_REMAINING_LENGTH`` and
``ERR_OVERSIZE`` as soon as the fixed header shows them (before the body arrives), the
others once the packet is complete.
"""

from __future__ import annotations

import numba
import numpy as np

SEG_START, SEG_END, SEG_VERSION, SEG_MAX_PACKET, SEG_POS, SEG_FIRST, SEG_COUNT, SEG_ERROR, \
    SEG_AUX1, SEG_AUX2 = range(10)
SEG_COLUMNS = 10
OUT_KIND, OUT_FIRST, OUT_BODY, OUT_END, OUT_TOPIC, OUT_TOPIC_END, OUT_PACKET_ID, OUT_PAYLOAD, \
    OUT_PROPS, OUT_REASON = range(10)
OUT_COLUMNS = 10

KIND_SLOW, KIND_PUBLISH, KIND_PUBLISH_PROPS, KIND_ACK = range(4)

(ERR_NONE, ERR_RESERVED_TYPE, ERR_REMAINING_LENGTH, ERR_OVERSIZE, ERR_QOS3, ERR_DUP_QOS0,
 ERR_TRUNCATED, ERR_UTF8, ERR_NUL, ERR_PUBLISH_ID0, ERR_ACK_FLAGS, ERR_ACK_ID0,
 ERR_ACK_REASON, ERR_TRAILING) = range(14)
FRAMING_ERRORS = (ERR_RESERVED_TYPE, ERR_REMAINING_LENGTH, ERR_OVERSIZE)
"""Errors found in the fixed header: the packet is not taken (not counted as a packet in)."""

V5 = 5


@numba.njit(cache=True, nogil=True)
def _utf8_error(buf, start, end):
    """0 when buf[start:end] is well-formed UTF-8 without U+0000, else ERR_UTF8 (malformed:
    takes precedence, as codec.py decodes first) or ERR_NUL."""
    nul = False
    i = start
    while i < end:
        b = buf[i]
        if b < 0x80:
            if b == 0:
                nul = True
            i += 1
            continue
        if 0xC2 <= b <= 0xDF:
            if i + 1 >= end or buf[i + 1] & 0xC0 != 0x80:
                return ERR_UTF8
            i += 2
            continue
        if 0xE0 <= b <= 0xEF:
            if i + 2 >= end:
                return ERR_UTF8
            c = buf[i + 1]
            lo, hi = 0x80, 0xBF
            if b == 0xE0:
                lo = 0xA0
            elif b == 0xED:
                hi = 0x9F
            if c < lo or c > hi or buf[i + 2] & 0xC0 != 0x80:
                return ERR_UTF8
            i += 3
            continue
        if 0xF0 <= b <= 0xF4:
            if i + 3 >= end:
                return ERR_UTF8
            c = buf[i + 1]
            lo, hi = 0x80, 0xBF
            if b == 0xF0:
                lo = 0x90
            elif b == 0xF4:
                hi = 0x8F
            if c < lo or c > hi or buf[i + 2] & 0xC0 != 0x80 or buf[i + 3] & 0xC0 != 0x80:
                return ERR_UTF8
            i += 4
            continue
        return ERR_UTF8
    return ERR_NUL if nul else 0


@numba.njit(cache=True, nogil=True)
def _ack_reason_ok(ptype, reason):
    """The reason codes MQTT 5.0 defines for each acknowledgement (codec._ACK_REASONS)."""
    if ptype == 4 or ptype == 5:  # PUBACK, PUBREC
        return (reason == 0x00 or reason == 0x10 or reason == 0x80 or reason == 0x83
                or reason == 0x87 or reason == 0x90 or reason == 0x91 or reason == 0x97
                or reason == 0x99)
    return reason == 0x00 or reason == 0x92  # PUBREL, PUBCOMP


@numba.njit(cache=True, nogil=True)
def _decode_publish(buf, first, body, end, version, row):
    """Fill ``row`` for the PUBLISH at buf[body:end]; returns (error, aux1, aux2)."""
    flags = first & 0x0F
    qos = (flags >> 1) & 0x03
    if qos == 3:
        return ERR_QOS3, 0, 0
    if flags & 0x08 and qos == 0:
        return ERR_DUP_QOS0, 0, 0
    if end - body < 2:
        return ERR_TRUNCATED, 2, end - body
    tlen = (np.int64(buf[body]) << 8) | np.int64(buf[body + 1])
    topic = body + 2
    if topic + tlen > end:
        return ERR_TRUNCATED, tlen, end - topic
    topic_end = topic + tlen
    err = _utf8_error(buf, topic, topic_end)
    if err:
        return err, 0, 0
    pos = topic_end
    packet_id = 0
    if qos:
        if end - pos < 2:
            return ERR_TRUNCATED, 2, end - pos
        packet_id = (np.int64(buf[pos]) << 8) | np.int64(buf[pos + 1])
        if packet_id == 0:
            return ERR_PUBLISH_ID0, 0, 0
        pos += 2
    row[OUT_TOPIC] = topic
    row[OUT_TOPIC_END] = topic_end
    row[OUT_PACKET_ID] = packet_id
    row[OUT_PROPS] = -1
    row[OUT_KIND] = KIND_PUBLISH
    if version == V5:
        if pos < end and buf[pos] == 0:
            pos += 1
        else:  # properties (or a bad or missing length): read in Python
            row[OUT_KIND] = KIND_PUBLISH_PROPS
            row[OUT_PROPS] = pos
    row[OUT_PAYLOAD] = pos
    return 0, 0, 0


@numba.njit(cache=True, nogil=True)
def _decode_ack(buf, first, body, end, version, row):
    """Fill ``row`` for the PUBACK/PUBREC/PUBREL/PUBCOMP at buf[body:end]."""
    ptype = first >> 4
    flags = first & 0x0F
    want = 0b0010 if ptype == 6 else 0
    if flags != want:
        return ERR_ACK_FLAGS, ptype, flags
    if end - body < 2:
        return ERR_TRUNCATED, 2, end - body
    packet_id = (np.int64(buf[body]) << 8) | np.int64(buf[body + 1])
    if packet_id == 0:
        return ERR_ACK_ID0, ptype, 0
    pos = body + 2
    reason = 0
    row[OUT_KIND] = KIND_ACK
    if version == V5 and pos < end:
        reason = np.int64(buf[pos])
        if not _ack_reason_ok(ptype, reason):
            return ERR_ACK_REASON, ptype, reason
        pos += 1
        if pos < end:  # properties after the reason: codec.decode reads the packet
            row[OUT_KIND] = KIND_SLOW
            return 0, 0, 0
    if pos < end:
        return ERR_TRAILING, end - pos, ptype
    row[OUT_PACKET_ID] = packet_id
    row[OUT_REASON] = reason
    return 0, 0, 0


@numba.njit(cache=True, nogil=True)
def _frame_segment(buf, pos, end, version, max_packet, out, nout):
    """Frame and decode buf[pos:end] into rows ``nout`` on of ``out``; returns (the rows
    filled now, where the first unframed byte is, error, aux1, aux2)."""
    capacity = out.shape[0]
    count = 0
    err, aux1, aux2 = 0, 0, 0
    while pos < end and nout < capacity:
        first = np.int64(buf[pos])
        if first >> 4 == 0:  # reserved: refused before a length that may never end
            err = ERR_RESERVED_TYPE
            break
        length = 0
        shift = 0
        used = 0
        complete = False
        avail = end - pos - 1
        n = 4 if avail > 4 else avail
        for i in range(n):
            b = np.int64(buf[pos + 1 + i])
            length |= (b & 0x7F) << shift
            if not b & 0x80:
                used = i + 1
                complete = True
                break
            shift += 7
        if not complete:
            if avail >= 4:
                err = ERR_REMAINING_LENGTH
            break
        if 1 + used + length > max_packet:
            err = ERR_OVERSIZE
            aux1 = length
            break
        body = pos + 1 + used
        packet_end = body + length
        if packet_end > end:
            break
        row = out[nout]
        row[OUT_KIND] = KIND_SLOW
        row[OUT_FIRST] = first
        row[OUT_BODY] = body
        row[OUT_END] = packet_end
        ptype = first >> 4
        if ptype == 3:
            err, aux1, aux2 = _decode_publish(buf, first, body, packet_end, version, row)
        elif 4 <= ptype <= 7:
            err, aux1, aux2 = _decode_ack(buf, first, body, packet_end, version, row)
        if err:  # the malformed packet is taken (counted in), not returned as a row
            pos = packet_end
            break
        nout += 1
        count += 1
        pos = packet_end
        if ptype == 1:  # CONNECT: the level it sets decides how the next ones decode
            break
    return count, pos, err, aux1, aux2


@numba.njit(cache=True, nogil=True)
def frame_packets(buf, segs, out):
    """Frame and decode every segment's complete packets (module docstring); returns the
    number of rows of ``out`` filled."""
    nout = 0
    for s in range(segs.shape[0]):
        segs[s, SEG_FIRST] = nout
        count, pos, err, aux1, aux2 = _frame_segment(
            buf, segs[s, SEG_START], segs[s, SEG_END], segs[s, SEG_VERSION],
            segs[s, SEG_MAX_PACKET], out, nout)
        nout += count
        segs[s, SEG_POS] = pos
        segs[s, SEG_COUNT] = count
        segs[s, SEG_ERROR] = err
        segs[s, SEG_AUX1] = aux1
        segs[s, SEG_AUX2] = aux2
    return nout


@numba.njit(cache=True, nogil=True)
def frame_one(buf, start, end, version, max_packet, out):
    """One connection's segment (``frame_packets`` without the segment table: a read of one
    connection pays less to call it); returns (rows filled, where the first unframed byte
    is, error, aux1, aux2)."""
    return _frame_segment(buf, start, end, version, max_packet, out, 0)


def warm_up() -> None:
    """Compile (or load from numba's cache) ``frame_packets`` for the arrays the edge passes
    it: a bytearray's writable view, int64 tables, ints."""
    buf = np.frombuffer(bytearray(b"\x30\x05\x00\x01a\x00\x00\x40\x02\x00\x01"), np.uint8)
    segs = np.zeros((1, SEG_COLUMNS), np.int64)
    segs[0, SEG_END] = len(buf)
    segs[0, SEG_VERSION] = V5
    segs[0, SEG_MAX_PACKET] = 1 << 20
    out = np.zeros((4, OUT_COLUMNS), np.int64)
    frame_packets(buf, segs, out)
    frame_one(buf, 0, len(buf), V5, 1 << 20, out)
