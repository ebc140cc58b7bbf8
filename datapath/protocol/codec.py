"""Native protocol v1 codec: the reference decoder, flyweights and frame writers.

``decode_frame`` validates a whole frame and is the executable form of docs/protocol.md's
"malformed frames" table; it raises only ``ProtocolError`` and never reads outside
``[offset, offset + length)``. The numba kernels in ``batch.py`` make the same decisions, in
the same order, over many frames at once (the hot path); this module is for tools, the
control plane and tests.

Hot-path writing goes through ``FrameWriter``: it packs headers in place into a
preallocated buffer with precompiled structs, so appending a message allocates nothing but
the Python ints it is given.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from datapath.config import MAX_FRAME_BYTES, MAX_TOPIC_BYTES
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol.errors import MalformedReason as R
from datapath.protocol.errors import ProtocolError

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """A decoded, validated frame header."""

    frame_type: fl.FrameType
    flags: int
    msg_count: int
    frame_len: int
    source_session: int
    dest_session: int
    stream_id: int
    send_ts_ns: int
    version: int = fl.PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class AuthTrailer:
    key_id: int
    epoch: int
    auth_seq: int
    mac: bytes


class MessageView:
    """Flyweight over one message inside a buffer: wrap it at an offset, read fields in place.

    One instance is reused across a frame's messages by ``Frame.messages()``; copy the fields
    you keep (``snapshot()``), not the view.
    """

    __slots__ = ("_buf", "offset")

    def __init__(self, buf: Buffer | None = None, offset: int = 0) -> None:
        self._buf = buf
        self.offset = offset

    def wrap(self, buf: Buffer, offset: int) -> MessageView:
        self._buf = buf
        self.offset = offset
        return self

    def _u(self, fmt_offset: int, size: int) -> int:
        return int.from_bytes(self._buf[self.offset + fmt_offset : self.offset + fmt_offset + size])

    @property
    def topic_key(self) -> int:
        return self._u(ml.TOPIC_KEY_OFFSET, 8)

    @property
    def sequence(self) -> int:
        return self._u(ml.SEQUENCE_OFFSET, 8)

    @property
    def publish_ts_ns(self) -> int:
        return self._u(ml.PUBLISH_TS_OFFSET, 8)

    @property
    def namespace_id(self) -> int:
        return self._u(ml.NAMESPACE_OFFSET, 4)

    @property
    def schema_id(self) -> int:
        return self._u(ml.SCHEMA_OFFSET, 2)

    @property
    def qos(self) -> int:
        return self._buf[self.offset + ml.QOS_OFFSET]

    @property
    def flags(self) -> int:
        return self._buf[self.offset + ml.MSG_FLAGS_OFFSET]

    @property
    def payload_len(self) -> int:
        return self._u(ml.PAYLOAD_LEN_OFFSET, 4)

    @property
    def topic_len(self) -> int:
        return self._u(ml.TOPIC_LEN_OFFSET, 2)

    @property
    def payload(self) -> memoryview:
        start = self.offset + ml.PAYLOAD_OFFSET
        return memoryview(self._buf)[start : start + self.payload_len]

    @property
    def topic(self) -> str:
        start = self.offset + ml.PAYLOAD_OFFSET + self.payload_len
        return bytes(self._buf[start : start + self.topic_len]).decode("utf-8", "replace")

    @property
    def size(self) -> int:
        return ml.message_bytes(self.payload_len, self.topic_len)

    def extensions(self) -> tuple[memoryview, dict | None, tuple[int, ...] | None]:
        """(application payload, headers or None, segment descriptor or None): the payload
        region split by the HEADERS and SEGMENT flags (``extensions.split``; raises its
        ``ExtensionError`` when they do not parse)."""
        from datapath.protocol.extensions import split

        return split(self.payload, self.flags)

    def snapshot(self) -> dict[str, Any]:
        """The message's fields as a plain dict (copies the payload)."""
        return {
            "topic_key": self.topic_key,
            "sequence": self.sequence,
            "publish_ts_ns": self.publish_ts_ns,
            "namespace_id": self.namespace_id,
            "schema_id": self.schema_id,
            "qos": self.qos,
            "flags": self.flags,
            "payload": bytes(self.payload),
            "topic": self.topic,
        }


