"""A bridge's durable backlog: the QoS 1 messages for the remote broker that it has not
acknowledged yet, in memory and in an append-only journal on disk.

Journal ``backlog.log`` in the bridge's directory, a header then records::

    header:  b"TWBL" | u8 version (1)
    record:  u32 body length | u32 CRC-32 of body | body
    body:    u8 kind | u64 seq | (PUT, PUT_META) u8 qos | u8 retain | u16 topic length | topic
             | (PUT_META only) u16 metadata length | metadata | payload
             kind 1 = PUT (a message entered the backlog), 3 = PUT_META (one with MQTT
             metadata: meta.py's ``mqtt.`` headers as a native header block), 2 = ACK (the
             remote acknowledged it)

``append`` keeps the message in memory at once and hands its PUT to the journal's writer
thread; ``ack`` (the remote's PUBACK) removes it from memory and hands its ACK to the writer.
The framing, the writer (group commit: one ``fdatasync`` per batch), the torn-tail check and
the compaction are appliance/edge/mqtt/journal.py's. On
open the journal is read back: the live messages are the PUTs without an ACK, in order; a
torn or corrupt tail (a crash mid-write) is cut off there and counted. When the journal grows
past twice the live bytes (and ``COMPACT_MIN_BYTES``), the writer rewrites it with only the
live messages (a new file, synced, renamed over the old one), so the disk holds at most about
twice ``backlog_max_bytes``.

Bounded: at most ``max_messages`` and ``max_bytes`` (topic + payload + metadata) live;
``append`` of one more returns None (the caller drops it and counts it: the newest is refused,
what is already kept stays). A message is removed only by ``ack``. After a crash, the PUTs and
ACKs of the last batch not yet synced may be missing: such a message is lost, or sent once
more (QoS 1 is at least once).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from appliance.edge.mqtt import journal
from appliance.edge.mqtt.journal import Journal, JournalError

log = logging.getLogger("topicwire.edge.mqtt.bridge")

MAGIC = b"TWBL\x01"
JOURNAL = "backlog.log"
PUT_HEAD = struct.Struct(">BQBBH")
META_LEN = struct.Struct(">H")
ACK_BODY = struct.Struct(">BQ")
PUT, ACK, PUT_META = 1, 2, 3
"""Records: ``PUT`` an entry without metadata, ``PUT_META`` one with its MQTT metadata (the
native header block of meta.py's ``mqtt.`` headers, its length after the topic), ``ACK``."""
COMPACT_MIN_BYTES = journal.COMPACT_MIN_BYTES
"""(journal.py's: the journal is rewritten only once it is at least this large.)"""


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    meta: bytes = b""
    """The message's MQTT metadata as a native header block (meta.py), b"" for none."""

    @property
    def size(self) -> int:
        return len(self.topic) + len(self.payload) + len(self.meta)


def _put_body(e: Entry) -> bytes:
    topic = e.topic.encode()
    if not e.meta:
        return PUT_HEAD.pack(PUT, e.seq, e.qos, int(e.retain), len(topic)) + topic + e.payload
    return (PUT_HEAD.pack(PUT_META, e.seq, e.qos, int(e.retain), len(topic)) + topic
            + META_LEN.pack(len(e.meta)) + e.meta + e.payload)


def _read(path: Path) -> tuple[dict[int, Entry], int]:
    """The live entries of a journal and the number of bytes cut off its tail."""
    live: dict[int, Entry] = {}
    try:
        bodies, cut = journal.read(path, MAGIC)
    except JournalError:
        raise OSError(f"{path}: not a bridge backlog journal") from None
    for i, body in enumerate(bodies):
        if body[0] == ACK and len(body) == ACK_BODY.size:
            live.pop(ACK_BODY.unpack(body)[1], None)
        elif body[0] in (PUT, PUT_META) and len(body) >= PUT_HEAD.size:
            _, seq, qos, retain, tlen = PUT_HEAD.unpack_from(body)
            at = PUT_HEAD.size + tlen
            topic = body[PUT_HEAD.size:at].decode(errors="replace")
            meta = b""
            if body[0] == PUT_META:
                if len(body) < at + META_LEN.size:
                    cut += sum(len(b) + journal.RECORD_HEAD.size for b in bodies[i:])
                    break
                (mlen,) = META_LEN.unpack_from(body, at)
                meta = bytes(body[at + META_LEN.size:at + META_LEN.size + mlen])
                at += META_LEN.size + mlen
            live[seq] = Entry(seq, topic, bytes(body[at:]), qos, bool(retain), meta)
        else:  # an unknown record: cut there, as a corrupt one
            cut += sum(len(b) + journal.RECORD_HEAD.size for b in bodies[i:])
            break
    return dict(sorted(live.items())), cut


class Backlog:
    """See the module docstring. Thread-safe; ``close`` is safe twice."""

    def __init__(self, directory: Path, max_messages: int, max_bytes: int,
                 count: Callable[[str, int], None]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._count = count
        self.path = self.directory / JOURNAL
        self.live, cut = _read(self.path)
        if cut:
            count("backlog_torn_tail_bytes", cut)
            log.warning("bridge backlog %s: %d bytes of a torn tail cut off", self.path, cut)
        self.bytes = sum(e.size for e in self.live.values())
        self.recovered = len(self.live)
        self._seq = max(self.live, default=0)
        self.lock = threading.Lock()
        self._journal = Journal(
            self.path, MAGIC, lambda: [_put_body(e) for e in self.snapshot()],
            lambda: self.bytes, count, prefix="backlog_",
            compact_min_bytes=COMPACT_MIN_BYTES,
            name=f"bridge-backlog-{self.directory.name}").start(
                [_put_body(e) for e in self.live.values()])

    def __len__(self) -> int:
        return len(self.live)

    # --- callers ---------------------------------------------------------------------------
    def append(self, topic: str, payload: bytes, qos: int, retain: bool,
               meta: bytes = b"") -> Entry | None:
        """Keep a message (None: the backlog is full, nothing kept); ``meta``: its MQTT
        metadata as a native header block."""
        with self.lock:
            size = len(topic) + len(payload) + len(meta)
            if len(self.live) >= self.max_messages or self.bytes + size > self.max_bytes:
                return None
            self._seq += 1
            entry = Entry(self._seq, topic, payload, qos, retain, meta)
            self.live[entry.seq] = entry
            self.bytes += size
            self._journal.write(_put_body(entry))
        return entry

    def ack(self, seq: int) -> bool:
        """The remote acknowledged ``seq``: remove it (False: it was not live)."""
        with self.lock:
            entry = self.live.pop(seq, None)
            if entry is None:
                return False
            self.bytes -= entry.size
            self._journal.write(ACK_BODY.pack(ACK, seq))
        return True

    def snapshot(self) -> list[Entry]:
        """The live entries, oldest first."""
        with self.lock:
            return list(self.live.values())

    def sync(self, timeout_s: float) -> bool:
        """Wait until everything handed to the writer so far is on disk."""
        return self._journal.sync(timeout_s)

    def close(self) -> None:
        self._journal.close()
