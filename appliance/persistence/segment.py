"""One segment file of a log: its records from a base sequence on, and its sparse index.

A segment is written only at its end (``write``), sealed when the log rolls to the next one
(``seal``: synced, then its index written beside it), and read with ``pread`` (``read``). At
open a sealed segment loads its index when the index checks against the file (its CRC, the
file's size), else it is scanned; the newest segment is always scanned, and whatever follows
its last valid record (a torn write) is cut (``recover``). Layouts: layout.py.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from appliance.persistence import _kernels as k
from appliance.persistence.layout import (
    INDEX_CRC_BYTES,
    INDEX_ENTRY_DTYPE,
    index_name,
    record_bytes,
    segment_name,
)
from appliance.persistence.settings import COMPONENT, READ_CHUNK_BYTES, LogConfig
from datapath.errors import DeviceError

log = logging.getLogger("topicwire.persistence")

_INDEX_TRAILER = struct.Struct("<QQQQQQ")
"""After the index entries: segment size, record count, first sequence, last sequence, max
timestamp, entry count (then the CRC-32 of everything before it)."""
_SCAN_RECORDS = 65_536
"""Records listed per ``_scan`` call while scanning a whole segment."""


def _fail(what: str, path: Path, exc: OSError) -> DeviceError:
    return DeviceError(f"{what} {path}: {exc.strerror or exc}", errno=exc.errno,
                       component=COMPONENT)


class ScanArrays:
    """Output arrays of ``_kernels._scan`` (reused)."""

    def __init__(self, capacity: int) -> None:
        self.seqs = np.zeros(capacity, np.uint64)
        self.stamps = np.zeros(capacity, np.uint64)
        self.offsets = np.zeros(capacity, np.int64)
        self.lengths = np.zeros(capacity, np.int64)


class Segment:
    """A segment file, open for reading and (while it is the newest) for writing."""

    def __init__(self, directory: Path, base: int, config: LogConfig) -> None:
        self.directory = directory
        self.base = base
        self.config = config
        self.path = directory / segment_name(base)
        self.index_path = directory / index_name(base)
        self.size = 0
        """Bytes of valid records written to the file."""
        self.sealed = False
        self.meta = np.zeros(k.META_FIELDS, np.uint64)
        """Record count, first/last sequence, max timestamp, index state (``_kernels._note``)."""
        capacity = config.segment_bytes // config.index_interval_bytes + 2
        self.idx_seq = np.zeros(capacity, np.uint64)
        self.idx_ts = np.zeros(capacity, np.uint64)
        """Running maximum of the timestamps up to each entry's record (non-decreasing)."""
        self.idx_pos = np.zeros(capacity, np.int64)
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _fail("cannot open segment", self.path, exc) from exc

    @property
    def records(self) -> int:
        return int(self.meta[k.META_RECORDS])

    @property
    def first_seq(self) -> int:
        """0 while the segment holds no record."""
        return int(self.meta[k.META_FIRST])

    @property
    def last_seq(self) -> int:
        return int(self.meta[k.META_LAST])

    @property
    def max_ts(self) -> int:
        return int(self.meta[k.META_MAX_TS])

    @property
    def index_count(self) -> int:
        return int(self.meta[k.META_INDEX_COUNT])

    # --- open ---------------------------------------------------------------------------------
    def load(self, newest: bool) -> int:
        """Read what the file holds: the index of a sealed segment if it checks, else a scan
        (cutting a torn tail when ``newest``). Returns the bytes cut."""
        if not newest and self._load_index():
            self.sealed = True
            return 0
        cut = self._scan_all()
        if not newest:
            self.sealed = True
            self._write_index()
        else:
            self.index_path.unlink(missing_ok=True)
        return cut

    def _load_index(self) -> bool:
        try:
            data = self.index_path.read_bytes()
            file_size = os.fstat(self.fd).st_size
        except OSError:
            return False
        if len(data) < _INDEX_TRAILER.size + INDEX_CRC_BYTES:
            return False
        body, crc = data[:-INDEX_CRC_BYTES], int.from_bytes(data[-INDEX_CRC_BYTES:], "little")
        if zlib.crc32(body) != crc:
            return False
        size, records, first, last, max_ts, count = _INDEX_TRAILER.unpack_from(body, len(body)
                                                                      - _INDEX_TRAILER.size)
        entries = body[: -_INDEX_TRAILER.size]
        if size != file_size or count * INDEX_ENTRY_DTYPE.itemsize != len(entries):
            return False
        if count > len(self.idx_seq):
            return False
        table = np.frombuffer(entries, INDEX_ENTRY_DTYPE)
        self.idx_seq[:count] = table["sequence"]
        self.idx_ts[:count] = table["max_ts_ns"]
        self.idx_pos[:count] = table["position"]
        self.size = size
        self.meta[:] = 0
        self.meta[k.META_INDEX_COUNT] = count
        self.meta[k.META_BUCKET] = (int(table["position"][-1]) // self.config.index_interval_bytes
                                    + 1) if count else 0
        self.meta[k.META_RECORDS] = records
        self.meta[k.META_FIRST] = first
        self.meta[k.META_LAST] = last
        self.meta[k.META_MAX_TS] = max_ts
        return True

    def _scan_all(self) -> int:
        """Scan every record from the start; cut the file after the last valid one."""
        file_size = os.fstat(self.fd).st_size
        arrays = ScanArrays(_SCAN_RECORDS)
        chunk = np.zeros(max(READ_CHUNK_BYTES, record_bytes(self.config.max_payload_bytes)
                             + 8) // 8 * 8 + 8, np.uint8)
        pos = 0
        prev = 0
        while pos < file_size:
            start = pos
            got = self._pread(chunk, start, min(len(chunk), file_size - start))
            count, end, status = k._scan(chunk, 0, got, np.uint64(prev),
                                         self.config.max_payload_bytes, k.TABLES, arrays.seqs,
                                         arrays.stamps, arrays.offsets, arrays.lengths)
            if count:
                k._note_many(arrays.seqs, arrays.stamps, arrays.offsets + start, count,
                             self.config.index_interval_bytes, self.meta, self.idx_seq,
                             self.idx_ts, self.idx_pos)
                prev = int(arrays.seqs[count - 1])
            pos = start + int(end)
            if status == k.SCAN_CORRUPT:
                break
            if status == k.SCAN_INCOMPLETE and (start + got >= file_size or count == 0):
                break  # runs past the file's end: torn (a record fits a chunk: max_payload)
        self.size = pos
        cut = file_size - pos
        if cut:
            log.warning("persistence: %s: cut %d bytes after the last valid record at %d "
                        "(a torn write)", self.path, cut, pos)
            try:
                os.ftruncate(self.fd, pos)
                os.fsync(self.fd)
            except OSError as exc:
                raise _fail("cannot cut the torn tail of", self.path, exc) from exc
        return cut

    # --- write --------------------------------------------------------------------------------
    def write(self, data: memoryview) -> None:
        """Append encoded records (``_kernels._append`` noted them already)."""
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(self.fd, data[written:], self.size + written)
        except OSError as exc:
            raise _fail("cannot write segment", self.path, exc) from exc
        self.size += len(data)

    def sync(self) -> None:
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise _fail("cannot fsync segment", self.path, exc) from exc

    def seal(self) -> None:
        """Sync the records and write the index beside them (the log rolls on)."""
        self.sync()
        self.sealed = True
        self._write_index()

    def _write_index(self) -> None:
        count = self.index_count
        table = np.zeros(count, INDEX_ENTRY_DTYPE)
        table["sequence"] = self.idx_seq[:count]
        table["max_ts_ns"] = self.idx_ts[:count]
        table["position"] = self.idx_pos[:count]
        body = table.tobytes() + _INDEX_TRAILER.pack(self.size, self.records, self.first_seq,
                                                     self.last_seq, self.max_ts, count)
        tmp = self.index_path.with_suffix(".idx.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(body + zlib.crc32(body).to_bytes(INDEX_CRC_BYTES, "little"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.index_path)
        except OSError as exc:
            raise _fail("cannot write index", self.index_path, exc) from exc

    # --- read ---------------------------------------------------------------------------------
    def _pread(self, out: np.ndarray, pos: int, nbytes: int) -> int:
        view = memoryview(out)[:nbytes]
        got = 0
        try:
            while got < nbytes:
                n = os.preadv(self.fd, [view[got:]], pos + got)
                if n == 0:
                    break
                got += n
        except OSError as exc:
            raise _fail("cannot read segment", self.path, exc) from exc
        return got

    def read(self, out: np.ndarray, pos: int) -> int:
        """Bytes of records from ``pos`` into ``out`` (as many as fit); the count read."""
        return self._pread(out, pos, min(len(out), self.size - pos))

    def position_of(self, seq: int) -> int:
        """Where to start scanning for ``seq``: the last index entry at or below it."""
        count = self.index_count
        e = int(np.searchsorted(self.idx_seq[:count], np.uint64(seq), side="right"))
        return int(self.idx_pos[e - 1]) if e else 0

    def position_of_time(self, ts_ns: int) -> int | None:
        """Where to start scanning for the first record with a timestamp >= ``ts_ns``: the
        entry before the first whose running maximum reaches it (None: no record does)."""
        if not self.records or self.max_ts < ts_ns:
            return None
        count = self.index_count
        e = int(np.searchsorted(self.idx_ts[:count], np.uint64(ts_ns), side="left"))
        return int(self.idx_pos[e - 1]) if e else 0

    # --- end ----------------------------------------------------------------------------------
    def delete(self) -> None:
        self.close()
        for path in (self.path, self.index_path):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise _fail("cannot delete", path, exc) from exc

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
