"""The hot path's packets decoded by a compiled kernel: every complete packet of a buffer in
one call, the Python objects made from its offsets.

``Framer.take(buf, pos, version, into)`` runs ``_kernels.frame_one`` over ``buf[pos:]`` (one
connection's segment; ``frame_segments`` takes many in one call), appends to ``into``
each complete packet in order, as ``codec`` would decode it (a ``Publish``, an ``Ack``, or
for any other type ``codec.decode``'s packet or ``Refusal``), and returns where the first
unframed byte is and the fixed-header error that stopped it (a ``Refusal``, else None). A
malformed packet's refusal is appended in its place (nothing after it): the same reason and
reason code ``codec.decode`` gives (tests/edge/test_fastcodec.py holds the two to each other
over random packets and every split of a stream). 5.0 PUBLISH properties, when a PUBLISH
has any, are read in Python (``codec``'s reader, from the offset the kernel gives).
"""

from __future__ import annotations

import numpy as np

from appliance.edge.mqtt import _kernels as K
from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import Ack, PacketType, Publish, Reason, Refusal

ROWS = 256
"""Packets one kernel call frames at most per connection (the rest in the next call)."""

_TYPES = {int(t): t for t in PacketType}


def refusal(err: int, aux1: int, aux2: int) -> Refusal:
    """The ``Refusal`` codec.py gives for the kernel's error ``err`` (with its details)."""
    if err == K.ERR_RESERVED_TYPE:
        return Refusal("bad_packet_type", Reason.MALFORMED, "packet type 0 is reserved")
    if err == K.ERR_REMAINING_LENGTH:
        return Refusal("bad_remaining_length", Reason.MALFORMED,
                       "a remaining length longer than 4 bytes")
    if err == K.ERR_OVERSIZE:
        return Refusal("oversize", Reason.PACKET_TOO_LARGE, f"{aux1} bytes announced")
    if err == K.ERR_QOS3:
        return Refusal("bad_qos", Reason.MALFORMED, "PUBLISH with QoS 3")
    if err == K.ERR_DUP_QOS0:
        return Refusal("bad_flags", Reason.MALFORMED, "PUBLISH with DUP set at QoS 0")
    if err == K.ERR_TRUNCATED:
        return Refusal("truncated", Reason.MALFORMED, f"{aux1} bytes wanted, {aux2} left")
    if err == K.ERR_UTF8:
        return Refusal("bad_utf8", Reason.MALFORMED, "a string that is not well-formed UTF-8")
    if err == K.ERR_NUL:
        return Refusal("bad_utf8", Reason.MALFORMED, "a string holding U+0000")
    if err == K.ERR_PUBLISH_ID0:
        return Refusal("bad_packet_id", Reason.PROTOCOL_ERROR, "packet identifier 0")
    if err == K.ERR_ACK_FLAGS:
        return Refusal("bad_flags", Reason.MALFORMED,
                       f"{_TYPES[aux1].name} with fixed-header flags {aux2:04b}")
    if err == K.ERR_ACK_ID0:
        return Refusal("bad_packet_id", Reason.PROTOCOL_ERROR,
                       f"{_TYPES[aux1].name} with packet identifier 0")
    if err == K.ERR_ACK_REASON:
        return Refusal("bad_reason_code", Reason.PROTOCOL_ERROR,
                       f"{_TYPES[aux1].name} with reason code {aux2:#04x}")
    if err == K.ERR_TRAILING:
        return Refusal("trailing_bytes", Reason.MALFORMED,
                       f"{aux1} bytes after the {_TYPES[aux2].name} packet")
    return Refusal("malformed", Reason.MALFORMED, f"kernel error {err}")


def _publish_props(data: bytes, first: int, topic: str, packet_id: int) -> Publish | Refusal:
    """A 5.0 PUBLISH whose properties start ``data`` (the payload follows them)."""
    r = codec._Reader(data)
    try:
        props = r.props("publish")
    except codec._Bad as bad:
        return Refusal(bad.reason, bad.code, str(bad))
    except (ValueError, IndexError, OverflowError) as exc:  # as codec.decode
        return Refusal("malformed", Reason.MALFORMED, f"{type(exc).__name__}: {exc}")
    return _publish(topic, data[r.pos:], first & 0x0F, packet_id, props)


class Framer:
    """The kernel's row table (``take``: the module docstring). ``take`` runs to its end
    without yielding, so one table serves every connection of an event loop."""

    __slots__ = ("out", "max_packet_bytes")

    def __init__(self, max_packet_bytes: int, rows: int = ROWS) -> None:
        self.out = np.zeros((rows, K.OUT_COLUMNS), np.int64)
        self.max_packet_bytes = max_packet_bytes

    def take(self, buf: bytearray, pos: int, version: int,
             into: list) -> tuple[int, Refusal | None]:
        view = np.frombuffer(buf, np.uint8)
        try:
            n, pos, err, aux1, aux2 = K.frame_one(view, pos, len(buf), version,
                                                  self.max_packet_bytes, self.out)
        finally:
            del view  # (a bytearray with a view cannot grow)
        return _packets(buf, self.out[:n].tolist() if n else [], version, into,
                        pos, err, aux1, aux2)


