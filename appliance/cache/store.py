"""``CacheStore``: one ``StreamLog`` per ``cache.patterns`` entry, appends and replay pages.

One log per pattern, not per topic: the patterns are the operator's (at most
``MAX_CACHE_PATTERNS``), so the open logs are bounded by the config, not by what publishers
make up; a pattern's messages are in one log in the order the cache received them (each
publisher's in its publish order), so a replay reads one log front to back with no merge
across topics. A message matching two patterns is kept in both logs.

Used by the cache agent's thread only (``StreamLog`` is not thread-safe).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from appliance.cache import _kernels as k
from appliance.cache import layout
from appliance.cache.settings import (
    REPLAY_PAGE_BYTES,
    REPLAY_PAGE_FRAMES,
    REPLAY_PAGE_MESSAGES,
    REPLAY_READ_CHUNK_BYTES,
    REPLAY_SCAN_RECORDS,
    CacheSettings,
)
from appliance.persistence import StreamLog
from datapath.errors import TopicwireError
from datapath.topics.algebra import includes, matches

REPLAY_BATCH_RECORDS = 8_192
"""Records a page reads from its log at a time."""
VERDICTS_KEPT = 65_536
"""Topic keys whose match against a replayed pattern is remembered (per pattern; cleared when
full)."""
DELETED_RANGES_KEPT = 256
"""Per log, the ranges of cache sequences deleted since the start whose reason is remembered
(the oldest forgotten first: they are then reported as ``RETENTION``)."""
RETENTION = "RETENTION"
"""A deletion by ``retention_bytes`` or ``retention_hours`` (the log's own limits)."""
DISK_LIMIT = "CACHE_DISK_LIMIT"
"""A deletion by ``max_disk_bytes`` (all the logs together)."""


class ReplayPage:
    """The buffers one page is built in (reused for every page; the cache's thread only)."""

    def __init__(self, max_frame_bytes: int, max_frames: int = REPLAY_PAGE_FRAMES,
                 max_bytes: int = REPLAY_PAGE_BYTES,
                 max_messages: int = REPLAY_PAGE_MESSAGES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.max_frames = max_frames
        self.max_bytes = min(max_bytes, max_frames * max_frame_bytes)
        self.max_messages = max_messages
        self.out = np.zeros(max_frames * max_frame_bytes, np.uint8)
        self.frame_offsets = np.zeros(max_frames, np.int64)
        self.frame_lengths = np.zeros(max_frames, np.int64)
        self.frame_counts = np.zeros(max_frames, np.int64)
        self.state = np.zeros(k.ST_WORDS, np.int64)
        self.ext = np.zeros(16 * 2_048, np.uint8)
        self.keys = np.zeros(REPLAY_BATCH_RECORDS, np.uint64)
        self.request_id = 0
        self.page_id = 0

    def reset(self) -> None:
        self.state[:] = 0
        self.state[k.ST_START] = -1

    def finish(self) -> None:
        k._finish(self.out, self.frame_offsets, self.frame_lengths, self.frame_counts,
                  self.state, self.ext, self.request_id, self.page_id)

    @property
    def frames(self) -> int:
        return int(self.state[k.ST_FRAMES])

    @property
    def count(self) -> int:
        return int(self.state[k.ST_MESSAGES])

    def frame(self, i: int) -> np.ndarray:
        """Frame ``i`` (its header not written: ``stamp``)."""
        at = int(self.frame_offsets[i])
        return self.out[at : at + int(self.frame_lengths[i])]

    def stamp(self, i: int, source_session: int, dest_session: int, send_ts_ns: int
              ) -> np.ndarray:
        """Frame ``i`` with its header written."""
        from datapath.protocol import frame_layout as fl
        from datapath.protocol.replay_layout import REPLAY_STREAM_ID

        frame = self.frame(i)
        fl.FRAME_HEADER_STRUCT.pack_into(
            frame, 0, fl.FRAME_MAGIC, fl.PROTOCOL_VERSION, int(fl.FrameType.DATA), 0,
            int(self.frame_counts[i]) + 1, len(frame), source_session, dest_session,
            REPLAY_STREAM_ID, send_ts_ns)
        return frame


def log_dir_name(pattern: str) -> str:
    """A pattern's log directory: named by a hash (patterns hold '/', '#', '+'); the pattern
    is written beside its segments in ``PATTERN``."""
    return "p-" + hashlib.blake2b(pattern.encode(), digest_size=8).hexdigest()


class CacheStore:
    """The logs of ``settings.patterns`` under ``settings.dir`` (made if missing)."""

    def __init__(self, settings: CacheSettings) -> None:
        self.settings = settings
        self.logs: dict[str, StreamLog] = {}
        self._dirty: set[str] = set()
        self._verdicts: dict[str, dict[int, bool]] = {}
        self.deleted: dict[str, list[tuple[int, int, str]]] = {}
        """Per log, (first, last, reason) of the cache sequences deleted since the start
        (at most ``DELETED_RANGES_KEPT``, adjacent ones of one reason merged)."""
        self.disk_limit_deleted = [0, 0]
        """Segments and records ``enforce_disk_limit`` deleted."""
        config = settings.log_config()
        try:
            for pattern in settings.patterns:
                directory = Path(settings.dir) / log_dir_name(pattern)
                self.logs[pattern] = StreamLog(directory, config)
                name = directory / "PATTERN"
                if not name.exists():
                    name.write_text(pattern + "\n")
        except BaseException:
            self.close()
            raise

    def append(self, topic: str, namespace: int, seq: int, key: int, origin: int,
               stream: int, schema_id: int, qos: int, publish_ts_ns: int,
               payload: bytes, flags: int = 0) -> list[tuple[str, int]]:
        """Append a message to the log of each pattern it matches (namespace 0); buffered
        until ``commit``. ``payload``: its payload region (``flags`` HEADERS: with its
        header block). Returns (pattern, cache sequence) of each log that took it."""
        if namespace != 0:
            return []
        record = None
        taken: list[tuple[str, int]] = []
        for pattern, log in self.logs.items():
            if matches(pattern, topic):
                if record is None:
                    record = layout.encode(seq, key, origin, stream, namespace, schema_id, qos,
                                           topic.encode(), payload, flags)
                seq = log.last_seq + 1
                log.append(seq, publish_ts_ns, record)
                self._dirty.add(pattern)
                taken.append((pattern, seq))
        return taken

    def append_marker(self, pattern: str, ts_ns: int, origin: int, stream: int,
                      loss: dict) -> int:
        """Append a loss marker (appliance/cache/layout.py) to ``pattern``'s log; buffered
        until ``commit``. Returns its cache sequence."""
        log = self.logs[pattern]
        seq = log.last_seq + 1
        log.append(seq, ts_ns, layout.encode_marker(origin, stream, loss))
        self._dirty.add(pattern)
        return seq

    def durable(self, positions: list[tuple[str, int]]) -> bool:
        """Whether every (pattern, cache sequence) is on disk (per ``cache.fsync``)."""
        logs = self.logs
        return all(logs[p].durable_seq >= seq for p, seq in positions)

    def commit(self) -> set[str]:
        """Write what was appended and sync it as ``cache.fsync`` says; the patterns whose
        logs took records."""
        committed = set()
        for pattern in list(self._dirty):
            self.logs[pattern].commit()
            self._dirty.discard(pattern)
            committed.add(pattern)
        return committed

    def end(self, kept: str) -> int:
        """The cache sequence the next record of ``kept``'s log will have."""
        return self.logs[kept].last_seq + 1

    def first(self, kept: str) -> int:
        """The oldest cache sequence ``kept``'s log holds, or the next one when it holds
        none (everything before it was deleted, or nothing was kept yet)."""
        return _first(self.logs[kept])

    def do_work(self, now_ns: int) -> int:
        """The ``interval`` policy's syncs once due."""
        return sum(log.do_work(now_ns) for log in self.logs.values())

    def wake_at_ns(self) -> int | None:
        due = [t for t in (log.wake_at_ns() for log in self.logs.values()) if t is not None]
        return min(due) if due else None

    def enforce_retention(self) -> int:
        """Each log's own limits (age, size): the segments deleted."""
        deleted = 0
        for pattern, log in self.logs.items():
            before = _first(log)
            n = log.enforce_retention()
            if n:
                self._deleted(pattern, before, _first(log) - 1, RETENTION)
                deleted += n
        return deleted

    def disk_bytes(self) -> int:
        """What the logs' segments hold together (with what is buffered to be written)."""
        return sum(log.size_bytes() for log in self.logs.values())

    def enforce_disk_limit(self) -> int:
        """``max_disk_bytes``: while the logs together are over it, delete the oldest sealed
        segment of any log (the one whose newest record is oldest); the newest segment of
        each log stays. Returns the segments deleted."""
        limit = self.settings.max_disk_bytes
        if not limit:
            return 0
        total = self.disk_bytes()
        deleted = 0
        while total > limit:
            candidates = [(log.segments[0].max_ts, pattern) for pattern, log in
                          self.logs.items() if len(log.segments) > 1]
            if not candidates:
                break  # only each log's newest segment is left: a quarter of the bound at most
            _, pattern = min(candidates)
            log = self.logs[pattern]
            before, size, records = _first(log), log.segments[0].size, log.segments[0].records
            if log.delete_oldest() is None:
                break
            self._deleted(pattern, before, _first(log) - 1, DISK_LIMIT)
            total -= size
            deleted += 1
            self.disk_limit_deleted[0] += 1
            self.disk_limit_deleted[1] += records
        return deleted

    def _deleted(self, pattern: str, first: int, last: int, reason: str) -> None:
        if last < first:
            return
        ranges = self.deleted.setdefault(pattern, [])
        if ranges and ranges[-1][2] == reason and ranges[-1][1] + 1 >= first:
            ranges[-1] = (ranges[-1][0], last, reason)
        else:
            ranges.append((first, last, reason))
            if len(ranges) > DELETED_RANGES_KEPT:
                del ranges[0]

    def deleted_ranges(self, kept: str, start: int, end: int) -> list[tuple[int, int, str]]:
        """The cache sequences ``start``..``end`` of ``kept``'s log (deleted) as (first,
        last, reason) ranges covering them in order; what no remembered deletion names (it
        was before the start) is ``RETENTION``."""
        out: list[tuple[int, int, str]] = []
        at = start
        for first, last, reason in self.deleted.get(kept, ()):
            if last < at or first > end:
                continue
            if first > at:
                out.append((at, first - 1, RETENTION))
            out.append((max(first, at), min(last, end), reason))
            at = min(last, end) + 1
        if at <= end:
            out.append((at, end, RETENTION))
        merged: list[tuple[int, int, str]] = []
        for first, last, reason in out:
            if merged and merged[-1][2] == reason and merged[-1][1] + 1 == first:
                merged[-1] = (merged[-1][0], last, reason)
            else:
                merged.append((first, last, reason))
        return merged

    def log_of(self, pattern: str) -> str | None:
        """The first configured pattern whose log holds every topic ``pattern`` denotes."""
        return next((p for p in self.logs if includes(p, pattern)), None)

    def page(self, kept: str, pattern: str, from_seq: int | None, from_time_ns: int | None,
             page: ReplayPage, markers: list[tuple[int, dict]] | None = None,
             max_markers: int = 0) -> tuple[int, bool]:
        """One page of the log of ``kept`` into ``page`` (its frames, ``page.count``
        messages): the stored messages matching ``pattern`` from cache sequence
        ``from_seq`` or publish time ``from_time_ns`` (or the start), as native message
        records in page frames (datapath/protocol/replay_layout.py); returns the cache
        sequence the next page begins at and whether the log has nothing after this page.
        Bounded by ``page``'s frames, bytes and messages and by ``REPLAY_SCAN_RECORDS`` (the
        records looked at, matching or not). The log is read in batches; the pattern is
        matched once per distinct topic key of a batch; no Python runs per record.

        ``markers`` (a durable subscription's page): the loss markers among the records the
        page covers are added to it as (cache sequence, document), at most ``max_markers``
        (the page ends before one more)."""
        log = self.logs[kept]
        page.reset()
        scanned = 0
        next_seq = from_seq if from_seq is not None else 0
        batches = log.replay(from_seq=from_seq, from_time_ns=from_time_ns,
                             batch_records=REPLAY_BATCH_RECORDS,
                             chunk_bytes=REPLAY_READ_CHUNK_BYTES)
        try:
            for batch in batches:
                n = len(batch)
                if scanned + n > REPLAY_SCAN_RECORDS:
                    n = REPLAY_SCAN_RECORDS - scanned
                keys = page.keys[:n]
                k._record_keys(batch.buf, batch.offsets[:n], batch.lengths[:n], keys)
                found: list[tuple[int, dict]] = []
                if markers is not None:
                    for i in np.flatnonzero(keys == 0).tolist():
                        doc = layout.decode_marker(batch.payload(i))
                        if doc is None:
                            continue  # not an envelope: skipped, as a replay skips it
                        if len(markers) + len(found) >= max_markers:
                            n = i  # the page ends before this marker
                            keys = keys[:n]
                            break
                        found.append((i, doc))
                    if n == 0:
                        page.finish()
                        return int(batch.seqs[0]), False
                take = np.flatnonzero(self._matching(pattern, keys, batch, n))
                stopped = k._encode(batch.buf, batch.offsets, batch.lengths, batch.seqs,
                                    batch.stamps, take, 0, page.out, page.frame_offsets,
                                    page.frame_lengths, page.frame_counts, page.state,
                                    page.ext, page.max_frame_bytes, page.max_frames,
                                    page.max_messages, page.max_bytes, page.request_id,
                                    page.page_id)
                if stopped < len(take):  # the page is full
                    cut = int(take[stopped])
                    if markers is not None:
                        markers.extend((int(batch.seqs[i]), doc) for i, doc in found
                                       if i < cut)
                    page.finish()
                    return int(batch.seqs[cut]), False
                if markers is not None:
                    markers.extend((int(batch.seqs[i]), doc) for i, doc in found)
                scanned += n
                next_seq = int(batch.seqs[n - 1]) + 1
                if n < len(batch):
                    page.finish()
                    return next_seq, False
        finally:
            batches.close()  # type: ignore[attr-defined]
        page.finish()
        if not scanned and from_seq is None:  # from a time after everything kept
            next_seq = log.last_seq + 1
        return next_seq, True

    def _matching(self, pattern: str, keys: np.ndarray, batch: object, n: int) -> np.ndarray:
        """Which of a batch's first ``n`` records have a topic matching ``pattern``: each
        distinct topic key's topic is read and matched once (key 0: not an envelope)."""
        uniq, first = np.unique(keys, return_index=True)
        verdicts = np.zeros(len(uniq), bool)
        known = self._verdicts.setdefault(pattern, {})
        for i, (key, at) in enumerate(zip(uniq.tolist(), first.tolist())):
            verdict = known.get(key)
            if verdict is None:
                env = layout.decode(batch.payload(at)) if key else None  # type: ignore
                verdict = env is not None and matches(pattern, env[7])
                if len(known) >= VERDICTS_KEPT:
                    known.clear()
                known[key] = verdict
            verdicts[i] = verdict
        return verdicts[np.searchsorted(uniq, keys)]

    def status(self) -> list[dict]:
        return [{"pattern": p, "first_seq": log.first_seq(), "last_seq": log.last_seq,
                 "durable_seq": log.durable_seq, "bytes": log.size_bytes(),
                 "segments": len(log.segments)} for p, log in self.logs.items()]

    def disk_status(self) -> dict:
        return {"bytes": self.disk_bytes(), "max_bytes": self.settings.max_disk_bytes,
                "segments_deleted": self.disk_limit_deleted[0],
                "records_deleted": self.disk_limit_deleted[1]}

    def close(self) -> None:
        """Sync and close every log (twice is fine)."""
        logs, self.logs = self.logs, {}
        failed: BaseException | None = None
        for log in logs.values():
            try:
                log.close()  # its files close even when the last sync fails
            except (TopicwireError, OSError) as exc:
                failed = failed or exc
        if failed is not None:
            raise failed


def _first(log: StreamLog) -> int:
    """The oldest cache sequence a log holds, or the next one when it holds none."""
    return log.first_seq() or log.last_seq + 1


def warm_up() -> None:
    """Append, commit and replay a few records as the cache does, in a temporary directory:
    the persistence kernels compile (or load) for the cache's signatures (``topicwire warm``)."""
    import tempfile

    from appliance.cache.settings import CacheSettings

    with tempfile.TemporaryDirectory(prefix="topicwire-warm-cache-") as directory:
        store = CacheStore(CacheSettings(Path(directory), ("warm/#",)))
        try:
            for i in range(3):
                store.append("warm/x", 0, i + 1, 7, 1, 1, 0, 0, i, b"warm")
            store.commit()
            page = ReplayPage(65_472)
            store.page("warm/#", "warm/x", None, None, page)
            store.page("warm/#", "warm/x", None, 1, page)
            page.stamp(0, 1, 1, 0)
        finally:
            store.close()