@dataclass(frozen=True, slots=True)
class Frame:
    """A validated frame inside a buffer: its header and where its body lies."""

    header: FrameHeader
    buffer: Buffer
    offset: int
    body_end: int
    auth: AuthTrailer | None = None

    @property
    def frame_type(self) -> fl.FrameType:
        return self.header.frame_type

    @property
    def is_message_frame(self) -> bool:
        return self.header.frame_type in fl.MESSAGE_FRAME_TYPES

    def messages(self, view: MessageView | None = None) -> Iterator[MessageView]:
        """Yield one flyweight (reused) positioned at each message in turn."""
        if not self.is_message_frame:
            return
        view = view or MessageView()
        pos = self.offset + fl.FRAME_HEADER_BYTES
        for _ in range(self.header.msg_count):
            view.wrap(self.buffer, pos)
            yield view
            pos += view.size

    def admin(self) -> tuple[dict[str, int], list[Any]]:
        """The admin body: its body-header fields and its entries (dataclasses)."""
        if self.is_message_frame:
            raise ProtocolError(R.UNKNOWN_TYPE, "a message frame has no admin body", self.offset)
        return _walk_admin(self.buffer, self.offset, self.body_end, self.header)

    def signed_bytes(self) -> memoryview:
        """The bytes an authentication MAC covers: everything but the MAC itself."""
        end = self.offset + self.header.frame_len - fl.AUTH_MAC_BYTES
        return memoryview(self.buffer)[self.offset : end]


def _u16(buf: Buffer, at: int) -> int:
    return (buf[at] << 8) | buf[at + 1]


def _u32(buf: Buffer, at: int) -> int:
    return int.from_bytes(buf[at : at + 4])


def decode_header(buf: Buffer, offset: int = 0, length: int | None = None,
                  *, exact: bool = True) -> FrameHeader:
    """Validate and decode the frame header at ``offset``.

    ``length`` is how many bytes belong to this frame's container (a datagram: ``exact``
    requires frame_len == length) or are available (a stream: ``exact=False``).
    """
    available = len(buf) - offset if length is None else length
    if offset < 0 or available < 0 or offset + available > len(buf):
        raise ProtocolError(R.TOO_SHORT, "offset/length outside the buffer", max(offset, 0))
    if available < fl.FRAME_HEADER_BYTES:
        raise ProtocolError(R.TOO_SHORT, f"{available} bytes, a header needs "
                            f"{fl.FRAME_HEADER_BYTES}", offset)
    (magic, version, ftype, flags, count, frame_len, src, dst, stream,
     send_ts) = fl.FRAME_HEADER_STRUCT.unpack_from(buf, offset)
    if magic != fl.FRAME_MAGIC:
        raise ProtocolError(R.BAD_MAGIC, f"magic {magic:#06x}, expected {fl.FRAME_MAGIC:#06x}",
                            offset)
    if version != fl.PROTOCOL_VERSION:
        raise ProtocolError(R.BAD_VERSION, f"version {version}, this receiver speaks "
                            f"{fl.PROTOCOL_VERSION}", offset + fl.VERSION_OFFSET)
    if not 1 <= ftype <= fl.MAX_FRAME_TYPE:
        raise ProtocolError(R.UNKNOWN_TYPE, f"frame type {ftype}", offset + fl.TYPE_OFFSET)
    if flags & ~fl.KNOWN_FRAME_FLAGS:
        raise ProtocolError(R.UNKNOWN_FLAGS, f"reserved frame flag bits {flags:#06x}",
                            offset + fl.FLAGS_OFFSET)
    if (frame_len < fl.FRAME_HEADER_BYTES or frame_len % fl.FRAME_ALIGNMENT_BYTES
            or frame_len > MAX_FRAME_BYTES or frame_len > available):
        raise ProtocolError(R.BAD_FRAME_LENGTH, f"frame_len {frame_len} with {available} "
                            f"bytes available", offset + fl.FRAME_LEN_OFFSET)
    if exact and frame_len != available:
        raise ProtocolError(R.LENGTH_MISMATCH, f"frame_len {frame_len} in a datagram of "
                            f"{available} bytes", offset + fl.FRAME_LEN_OFFSET)
    if flags & fl.FrameFlags.AUTH_TRAILER and (
            frame_len < fl.FRAME_HEADER_BYTES + fl.AUTH_TRAILER_BYTES):
        raise ProtocolError(R.BAD_FRAME_LENGTH, "frame too short for its auth trailer",
                            offset + fl.FRAME_LEN_OFFSET)
    return FrameHeader(fl.FrameType(ftype), flags, count, frame_len, src, dst, stream, send_ts,
                       version)