def _packets(buf: bytes | bytearray, rows: list[list[int]], version: int, into: list,
             pos: int, err: int, aux1: int, aux2: int) -> tuple[int, Refusal | None]:
    """One segment's result (``Framer.take``'s): its ``rows`` as packets into ``into``, then
    the kernel's error ``err``: a fixed-header one returned (the connection stops there),
    another appended as its packet's ``Refusal``; where its first unframed byte is."""
    if rows:
        refused_at = objects(buf, rows, version, into)
        if refused_at >= 0:  # a packet decoded in Python was refused: the end
            return refused_at, None
    if err:
        if err in K.FRAMING_ERRORS:
            return pos, refusal(err, aux1, aux2)
        into.append(refusal(err, aux1, aux2))
    return pos, None


_FLAGS = [((f >> 1) & 0x03, bool(f & 0x01), bool(f & 0x08)) for f in range(16)]
"""A PUBLISH's fixed-header flags -> (QoS, retain, DUP)."""
_new = object.__new__
_set = object.__setattr__


def _publish(topic: str, payload: bytes, flags: int, packet_id: int, props: list) -> Publish:
    """``Publish(...)`` without the frozen dataclass's ``__init__`` (a field at a time through
    ``object.__setattr__``: 1 us, the largest cost of a decoded PUBLISH; this: 0.4 us)."""
    qos, retain, dup = _FLAGS[flags]
    p = _new(Publish)
    _set(p, "__dict__", {"topic": topic, "payload": payload, "qos": qos, "retain": retain,
                         "dup": dup, "packet_id": packet_id, "props": props})
    return p


def objects(buf: bytes | bytearray, rows: list[list[int]], version: int, into: list) -> int:
    """The packets of the kernel's ``rows`` (``out[:n].tolist()``), appended to ``into`` up
    to the first that Python refuses (5.0 properties, a packet ``codec.decode`` takes):
    where that one ends, else -1."""
    append = into.append
    view = memoryview(buf)
    try:
        for kind, first, body, end, topic, topic_end, packet_id, payload, props, reason in rows:
            if kind == K.KIND_PUBLISH:
                append(_publish(buf[topic:topic_end].decode(), view[payload:end].tobytes(),
                                first & 0x0F, packet_id, []))
            elif kind == K.KIND_ACK:
                append(Ack(_TYPES[first >> 4], packet_id, reason, []))
            else:
                pkt = _publish_props(view[props:end].tobytes(), first,
                                     buf[topic:topic_end].decode(), packet_id) \
                    if kind == K.KIND_PUBLISH_PROPS else \
                    codec.decode(first, view[body:end].tobytes(), version)
                append(pkt)
                if isinstance(pkt, Refusal):
                    return end
        return -1
    finally:
        view.release()


def frame_segments(buf: bytes | bytearray, segments: list[tuple[int, int, int, int]],
                   rows: int = ROWS * 4) -> list[tuple[int, list, Refusal | None]]:
    """Many connections' segments of one buffer in one kernel call: per segment (start, end,
    protocol level, max packet bytes), where its first unframed byte is, its packets (as
    ``Framer.take`` appends them) and its fixed-header refusal (None)."""
    segs = np.zeros((len(segments), K.SEG_COLUMNS), np.int64)
    for i, (start, end, version, max_packet) in enumerate(segments):
        segs[i, :4] = (start, end, version, max_packet)
    out = np.zeros((rows, K.OUT_COLUMNS), np.int64)
    view = np.frombuffer(buf, np.uint8)
    if view.flags.writeable is False:  # (one signature: the edge passes bytearrays)
        view = view.copy()
    n = K.frame_packets(view, segs, out)
    del view
    table = out[:n].tolist()
    result = []
    for i, (_, _, version, _) in enumerate(segments):
        first, count, pos, err, aux1, aux2 = (int(v) for v in segs[i, [
            K.SEG_FIRST, K.SEG_COUNT, K.SEG_POS, K.SEG_ERROR, K.SEG_AUX1, K.SEG_AUX2]])
        packets: list = []
        pos, stop = _packets(buf, table[first:first + count], version, packets, pos, err,
                             aux1, aux2)
        result.append((pos, packets, stop))
    return result


def warm_up() -> None:
    """Load (or compile, on a cold cache) the kernel now, not on a client's first packet."""
    K.warm_up()
