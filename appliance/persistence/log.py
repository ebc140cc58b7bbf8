"""``StreamLog``: the append-only log of one stream, in segment files, with replay.

Appends (``append``, ``append_batch``: sequences rising, timestamps any) are encoded by
``_kernels._encode`` into a write buffer; ``commit`` writes the buffer to the newest segment
and syncs it as the fsync policy says (``batch``: every commit; ``interval``: at most
``fsync_interval_ms`` after the first unsynced write, in ``commit`` or ``do_work``).
``durable_seq`` is the highest sequence known to be on disk. A segment that would pass
``segment_bytes`` is sealed and the next begins at the next record. ``replay`` reads records
back in order from a sequence or a time, checking every record's CRC (``_kernels._scan``);
``enforce_retention`` deletes the oldest sealed segments past the age and size limits.

At open, what follows the newest segment's last valid record (a torn write after a crash) is
cut; it is never replayed. An agent (``do_work(now_ns)``); not thread-safe.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from appliance.persistence import _kernels as k
from appliance.persistence.layout import SEGMENT_NAME_DIGITS, SEGMENT_SUFFIX, record_bytes
from appliance.persistence.segment import ScanArrays, Segment, _fail
from appliance.persistence.settings import (
    COMPONENT,
    FSYNC_BATCH,
    READ_CHUNK_BYTES,
    WRITE_BUFFER_BYTES,
    LogConfig,
)
from datapath.errors import DeviceError, UserError

REPLAY_BATCH_RECORDS = 8192
"""Records per ``ReplayBatch`` at most."""


@dataclass
class LogCounters:
    appended: int = 0
    appended_bytes: int = 0
    commits: int = 0
    fsyncs: int = 0
    segments_rolled: int = 0
    torn_bytes_cut: int = 0
    segments_deleted: int = 0
    records_deleted: int = 0


@dataclass
class ReplayBatch:
    """Records read back: record ``i`` starts at ``offsets[i]`` in ``buf`` (its payload at
    ``offsets[i] + 24``, ``lengths[i]`` bytes). Valid until the next batch is taken."""

    buf: np.ndarray
    seqs: np.ndarray
    stamps: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.seqs)

    def payload(self, i: int) -> bytes:
        start = int(self.offsets[i]) + 24
        return self.buf[start : start + int(self.lengths[i])].tobytes()


class StreamLog:
    """The log of one stream in ``directory`` (created if missing); a context manager."""

    def __init__(self, directory: str | Path, config: LogConfig | None = None) -> None:
        self.directory = Path(directory)
        self.config = config = config or LogConfig()
        self.counters = LogCounters()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise _fail("cannot open log directory", self.directory, exc) from exc
        size = max(WRITE_BUFFER_BYTES, record_bytes(config.max_payload_bytes))
        self._buf = np.zeros((size + 7) // 8 * 8, np.uint8)
        self._fill = 0
        self._fill_last_seq = 0
        """The last sequence in the write buffer."""
        self._dirty_since_ns: int | None = None
        """When the first write not yet synced happened (interval policy)."""
        self.segments: list[Segment] = []
        self._open_segments()
        newest = self.segments[-1]
        self.last_seq = next((s.last_seq for s in reversed(self.segments) if s.last_seq), 0)
        self.written_seq = self.last_seq
        self.durable_seq = self.last_seq
        self._newest = newest

    # --- open ---------------------------------------------------------------------------------
    def _open_segments(self) -> None:
        bases = []
        for path in self.directory.iterdir():
            name = path.name
            if name.endswith(".idx.tmp"):
                path.unlink(missing_ok=True)  # an index write a crash interrupted
            elif (name.endswith(SEGMENT_SUFFIX) and len(name) == SEGMENT_NAME_DIGITS
                  + len(SEGMENT_SUFFIX) and name[:SEGMENT_NAME_DIGITS].isdigit()):
                bases.append(int(name[:SEGMENT_NAME_DIGITS]))
        bases.sort()
        try:
            for i, base in enumerate(bases):
                segment = Segment(self.directory, base, self.config)
                self.segments.append(segment)
                self.counters.torn_bytes_cut += segment.load(newest=i == len(bases) - 1)
            if not self.segments:
                self._new_segment(1)
        except BaseException:
            self.close()
            raise

    def _new_segment(self, base: int) -> Segment:
        segment = Segment(self.directory, base, self.config)
        self.segments.append(segment)
        try:
            os.fsync(self._dir_fd)  # the new file's entry is durable before records in it
        except OSError as exc:
            raise _fail("cannot fsync log directory", self.directory, exc) from exc
        self._newest = segment
        return segment

    # --- append -------------------------------------------------------------------------------
    def append(self, seq: int, ts_ns: int, payload: bytes) -> None:
        """One record (see ``append_batch``)."""
        data = np.frombuffer(payload, np.uint8)
        self.append_batch(np.array([seq], np.uint64), np.array([ts_ns], np.uint64), data,
                          np.zeros(1, np.int64), np.array([len(data)], np.int64))

    def append_batch(self, seqs: np.ndarray, stamps: np.ndarray, src: np.ndarray,
                     offsets: np.ndarray, lengths: np.ndarray) -> None:
        """Records ``i``: sequence ``seqs[i]`` (rising, above ``last_seq``), timestamp
        ``stamps[i]`` (ns), payload ``src[offsets[i] : offsets[i] + lengths[i]]``. Buffered
        until ``commit`` (or until the buffer fills). A refused record raises ``UserError``;
        the records before it are appended."""
        n = len(seqs)
        if not (len(stamps) == len(offsets) == len(lengths) == n):
            raise UserError("append_batch: seqs, stamps, offsets and lengths differ in length",
                            component=COMPONENT)
        seqs = np.ascontiguousarray(seqs, np.uint64)
        stamps = np.ascontiguousarray(stamps, np.uint64)
        offsets = np.ascontiguousarray(offsets, np.int64)
        lengths = np.ascontiguousarray(lengths, np.int64)
        src = np.ascontiguousarray(src, np.uint8)
        config = self.config
        i = 0
        while i < n:
            seg = self._newest
            limit = min(len(self._buf), config.segment_bytes - seg.size)
            start, fill_before = i, self._fill
            i, self._fill, status = k._append(
                self._buf, self._fill, limit, seqs, stamps, src, offsets, lengths, i,
                np.uint64(self.last_seq), config.max_payload_bytes, seg.size,
                config.index_interval_bytes, seg.meta, seg.idx_seq, seg.idx_ts, seg.idx_pos,
                k.TABLES)
            if i > start:
                self.last_seq = self._fill_last_seq = int(seqs[i - 1])
                self.counters.appended += i - start
                self.counters.appended_bytes += self._fill - fill_before
            if status == k.APPEND_DONE:
                break
            if status == k.APPEND_NO_ROOM:
                if seg.size + self._fill + record_bytes(int(lengths[i])) > config.segment_bytes:
                    self._roll(int(seqs[i]))
                else:
                    self._write()
                continue
            raise UserError(self._refusal(status, i, seqs, lengths), component=COMPONENT)

    def _refusal(self, status: int, i: int, seqs: np.ndarray, lengths: np.ndarray) -> str:
        if status == k.APPEND_BAD_SEQUENCE:
            return (f"sequences must rise above the log's last ({self.last_seq}); got "
                    f"{int(seqs[i])} in {self.directory}")
        if status == k.APPEND_BAD_LENGTH:
            return (f"a payload of {int(lengths[i])} bytes is over max_payload_bytes "
                    f"({self.config.max_payload_bytes}); raise it")
        if status == k.APPEND_BAD_SOURCE:
            return f"append_batch: payload {i} lies outside src"
        return f"the index of {self._newest.path} is full"  # cannot be: sized by the segment

    def _write(self) -> None:
        """The write buffer to the newest segment (not synced)."""
        if not self._fill:
            return
        self._newest.write(memoryview(self._buf)[: self._fill])
        self.written_seq = self._fill_last_seq
        self._fill = 0
        if self._dirty_since_ns is None:
            self._dirty_since_ns = time.monotonic_ns()

    def _sync(self) -> None:
        self._newest.sync()
        self.counters.fsyncs += 1
        self.durable_seq = self.written_seq
        self._dirty_since_ns = None

    def _roll(self, next_seq: int) -> None:
        self._write()
        self._newest.seal()
        self.counters.fsyncs += 1
        self.durable_seq = self.written_seq
        self._dirty_since_ns = None
        self._new_segment(next_seq)
        self.counters.segments_rolled += 1

    def commit(self, now_ns: int | None = None) -> int:
        """Write what is buffered and sync it as the policy says; returns ``durable_seq``."""
        self.counters.commits += 1
        self._write()
        if self._dirty_since_ns is not None:
            if self.config.fsync == FSYNC_BATCH:
                self._sync()
            else:
                self.do_work(time.monotonic_ns() if now_ns is None else now_ns)
        return self.durable_seq

    def sync(self) -> int:
        """Write and sync now, whatever the policy; returns ``durable_seq``."""
        self._write()
        if self._dirty_since_ns is not None:
            self._sync()
        return self.durable_seq

    def wake_at_ns(self) -> int | None:
        """When ``do_work`` has a sync due (None: nothing unsynced)."""
        if self._dirty_since_ns is None:
            return None
        return self._dirty_since_ns + self.config.fsync_interval_ms * 1_000_000

    def do_work(self, now_ns: int) -> int:
        """The interval policy's sync once due; 1 when it synced."""
        due = self.wake_at_ns()
        if due is None or now_ns < due:
            return 0
        self._sync()
        return 1

    # --- replay -------------------------------------------------------------------------------
    def replay(self, from_seq: int | None = None, from_time_ns: int | None = None,
               batch_records: int = REPLAY_BATCH_RECORDS,
               chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[ReplayBatch]:
        """Committed records in order: from sequence ``from_seq`` (the first at or above it),
        or from the first whose timestamp is >= ``from_time_ns``, or from the start. Each
        record's CRC is checked; a record that does not check raises ``DeviceError`` naming
        the segment and position (corruption after open). Segments are read ``chunk_bytes``
        at a time (at least one largest record): less for a reader that stops early."""
        if from_seq is not None and from_time_ns is not None:
            raise UserError("replay: give from_seq or from_time_ns, not both",
                            component=COMPONENT)
        arrays = ScanArrays(batch_records)
        chunk = np.zeros((max(chunk_bytes, record_bytes(self.config.max_payload_bytes))
                          + 7) // 8 * 8, np.uint8)
        timed = from_time_ns is not None
        for segment in list(self.segments):
            if not segment.last_seq or (from_seq is not None and segment.last_seq < from_seq):
                continue
            if timed:
                start = segment.position_of_time(from_time_ns)
                if start is None:
                    continue
            else:
                start = segment.position_of(from_seq) if from_seq is not None else 0
            yield from self._replay_segment(segment, start, from_seq, from_time_ns, arrays,
                                            chunk)
            from_seq = None
            from_time_ns = None
            timed = False

    def _replay_segment(self, segment: Segment, pos: int, from_seq: int | None,
                        from_time_ns: int | None, arrays: ScanArrays,
                        chunk: np.ndarray) -> Iterator[ReplayBatch]:
        prev = 0
        end_of_data = segment.size
        while pos < end_of_data:
            got = segment.read(chunk, pos)
            at = 0
            while True:
                count, end, status = k._scan(chunk, at, got, np.uint64(prev),
                                             self.config.max_payload_bytes, k.TABLES,
                                             arrays.seqs, arrays.stamps, arrays.offsets,
                                             arrays.lengths)
                first = 0
                if count and (from_seq is not None or from_time_ns is not None):
                    if from_seq is not None:
                        first = int(np.searchsorted(arrays.seqs[:count], from_seq))
                    else:
                        hit = np.flatnonzero(arrays.stamps[:count] >= from_time_ns)
                        first = int(hit[0]) if len(hit) else count
                    if first < count:
                        from_seq = from_time_ns = None
                if count:
                    prev = int(arrays.seqs[count - 1])
                    if first < count:
                        yield ReplayBatch(chunk, arrays.seqs[first:count],
                                          arrays.stamps[first:count],
                                          arrays.offsets[first:count],
                                          arrays.lengths[first:count])
                at = int(end)
                if status == k.SCAN_CORRUPT:
                    raise DeviceError(f"record at {pos + at} of {segment.path} does not check "
                                      "(CRC, length or sequence): the file changed or the "
                                      "disk corrupted it", component=COMPONENT)
                if status == k.SCAN_INCOMPLETE or at == got:
                    break
            if at == 0:
                raise DeviceError(f"record at {pos} of {segment.path} runs past the segment's "
                                  "end", component=COMPONENT)
            pos += at

    # --- retention ----------------------------------------------------------------------------
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments) + self._fill

    def enforce_retention(self, now_wall_ns: int | None = None) -> int:
        """Delete the oldest sealed segments whose newest record is older than
        ``retention_max_age_ms``, and while the log is over ``retention_max_bytes``. The
        newest segment is never deleted. Returns the segments deleted."""
        config = self.config
        now = time.time_ns() if now_wall_ns is None else now_wall_ns
        total = self.size_bytes()
        deleted = 0
        while len(self.segments) > 1:
            oldest = self.segments[0]
            too_old = (config.retention_max_age_ms
                       and oldest.max_ts < now - config.retention_max_age_ms * 1_000_000)
            too_big = config.retention_max_bytes and total > config.retention_max_bytes
            if not (too_old or too_big):
                break
            total -= oldest.size
            self.delete_oldest()
            deleted += 1
        return deleted

    def delete_oldest(self) -> tuple[int, int] | None:
        """Delete the oldest segment if it is sealed (the newest never is deleted): the
        (first, last) sequence it held (0, 0 when empty), or None when nothing was
        deleted. A bound over several logs (the cache's ``max_disk_bytes``) uses it."""
        if len(self.segments) <= 1:
            return None
        oldest = self.segments[0]
        held = (oldest.first_seq, oldest.last_seq)
        records = oldest.records
        oldest.delete()
        self.segments.pop(0)
        self.counters.segments_deleted += 1
        self.counters.records_deleted += records
        return held

    def first_seq(self) -> int:
        """The oldest sequence the log still holds (0: none)."""
        return next((s.first_seq for s in self.segments if s.first_seq), 0)

    # --- end ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Write and sync what is buffered or unsynced, seal nothing, close the files (twice
        is fine)."""
        if getattr(self, "_dir_fd", -1) < 0:
            return
        try:
            if self.segments and (self._fill or self._dirty_since_ns is not None):
                self.sync()
        finally:
            for segment in self.segments:
                segment.close()
            os.close(self._dir_fd)
            self._dir_fd = -1

    def __enter__(self) -> StreamLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
