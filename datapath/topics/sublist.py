"""Subscription lists with positive and negative entries (seed 000, figures 4-8).

A subscriber's list is ordered oldest to newest; ``+p`` delivers the topics of ``p``, ``-p``
withholds them. The newest entry whose pattern includes a topic decides it, so a partial
unsubscribe (``-a/b/#`` after ``+a/#``) needs no rewrite of the broader subscription.
Requests keep the list short (seed 000's steps, figure 4):

subscribe p:   41/42 remove every entry (+ or -) that p includes;
               43/44 append +p if no positive entry includes p, or
               45    if one does but p overlaps a negative entry (which could withhold part of p).
unsubscribe p: 46/47 remove every entry that p includes;
               48/49 append -p if it overlaps a remaining positive entry.
Then negative entries at the head are dropped: nothing older remains for them to withhold.

The result decides every topic exactly as the naive list of every request ever made, walked
newest first (``naive_decision``); tests/datapath/topics/test_sublist.py checks that on random
request sequences.

Cost: subscribing a topic without wildcards (the usual request of a list that holds many)
looks only at the entries with wildcards and at the entry of that same topic, if any (a
topic includes, and overlaps, only itself): a list of many plain topics takes one more in
constant time, not in a pass over all of them. Other requests pass over the list. Deciding
a topic likewise looks only at the wildcard entries and the topic's own (``decides``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from datapath.topics.algebra import (
    MULTI,
    SINGLE,
    TopicError,
    includes_levels,
    matches_levels,
    overlaps_levels,
    split_pattern,
    split_topic,
)

_LEVEL_CACHE_ENTRIES = 65_536
SUBSCRIBE = "+"
UNSUBSCRIBE = "-"


@dataclass(frozen=True, slots=True)
class Entry:
    """One list entry: a pattern and whether it delivers (+) or withholds (-) its topics."""

    positive: bool
    pattern: str

    @property
    def levels(self) -> tuple[str, ...]:
        return _levels(self.pattern)

    def __str__(self) -> str:
        return (SUBSCRIBE if self.positive else UNSUBSCRIBE) + self.pattern


@lru_cache(maxsize=_LEVEL_CACHE_ENTRIES)
def _levels(pattern: str) -> tuple[str, ...]:
    return split_pattern(pattern)


def _wildcarded(levels: tuple[str, ...]) -> bool:
    return SINGLE in levels or MULTI in levels


def parse_request(request: str) -> Entry:
    """``'+a/#'`` -> subscribe, ``'-a/b/#'`` -> unsubscribe, a bare pattern -> subscribe."""
    text = request.strip()
    if not text:
        raise TopicError("empty request; write '+PATTERN' to subscribe or '-PATTERN' to "
                         "unsubscribe")
    positive = not text.startswith(UNSUBSCRIBE)
    pattern = text[1:] if text[0] in (SUBSCRIBE, UNSUBSCRIBE) else text
    split_pattern(pattern)
    return Entry(positive, pattern)


class SubscriptionList:
    """One subscriber's list; see the module docstring for the rules."""

    def __init__(self, requests: Iterable[str] = ()) -> None:
        self._entries: list[Entry] = []
        self._wild: list[Entry] = []
        """The entries whose pattern has a wildcard (in list order)."""
        self._plain: dict[str, Entry] = {}
        """Pattern -> the entry of a pattern without wildcards (at most one each)."""
        self._order: dict[str, int] = {}
        """Pattern -> when its entry was appended (a list holds one entry per pattern, and
        entries keep the order they were appended in): ``decides`` compares two."""
        self._appended = 0
        self._log: list[tuple[bool, str]] | None = None
        """While ``tracked`` runs: (positive entry added, pattern), (removed, pattern)."""
        for request in requests:
            self.apply(request)

    @property
    def entries(self) -> tuple[Entry, ...]:
        """Oldest first."""
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    def __repr__(self) -> str:
        return f"SubscriptionList([{', '.join(repr(str(e)) for e in self._entries)}])"

    def apply(self, request: str) -> None:
        """Apply a request text: ``+p`` (or bare ``p``) subscribes, ``-p`` unsubscribes."""
        entry = parse_request(request)
        if entry.positive:
            self.subscribe(entry.pattern)
        else:
            self.unsubscribe(entry.pattern)

    def subscribe(self, pattern: str) -> None:
        levels = split_pattern(pattern)
        if not _wildcarded(levels):
            self._subscribe_plain(pattern, levels)
            return
        self._remove_included_in(levels)
        covered = any(e.positive and includes_levels(e.levels, levels) for e in self._entries)
        shadowed = any(not e.positive and overlaps_levels(e.levels, levels)
                       for e in self._entries)
        if not covered or shadowed:
            self._append(Entry(True, pattern))
        self._drop_leading_negatives()
        self._reindex()

    def _subscribe_plain(self, pattern: str, levels: tuple[str, ...]) -> None:
        """``subscribe`` of a topic without wildcards: the same steps, over the entries that
        can include or overlap it (those with wildcards, and its own)."""
        own = self._plain.pop(pattern, None)
        if own is not None:  # 41/42: the only plain entry a plain topic includes
            self._entries.remove(own)
            del self._order[pattern]
            if own.positive and self._log is not None:
                self._log.append((False, pattern))
        covered = any(e.positive and includes_levels(e.levels, levels) for e in self._wild)
        shadowed = any(not e.positive and overlaps_levels(e.levels, levels)
                       for e in self._wild)
        if not covered or shadowed:
            entry = Entry(True, pattern)
            self._append(entry)
            self._plain[pattern] = entry
        if self._entries and not self._entries[0].positive:
            self._drop_leading_negatives()
            self._reindex()

    def _append(self, entry: Entry) -> None:
        if entry.positive and self._log is not None:
            self._log.append((True, entry.pattern))
        self._entries.append(entry)
        self._order[entry.pattern] = self._appended
        self._appended += 1

    def _reindex(self) -> None:
        self._wild = [e for e in self._entries if _wildcarded(e.levels)]
        self._plain = {e.pattern: e for e in self._entries if not _wildcarded(e.levels)}
        order = self._order
        self._order = {e.pattern: order[e.pattern] for e in self._entries}

    def unsubscribe(self, pattern: str) -> None:
        levels = split_pattern(pattern)
        self._remove_included_in(levels)
        if any(e.positive and overlaps_levels(e.levels, levels) for e in self._entries):
            self._append(Entry(False, pattern))
        self._drop_leading_negatives()
        self._reindex()

    def withdraw(self, pattern: str) -> bool:
        """Remove the positive entry ``pattern`` (no negative entry is added): the topics it
        decided fall to the older entries, so the list delivers a subset of what it did and
        every topic it still delivers is one a remaining positive entry matches. Used when an
        entitlement is taken back (docs/appliance.md, "Reload (SIGHUP)"); True if found."""
        kept = [e for e in self._entries if not (e.positive and e.pattern == pattern)]
        if len(kept) == len(self._entries):
            return False
        self._entries = kept
        if self._log is not None:
            self._log.append((False, pattern))
        self._drop_leading_negatives()
        self._reindex()
        return True

    def decides(self, topic: str) -> bool:
        """Deliver ``topic``? The newest entry whose pattern matches it decides; none: no.
        The entries that can match a topic are those with wildcards and the one of that
        very topic, if any: the newest of them decides, found without a pass over the
        plain topics of a list that holds many."""
        levels = split_topic(topic)
        own = self._plain.get(topic)
        for entry in reversed(self._wild):
            if matches_levels(entry.levels, levels):
                if own is None or self._order[entry.pattern] > self._order[own.pattern]:
                    return entry.positive
                break
        return own is not None and own.positive

    def positive_patterns(self) -> list[str]:
        """The patterns this list can deliver from (what a topic index needs to hold)."""
        return [e.pattern for e in self._entries if e.positive]

    def tracked(self, change: Callable[[SubscriptionList], object]) -> tuple[set[str], set[str]]:
        """Run ``change(self)``; return the patterns it made positive entries of and those
        whose positive entry it removed for good (what a topic index adds and removes),
        without the two passes over the list that comparing ``positive_patterns`` before and
        after takes. A list holds one entry per pattern and a subscribe removes a pattern's
        entry before it appends one, so a pattern's first change says what it was."""
        log: list[tuple[bool, str]] = []
        self._log = log
        try:
            change(self)
        finally:
            self._log = None
        first: dict[str, bool] = {}
        last: dict[str, bool] = {}
        for added, pattern in log:
            first.setdefault(pattern, added)
            last[pattern] = added
        gained = {p for p, added in last.items() if added and first[p]}
        lost = {p for p, added in last.items() if not added and not first[p]}
        return gained, lost

    def _remove_included_in(self, levels: tuple[str, ...]) -> None:
        kept = [e for e in self._entries if not includes_levels(levels, e.levels)]
        if self._log is not None and len(kept) != len(self._entries):
            self._log.extend((False, e.pattern) for e in self._entries
                             if e.positive and includes_levels(levels, e.levels))
        self._entries = kept

    def _drop_leading_negatives(self) -> None:
        while self._entries and not self._entries[0].positive:
            self._entries.pop(0)


def naive_decision(requests: Sequence[str], topic: str) -> bool:
    """The reference: every request ever made, newest first; the first that matches decides."""
    levels = split_topic(topic)
    for request in reversed(requests):
        entry = parse_request(request)
        if matches_levels(entry.levels, levels):
            return entry.positive
    return False


def replay(lines: Iterable[str]) -> SubscriptionList:
    """Build a list from request lines (``+p``, ``-p`` or bare ``p``); blank lines are skipped.

    There is no comment syntax: ``#`` starts a valid pattern. Errors name the line number.
    """
    sublist = SubscriptionList()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            sublist.apply(line)
        except TopicError as exc:
            raise TopicError(f"line {number}: {str(exc).removeprefix('topics: ')}") from None
    return sublist
