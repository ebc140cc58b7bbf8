"""``CacheStore``: one ``StreamLog`` per ``cache.patterns`` entry, appends and replay pages.

One log per pattern, not per topic: the patterns are the operator's (at most
``MAX_CACHE_PATTERNS``), so the open logs are bounded by the config, not by what publishers
make up; a pattern's messages are in one log in the order the cache received them (each
publisher's in its publish order), so a replay reads one log front to back with no merge
across topics. A message matching two patterns is kept in both logs.

Used by the cache agent's thread only (``StreamLog`` is not thread-safe).
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from appliance.cache import layout
from appliance.cache.settings import (
    REPLAY_PAGE_BYTES,
    REPLAY_PAGE_MESSAGES,
    REPLAY_READ_CHUNK_BYTES,
    REPLAY_SCAN_RECORDS,
    CacheSettings,
)
from appliance.persistence import StreamLog
from datapath.errors import TopicwireError
from datapath.topics.algebra import includes, matches

PAGE_ROW_OVERHEAD_BYTES = 160
"""A page row's JSON beside its payload and topic (ten numbers, brackets, quotes)."""


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
               payload: bytes) -> list[tuple[str, int]]:
        """Append a message to the log of each pattern it matches (namespace 0); buffered
        until ``commit``. Returns (pattern, cache sequence) of each log that took it."""
        if namespace != 0:
            return []
        record = None
        taken: list[tuple[str, int]] = []
        for pattern, log in self.logs.items():
            if matches(pattern, topic):
                if record is None:
                    record = layout.encode(seq, key, origin, stream, namespace, schema_id, qos,
                                           topic.encode(), payload)
                seq = log.last_seq + 1
                log.append(seq, publish_ts_ns, record)
                self._dirty.add(pattern)
                taken.append((pattern, seq))
        return taken

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
        """The oldest cache sequence ``kept``'s log holds (0: none)."""
        return self.logs[kept].first_seq()

    def do_work(self, now_ns: int) -> int:
        """The ``interval`` policy's syncs once due."""
        return sum(log.do_work(now_ns) for log in self.logs.values())

    def wake_at_ns(self) -> int | None:
        due = [t for t in (log.wake_at_ns() for log in self.logs.values()) if t is not None]
        return min(due) if due else None

    def enforce_retention(self) -> int:
        return sum(log.enforce_retention() for log in self.logs.values())

    def log_of(self, pattern: str) -> str | None:
        """The first configured pattern whose log holds every topic ``pattern`` denotes."""
        return next((p for p in self.logs if includes(p, pattern)), None)

    def page(self, kept: str, pattern: str, from_seq: int | None,
             from_time_ns: int | None) -> tuple[list[list], int, bool]:
        """One page of the log of ``kept``: the stored messages matching ``pattern`` from
        cache sequence ``from_seq`` or publish time ``from_time_ns`` (or the start), as
        REPLAY_RESULT rows; the cache sequence the next page begins at; whether the log has
        nothing after this page. Bounded by ``REPLAY_PAGE_BYTES``, ``REPLAY_PAGE_MESSAGES``
        and ``REPLAY_SCAN_RECORDS`` (the records looked at, matching or not)."""
        log = self.logs[kept]
        rows: list[list] = []
        size = scanned = 0
        next_seq = from_seq if from_seq is not None else 0
        batches = log.replay(from_seq=from_seq, from_time_ns=from_time_ns,
                             batch_records=1_024, chunk_bytes=REPLAY_READ_CHUNK_BYTES)
        try:
            for batch in batches:
                seqs = batch.seqs.tolist()
                stamps = batch.stamps.tolist()
                for i, seq in enumerate(seqs):
                    if scanned >= REPLAY_SCAN_RECORDS or len(rows) >= REPLAY_PAGE_MESSAGES:
                        return rows, seq, False
                    env = layout.decode(batch.payload(i))
                    if env is None or not matches(pattern, env[7]):
                        scanned += 1
                        next_seq = seq + 1
                        continue
                    pseq, key, origin, stream, ns, schema, qos, topic, payload = env
                    text = base64.b64encode(payload).decode("ascii")
                    cost = len(text) + 6 * len(topic.encode()) + PAGE_ROW_OVERHEAD_BYTES
                    if rows and size + cost > REPLAY_PAGE_BYTES:
                        return rows, seq, False
                    rows.append([seq, topic, ns, key, pseq, stamps[i], schema, qos, origin,
                                 stream, text])
                    size += cost
                    scanned += 1
                    next_seq = seq + 1
        finally:
            batches.close()  # type: ignore[attr-defined]
        if not scanned and from_seq is None:  # from a time after everything kept
            next_seq = log.last_seq + 1
        return rows, next_seq, True

    def status(self) -> list[dict]:
        return [{"pattern": p, "first_seq": log.first_seq(), "last_seq": log.last_seq,
                 "durable_seq": log.durable_seq, "bytes": log.size_bytes(),
                 "segments": len(log.segments)} for p, log in self.logs.items()]

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
            store.page("warm/#", "warm/x", None, None)
            store.page("warm/#", "warm/x", None, 1)
        finally:
            store.close()