def decode_frame(buf: Buffer, offset: int = 0, length: int | None = None,
                 *, exact: bool = True) -> Frame:
    """Validate the whole frame at ``offset`` (header, every message or entry) and return it."""
    header = decode_header(buf, offset, length, exact=exact)
    body_end = offset + header.frame_len
    auth = None
    if header.flags & fl.FrameFlags.AUTH_TRAILER:
        body_end -= fl.AUTH_TRAILER_BYTES
        key_id, epoch, auth_seq = fl.AUTH_TRAILER_STRUCT.unpack_from(buf, body_end)
        mac_at = body_end + fl.AUTH_TRAILER_STRUCT.size
        mac = bytes(buf[mac_at : mac_at + fl.AUTH_MAC_BYTES])
        auth = AuthTrailer(key_id, epoch, auth_seq, mac)
    frame = Frame(header, buf, offset, body_end, auth)
    if frame.is_message_frame:
        _walk_messages(buf, offset, body_end, header.msg_count)
    else:
        _walk_admin(buf, offset, body_end, header)
    return frame


def iter_frames(buf: Buffer, offset: int = 0, end: int | None = None) -> Iterator[Frame]:
    """Frames laid back to back in a stream buffer (shared-memory ring, TCP); stops at ``end``."""
    end = len(buf) if end is None else end
    while offset < end:
        frame = decode_frame(buf, offset, end - offset, exact=False)
        yield frame
        offset += frame.header.frame_len


def _walk_messages(buf: Buffer, offset: int, body_end: int, count: int) -> None:
    if count == 0 or count > ml.MAX_MESSAGES_PER_FRAME:
        raise ProtocolError(R.BAD_COUNT, f"msg_count {count}", offset + fl.MSG_COUNT_OFFSET)
    pos = offset + fl.FRAME_HEADER_BYTES
    for index in range(count):
        if pos + ml.MESSAGE_HEADER_BYTES > body_end:
            raise ProtocolError(R.MESSAGE_OVERRUN, f"message {index} header past the body end",
                                pos)
        qos = buf[pos + ml.QOS_OFFSET]
        if qos > ml.MAX_QOS:
            raise ProtocolError(R.BAD_QOS, f"message {index} qos {qos}", pos + ml.QOS_OFFSET)
        mflags = buf[pos + ml.MSG_FLAGS_OFFSET]
        if mflags & ~ml.KNOWN_MESSAGE_FLAGS:
            raise ProtocolError(R.UNKNOWN_FLAGS, f"message {index} reserved flag bits "
                                f"{mflags:#04x}", pos + ml.MSG_FLAGS_OFFSET)
        payload_len = _u32(buf, pos + ml.PAYLOAD_LEN_OFFSET)
        topic_len = _u16(buf, pos + ml.TOPIC_LEN_OFFSET)
        size = ml.message_bytes(payload_len, topic_len)
        if pos + size > body_end:
            raise ProtocolError(R.MESSAGE_OVERRUN, f"message {index} of {size} bytes past the "
                                "body end", pos + ml.PAYLOAD_LEN_OFFSET)
        pos += size
    if pos != body_end:
        raise ProtocolError(R.TRAILING_BYTES, f"{body_end - pos} bytes after message "
                            f"{count - 1}", pos)


