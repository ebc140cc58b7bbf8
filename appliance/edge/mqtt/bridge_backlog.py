"""A bridge's durable backlog: the QoS 1 messages for the remote broker that it has not
acknowledged yet, in memory and in an append-only journal on disk.

Journal ``backlog.log`` in the bridge's directory, a header then records::

    header:  b"TWBL" | u8 version (1)
    record:  u32 body length | u32 CRC-32 of body | body
    body:    u8 kind | u64 seq | (PUT only) u8 qos | u8 retain | u16 topic length | topic | payload
             kind 1 = PUT (a message entered the backlog), 2 = ACK (the remote acknowledged it)

``append`` keeps the message in memory at once and hands its PUT to the writer thread;
``ack`` (the remote's PUBACK) removes it from memory and hands its ACK to the writer. The
writer appends what is queued, then ``fdatasync`` (a group commit: one sync per batch). On
open the journal is read back: the live messages are the PUTs without an ACK, in order; a
torn or corrupt tail (a crash mid-write) is cut off there and counted. When the journal grows
past twice the live bytes (and ``COMPACT_MIN_BYTES``), the writer rewrites it with only the
live messages (a new file, synced, renamed over the old one), so the disk holds at most about
twice ``backlog_max_bytes``.

Bounded: at most ``max_messages`` and ``max_bytes`` (topic + payload) live; ``append`` of one
more returns None (the caller drops it and counts it: the newest is refused, what is already
kept stays). A message is removed only by ``ack``. After a crash, the PUTs and ACKs of the last
batch not yet synced may be missing: such a message is lost, or sent once more (QoS 1 is at
least once).
"""

from __future__ import annotations

import logging
import os
import queue
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("topicwire.edge.mqtt.bridge")

MAGIC = b"TWBL\x01"
JOURNAL = "backlog.log"
RECORD_HEAD = struct.Struct(">II")
PUT_HEAD = struct.Struct(">BQBBH")
ACK_BODY = struct.Struct(">BQ")
PUT, ACK = 1, 2
COMPACT_MIN_BYTES = 4 * 1024 * 1024
"""The journal is rewritten only once it is at least this large (and twice the live bytes)."""
MAX_RECORD_BYTES = 1 << 28
WRITER_BATCH_OPS = 4_096
"""Records written per sync at most."""


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    topic: str
    payload: bytes
    qos: int
    retain: bool

    @property
    def size(self) -> int:
        return len(self.topic) + len(self.payload)


def _put_record(e: Entry) -> bytes:
    topic = e.topic.encode()
    body = PUT_HEAD.pack(PUT, e.seq, e.qos, int(e.retain), len(topic)) + topic + e.payload
    return RECORD_HEAD.pack(len(body), zlib.crc32(body)) + body


def _ack_record(seq: int) -> bytes:
    body = ACK_BODY.pack(ACK, seq)
    return RECORD_HEAD.pack(len(body), zlib.crc32(body)) + body


def _read(path: Path) -> tuple[dict[int, Entry], int]:
    """The live entries of a journal and the number of bytes cut off its tail."""
    live: dict[int, Entry] = {}
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return live, 0
    if not data.startswith(MAGIC):
        raise OSError(f"{path}: not a bridge backlog journal")
    at = len(MAGIC)
    while at + RECORD_HEAD.size <= len(data):
        length, crc = RECORD_HEAD.unpack_from(data, at)
        body = data[at + RECORD_HEAD.size:at + RECORD_HEAD.size + length]
        if len(body) != length or length > MAX_RECORD_BYTES or zlib.crc32(body) != crc or (
                not body):
            break
        at += RECORD_HEAD.size + length
        if body[0] == ACK and len(body) == ACK_BODY.size:
            live.pop(ACK_BODY.unpack(body)[1], None)
        elif body[0] == PUT and len(body) >= PUT_HEAD.size:
            _, seq, qos, retain, tlen = PUT_HEAD.unpack_from(body)
            topic = body[PUT_HEAD.size:PUT_HEAD.size + tlen].decode(errors="replace")
            live[seq] = Entry(seq, topic, bytes(body[PUT_HEAD.size + tlen:]), qos, bool(retain))
        else:
            break
    return dict(sorted(live.items())), len(data) - at


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
        self._ops: queue.SimpleQueue = queue.SimpleQueue()
        self._file = None
        self._file_bytes = 0
        self._rewrite(list(self.live.values()))
        self._closed = False
        self._synced = threading.Condition()
        self._ops_done = 0
        self._ops_queued = 0
        self._thread = threading.Thread(target=self._writer, daemon=True,
                                        name=f"bridge-backlog-{self.directory.name}")
        self._thread.start()

    def __len__(self) -> int:
        return len(self.live)

    # --- callers ---------------------------------------------------------------------------
    def append(self, topic: str, payload: bytes, qos: int, retain: bool) -> Entry | None:
        """Keep a message (None: the backlog is full, nothing kept)."""
        with self.lock:
            size = len(topic) + len(payload)
            if len(self.live) >= self.max_messages or self.bytes + size > self.max_bytes:
                return None
            self._seq += 1
            entry = Entry(self._seq, topic, payload, qos, retain)
            self.live[entry.seq] = entry
            self.bytes += size
            self._ops_queued += 1
            self._ops.put(_put_record(entry))
        return entry

    def ack(self, seq: int) -> bool:
        """The remote acknowledged ``seq``: remove it (False: it was not live)."""
        with self.lock:
            entry = self.live.pop(seq, None)
            if entry is None:
                return False
            self.bytes -= entry.size
            self._ops_queued += 1
            self._ops.put(_ack_record(seq))
        return True

    def snapshot(self) -> list[Entry]:
        """The live entries, oldest first."""
        with self.lock:
            return list(self.live.values())

    def sync(self, timeout_s: float) -> bool:
        """Wait until everything handed to the writer so far is on disk."""
        with self.lock:
            target = self._ops_queued
        with self._synced:
            return self._synced.wait_for(lambda: self._ops_done >= target, timeout_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._ops.put(None)
        self._thread.join()

    # --- the writer --------------------------------------------------------------------------
    def _rewrite(self, entries: list[Entry]) -> None:
        """A new journal holding ``entries`` (synced, then renamed over the old one)."""
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            for e in entries:
                f.write(_put_record(e))
            f.flush()
            os.fdatasync(f.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        if self._file is not None:
            self._file.close()
        self._file = open(self.path, "ab")
        self._file_bytes = self._file.tell()

    def _writer(self) -> None:
        stop = False
        while not stop:
            batch = [self._ops.get()]
            while len(batch) < WRITER_BATCH_OPS:
                try:
                    batch.append(self._ops.get_nowait())
                except queue.Empty:
                    break
            if None in batch:
                stop = True
            records = [r for r in batch if r is not None]
            try:
                if records:
                    data = b"".join(records)
                    self._file.write(data)
                    self._file.flush()
                    os.fdatasync(self._file.fileno())
                    self._file_bytes += len(data)
                    self._count("backlog_syncs", 1)
                if self._file_bytes > max(COMPACT_MIN_BYTES, 2 * self.bytes + len(MAGIC)):
                    self._rewrite(self.snapshot())
                    self._count("backlog_compactions", 1)
            except OSError as exc:  # a full or failing disk: memory still holds the backlog
                self._count("backlog_write_errors", 1)
                log.error("bridge backlog %s: cannot write: %s", self.path, exc)
            with self._synced:
                self._ops_done += len(records)
                self._synced.notify_all()
        if self._file is not None:
            self._file.close()
