"""Persisted acknowledgements across the fabric: a neighbour's cache (docs/fault-tolerance.md,
"Persisted by a neighbour's cache").

Two sides, both on the data-path thread, owned by the ``GuaranteedPlane``:

``Reporter`` (at the caching appliance B, ``[cache] acknowledge = "persisted"``): for each
guaranteed stream that arrives from another appliance A, ``(A, publishing session | R)``, it
follows the positions of the reliable stream A -> B (A's sender's sequence numbers, which
both ends know): ``through``, the last one routed here; ``waiting``, the ones handed to the
cache's session and not yet reported persisted (with their sequence on the stream to the
cache, by which the cache reports them); ``failed``, the first one the cache will never
persist (dropped from its full queue, lost on the way, the cache's session gone). What it
tells A, per stream, is ``[stream, first, settled, failed, why]``: every position from
``first`` (the first it followed) to ``settled`` either went to the cache and is on disk, or
was not for the cache; ``failed`` (0: none) will never be. The control agent sends the
entries to A as a CONTROL ``PERSISTED`` document, signed like every admin frame on the link;
they are cumulative, so a lost one is made good by the next, and each stream's entry is sent
again every ``RESEND_NS`` while it changed in the last ``RESEND_FOR_NS`` and every
``REPEAT_NS`` while it changed in the last ``REPEAT_FOR_NS``.

``Waiter`` (at the publisher's appliance A, ``[cache] remote = "B"``): a local publisher's
guaranteed message that goes to B waits in its stream's gate (the one persisted
acknowledgements use: ``_Gate.waiting`` holds (client stream sequence, its sequence on the
stream to B)) until an entry of B's covers it; one below ``first``, or at ``failed``, ends
the publisher's session (``_persist_failed``), as a local cache's drop does.

Bounds: B follows at most ``MAX_STREAMS`` streams (one with nothing waiting goes first when
a new one comes; when all wait, the new stream's messages are reported failed at once, so
A's publisher is told instead of stalling); the waiting entries are bounded by the
publishers' send windows. A keeps nothing per report: an entry either moves a gate or is
counted and dropped.
"""

from __future__ import annotations

import json
import time
from collections import deque
from typing import TYPE_CHECKING

from appliance.dataplane.names import PERSISTED_CHANNEL
from appliance.dataplane.state import log

if TYPE_CHECKING:
    from appliance.dataplane.guaranteed import GuaranteedPlane

MAX_STREAMS = 4_096
"""(origin, publishing stream) pairs a caching appliance follows for its neighbours."""
ENTRIES_PER_DOCUMENT = 32
"""Streams per PERSISTED document (with reasons, well within one frame)."""
RESEND_NS = 200_000_000
"""A stream's entry is sent again this often ..."""
RESEND_FOR_NS = 3_000_000_000
"""... while it changed within this long (or something of it still waits); and ..."""
REPEAT_NS = 1_000_000_000
"""... every this often while it changed within ``REPEAT_FOR_NS``: a report lost while
the link was down (a partition) is made good once it is back."""
REPEAT_FOR_NS = 60_000_000_000
"""(``STREAM_IDLE_TIMEOUT_NS``: a longer outage is not covered anyway, reliability.md.)"""
MAX_WHY_CHARS = 512
PERSISTED_BEACON_NS = 1_000_000_000
"""A caching appliance tells its up neighbours which patterns its cache keeps this often
(a PERSISTED document with no streams; control/agent.py ``_persisted_timers``)."""
RELIABLE = 0x8000_0000
"""``RELIABLE_STREAM_BIT`` (guaranteed.py imports this module)."""


class _Stream:
    __slots__ = ("changed_ns", "failed", "first", "through", "waiting", "why")

    def __init__(self, first: int, now_ns: int) -> None:
        self.first = first
        self.through = first - 1
        self.waiting: deque[tuple[int, int]] = deque()
        """(position on the stream from the origin, sequence on the stream to the cache)."""
        self.failed = 0
        self.why = ""
        self.changed_ns = now_ns

    def settled(self) -> int:
        upto = self.through
        if self.waiting:
            upto = min(upto, self.waiting[0][0] - 1)
        if self.failed:
            upto = min(upto, self.failed - 1)
        return upto

    def fail(self, pos: int, why: str) -> None:
        if not self.failed or pos < self.failed:
            self.failed, self.why = pos, why[:MAX_WHY_CHARS]