def _walk_admin(buf: Buffer, offset: int, body_end: int,
                header: FrameHeader) -> tuple[dict[str, int], list[Any]]:
    layout = al.ADMIN_LAYOUTS[header.frame_type]
    count = header.msg_count
    if count == 0:
        raise ProtocolError(R.BAD_COUNT, "an admin frame needs at least one entry",
                            offset + fl.MSG_COUNT_OFFSET)
    pos = offset + fl.FRAME_HEADER_BYTES
    body_fields: dict[str, int] = {}
    if layout.body_header is not None:
        if pos + layout.body_header.size > body_end:
            raise ProtocolError(R.MESSAGE_OVERRUN, "body header past the body end", pos)
        names = al.BODY_HEADER_FIELDS[header.frame_type]
        body_fields = dict(zip(names, layout.body_header.unpack_from(buf, pos)))
        pos += layout.body_header.size
    plan = _decode_plan(layout)
    if plan is not None:
        return body_fields, _walk_entries_fast(buf, pos, body_end, count, layout, plan)
    entries = []
    fixed = layout.entry_struct
    for index in range(count):
        if pos + fixed.size > body_end:
            raise ProtocolError(R.MESSAGE_OVERRUN, f"entry {index} past the body end", pos)
        values = dict(zip(layout.fields, fixed.unpack_from(buf, pos)))
        text_pos = pos + fixed.size
        texts: dict[str, str] = {}
        for name in layout.texts:
            size = values[f"{name}_len"]
            if text_pos + size > body_end:
                raise ProtocolError(R.MESSAGE_OVERRUN, f"entry {index} {name} past the body "
                                    "end", text_pos)
            if size > layout.text_limit_bytes:
                raise ProtocolError(R.BAD_FIELD, f"entry {index} {name} of {size} bytes, limit "
                                    f"{layout.text_limit_bytes}", text_pos)
            try:
                texts[name] = bytes(buf[text_pos : text_pos + size]).decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError(R.BAD_FIELD, f"entry {index} {name} is not UTF-8",
                                    text_pos) from None
            text_pos += size
        for name, enum in layout.enums:
            try:
                values[name] = enum(values[name])
            except ValueError:
                raise ProtocolError(R.BAD_FIELD, f"entry {index} {name} {values[name]}",
                                    pos) from None
        end = pos + admin_entry_bytes(layout, text_pos - pos - fixed.size)
        if end > body_end:
            raise ProtocolError(R.MESSAGE_OVERRUN, f"entry {index} padding past the body end",
                                text_pos)
        kwargs = {k: v for k, v in values.items() if not k.startswith("_")
                  and not (k.endswith("_len") and k[:-4] in layout.texts)}
        kwargs.update(texts)
        entries.append(layout.entry_type(**kwargs))
        pos = end
    if pos != body_end:
        raise ProtocolError(R.TRAILING_BYTES, f"{body_end - pos} bytes after entry {count - 1}",
                            pos)
    return body_fields, entries


_PLANS: dict[int, tuple | None] = {}
_ENCODE_PLANS: dict[int, tuple | None] = {}


def _encode_plan(layout: al.AdminLayout) -> tuple | None:
    """How ``encode_admin`` packs an entry of a layout with one text field: (the text's
    rank, its getter, a getter of the other fields as a tuple, each struct member as None
    (reserved: 0), -1 (the text's length) or an index into that tuple). None for other
    layouts (the general loop)."""
    found = _ENCODE_PLANS.get(id(layout), False)
    if found is not False:
        return found  # type: ignore[return-value]
    plan = None
    if len(layout.texts) == 1:
        text = layout.texts[0]
        names: list[str] = []
        order: list[int | None] = []
        for field in layout.fields:
            if field.startswith("_"):
                order.append(None)
            elif field == f"{text}_len":
                order.append(-1)
            else:
                order.append(len(names))
                names.append(field)
        if names:
            get = operator.attrgetter(*names)
            get_values = get if len(names) > 1 else (lambda e, g=get: (g(e),))
            plan = (0, operator.attrgetter(text), get_values, tuple(order))
    _ENCODE_PLANS[id(layout)] = plan
    return plan


