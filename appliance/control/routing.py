"""Link state, per-(source, destination) paths and interest suppression: pure functions.

Every appliance holds the same link-state database (flooded LSAs) and so computes the same
paths: Dijkstra over links both ends advertise, ties broken by the lexicographically smallest
sequence of node ids (the heap orders by (cost, path)). Route overrides replace the path of a
pair when every link on them is up.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from datapath.topics.algebra import WILDCARDS, _fresh_level, includes_levels, split_pattern
from datapath.topics.index import TopicIndex

Path = tuple[int, ...]


@dataclass(frozen=True)
class Lsa:
    """One origin's link-state advertisement."""

    origin: int
    name: str
    epoch: int
    seq: int
    links: tuple[tuple[int, int], ...]
    """(neighbour node id, cost) of its live neighbours."""

    def newer_than(self, other: Lsa | None) -> bool:
        return other is None or (self.epoch, self.seq) > (other.epoch, other.seq)


def graph_of(lsas: Mapping[int, Lsa]) -> dict[int, dict[int, int]]:
    """Adjacency {node: {neighbour: cost}} of the links both ends advertise (the higher cost
    of the two directions counts)."""
    said = {origin: dict(lsa.links) for origin, lsa in lsas.items()}
    graph: dict[int, dict[int, int]] = {origin: {} for origin in said}
    for a, links in said.items():
        for b, cost in links.items():
            back = said.get(b, {}).get(a)
            if back is not None and a != b:
                graph[a][b] = max(cost, back)
    return graph


def shortest_paths(graph: Mapping[int, Mapping[int, int]],
                   source: int) -> dict[int, tuple[int, Path]]:
    """{destination: (cost, path)} from ``source``; ties: smallest sequence of node ids."""
    if source not in graph:
        return {}
    best: dict[int, tuple[int, Path]] = {}
    heap: list[tuple[int, Path]] = [(0, (source,))]
    while heap:
        cost, path = heapq.heappop(heap)
        node = path[-1]
        if node in best:
            continue
        best[node] = (cost, path)
        for nxt, link in graph.get(node, {}).items():
            if nxt not in best and nxt not in path:
                heapq.heappush(heap, (cost + link, (*path, nxt)))
    return best


def all_paths(graph: Mapping[int, Mapping[int, int]],
              overrides: Mapping[tuple[int, int], Path] | None = None
              ) -> dict[tuple[int, int], tuple[int, Path]]:
    """{(source, destination): (cost, path)} for every connected pair, overrides applied."""
    out: dict[tuple[int, int], tuple[int, Path]] = {}
    for source in graph:
        for dest, found in shortest_paths(graph, source).items():
            if dest != source:
                out[(source, dest)] = found
    for pair, path in (overrides or {}).items():
        cost = path_cost(graph, path)
        if cost is not None and pair in out and path[0] == pair[0] and path[-1] == pair[1]:
            out[pair] = (cost, path)
    return out


def path_cost(graph: Mapping[int, Mapping[int, int]], path: Path) -> int | None:
    """The cost of ``path`` if it is simple and every link of it is up, else None."""
    if len(path) < 2 or len(set(path)) != len(path):
        return None
    total = 0
    for a, b in zip(path, path[1:]):
        link = graph.get(a, {}).get(b)
        if link is None:
            return None
        total += link
    return total


def minimal_patterns(patterns: Iterable[str]) -> list[str]:
    """The patterns no other one ``includes`` (superset suppression), sorted; of patterns
    that include each other (equivalent), the smallest text is kept.

    The patterns go into a topic index once; each pattern is then compared only with the
    patterns that match its witness, the topic made of it by writing a level no pattern
    names for each wildcard. A pattern that includes it matches every topic it matches, the
    witness too (a necessary condition of inclusion), so the index returns every candidate;
    the cost is one index walk per pattern, whatever the patterns share (bucketing them by
    their literal prefix compared every pair of patterns starting with a wildcard, and
    comparing all pairs cost about a million ``includes`` calls for a thousand patterns)."""
    unique = sorted(set(patterns))
    if len(unique) < 2:
        return unique
    levels = {p: split_pattern(p) for p in unique}
    fresh = _fresh_level(*levels.values())
    index: TopicIndex[str] = TopicIndex(cache_entries=0)
    for p in unique:
        index.add(p, p)
    kept = []
    for p in unique:
        lp = levels[p]
        witness = tuple(fresh if level in WILDCARDS else level for level in lp)
        covered = False
        for q in index.match_levels(witness):
            if q != p and includes_levels(levels[q], lp) and (
                    q < p or not includes_levels(lp, levels[q])):
                covered = True
                break
        if not covered:
            kept.append(p)
    return kept


def _covers(q: tuple[str, ...], p: tuple[str, ...], q_text: str, p_text: str) -> bool:
    """Whether pattern ``q`` makes ``p`` not minimal (``minimal_patterns``'s rule): it
    includes it, and of two that include each other the smaller text stays."""
    return includes_levels(q, p) and (q_text < p_text or not includes_levels(p, q))


class MinimalSet:
    """The ``minimal_patterns`` of a changing set of patterns, kept as patterns come and go
    (the interest of a namespace: control/state.py ``InterestSets``).

    Adding a pattern costs one walk of an index of the minimal ones (is it covered?) and, for
    a pattern with a wildcard that is not covered, one pass over the minimal ones (which does
    it cover?); a topic without wildcards covers nothing but itself. Removing a pattern that
    is not minimal, or one without wildcards, costs nothing more; removing a minimal pattern
    with a wildcard recomputes from the patterns held (those it covered may be minimal now).
    Recomputing every time cost an index walk per pattern held at every change: about 10 ms
    per subscribe for a thousand patterns."""

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.minimal: set[str] = set()
        self._levels: dict[str, tuple[str, ...]] = {}
        self._index: TopicIndex[str] = TopicIndex(cache_entries=0)
        self._fresh = _fresh_level()
        self.recomputes = 0

    def _witness(self, levels: tuple[str, ...]) -> tuple[str, ...]:
        """A topic ``levels`` matches (its wildcards written as one rare level): every
        pattern that includes it matches this topic (another may too, and is checked)."""
        return tuple(self._fresh if level in WILDCARDS else level for level in levels)

    def add(self, pattern: str) -> None:
        if pattern in self.held:
            return
        levels = split_pattern(pattern)
        self.held.add(pattern)
        self._levels[pattern] = levels
        for q in self._index.match_levels(self._witness(levels)):
            if q != pattern and _covers(self._levels[q], levels, q, pattern):
                return  # covered by a minimal pattern: the minimal set stays
        if any(level in WILDCARDS for level in levels):
            gone = [r for r in self.minimal
                    if _covers(levels, self._levels[r], pattern, r)]
            for r in gone:
                self.minimal.discard(r)
                self._index.remove(r, r)
        self.minimal.add(pattern)
        self._index.add(pattern, pattern)

    def remove(self, pattern: str) -> None:
        if pattern not in self.held:
            return
        self.held.discard(pattern)
        levels = self._levels.pop(pattern)
        if pattern not in self.minimal:
            return
        self.minimal.discard(pattern)
        self._index.remove(pattern, pattern)
        if any(level in WILDCARDS for level in levels):  # what it covered may be minimal now
            self.recomputes += 1
            self.minimal = set(minimal_patterns(self.held))
            self._index = TopicIndex(cache_entries=0)
            for p in self.minimal:
                self._index.add(p, p)
