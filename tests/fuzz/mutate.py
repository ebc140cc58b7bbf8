"""Mutations: bytes, frames that know where their length fields are, and JSON documents.

``Mutator.frame`` stacks one to four byte-level operators on a frame (cheap: the live
fuzzer's hot loop): bit flips, a byte set to a boundary value, a length or count field set to
0, its maximum, one off or a random value, a header or entry field replaced, truncation,
extension, a chunk duplicated or deleted, two frames spliced or concatenated, random bytes.
Afterwards it often sets ``frame_len`` to the datagram's length, so that a mutation deep in a
body is not refused at the first length check. ``Mutator.control`` mutates the JSON document
of a CONTROL entry and encodes the frame again around it, so the document reaches its schema.
``Mutator.json`` changes types, nests, enlarges and truncates documents; ``Mutator.text`` and
``Mutator.blob`` mutate texts and files.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import json
import random
import struct
from typing import Any

from datapath.config import MAX_FRAME_BYTES
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol.codec import decode_frame, encode_admin
from datapath.protocol.errors import ProtocolError

BOUNDARY_BYTES = (0x00, 0x01, 0x07, 0x08, 0x7F, 0x80, 0xFE, 0xFF)
INTERESTING = (0, 1, 2, 7, 8, 31, 32, 39, 40, 63, 64, 127, 128, 255, 256, 1_023, 1_024,
               1_472, 4_095, 4_096, 32_767, 32_768, 65_503, 65_504, 65_535, 65_536,
               2**31 - 1, 2**31, 2**32 - 1)
JSON_ATOMS: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63,
    2**64 - 1, 2**64, -(2**63) - 1, 10**400, 1.5, -0.0, 1e308, "", "x", "#", "a/#", "+/+",
    "/", "a//b", "\x00", "\ud800", "\u20ac" * 64, "x" * 300, "x" * 70_000, [], {}, [[]], {"": {}},
)
CONTROL_MUTANT_MAX_BYTES = 8_192
"""``Mutator.control`` leaves larger frames alone: their documents were made large by earlier
mutations (parsing and writing them again costs milliseconds); they are sent as they are."""
MAX_REPEAT_CHARS = 1_000_000
"""A list repeated by the JSON mutator stays under this many characters of JSON (nested
repeats multiply: a CI run's mutator once grew a document past 24 GB)."""
KEYS = ("origin", "name", "epoch", "seq", "links", "patterns", "guaranteed", "pm", "version",
        "identities", "publish", "subscribe", "anonymous", "namespaces", "schemas", "routes",
        "backups", "duplicate", "identity", "ring", "token", "accepted", "session", "node",
        "node_id", "reason", "request", "sub_id", "pattern", "topic", "namespace", "keys", "ts",
        "id", "fields", "x")


def _offsets(fmt: str) -> list[tuple[int, int]]:
    """(offset, size) of each member of a big-endian struct format."""
    out, pos = [], 0
    for ch in fmt.lstrip(">"):
        size = struct.calcsize(">" + ch)
        out.append((pos, size))
        pos += size
    return out


_LAYOUT_FIELDS = {t: _offsets(layout.entry_struct.format)
                  for t, layout in al.ADMIN_LAYOUTS.items()}
_HEADER_FIELDS = _offsets(fl.FRAME_HEADER_STRUCT.format)
"""magic, version, type, flags, msg_count, frame_len, source, dest, stream, send_ts."""


def length_fields(buf: bytes | bytearray) -> list[tuple[int, int]]:
    """(offset, size) of the count and length fields of a frame, walked without trusting it
    (best effort: stops where the walk leaves the buffer)."""
    n = len(buf)
    if n < fl.FRAME_HEADER_BYTES:
        return [(o, s) for o, s in _HEADER_FIELDS[4:6] if o + s <= n]
    out = [(fl.MSG_COUNT_OFFSET, 2), (fl.FRAME_LEN_OFFSET, 4)]
    ftype = buf[fl.TYPE_OFFSET]
    count = int.from_bytes(buf[6:8], "big")
    pos = fl.FRAME_HEADER_BYTES
    if ftype in (fl.FrameType.DATA, fl.FrameType.RETRANSMISSION):
        for _ in range(min(count, 64)):
            if pos + ml.MESSAGE_HEADER_BYTES > n:
                break
            out += [(pos + ml.PAYLOAD_LEN_OFFSET, 4), (pos + ml.TOPIC_LEN_OFFSET, 2)]
            plen = int.from_bytes(buf[pos + 32:pos + 36], "big")
            tlen = int.from_bytes(buf[pos + 36:pos + 38], "big")
            pos += ml.message_bytes(plen, tlen)
        return out
    try:
        layout = al.ADMIN_LAYOUTS[fl.FrameType(ftype)]
    except (ValueError, KeyError):
        return out
    if layout.body_header is not None:
        pos += layout.body_header.size
    fields = _LAYOUT_FIELDS[fl.FrameType(ftype)]
    for _ in range(min(count, 64)):
        if pos + layout.entry_struct.size > n:
            break
        texts = 0
        for name, (off, size) in zip(layout.fields, fields):
            if name.endswith("_len"):
                out.append((pos + off, size))
                texts += int.from_bytes(buf[pos + off:pos + off + size], "big")
        pos += layout.entry_struct.size + fl.align8(texts)
    return out


class Mutator:
    """Mutations drawn from ``rng`` (a seeded ``random.Random``: runs are reproducible)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._ops = [
            (self._flip, 14), (self._boundary, 10), (self._length, 16), (self._header, 8),
            (self._truncate, 8), (self._extend, 5), (self._dup_chunk, 4), (self._delete, 4),
            (self._splice, 4), (self._concat, 3), (self._random, 2), (self._entry_field, 8),
        ]
        self._cum = list(itertools.accumulate(w for _, w in self._ops))
        self._fns = [f for f, _ in self._ops]

    # --- frames ---------------------------------------------------------------------------------
    def frame(self, data: bytes, pool: list[bytes], fix_len: float = 0.5) -> bytes:
        """One mutant of ``data`` (``pool``: other frames to splice with): one to four
        byte-level operators (cheap: the live fuzzer's hot loop)."""
        rng = self.rng
        buf = bytearray(data)
        cum, top = self._cum, self._cum[-1]
        for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
            buf = self._fns[bisect.bisect_right(cum, rng.random() * top)](buf, pool)
        if len(buf) >= fl.FRAME_LEN_OFFSET + 4 and rng.random() < fix_len:
            if rng.random() < 0.5:
                buf += bytes(-len(buf) % 8)
            struct.pack_into(">I", buf, fl.FRAME_LEN_OFFSET, len(buf))
        if len(buf) > MAX_FRAME_BYTES:
            del buf[MAX_FRAME_BYTES:]
        return bytes(buf)

    def control(self, data: bytes) -> bytes | None:
        """A CONTROL frame whose entry's document (or kind) is mutated, encoded again around
        it with its header fields (an auth trailer kept, to be signed again by the sender):
        valid framing, so the document reaches its schema. None: ``data`` is not a CONTROL
        frame that decodes, or the mutant does not fit a frame."""
        if len(data) > CONTROL_MUTANT_MAX_BYTES:
            return None
        try:
            frame = decode_frame(data)
        except ProtocolError:
            return None
        h = frame.header
        if h.frame_type is not fl.FrameType.CONTROL:
            return None
        body, entries = frame.admin()
        rng = self.rng
        i = rng.randrange(len(entries))
        kind = entries[i].kind
        if rng.random() < 0.1:
            kind = rng.choice(list(al.ControlKind))
        entries[i] = al.Control(kind, self.document(entries[i].document))
        if rng.random() < 0.1:
            entries.append(entries[i])
        auth = (frame.auth.key_id, frame.auth.epoch, frame.auth.auth_seq) if frame.auth else None
        try:
            return bytes(encode_admin(h.frame_type, entries, body_header=body,
                                      source_session=h.source_session,
                                      dest_session=h.dest_session, stream_id=h.stream_id,
                                      send_ts_ns=h.send_ts_ns, auth=auth))
        except ValueError:  # too large for a frame, or text that is not UTF-8
            return None

    def _flip(self, buf: bytearray, _pool: list) -> bytearray:
        if buf:
            for _ in range(self.rng.choice((1, 1, 2, 4, 8))):
                buf[self.rng.randrange(len(buf))] ^= 1 << self.rng.randrange(8)
        return buf

    def _boundary(self, buf: bytearray, _pool: list) -> bytearray:
        if buf:
            buf[self.rng.randrange(len(buf))] = self.rng.choice(BOUNDARY_BYTES)
        return buf

    def _int_for(self, size: int, current: int, datagram: int) -> int:
        rng = self.rng
        top = (1 << (8 * size)) - 1
        choice = rng.random()
        if choice < 0.5:
            value = rng.choice((0, 1, top, top - 1, current + 1, current - 1, current + 8,
                                current - 8, datagram, datagram - fl.FRAME_HEADER_BYTES,
                                current * 2))
        elif choice < 0.8:
            value = rng.choice(INTERESTING)
        else:
            value = rng.randrange(top + 1)
        return value & top

    def _length(self, buf: bytearray, _pool: list) -> bytearray:
        fields = length_fields(buf)
        if not fields:
            return self._flip(buf, _pool)
        off, size = self.rng.choice(fields)
        current = int.from_bytes(buf[off:off + size], "big")
        buf[off:off + size] = self._int_for(size, current, len(buf)).to_bytes(size, "big")
        return buf

    def _entry_field(self, buf: bytearray, _pool: list) -> bytearray:
        """A fixed field of an admin entry or a message header (enums, ids, sequences)."""
        if len(buf) < fl.FRAME_HEADER_BYTES + 8:
            return self._boundary(buf, _pool)
        ftype = buf[fl.TYPE_OFFSET]
        if ftype in (fl.FrameType.DATA, fl.FrameType.RETRANSMISSION):
            fields = _offsets(ml.MESSAGE_HEADER_STRUCT.format)
        else:
            try:
                fields = _LAYOUT_FIELDS[fl.FrameType(ftype)]
            except (ValueError, KeyError):
                return self._boundary(buf, _pool)
        off, size = self.rng.choice(fields)
        off += fl.FRAME_HEADER_BYTES
        if off + size > len(buf):
            return buf
        current = int.from_bytes(buf[off:off + size], "big")
        buf[off:off + size] = self._int_for(size, current, len(buf)).to_bytes(size, "big")
        return buf

    def _header(self, buf: bytearray, _pool: list) -> bytearray:
        if len(buf) < fl.FRAME_HEADER_BYTES:
            return self._boundary(buf, _pool)
        rng = self.rng
        index = rng.choice((1, 2, 2, 2, 3, 3, 4, 6, 7, 8, 8))
        off, size = _HEADER_FIELDS[index]
        if index == 2:  # frame type: any type, or one past the last
            value = rng.randrange(0, fl.MAX_FRAME_TYPE + 3)
        elif index == 3:  # flags: the auth bit, or a reserved one
            value = rng.choice((0, 1, 2, 0x8000, 0xFFFF))
        else:
            value = self._int_for(size, int.from_bytes(buf[off:off + size], "big"), len(buf))
        buf[off:off + size] = value.to_bytes(size, "big")
        return buf

    def _truncate(self, buf: bytearray, _pool: list) -> bytearray:
        if len(buf) > 1:
            cut = self.rng.choice((self.rng.randrange(1, len(buf)), len(buf) - 8,
                                   len(buf) - 1, fl.FRAME_HEADER_BYTES,
                                   fl.FRAME_HEADER_BYTES - 1, 8))
            del buf[max(cut, 0):]
        return buf

    def _extend(self, buf: bytearray, _pool: list) -> bytearray:
        rng = self.rng
        n = rng.choice((1, 7, 8, 16, 40, rng.randrange(1, 2_000)))
        buf += bytes(n) if rng.random() < 0.5 else rng.randbytes(n)
        return buf

    def _dup_chunk(self, buf: bytearray, _pool: list) -> bytearray:
        if len(buf) > 1:
            a = self.rng.randrange(len(buf))
            b = min(len(buf), a + self.rng.choice((8, 16, 40, 64, len(buf))))
            at = self.rng.randrange(len(buf) + 1)
            buf[at:at] = buf[a:b] * self.rng.choice((1, 1, 2, 16))
        return buf

    def _delete(self, buf: bytearray, _pool: list) -> bytearray:
        if len(buf) > 1:
            a = self.rng.randrange(len(buf))
            del buf[a:a + self.rng.choice((1, 4, 8, 40))]
        return buf

    def _splice(self, buf: bytearray, pool: list) -> bytearray:
        other = self.rng.choice(pool) if pool else bytes(buf)
        a = self.rng.randrange(len(buf) + 1)
        b = self.rng.randrange(len(other) + 1)
        return bytearray(buf[:a] + other[b:])

    def _concat(self, buf: bytearray, pool: list) -> bytearray:
        other = self.rng.choice(pool) if pool else bytes(buf)
        return bytearray(buf + other)

    def _random(self, buf: bytearray, _pool: list) -> bytearray:
        rng = self.rng
        n = rng.choice((1, 8, 31, 32, 33, 40, 64, rng.randrange(1, 512)))
        data = bytearray(rng.randbytes(n))
        if n >= 4 and rng.random() < 0.7:  # the magic and version: past the first check
            data[0:3] = b"TW\x01"
            data[3] = rng.randrange(0, fl.MAX_FRAME_TYPE + 2)
        return data

    # --- JSON -----------------------------------------------------------------------------------
    def document(self, text: str) -> str:
        """A mutant of a JSON document: the value mutated structurally, then (sometimes) the
        text itself."""
        rng = self.rng
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return self.text(text)
        for _ in range(rng.choice((1, 1, 2, 3))):
            value = self.json(value)
        try:
            out = json.dumps(value, ensure_ascii=rng.random() < 0.5,
                             separators=rng.choice(((",", ":"), (", ", ": "))))
        except (ValueError, RecursionError):
            out = text
        return self.text(out) if rng.random() < 0.15 else out

    def _atom(self) -> Any:
        """One of JSON_ATOMS (a fresh copy: documents never share a mutable part)."""
        atom = self.rng.choice(JSON_ATOMS)
        return copy.deepcopy(atom) if isinstance(atom, (list, dict)) else atom

    def json(self, value: Any, depth: int = 0) -> Any:
        """One structural mutation somewhere in ``value``."""
        rng = self.rng
        if depth < 6 and isinstance(value, dict) and value and rng.random() < 0.7:
            key = rng.choice(list(value))
            r = rng.random()
            if r < 0.6:
                value[key] = self.json(value[key], depth + 1)
            elif r < 0.75:
                del value[key]
            elif r < 0.9:
                value[rng.choice(KEYS)] = self._atom()
            else:
                value[key + rng.choice(("", "x", "\u20ac"))] = value.pop(key)
            return value
        if depth < 6 and isinstance(value, list) and value and rng.random() < 0.7:
            i = rng.randrange(len(value))
            r = rng.random()
            if r < 0.6:
                value[i] = self.json(value[i], depth + 1)
            elif r < 0.75:
                del value[i]
            elif r < 0.9:
                try:
                    value.append(copy.deepcopy(value[i]) if rng.random() < 0.5
                                 else self._atom())
                except RecursionError:
                    pass
            else:
                try:
                    text = json.dumps(value)
                    k = min(rng.choice((2, 100, 2_000)), max(1, 20_000 // len(value)),
                            max(1, MAX_REPEAT_CHARS // max(len(text), 1)))
                    value = json.loads("[" + ",".join([text[1:-1]] * k) + "]")
                except (ValueError, RecursionError):
                    pass
            return value
        r = rng.random()
        if r < 0.45:
            return self._atom()
        if r < 0.6:  # nested
            inner = value
            for _ in range(rng.choice((1, 2, 10, 100, 1_200))):
                inner = [inner] if rng.random() < 0.5 else {"x": inner}
            return inner
        if isinstance(value, str):
            k = min(rng.choice((2, 50, 5_000)), max(1, 70_000 // max(len(value), 1)))
            return rng.choice((value * k, value + "/#", value + "\x00",
                               value[: len(value) // 2], "+/" + value, value + "\u20ac"))
        if isinstance(value, bool):
            return not value
        if isinstance(value, int):
            return rng.choice((value + 1, value - 1, -value, value * 2**32,
                               float(value) if abs(value) < 2**1000 else 1e308))
        return [value] if rng.random() < 0.5 else {rng.choice(KEYS): value}

    # --- texts and files ------------------------------------------------------------------------
    def text(self, text: str) -> str:
        rng = self.rng
        r = rng.random()
        if not text:
            return rng.choice(("{", "[", '"', "NaN", "\x00", "-"))
        i = rng.randrange(len(text) + 1)
        if r < 0.25:
            return text[:i]
        if r < 0.5:
            return text[:i] + rng.choice(("{", "}", "[", "]", '"', ",", ":", "\\", "\\u", "\x00",
                                          "NaN", "Infinity", "-", "1e999", "9" * 5_000, "\n",
                                          "=", "'''", "[[", "#", "\ud800", "\u20ac")) + text[i:]
        if r < 0.7:
            j = min(len(text), i + rng.randrange(1, 32))
            return text[:i] + text[j:]
        if r < 0.85:
            j = min(len(text), i + rng.randrange(1, 64))
            k = rng.choice((2, 3, 200)) if len(text) < 100_000 else 1
            return text[:i] + text[i:j] * k + text[j:]
        chars = list(text)
        for _ in range(rng.randrange(1, 4)):
            k = rng.randrange(len(chars))
            chars[k] = chr(rng.choice((0, 0x22, 0x5C, 0x7F, 0xA0, 0xFFFD, rng.randrange(0x20, 0x7F),
                                       rng.randrange(0x80, 0x3000))))
        return "".join(chars)

    def blob(self, data: bytes) -> bytes:
        """A mutant of a file (registry, capture): bit flips, boundary bytes, truncation,
        chunks duplicated or removed, 32-bit fields set to interesting values."""
        rng = self.rng
        buf = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 4))):
            r = rng.random()
            if not buf:
                buf += rng.randbytes(8)
            elif r < 0.3:
                buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
            elif r < 0.45:
                buf[rng.randrange(len(buf))] = rng.choice(BOUNDARY_BYTES)
            elif r < 0.6 and len(buf) >= 4:
                at = rng.randrange(len(buf) - 3)
                buf[at:at + 4] = (rng.choice(INTERESTING) & 0xFFFFFFFF).to_bytes(
                    4, rng.choice(("big", "little")))
            elif r < 0.7:
                del buf[rng.randrange(len(buf)):]
            elif r < 0.85:
                a = rng.randrange(len(buf))
                b = min(len(buf), a + rng.randrange(1, 256))
                at = rng.randrange(len(buf) + 1)
                buf[at:at] = buf[a:b]
            else:
                a = rng.randrange(len(buf))
                del buf[a:a + rng.randrange(1, 64)]
        return bytes(buf)