def _decode_plan(layout: al.AdminLayout) -> tuple | None:
    """How to build ``layout``'s entries positionally (a registration of 100,000 topics
    decodes 100,000 entries: a dict per entry cost most of its decode): (the struct index of
    each text's length, the constructor's arguments as struct indices or ``-1 - text rank``).
    and each enum's (struct index, name, type). None for a layout whose constructor takes
    other fields (the general walk)."""
    found = _PLANS.get(id(layout), False)
    if found is not False:
        return found  # type: ignore[return-value]
    plan = None
    names = [f.name for f in fields(layout.entry_type)] if is_dataclass(layout.entry_type) \
        else None
    if names is not None:
        lens = tuple(layout.fields.index(f"{t}_len") for t in layout.texts)
        args = []
        for name in names:
            if name in layout.texts:
                args.append(-1 - layout.texts.index(name))
            elif name in layout.fields:
                args.append(layout.fields.index(name))
            else:
                args = None
                break
        if args is not None:
            enums = tuple((layout.fields.index(name), name, enum) for name, enum in layout.enums)
            n = len(layout.texts)
            head = None  # the texts are the last arguments, in order: make(*head(values), *texts)
            if n and args[-n:] == [-1 - rank for rank in range(n)] and len(args) > n:
                head = operator.itemgetter(*args[:-n]) if len(args) - n > 1 else \
                    (lambda values, at=args[0]: (values[at],))
            plan = (lens, tuple(args), enums, head)
    _PLANS[id(layout)] = plan
    return plan


def _walk_entries_fast(buf: Buffer, pos: int, body_end: int, count: int,
                       layout: al.AdminLayout, plan: tuple) -> list[Any]:
    """``_walk_admin``'s entries by ``_decode_plan``: the same checks and errors."""
    lens, args, enums, head = plan
    fixed = layout.entry_struct
    unpack, size, limit, make = fixed.unpack_from, fixed.size, layout.text_limit_bytes, \
        layout.entry_type
    texts_named = layout.texts
    view = memoryview(buf)
    entries = []
    append = entries.append
    for index in range(count):
        if pos + size > body_end:
            raise ProtocolError(R.MESSAGE_OVERRUN, f"entry {index} past the body end", pos)
        values = unpack(buf, pos)
        text_pos = pos + size
        texts = []
        for rank, at in enumerate(lens):
            n = values[at]
            if text_pos + n > body_end:
                raise ProtocolError(R.MESSAGE_OVERRUN, f"entry {index} {texts_named[rank]} "
                                    "past the body end", text_pos)
            if n > limit:
                raise ProtocolError(R.BAD_FIELD, f"entry {index} {texts_named[rank]} of {n} "
                                    f"bytes, limit {limit}", text_pos)
            try:
                texts.append(str(view[text_pos:text_pos + n], "utf-8"))
            except UnicodeDecodeError:
                raise ProtocolError(R.BAD_FIELD, f"entry {index} {texts_named[rank]} is not "
                                    "UTF-8", text_pos) from None
            text_pos += n
        if enums:
            values = list(values)
            for at, name, enum in enums:
                try:
                    values[at] = enum(values[at])
                except ValueError:
                    raise ProtocolError(R.BAD_FIELD, f"entry {index} {name} {values[at]}",
                                        pos) from None
        end = pos + size + ((text_pos - pos - size + 7) & ~7)
        if end > body_end:
            raise ProtocolError(R.MESSAGE_OVERRUN, f"entry {index} padding past the body end",
                                text_pos)
        if head is not None:
            append(make(*head(values), *texts))
        else:
            append(make(*[values[a] if a >= 0 else texts[-1 - a] for a in args]))
        pos = end
    if pos != body_end:
        raise ProtocolError(R.TRAILING_BYTES, f"{body_end - pos} bytes after entry {count - 1}",
                            pos)
    return entries


def admin_entry_bytes(layout: al.AdminLayout, text_bytes: int) -> int:
    """Bytes one admin entry occupies: fixed part plus texts, padded to 8."""
    return layout.entry_struct.size + fl.align8(text_bytes)


# ------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------

