"""The cache's side of NAKs served from it (appliance/dataplane/cache_naks.py).

The data path asks for messages of one (origin, publishing session) by their sequence on
the reliable stream to the cache's session (what the cache's records hold as ``seq`` for a
guaranteed message). ``NakIndex`` finds them: per (origin, stream), a ring of the last
``CACHE_NAK_INDEX_MESSAGES`` such sequences -> (log, cache sequence), filled as messages are
kept. ``NakServer`` answers the requests on the cache's thread, after each append batch
(so a message the data path sent the cache before the NAK is usually found): each request
is read from the logs within ``CACHE_NAK_READ_BYTES`` and a token bucket of
``CACHE_NAK_READ_BYTES_PER_S``; what is over them is refused (the data path asks again on
the receiver's next NAK). A sequence not indexed yet, above the highest the cache kept of
that stream, is waited for up to ``CACHE_NAK_WAIT_NS`` (it may still be on its way to the
cache); after that, or below it, it is not kept.

    request (data path -> control agent -> on_request):
        {"id": n, "origin": o, "stream": s, "seqs": [c, ...]}
    answer (command ``cache_nak_answer``): per c, (publish ts, record payload) | None (not
        kept) | False (refused: over a bound)
"""

from __future__ import annotations

import json
import time
from collections import Counter, deque
from typing import Any

import numpy as np

from appliance.cache.settings import (
    CACHE_NAK_INDEX_MESSAGES,
    CACHE_NAK_INDEX_STREAMS,
    CACHE_NAK_QUEUE,
    CACHE_NAK_READ_BYTES,
    CACHE_NAK_READ_BYTES_PER_S,
    CACHE_NAK_SEQS_PER_REQUEST,
    CACHE_NAK_WAIT_NS,
)
from datapath.errors import TopicwireError

COUNTERS = ("nak_requests", "nak_records_read", "nak_bytes_read", "nak_not_kept", "nak_refused",
            "nak_requests_malformed", "nak_read_errors")
"""The counters (``cache_<name>`` in the status)."""
_PATTERN_SHIFT = 48
_STREAM_MASK = 0x7FFF_FFFF


class _Ring:
    __slots__ = ("highest", "seqs", "where")

    def __init__(self) -> None:
        self.seqs = np.zeros(CACHE_NAK_INDEX_MESSAGES, np.int64)
        self.where = np.zeros(CACHE_NAK_INDEX_MESSAGES, np.int64)
        self.highest = 0


