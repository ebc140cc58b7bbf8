"""Large messages: split at the publishing client into segment messages (``segment``), put
back together at the subscribing client (``Reassembler``). Appliances forward segments as
ordinary messages (docs/protocol.md, "Large messages").

Segments of one message follow each other in order on their publisher's stream (guaranteed:
the reliable stream delivers them in order; best-effort: one path, in order, or lost). The
reassembler takes them in that order only: a segment that is not the next one expected (a
gap, a repeat, an overlap) ends its message, which is dropped whole and counted; nothing is
ever delivered partial. Its state is bounded: at most ``max_messages`` messages and
``max_bytes`` bytes (their declared sizes) in progress, each for at most ``timeout_ns``
since its last segment.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

from datapath.protocol import extension_layout as xl
from datapath.protocol.extensions import HEADERS_FLAG, SEGMENT_FLAG, encode_segment

Buffer = bytes | bytearray | memoryview

SEGMENT_REGION_BYTES = 1_472 - 32 - 32 - 40
"""The payload region of a segment message (1,368 bytes): it fits a 1,472-byte frame (one
datagram on an Ethernet MTU, the fabric's and guaranteed UDP clients' frame size) with its
authentication trailer, so every hop carries it."""
SEGMENT_CHUNK_BYTES = SEGMENT_REGION_BYTES - xl.SEGMENT_DESCRIPTOR_BYTES
"""Payload bytes per segment (1,352; the first segment's less its header block)."""
REASSEMBLY_MAX_BYTES = 64 * 1024 * 1024
"""Bytes of messages in reassembly per client (declared sizes): four of the largest."""
REASSEMBLY_MAX_MESSAGES = 64
"""Messages in reassembly per client at once."""
REASSEMBLY_TIMEOUT_NS = 30_000_000_000
"""A message whose next segment has not come for this long is dropped (counted)."""


def segment(payload: Buffer, block: bytes, chunk_bytes: int, segment_id: int
            ) -> Iterator[tuple[bytes, int]]:
    """The segment messages' payload regions and flags of one large message: ``payload``
    cut into chunks of at most ``chunk_bytes`` (the first less the header ``block``, which
    only it carries), each followed by its descriptor."""
    total = len(payload)
    if total > xl.MAX_MESSAGE_BYTES:
        raise ValueError(f"a payload of {total:,} bytes; a message is at most "
                         f"{xl.MAX_MESSAGE_BYTES:,} bytes (16 MiB)")
    first = chunk_bytes - len(block)
    count = 1 + max(0, -(-(total - first) // chunk_bytes))
    if count > xl.MAX_SEGMENTS:
        raise ValueError(f"{count} segments of {chunk_bytes} bytes; at most {xl.MAX_SEGMENTS}")
    view = memoryview(payload)
    offset = 0
    for index in range(count):
        size = first if index == 0 else chunk_bytes
        part = view[offset : offset + size]
        tail = encode_segment(segment_id, total, offset, index, count)
        if index == 0 and block:
            yield b"".join((part, block, tail)), HEADERS_FLAG | SEGMENT_FLAG
        else:
            yield b"".join((part, tail)), SEGMENT_FLAG
        offset += len(part)


@dataclass(slots=True)
class _InProgress:
    total: int
    count: int
    headers: Any
    first: Any
    """What the caller gave with segment 0 (the message's fields)."""
    parts: list = field(default_factory=list)
    received: int = 0
    next_index: int = 1
    last_ns: int = 0


class Reassembler:
    """Segments in, whole messages out; bounded and counted (``counters``)."""

    def __init__(self, *, max_bytes: int = REASSEMBLY_MAX_BYTES,
                 max_messages: int = REASSEMBLY_MAX_MESSAGES,
                 timeout_ns: int = REASSEMBLY_TIMEOUT_NS) -> None:
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self.timeout_ns = timeout_ns
        self._open: dict[Hashable, _InProgress] = {}
        self.bytes_in_progress = 0
        self.counters: Counter[str] = Counter()
        """``completed``, ``segments``; dropped messages by reason: ``dropped_gap`` (a
        segment missing, repeated or out of order), ``dropped_timeout``, ``dropped_full``
        (the bounds), ``refused_bad_segment`` (a descriptor that contradicts itself or its
        message)."""

    @property
    def messages_in_progress(self) -> int:
        return len(self._open)

    def _drop(self, key: Hashable, reason: str) -> None:
        entry = self._open.pop(key, None)
        if entry is not None:
            self.bytes_in_progress -= entry.total
            self.counters[reason] += 1

    def add(self, key: Hashable, descriptor: tuple[int, ...], chunk: Buffer, headers: Any,
            first: Any, now_ns: int) -> tuple[bytes, Any, Any] | None:
        """One segment of the message ``(key, segment_id)``; (payload, headers of segment 0,
        ``first`` of segment 0) when it completes the message, else None."""
        segment_id, total, offset, index, count = descriptor
        c = self.counters
        c["segments"] += 1
        k = (key, segment_id)
        n = len(chunk)
        if (count == 0 or index >= count or total > xl.MAX_MESSAGE_BYTES
                or offset + n > total or (index == count - 1) != (offset + n == total)
                or (index > 0 and headers is not None)):
            self._drop(k, "dropped_gap")
            c["refused_bad_segment"] += 1
            return None
        if index == 0:
            if offset != 0:
                c["refused_bad_segment"] += 1
                return None
            self._drop(k, "dropped_gap")  # a message begun again: the old one is incomplete
            if count == 1:
                c["completed"] += 1
                return bytes(chunk), headers, first
            if (len(self._open) >= self.max_messages
                    or self.bytes_in_progress + total > self.max_bytes):
                c["dropped_full"] += 1
                return None
            entry = self._open[k] = _InProgress(total, count, headers, first, [bytes(chunk)], n,
                                                1, now_ns)
            self.bytes_in_progress += total
            return None
        entry = self._open.get(k)
        if entry is None:  # its start was lost (or dropped): counted once, at segment 0's loss
            c["segments_orphaned"] += 1
            return None
        if (index != entry.next_index or count != entry.count or total != entry.total
                or offset != entry.received):
            self._drop(k, "dropped_gap")
            return None
        entry.parts.append(bytes(chunk))
        entry.received += n
        entry.next_index += 1
        entry.last_ns = now_ns
        if entry.next_index < entry.count:
            return None
        del self._open[k]
        self.bytes_in_progress -= entry.total
        c["completed"] += 1
        return b"".join(entry.parts), entry.headers, entry.first

    def expire(self, now_ns: int) -> int:
        """Drop the messages whose next segment is overdue; how many."""
        late = [k for k, e in self._open.items() if now_ns - e.last_ns > self.timeout_ns]
        for k in late:
            self._drop(k, "dropped_timeout")
        return len(late)