class FrameWriter:
    """Builds DATA/RETRANSMISSION frames in place in a preallocated buffer.

    ``begin()`` reserves the header, ``append()`` packs one message after the last
    (False when it does not fit: finish and begin a new frame), ``finish()`` writes the header
    and returns the frame's length.
    """

    def __init__(self, buffer: bytearray | memoryview, offset: int = 0,
                 capacity_bytes: int | None = None) -> None:
        self._buf = memoryview(buffer)
        if self._buf.readonly:
            raise ValueError("protocol: FrameWriter needs a writable buffer")
        self._start = offset
        limit = len(self._buf) - offset if capacity_bytes is None else capacity_bytes
        self._capacity = min(limit, MAX_FRAME_BYTES)
        self._pos = -1
        self._count = 0
        self._frame_type = fl.FrameType.DATA
        self._ids = (0, 0, 0)

    def begin(self, frame_type: fl.FrameType = fl.FrameType.DATA, *, source_session: int = 0,
              dest_session: int = 0, stream_id: int = 0, offset: int | None = None) -> None:
        """Start a frame (at ``offset`` if given, else where the writer was created)."""
        if frame_type not in fl.MESSAGE_FRAME_TYPES:
            raise ValueError(f"protocol: FrameWriter writes message frames, not {frame_type!r}; "
                             "use encode_admin")
        if offset is not None:
            self._start = offset
        self._frame_type = frame_type
        self._ids = (source_session, dest_session, stream_id)
        self._pos = self._start + fl.FRAME_HEADER_BYTES
        self._count = 0

    @property
    def message_count(self) -> int:
        return self._count

    @property
    def remaining_bytes(self) -> int:
        return self._capacity - (self._pos - self._start)

    def append(self, topic_key: int, sequence: int, publish_ts_ns: int, payload: Buffer = b"",
               *, namespace_id: int = 0, schema_id: int = 0, qos: int = 0, flags: int = 0,
               topic: bytes = b"") -> bool:
        """Pack one message; False (nothing written) when the frame has no room for it."""
        if self._pos < 0:
            raise ValueError("protocol: FrameWriter.append before begin")
        payload_len = len(payload)
        topic_len = len(topic)
        size = ml.message_bytes(payload_len, topic_len)
        if (self._pos - self._start) + size > self._capacity or (
                self._count == ml.MAX_MESSAGES_PER_FRAME):
            return False
        if topic_len > MAX_TOPIC_BYTES:
            raise ValueError(f"protocol: topic of {topic_len} bytes exceeds {MAX_TOPIC_BYTES}")
        pos = self._pos
        buf = self._buf
        ml.MESSAGE_HEADER_STRUCT.pack_into(buf, pos, topic_key, sequence, publish_ts_ns,
                                           namespace_id, schema_id, qos, flags, payload_len,
                                           topic_len, 0)
        body = pos + ml.PAYLOAD_OFFSET
        buf[body : body + payload_len] = payload
        if topic_len:
            buf[body + payload_len : body + payload_len + topic_len] = topic
        pad_from = body + payload_len + topic_len
        buf[pad_from : pos + size] = bytes(pos + size - pad_from)
        self._pos = pos + size
        self._count += 1
        return True

    def finish(self, send_ts_ns: int | None = None) -> int:
        """Write the header; return the frame length (0 if no message was appended)."""
        if self._count == 0:
            return 0
        frame_len = self._pos - self._start
        src, dst, stream = self._ids
        fl.FRAME_HEADER_STRUCT.pack_into(
            self._buf, self._start, fl.FRAME_MAGIC, fl.PROTOCOL_VERSION, self._frame_type, 0,
            self._count, frame_len, src, dst, stream,
            time.time_ns() if send_ts_ns is None else send_ts_ns)
        self._pos = -1
        return frame_len


def encode_data_frame(messages: Iterable[dict[str, Any]], *, frame_type: fl.FrameType =
                      fl.FrameType.DATA, source_session: int = 0, dest_session: int = 0,
                      stream_id: int = 0, send_ts_ns: int = 0) -> bytes:
    """One message frame from dicts with MessageView.snapshot()'s keys (missing keys: 0/empty).

    Convenience for tools and tests; the hot path uses FrameWriter or the batch kernels.
    """
    buf = bytearray(MAX_FRAME_BYTES)
    writer = FrameWriter(buf)
    writer.begin(frame_type, source_session=source_session, dest_session=dest_session,
                 stream_id=stream_id)
    for index, m in enumerate(messages):
        topic = m.get("topic", b"")
        ok = writer.append(
            m.get("topic_key", 0), m.get("sequence", 0), m.get("publish_ts_ns", 0),
            m.get("payload", b""), namespace_id=m.get("namespace_id", 0),
            schema_id=m.get("schema_id", 0), qos=m.get("qos", 0), flags=m.get("flags", 0),
            topic=topic.encode() if isinstance(topic, str) else topic)
        if not ok:
            raise ValueError(f"protocol: message {index} does not fit in one frame "
                             f"({MAX_FRAME_BYTES} bytes)")
    length = writer.finish(send_ts_ns)
    if length == 0:
        raise ValueError("protocol: a message frame needs at least one message")
    return bytes(buf[:length])


