"""codec.py's framing as the MQTT connection's read loop did it before the compiled kernel,
and the kernel fed read by read as the connection feeds it: the differential test
(test_fastcodec.py) and the decoder fuzzer's ``mqtt`` target (tests/fuzz/decoders.py) hold
the second to the first."""

from __future__ import annotations

from appliance.edge.mqtt import codec, fastcodec
from appliance.edge.mqtt.codec import Reason, Refusal


def reference(data: bytes, version: int, max_packet: int) -> tuple[list, int, Refusal | None]:
    """What the connection's read loop made of ``data`` with codec.py alone: its packets in
    order (a decode refusal last), the bytes taken, and the fixed-header refusal that stopped
    it."""
    pos, out = 0, []
    while pos < len(data):
        first = data[pos]
        if first >> 4 == 0:
            return out, pos, codec.decode(first, b"", version)
        got = codec.read_remaining_length(data[pos + 1:pos + 5])
        if got is None:
            break
        if isinstance(got, Refusal):
            return out, pos, got
        length, used = got
        if 1 + used + length > max_packet:
            return out, pos, Refusal("oversize", Reason.PACKET_TOO_LARGE,
                                     f"{length} bytes announced")
        end = pos + 1 + used + length
        if end > len(data):
            break
        pkt = codec.decode(first, data[pos + 1 + used:end], version)
        out.append(pkt)
        pos = end
        if isinstance(pkt, Refusal):
            break
    return out, pos, None


def compiled(chunks: list[bytes], version: int, max_packet: int,
             rows: int = fastcodec.ROWS) -> tuple[list, int, Refusal | None]:
    """The same through ``Framer.take``, fed read by read as the connection feeds it."""
    framer = fastcodec.Framer(max_packet, rows)
    buf, pos, taken, out = bytearray(), 0, 0, []
    for chunk in chunks:
        del buf[:pos]
        taken += pos
        pos = 0
        buf += chunk
        while True:
            before = len(out)
            pos, stop = framer.take(buf, pos, version, out)
            if stop is not None:
                return out, taken + pos, stop
            if out and isinstance(out[-1], Refusal):
                return out, taken + pos, None
            if len(out) == before:
                break
    return out, taken + pos, None