class Reporter:
    """The caching appliance's side (module docstring)."""

    def __init__(self, plane: GuaranteedPlane) -> None:
        self.plane = plane
        self.streams: dict[tuple[int, int], _Stream] = {}
        self.dirty: set[tuple[int, int]] = set()
        self._resend_at = 0
        self._repeat_at = 0

    def _stream(self, origin: int, stream: int, pos: int) -> _Stream | None:
        key = (origin, stream)
        st = self.streams.get(key)
        if st is not None:
            return st
        counters = self.plane.counters
        now_ns = time.monotonic_ns()
        if len(self.streams) >= MAX_STREAMS:
            idle = min((k for k, s in self.streams.items() if not s.waiting),
                       key=lambda k: self.streams[k].changed_ns, default=None)
            if idle is None:
                counters["persist_remote_streams_refused"] += 1
                st = _Stream(pos, now_ns)  # told, not kept: the publisher is not left waiting
                st.fail(pos, f"the caching appliance follows {MAX_STREAMS} publishing "
                        "streams already")
                self._send(origin, [self._entry(stream, st)])
                return None
            del self.streams[idle]
            self.dirty.discard(idle)
            counters["persist_remote_streams_evicted"] += 1
        st = self.streams[key] = _Stream(pos, now_ns)
        return st

    def routed(self, origin: int, stream: int, pos: int) -> None:
        """Position ``pos`` of (origin, stream) went through the tables here."""
        stream |= RELIABLE
        if not self.plane.cache_present():  # nothing reaches the cache: a stream followed
            st = self.streams.get((origin, stream))  # fails here (never settled past it);
            if st is not None and not st.failed:  # another is followed from its next
                st.fail(pos, "its cache's session was not logged in")  # message on
                self._touch((origin, stream), st)
            return
        st = self._stream(origin, stream, pos)
        if st is not None and pos > st.through:
            st.through = pos
            self._touch((origin, stream), st)

    def to_cache(self, origin: int, stream: int, pos: int, cache_seq: int) -> None:
        stream |= RELIABLE
        st = self.streams.get((origin, stream))
        if st is not None:
            st.waiting.append((pos, cache_seq))

    def persisted(self, origin: int, stream: int, cache_seq: int) -> None:
        """The cache reports (origin, stream)'s message ``cache_seq`` on disk (in order)."""
        stream |= RELIABLE
        st = self.streams.get((origin, stream))
        counters = self.plane.counters
        if st is None or not st.waiting:
            counters["persist_remote_untracked"] += 1
            return
        head = st.waiting[0][1]
        if cache_seq < head:  # handed to the cache before this stream was followed
            counters["persist_remote_untracked"] += 1
            return
        if cache_seq == head:
            st.waiting.popleft()
            counters["persist_remote_persisted"] += 1
        else:  # the head was skipped: it will never be reported
            st.fail(st.waiting[0][0], "the cache kept later messages of this publisher but "
                    "not this one")
        self._touch((origin, stream), st)

    def unkept(self, origin: int, stream: int, first: int, last: int, why: str) -> None:
        """The cache will never keep (origin, stream)'s messages ``first``..``last`` (its
        stream's sequences)."""
        stream |= RELIABLE
        st = self.streams.get((origin, stream))
        if st is None:
            return
        for pos, cache_seq in st.waiting:
            if first <= cache_seq <= last:
                st.fail(pos, why)
                self._touch((origin, stream), st)
                break

    def lost(self, origin: int, stream: int, first: int, last: int, reason: str) -> None:
        """Positions ``first``..``last`` of (origin, stream) never arrived here."""
        stream |= RELIABLE
        st = self.streams.get((origin, stream))
        if st is not None and last >= st.first:
            st.fail(max(first, st.first), f"lost on the way to the caching appliance "
                    f"({reason})")
            self._touch((origin, stream), st)

    def cache_gone(self) -> None:
        """The cache's session ended: what it was handed will not be reported."""
        for key, st in self.streams.items():
            if st.waiting:
                st.fail(st.waiting[0][0], "the cache's session ended before it was on disk")
                self._touch(key, st)

    def _touch(self, key: tuple[int, int], st: _Stream) -> None:
        st.changed_ns = time.monotonic_ns()
        self.dirty.add(key)

    @staticmethod
    def _entry(stream: int, st: _Stream) -> list:
        return [stream, st.first, max(st.settled(), 0), st.failed, st.why]

    def emit(self, now_ns: int) -> None:
        """Entries of the streams that moved (and, every RESEND_NS, of those that moved
        lately or still wait) to the control agent, per origin."""
        keys = self.dirty
        if now_ns >= self._resend_at:
            self._resend_at = now_ns + RESEND_NS
            within = RESEND_FOR_NS
            if now_ns >= self._repeat_at:
                self._repeat_at = now_ns + REPEAT_NS
                within = REPEAT_FOR_NS
            keys = keys | {k for k, st in self.streams.items()
                           if st.waiting or now_ns - st.changed_ns < within}
        if not keys:
            return
        by_origin: dict[int, list] = {}
        for key in keys:
            st = self.streams.get(key)
            if st is not None:
                by_origin.setdefault(key[0], []).append(self._entry(key[1], st))
        self.dirty = set()
        for origin, entries in by_origin.items():
            for i in range(0, len(entries), ENTRIES_PER_DOCUMENT):
                self._send(origin, entries[i : i + ENTRIES_PER_DOCUMENT])

    def _send(self, origin: int, entries: list) -> None:
        counters = self.plane.counters
        doc = json.dumps({"to": origin, "streams": entries}, separators=(",", ":")).encode()
        if self.plane.dp.to_inbox(PERSISTED_CHANNEL, doc):
            counters["persist_remote_reports"] += 1
        else:
            counters["persist_remote_reports_dropped"] += 1

    def count(self) -> dict[str, int]:
        return {"persist_remote_streams": len(self.streams),
                "persist_remote_waiting": sum(len(s.waiting) for s in self.streams.values())}