def encode_admin(frame_type: fl.FrameType, entries: Sequence[Any], *,
                 body_header: dict[str, int] | None = None, source_session: int = 0,
                 dest_session: int = 0, stream_id: int = 0, send_ts_ns: int = 0,
                 auth: tuple[int, int, int] | None = None) -> bytearray:
    """An admin frame from entry dataclasses of ``admin_layout``.

    ``auth=(key_id, epoch, auth_seq)`` appends an authentication trailer with a zero MAC;
    the signer computes the MAC over ``Frame.signed_bytes()`` and writes it with ``set_mac``.
    """
    layout = al.ADMIN_LAYOUTS.get(frame_type)
    if layout is None:
        raise ValueError(f"protocol: {frame_type!r} is not an admin frame type")
    if not entries:
        raise ValueError("protocol: an admin frame needs at least one entry")
    out = bytearray(fl.FRAME_HEADER_BYTES)
    if layout.body_header is not None:
        names = al.BODY_HEADER_FIELDS[frame_type]
        out += layout.body_header.pack(*((body_header or {}).get(n, 0) for n in names))
    plan = _encode_plan(layout)
    pack, limit = layout.entry_struct.pack, layout.text_limit_bytes
    for entry in entries:
        if not isinstance(entry, layout.entry_type):
            raise ValueError(f"protocol: {frame_type.name} entries are "
                             f"{layout.entry_type.__name__}, got {type(entry).__name__}")
        if plan is not None:  # one text field (most entries): no per-field loop
            text_at, get_text, get_values, order = plan
            text = get_text(entry).encode("utf-8")
            if len(text) > limit:
                raise ValueError(f"protocol: {layout.texts[0]} of {len(text)} bytes exceeds "
                                 f"{limit}")
            got = get_values(entry)
            values = [0 if a is None else len(text) if a < 0 else int(got[a]) for a in order]
            out += pack(*values)
            out += text
            out += bytes(-len(text) & 7)
            continue
        if not isinstance(entry, layout.entry_type):
            raise ValueError(f"protocol: {frame_type.name} entries are "
                             f"{layout.entry_type.__name__}, got {type(entry).__name__}")
        texts = [getattr(entry, name).encode("utf-8") for name in layout.texts]
        values = []
        for field in layout.fields:
            if field.startswith("_"):
                values.append(0)
            elif field.endswith("_len") and field[:-4] in layout.texts:
                values.append(len(texts[layout.texts.index(field[:-4])]))
            else:
                values.append(int(getattr(entry, field)))
        for text, name in zip(texts, layout.texts):
            if len(text) > layout.text_limit_bytes:
                raise ValueError(f"protocol: {name} of {len(text)} bytes exceeds "
                                 f"{layout.text_limit_bytes}")
        joined = b"".join(texts)
        out += layout.entry_struct.pack(*values) + joined + bytes(fl.align8(len(joined))
                                                                 - len(joined))
    flags = 0
    if auth is not None:
        flags |= fl.FrameFlags.AUTH_TRAILER
        out += fl.AUTH_TRAILER_STRUCT.pack(*auth) + bytes(fl.AUTH_MAC_BYTES)
    if len(out) > MAX_FRAME_BYTES:
        raise ValueError(f"protocol: admin frame of {len(out)} bytes exceeds {MAX_FRAME_BYTES}; "
                         "split the entries over several frames")
    fl.FRAME_HEADER_STRUCT.pack_into(out, 0, fl.FRAME_MAGIC, fl.PROTOCOL_VERSION, frame_type,
                                     flags, len(entries), len(out), source_session,
                                     dest_session, stream_id, send_ts_ns)
    return out


def set_mac(frame: bytearray | memoryview, mac: bytes, offset: int = 0) -> None:
    """Write the MAC into the auth trailer of the frame at ``offset``."""
    frame_len = _u32(frame, offset + fl.FRAME_LEN_OFFSET)
    if len(mac) != fl.AUTH_MAC_BYTES:
        raise ValueError(f"protocol: a MAC is {fl.AUTH_MAC_BYTES} bytes")
    end = offset + frame_len
    frame[end - fl.AUTH_MAC_BYTES : end] = mac