class NakIndex:
    """(origin, stream, sequence on the stream to the cache) -> (pattern, cache sequence) of
    the last ``CACHE_NAK_INDEX_MESSAGES`` messages per stream, ``CACHE_NAK_INDEX_STREAMS``
    streams (the oldest stream made goes first)."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = patterns
        self._slot = {p: i for i, p in enumerate(patterns)}
        self.rings: dict[tuple[int, int], _Ring] = {}
        self.streams_dropped = 0

    def add(self, origin: int, stream: int, seq: int, pattern: str, cache_seq: int) -> None:
        key = (origin, stream & _STREAM_MASK)
        ring = self.rings.get(key)
        if ring is None:
            if len(self.rings) >= CACHE_NAK_INDEX_STREAMS:
                del self.rings[next(iter(self.rings))]
                self.streams_dropped += 1
            ring = self.rings[key] = _Ring()
        i = seq & (CACHE_NAK_INDEX_MESSAGES - 1)
        ring.seqs[i] = seq
        ring.where[i] = (self._slot[pattern] << _PATTERN_SHIFT) | cache_seq
        if seq > ring.highest:
            ring.highest = seq

    def find(self, origin: int, stream: int, seq: int) -> tuple[str, int] | None | bool:
        """(pattern, cache sequence); None: not kept; False: not there yet (above the
        highest the cache kept of the stream)."""
        ring = self.rings.get((origin, stream & _STREAM_MASK))
        if ring is None or seq > ring.highest:
            return False
        i = seq & (CACHE_NAK_INDEX_MESSAGES - 1)
        if int(ring.seqs[i]) != seq:
            return None
        where = int(ring.where[i])
        return self.patterns[where >> _PATTERN_SHIFT], where & ((1 << _PATTERN_SHIFT) - 1)


class NakServer:
    """Answers the data path's requests on the cache's thread (module docstring)."""

    def __init__(self, store: Any, dp: Any) -> None:
        self.store = store
        self.dp = dp
        self.index = NakIndex(list(store.logs))
        self.counters: Counter[str] = Counter(dict.fromkeys(COUNTERS, 0))
        """(Every key made here: the control thread adds to it while the cache's thread
        reads it for the status.)"""
        self._queue: deque[tuple[dict, int]] = deque()
        self._tokens = float(CACHE_NAK_READ_BYTES_PER_S)
        self._tokens_ns = 0

    # --- the control agent's thread -----------------------------------------------------------
    def on_request(self, data: bytes) -> bool:
        """Queue a request (True: the cache's thread should wake); a malformed one is
        counted and dropped, one over ``CACHE_NAK_QUEUE`` is answered "refused" at once."""
        try:
            doc = json.loads(data)
            rid, origin, stream, seqs = doc["id"], doc["origin"], doc["stream"], doc["seqs"]
            if not (all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                        for v in (rid, origin, stream, *seqs))
                    and 0 < len(seqs) <= CACHE_NAK_SEQS_PER_REQUEST):
                raise ValueError("fields")
        except (ValueError, KeyError, TypeError):
            self.counters["nak_requests_malformed"] += 1
            return False
        if len(self._queue) >= CACHE_NAK_QUEUE:
            self.counters["nak_refused"] += len(seqs)
            try:
                self.dp.command("cache_nak_answer", rid, [False] * len(seqs))
            except OSError:  # the data path is stopping
                pass
            return False
        self._queue.append((doc, time.monotonic_ns()))
        return True

    @property
    def waiting(self) -> int:
        return len(self._queue)

    # --- the cache's thread -------------------------------------------------------------------
    def wake_at_ns(self) -> int | None:
        """When the oldest waiting request's wait for messages not kept yet ends."""
        return self._queue[0][1] + CACHE_NAK_WAIT_NS if self._queue else None

    def do_work(self, now_ns: int) -> int:
        work = 0
        for _ in range(len(self._queue)):
            doc, at = self._queue.popleft()
            if not self._answer(doc, now_ns - at >= CACHE_NAK_WAIT_NS, now_ns):
                self._queue.append((doc, at))  # some not kept yet: later
            else:
                work += 1
        return work

    def _answer(self, doc: dict, waited: bool, now_ns: int) -> bool:
        index = self.index
        origin, stream = doc["origin"], doc["stream"]
        found: list[tuple[str, int] | None | bool] = []
        for seq in doc["seqs"]:
            where = index.find(origin, stream, seq)
            if where is False and not waited:
                return False
            found.append(None if where is False else where)
        records: list[Any] = [None] * len(found)
        by_pattern: dict[str, dict[int, int]] = {}
        for i, where in enumerate(found):
            if where:
                by_pattern.setdefault(where[0], {})[where[1]] = i
        room = min(CACHE_NAK_READ_BYTES, self._take_tokens(now_ns))
        spent = 0
        for pattern, wanted in by_pattern.items():
            spent += self._read(pattern, wanted, records, room - spent)
        self._tokens -= spent
        c = self.counters
        c["nak_requests"] += 1
        c["nak_records_read"] += sum(1 for r in records if r)
        c["nak_bytes_read"] += spent
        c["nak_not_kept"] += sum(1 for r in records if r is None)
        c["nak_refused"] += sum(1 for r in records if r is False)
        self.dp.command("cache_nak_answer", doc["id"], records)
        return True

    def _take_tokens(self, now_ns: int) -> int:
        if now_ns > self._tokens_ns:
            if self._tokens_ns:
                self._tokens = min(float(CACHE_NAK_READ_BYTES_PER_S), self._tokens + (
                    now_ns - self._tokens_ns) * CACHE_NAK_READ_BYTES_PER_S / 1e9)
            self._tokens_ns = now_ns
        return max(int(self._tokens), 0)

    def _read(self, pattern: str, wanted: dict[int, int], records: list[Any],
              room: int) -> int:
        """Read the cache sequences ``wanted`` (-> their index in ``records``) of
        ``pattern``'s log, at most ``room`` bytes of records; the bytes read."""
        log = self.store.logs.get(pattern)
        for i in wanted.values():
            records[i] = False  # refused unless read, or passed (deleted: not kept)
        if log is None or room <= 0:
            return 0
        first, last = min(wanted), max(wanted)
        spent = 0
        try:
            for batch in log.replay(from_seq=first):
                seqs = batch.seqs
                for j in range(len(seqs)):
                    seq = int(seqs[j])
                    if seq > last:
                        break
                    i = wanted.get(seq)
                    if i is None:
                        continue
                    size = int(batch.lengths[j])
                    if spent + size > room:
                        return spent  # the rest: refused (asked again)
                    spent += size
                    records[i] = (int(batch.stamps[j]), batch.payload(j))
                else:
                    continue
                break
        except (TopicwireError, OSError):  # a log that cannot be read: not kept
            self.counters["nak_read_errors"] += 1
        for i in wanted.values():
            if records[i] is False:
                records[i] = None  # read past (or unreadable): retention deleted it
        return spent