class Waiter:
    """The publisher's appliance's side (module docstring)."""

    def __init__(self, plane: GuaranteedPlane, node: int, name: str) -> None:
        self.plane = plane
        self.node = node
        self.name = name
        self.ready = False
        """The neighbour is up and its cache's guaranteed interest is known here (the
        control agent's ``remote_ready``): publishes are taken only then."""

    def take(self, entries: list) -> None:
        """A ``PERSISTED`` document's entries from the caching appliance (its MAC and link
        checked by the control agent, its shape by the document schema)."""
        plane = self.plane
        counters = plane.counters
        for stream, first, settled, failed, why in entries:
            session = stream & ~RELIABLE
            gate = plane.gates.get(session)
            held = plane.senders.get(("n", self.node, stream))
            if gate is None or held is None or not stream & RELIABLE:
                counters["persist_remote_entries_unknown"] += 1
                continue
            sender = held.sender
            sent = sender.next_seq - 1 + len(sender.pending)
            if settled > sent or failed > sent + 1 or (failed and failed <= settled):
                counters["persist_remote_entries_refused"] += 1  # beyond what was sent
                continue
            counters["persist_remote_entries"] += 1
            waiting = gate.waiting
            while waiting:
                seq, pos = waiting[0]
                if pos < first:
                    plane._persist_failed(session, seq, f"it reached {self.name} before its "
                                          "cache followed this publisher's stream")
                    break
                if failed and pos >= failed:
                    plane._persist_failed(session, seq, f"{self.name}: {why}")
                    break
                if pos > settled:
                    break
                waiting.popleft()
                counters["guaranteed_persisted_acks"] += 1
                plane._busy.add(gate.where)

    def sender_dropped(self, stream: int, why: str) -> None:
        """The stream to the caching appliance ended (it restarted): what waited on it will
        never be reported."""
        gate = self.plane.gates.get(stream & ~RELIABLE)
        if gate is not None and gate.waiting:
            self.plane._persist_failed(stream & ~RELIABLE, gate.waiting[0][0],
                                       f"{self.name} {why} before it reported it persisted")

    def gone(self, why: str) -> None:
        """The caching appliance stopped (its goodbye): it restarts as a new incarnation,
        whose cache never reports what waits here."""
        for session, gate in list(self.plane.gates.items()):
            if gate.waiting:
                self.plane._persist_failed(session, gate.waiting[0][0], f"{self.name} {why} "
                                           "before it reported it persisted")

    def unreachable(self, session: int, seq: int, why: str) -> None:
        log.warning("data path: publishing session %d: message %d cannot reach %s (%s)",
                    session, seq, self.name, why)
        self.plane._persist_failed(session, seq, f"{self.name} {why}")
