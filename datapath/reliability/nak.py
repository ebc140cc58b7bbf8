"""Missing ranges of one stream and when to NAK them (receiver side).

``GapList`` keeps the stream's missing sequence ranges sorted and disjoint, each with its
timers: when it was detected, when its next NAK is due, how many NAKs it has had, and its
recovery deadline. Filling a sequence shrinks or splits its gap; splitting keeps the timers.
``NakSchedule`` decides the NAK times: immediate (unicast) or a random delay (multicast) for
the first NAK, then retries with exponential backoff until the deadline.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from operator import attrgetter

from datapath.reliability.config import ReceiverConfig

_FIRST = attrgetter("first")


class Gap:
    """Sequences first..last (inclusive) are missing."""

    __slots__ = ("deadline_ns", "detected_ns", "first", "last", "naks", "next_nak_ns")

    def __init__(self, first: int, last: int, detected_ns: int, deadline_ns: int,
                 next_nak_ns: int, naks: int = 0) -> None:
        self.first = first
        self.last = last
        self.detected_ns = detected_ns
        self.deadline_ns = deadline_ns
        self.next_nak_ns = next_nak_ns
        self.naks = naks

    def copy(self, first: int, last: int) -> Gap:
        return Gap(first, last, self.detected_ns, self.deadline_ns, self.next_nak_ns, self.naks)

    def __repr__(self) -> str:
        return f"Gap({self.first}..{self.last}, naks={self.naks}, next={self.next_nak_ns})"


class GapList:
    """Sorted, disjoint missing ranges of one stream, at most ``max_gaps`` of them."""

    __slots__ = ("gaps", "max_gaps")

    def __init__(self, max_gaps: int) -> None:
        self.gaps: list[Gap] = []
        self.max_gaps = max_gaps

    def __len__(self) -> int:
        return len(self.gaps)

    def __bool__(self) -> bool:
        return bool(self.gaps)

    def missing(self) -> int:
        """Sequences missing in all gaps."""
        return sum(g.last - g.first + 1 for g in self.gaps)

    def append(self, gap: Gap) -> bool:
        """Add a gap above every other one; False (nothing added) at the gap limit."""
        if len(self.gaps) >= self.max_gaps:
            return False
        self.gaps.append(gap)
        return True

    def _index(self, seq: int) -> int:
        """Index of the gap holding ``seq``, or -1."""
        gaps = self.gaps
        if not gaps:
            return -1
        i = bisect_right(gaps, seq, key=_FIRST) - 1
        if i >= 0 and gaps[i].last >= seq:
            return i
        return -1

    def fill(self, seq: int) -> Gap | None:
        """Remove ``seq`` from its gap; the gap it was in (timers intact), or None if not missing.

        Filling the middle of a gap splits it (one more gap): callers that hold the gap limit
        strictly check ``would_split`` first."""
        i = self._index(seq)
        if i < 0:
            return None
        gaps = self.gaps
        g = gaps[i]
        if g.first == g.last:
            del gaps[i]
        elif seq == g.first:
            g.first = seq + 1
        elif seq == g.last:
            g.last = seq - 1
        else:
            gaps.insert(i + 1, g.copy(seq + 1, g.last))
            g.last = seq - 1
        return g

    def contains(self, seq: int) -> bool:
        return self._index(seq) >= 0

    def would_split(self, seq: int) -> bool:
        """True when filling ``seq`` would split its gap in two."""
        i = self._index(seq)
        return i >= 0 and self.gaps[i].first < seq < self.gaps[i].last

    def isolate(self, first: int, last: int) -> list[Gap]:
        """Split gaps at ``first`` and ``last`` so that the parts inside [first, last] are gaps
        of their own, and return those parts (in order). Splits beyond the gap limit are
        skipped: a part then also covers sequences outside the range."""
        gaps = self.gaps
        if not gaps or first > last:
            return []
        i = max(bisect_right(gaps, first, key=_FIRST) - 1, 0)
        out: list[Gap] = []
        while i < len(gaps) and gaps[i].first <= last:
            g = gaps[i]
            if g.last < first:
                i += 1
                continue
            if g.first < first and len(gaps) < self.max_gaps:
                gaps.insert(i + 1, g.copy(first, g.last))
                g.last = first - 1
                i += 1
                g = gaps[i]
            if g.last > last and len(gaps) < self.max_gaps:
                gaps.insert(i + 1, g.copy(last + 1, g.last))
                g.last = last
            out.append(g)
            i += 1
        return out

    def remove(self, first: int, last: int) -> list[Gap]:
        """Take the missing parts of [first, last] out of the list and return them (in order,
        with their timers)."""
        gaps = self.gaps
        if not gaps or first > last:
            return []
        i = max(bisect_right(gaps, first, key=_FIRST) - 1, 0)
        out: list[Gap] = []
        while i < len(gaps) and gaps[i].first <= last:
            g = gaps[i]
            if g.last < first:
                i += 1
                continue
            lo, hi = max(g.first, first), min(g.last, last)
            out.append(g.copy(lo, hi))
            if g.first < lo and g.last > hi:
                gaps.insert(i + 1, g.copy(hi + 1, g.last))
                g.last = lo - 1
                i += 2
            elif g.first < lo:
                g.last = lo - 1
                i += 1
            elif g.last > hi:
                g.first = hi + 1
                i += 1
            else:
                del gaps[i]
        return out


class NakSchedule:
    """NAK timing of one receiver: first-NAK delay, retry backoff, jitter on multicast."""

    __slots__ = ("_rng", "config")

    def __init__(self, config: ReceiverConfig, rng: random.Random) -> None:
        self.config = config
        self._rng = rng

    def first_nak_ns(self, now_ns: int) -> int:
        c = self.config
        if c.multicast:
            return now_ns + int(self._rng.random() * c.nak_multicast_max_delay_ns)
        return now_ns + c.nak_delay_ns

    def retry_interval_ns(self, naks: int) -> int:
        """Interval after the ``naks``-th NAK of a gap (naks >= 1)."""
        c = self.config
        interval = c.nak_retry_initial_ns * c.nak_retry_backoff_factor ** min(naks - 1, 32)
        interval = min(interval, c.nak_retry_max_ns)
        if c.multicast:  # receivers that NAKed together should not retry together
            interval += int(self._rng.random() * c.nak_multicast_max_delay_ns)
        return interval
