"""An append-only journal of CRC-32 records on a real disk, written by a thread of its own
with group commit: what the bridge backlog (appliance/edge/mqtt/bridge_backlog.py) and the
edge's MQTT state (store.py) keep.

File layout, a header then records::

    header:  MAGIC (the owner's, e.g. b"TWBL\\x01")
    record:  u32 body length | u32 CRC-32 of body | body (the owner's bytes, not empty)

``read`` gives the bodies of a journal in order and the bytes of a torn or corrupt tail (a
crash mid-write: a short record, a bad CRC, a length beyond ``MAX_RECORD_BYTES``), where it
stops; a file that does not start with the magic raises ``JournalError``. ``Journal`` opens
one for appending: ``write`` hands a body to the writer thread, which appends what is queued
(at most ``WRITER_BATCH_OPS`` records), then ``fdatasync`` (one sync per batch), then calls
the ``on_synced`` callbacks of that batch with True (False: the write or sync failed).
When the file grows past ``compact_min_bytes`` (``COMPACT_MIN_BYTES``) and twice
``live_bytes()``, the writer rewrites it with ``live_records()`` (a new file, synced,
renamed over the old one, the directory synced).
The owner's records must be idempotent (a put by key, a delete of a key): records queued
while the writer takes the snapshot are appended after it, and replaying them again changes
nothing.
"""

from __future__ import annotations

import logging
import os
import queue
import struct
import threading
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("topicwire.edge.mqtt.journal")

RECORD_HEAD = struct.Struct(">II")
MAX_RECORD_BYTES = 1 << 28
COMPACT_MIN_BYTES = 4 * 1024 * 1024
"""The journal is rewritten only once it is at least this large (and twice the live bytes)."""
WRITER_BATCH_OPS = 4_096
"""Records written per sync at most."""

Synced = Callable[[bool], None]


class JournalError(Exception):
    """A journal that cannot be read (not this kind of journal)."""


def frame(body: bytes) -> bytes:
    """One record: its length, its CRC-32, the body."""
    return RECORD_HEAD.pack(len(body), zlib.crc32(body)) + body


def read(path: Path, magic: bytes, older: tuple[bytes, ...] = ()) -> tuple[list[bytes], int]:
    """The record bodies of the journal at ``path`` (none when absent) and the number of bytes
    of a torn or corrupt tail. ``older``: earlier headers of the same kind (as long as
    ``magic``) read too. Raises ``JournalError`` for a file of another kind."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    if not data.startswith((magic, *older)):
        raise JournalError(f"{path}: not a journal of this kind (header "
                           f"{data[:len(magic)]!r}, expected {magic!r})")
    bodies = []
    at = len(magic)
    while at + RECORD_HEAD.size <= len(data):
        length, crc = RECORD_HEAD.unpack_from(data, at)
        body = data[at + RECORD_HEAD.size:at + RECORD_HEAD.size + length]
        if len(body) != length or length > MAX_RECORD_BYTES or not body or (
                zlib.crc32(body) != crc):
            break
        at += RECORD_HEAD.size + length
        bodies.append(body)
    return bodies, len(data) - at


class Journal:
    """See the module docstring. ``count(name, n)`` receives ``<prefix>syncs``,
    ``<prefix>records_written``, ``<prefix>compactions``, ``<prefix>write_errors``,
    ``<prefix>callback_errors`` (a sync callback that raised: logged, the writer goes on).
    Thread-safe; ``close`` is safe twice."""

    def __init__(self, path: Path, magic: bytes, live_records: Callable[[], Iterable[bytes]],
                 live_bytes: Callable[[], int], count: Callable[[str, int], None],
                 prefix: str = "", name: str = "journal",
                 compact_min_bytes: int | None = None) -> None:
        self.path = Path(path)
        self.directory = self.path.parent
        self.magic = magic
        self._live_records = live_records
        self._live_bytes = live_bytes
        self._count = count
        self._prefix = prefix
        self.compact_min_bytes = COMPACT_MIN_BYTES if compact_min_bytes is None else (
            compact_min_bytes)
        self._ops: queue.SimpleQueue = queue.SimpleQueue()
        self._file = None
        self.file_bytes = 0
        self._closed = False
        self._lock = threading.Lock()
        self._synced = threading.Condition()
        self._ops_done = 0
        self._ops_queued = 0
        self._thread = threading.Thread(target=self._writer, daemon=True, name=name)

    def start(self, records: Iterable[bytes]) -> Journal:
        """Rewrite the file with ``records`` (the live state read back), then start the
        writer."""
        self._rewrite(records)
        self._thread.start()
        return self

    # --- callers ---------------------------------------------------------------------------
    def write(self, body: bytes, on_synced: Synced | None = None) -> None:
        """Append ``body`` (by the writer); ``on_synced`` runs on the writer thread once it
        is on disk (True) or could not be written (False)."""
        with self._lock:
            self._ops_queued += 1
            self._ops.put((frame(body), on_synced))

    def sync(self, timeout_s: float) -> bool:
        """Wait until everything handed to the writer so far is on disk."""
        with self._lock:
            target = self._ops_queued
        with self._synced:
            return self._synced.wait_for(lambda: self._ops_done >= target, timeout_s)

    def close(self) -> None:
        """Write and sync what is queued, then stop the writer."""
        if self._closed:
            return
        self._closed = True
        self._ops.put(None)
        if self._thread.is_alive():
            self._thread.join()
        elif self._file is not None:
            self._file.close()

    # --- the writer --------------------------------------------------------------------------
    def _rewrite(self, records: Iterable[bytes]) -> None:
        """A new journal holding ``records`` (synced, then renamed over the old one)."""
        tmp = self.path.with_suffix(".tmp")
        size = len(self.magic)
        with open(tmp, "wb") as f:
            f.write(self.magic)
            for body in records:
                rec = frame(body)
                f.write(rec)
                size += len(rec)
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
        self.file_bytes = size

    def _writer(self) -> None:
        stop = False
        p = self._prefix
        while not stop:
            batch = [self._ops.get()]
            while len(batch) < WRITER_BATCH_OPS:
                try:
                    batch.append(self._ops.get_nowait())
                except queue.Empty:
                    break
            if None in batch:
                stop = True
            ops = [op for op in batch if op is not None]
            ok = True
            try:
                if ops:
                    data = b"".join(rec for rec, _ in ops)
                    self._file.write(data)
                    self._file.flush()
                    os.fdatasync(self._file.fileno())
                    self.file_bytes += len(data)
                    self._count(p + "syncs", 1)
                    self._count(p + "records_written", len(ops))
            except OSError as exc:  # a full or failing disk: the owner's memory still holds it
                ok = False
                self._count(p + "write_errors", 1)
                log.error("journal %s: cannot write: %s", self.path, exc)
            for _, on_synced in ops:
                if on_synced is not None:
                    try:
                        on_synced(ok)
                    except Exception:  # (the owner's callback must not stop the writer)
                        self._count(p + "callback_errors", 1)
                        log.exception("journal %s: a sync callback failed", self.path)
            try:
                if ok and self.file_bytes > max(self.compact_min_bytes,
                                                2 * self._live_bytes() + len(self.magic)):
                    self._rewrite(self._live_records())
                    self._count(p + "compactions", 1)
            except OSError as exc:
                self._count(p + "write_errors", 1)
                log.error("journal %s: cannot compact: %s", self.path, exc)
            with self._synced:
                self._ops_done += len(ops)
                self._synced.notify_all()
        if self._file is not None:
            self._file.close()
