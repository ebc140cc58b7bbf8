"""Topic index: which subscriptions match a topic, and which topics a new pattern matches.

``TopicIndex`` answers the data-path question "who subscribed to this concrete topic?". It is
nats-server's sublist (``server/sublist.go``) generalised to this project's ``#``, which may
stand at any level and repeat (``#/a``, ``a/#/b/#``):

    root ── literal{"us": n1, "eu": n2}   pwc ("+"): n3   fwc ("#"): n4
               n1 ── literal{"nyse": ...}  pwc: ...      fwc: n5 ── subs {s1}       ("us/#")
                                                              └─ literal{"bid": n6} ("us/#/bid")

- One node per pattern prefix; a node holds the subscribers whose pattern ends there.
- ``+`` edges consume exactly one level (an empty one too), literal edges one equal level.
- In nats ``>`` is terminal. Here a ``#`` node may have children, so a lookup walks the topic
  level by level with a *set of active nodes* (an NFA walk): a ``#`` node, once reached, stays
  active for every later level (it absorbs 0..k levels). Each node is active at most once per
  level, so a lookup costs O(levels x active nodes), never exponential. A ``#`` node without
  children (the common trailing ``#``) contributes its subscribers at once and is not kept.
- A bounded LRU cache maps recent topics to their result; ``add`` updates the cached results
  the new pattern matches and ``remove`` drops them (sublist's ``addToCache``/
  ``removeFromCache``), so a cached answer is never stale.

``TopicCatalog`` is the reverse direction for the control plane: registered concrete topics in
a trie of nested dicts, and ``matching(pattern)`` walks it with the pattern, exploring subtrees
only where a ``+`` or ``#`` asks for it.

Neither class locks: each is owned by one agent (the control plane hands changes over as
commands, docs/CONVENTIONS.md), like the rest of the data path.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator
from typing import Generic, TypeVar

from datapath.config import TOPIC_MATCH_CACHE_ENTRIES
from datapath.errors import UserError
from datapath.topics.algebra import matches_levels, split_pattern, split_topic

S = TypeVar("S", bound=Hashable)

MATCH_CACHE_ENTRIES = TOPIC_MATCH_CACHE_ENTRIES
"""Default bound of ``TopicIndex``'s result cache (``config.TOPIC_MATCH_CACHE_ENTRIES``)."""

_PLUS = "+"
_HASH = "#"


class TopicIndexError(UserError):
    """A refused index operation (e.g. a negative cache size)."""

    component = "topic-index"


class _Node:
    """One pattern prefix: its literal, ``+`` and ``#`` children and the subscribers ending here."""

    __slots__ = ("literal", "plus", "hash", "subs")

    def __init__(self) -> None:
        self.literal: dict[str, _Node] = {}
        self.plus: _Node | None = None
        self.hash: _Node | None = None
        self.subs: set = set()

    def has_children(self) -> bool:
        return bool(self.literal) or self.plus is not None or self.hash is not None

    def is_empty(self) -> bool:
        return not self.subs and not self.has_children()


def _is_literal(levels: tuple[str, ...]) -> bool:
    return _PLUS not in levels and _HASH not in levels


class TopicIndex(Generic[S]):
    """Subscriptions (pattern, subscriber) indexed for ``match(topic) -> subscribers``.

    Subscribers are any hashable objects. Adding a pair that is already present is a no-op;
    ``len()`` counts distinct (pattern, subscriber) pairs.
    """

    def __init__(self, cache_entries: int = MATCH_CACHE_ENTRIES) -> None:
        if cache_entries < 0:
            raise TopicIndexError(
                f"refused cache_entries={cache_entries}; give 0 (no cache) or a positive size"
            )
        self._root = _Node()
        self._by_pattern: dict[str, set[S]] = {}
        self._count = 0
        self._cache_max = cache_entries
        # topic -> (its levels, the subscribers matching it); most recently used last
        self._cache: OrderedDict[str, tuple[tuple[str, ...], set[S]]] = OrderedDict()
        self.lookups = 0
        """Calls to ``match``."""
        self.cache_hits = 0
        """Calls to ``match`` answered from the cache."""

    # --- changes -----------------------------------------------------------------------------
    def add(self, pattern: str, subscriber: S) -> None:
        """Subscribe ``subscriber`` to ``pattern`` (validated with ``split_pattern``)."""
        levels = split_pattern(pattern)
        node = self._root
        for level in levels:
            if level == _HASH:
                if node.hash is None:
                    node.hash = _Node()
                node = node.hash
            elif level == _PLUS:
                if node.plus is None:
                    node.plus = _Node()
                node = node.plus
            else:
                child = node.literal.get(level)
                if child is None:
                    child = node.literal[sys.intern(level)] = _Node()
                node = child
        if subscriber in node.subs:
            return
        node.subs.add(subscriber)
        self._by_pattern[pattern] = node.subs
        self._count += 1
        if self._cache:
            self._cache_add(pattern, levels, subscriber)

    def remove(self, pattern: str, subscriber: S) -> bool:
        """Unsubscribe; False if the pair was not present. Empty nodes are pruned."""
        levels = split_pattern(pattern)
        path: list[tuple[_Node, str]] = []  # (parent, level) for every node on the way
        node = self._root
        for level in levels:
            if level == _HASH:
                child = node.hash
            elif level == _PLUS:
                child = node.plus
            else:
                child = node.literal.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if subscriber not in node.subs:
            return False
        node.subs.discard(subscriber)
        self._count -= 1
        if not node.subs:
            del self._by_pattern[pattern]
        for parent, level in reversed(path):  # prune, as sublist's pruneNode does
            if not node.is_empty():
                break
            if level == _HASH:
                parent.hash = None
            elif level == _PLUS:
                parent.plus = None
            else:
                del parent.literal[level]
            node = parent
        if self._cache:
            self._cache_drop(pattern, levels)
        return True

    # --- lookups -----------------------------------------------------------------------------
    def match(self, topic: str) -> set[S]:
        """Every subscriber with a pattern matching the concrete ``topic`` (a new set)."""
        self.lookups += 1
        cache = self._cache
        if self._cache_max:
            hit = cache.get(topic)
            if hit is not None:
                self.cache_hits += 1
                cache.move_to_end(topic)
                return set(hit[1])
        levels = split_topic(topic)
        result = self._match_levels(levels)
        if self._cache_max:
            cache[topic] = (levels, set(result))
            if len(cache) > self._cache_max:
                cache.popitem(last=False)
        return result

    def match_levels(self, levels: tuple[str, ...]) -> set[S]:
        """``match`` of a topic already split (not checked, not cached): a topic any level
        names may hold, such as a pattern's witness (control/routing.py)."""
        return self._match_levels(levels)

    def _match_levels(self, levels: tuple[str, ...]) -> set[S]:
        result: set[S] = set()
        sticky: list[_Node] = []  # '#' nodes with children: active at every later level
        active = [self._root]
        position = 0
        while True:
            # close the nodes that just became active over '#' absorbing zero levels; a '#'
            # node is only ever reached here, and becomes sticky once, so nothing is active
            # twice at one level
            old = len(sticky)
            for node in active:  # sees the nodes appended below too
                h = node.hash
                if h is None:
                    continue
                if h.subs:
                    result |= h.subs  # a '#' ending the pattern matches any remainder
                if (h.literal or h.plus is not None or h.hash is not None) and h not in sticky:
                    sticky.append(h)
                    active.append(h)  # active now; its own '#' child is closed in turn
            if old:
                active.extend(sticky[:old])  # earlier '#' nodes absorb this level too
            if position == len(levels):
                break
            level = levels[position]
            position += 1
            step: list[_Node] = []
            for node in active:
                child = node.literal.get(level)
                if child is not None:
                    step.append(child)
                if node.plus is not None:
                    step.append(node.plus)
            active = step
        for node in active:
            if node.subs:
                result |= node.subs
        return result

    # --- introspection -----------------------------------------------------------------------
    def patterns(self) -> list[str]:
        """The patterns with at least one subscriber, sorted."""
        return sorted(self._by_pattern)

    def subscribers(self, pattern: str) -> frozenset[S]:
        """The subscribers of exactly ``pattern`` (not of the patterns it includes)."""
        return frozenset(self._by_pattern.get(pattern, ()))

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[str, S]]:
        for pattern, subs in self._by_pattern.items():
            for sub in subs:
                yield pattern, sub

    def stats(self) -> dict[str, int]:
        """Counters: subscriptions, patterns, lookups, cache hits, cached entries."""
        return {
            "subscriptions": self._count,
            "patterns": len(self._by_pattern),
            "lookups": self.lookups,
            "cache_hits": self.cache_hits,
            "cache_entries": len(self._cache),
        }

    def clear_cache(self) -> None:
        """Drop every cached result (the counters stay)."""
        self._cache.clear()

    # --- cache maintenance -------------------------------------------------------------------
    def _cache_add(self, pattern: str, levels: tuple[str, ...], subscriber: S) -> None:
        if _is_literal(levels):  # only the entry for that very topic can match
            hit = self._cache.get(pattern)
            if hit is not None:
                hit[1].add(subscriber)
            return
        for topic_levels, subs in self._cache.values():
            if matches_levels(levels, topic_levels):
                subs.add(subscriber)

    def _cache_drop(self, pattern: str, levels: tuple[str, ...]) -> None:
        # the subscriber may still match through another pattern: drop, recompute on demand
        if _is_literal(levels):
            self._cache.pop(pattern, None)
            return
        stale = [t for t, (tl, _) in self._cache.items() if matches_levels(levels, tl)]
        for topic in stale:
            del self._cache[topic]


class _Leaf:
    """Marks a registered topic with no registered topic below it (saves one dict per leaf)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "LEAF"


_LEAF = _Leaf()
_END = None
"""Key marking, inside a node dict, that the node's own path is a registered topic."""


class TopicCatalog:
    """Registered concrete topics in a trie, for ``matching(pattern) -> topics``.

    A node is a dict ``level -> child``; a child is a node dict, or ``_LEAF`` when the topic
    ends there with nothing below it; ``node[None]`` marks a topic ending at an inner node.
    Level strings are interned, so the thousands of ``bid`` levels share one string.
    """

    def __init__(self, topics: Iterable[str] = ()) -> None:
        self._root: dict = {}
        self._count = 0
        self.add_many(topics)

    def add(self, topic: str) -> bool:
        """Register a concrete topic; False if it was already registered."""
        return self._add_levels(split_topic(topic))

    def add_many(self, topics: Iterable[str]) -> int:
        """Register many topics; returns how many were new."""
        added = 0
        add = self._add_levels
        for topic in topics:
            added += add(split_topic(topic))
        return added

    def _add_levels(self, levels: tuple[str, ...]) -> bool:
        node = self._root
        last = len(levels) - 1
        for i, level in enumerate(levels):
            child = node.get(level)
            if i == last:
                if child is None:
                    node[sys.intern(level)] = _LEAF
                elif child is _LEAF or _END in child:
                    return False
                else:
                    child[_END] = _LEAF
                break
            if child is None:
                child = node[sys.intern(level)] = {}
            elif child is _LEAF:
                child = node[level] = {_END: _LEAF}
            node = child
        self._count += 1
        return True

    def remove(self, topic: str) -> bool:
        """Unregister a topic; False if it was not registered. Empty nodes are pruned."""
        levels = split_topic(topic)
        path: list[tuple[dict, str]] = []
        node = self._root
        for level in levels[:-1]:
            child = node.get(level)
            if child is None or child is _LEAF:
                return False
            path.append((node, level))
            node = child
        last = levels[-1]
        child = node.get(last)
        if child is None:
            return False
        if child is _LEAF:
            del node[last]
        elif _END in child:
            del child[_END]
            return self._removed()
        else:
            return False
        for parent, level in reversed(path):  # collapse what became empty or a bare end mark
            if node:
                if len(node) == 1 and _END in node:
                    parent[level] = _LEAF
                break
            del parent[level]
            node = parent
        return self._removed()

    def _removed(self) -> bool:
        self._count -= 1
        return True

    def __len__(self) -> int:
        return self._count

    def __contains__(self, topic: object) -> bool:
        if not isinstance(topic, str):
            return False
        try:
            levels = split_topic(topic)
        except UserError:
            return False
        node: dict = self._root
        for level in levels[:-1]:
            child = node.get(level)
            if child is None or child is _LEAF:
                return False
            node = child
        child = node.get(levels[-1])
        return child is _LEAF or (isinstance(child, dict) and _END in child)

    def __iter__(self) -> Iterator[str]:
        stack: list[tuple[dict, str]] = [(self._root, "")]
        while stack:
            node, prefix = stack.pop()
            for level, child in node.items():
                if level is _END:
                    continue
                topic = level if node is self._root else f"{prefix}/{level}"
                if child is _LEAF:
                    yield topic
                else:
                    if _END in child:
                        yield topic
                    stack.append((child, topic))

    def matching(self, pattern: str) -> list[str]:
        """Every registered topic that ``pattern`` matches (trie order, no duplicates).

        Literal levels follow one edge, ``+`` every edge of one node, ``#`` absorbs zero levels
        or one more level and stays; ``(node, position)`` pairs are visited once, so repeated
        ``#`` cannot blow up. Only a leading ``#`` visits every inner node, and even then a
        literal level after it is followed as one edge.
        """
        levels = split_pattern(pattern)
        n = len(levels)
        # tail_hash[i]: levels[i:] are all '#', so a topic ending before position i matches
        tail_hash = [True] * (n + 1)
        for i in range(n - 1, -1, -1):
            tail_hash[i] = tail_hash[i + 1] and levels[i] == _HASH
        found: dict[str, None] = {}  # an ordered set: two '#' can reach a topic twice
        seen: set[tuple[int, int]] | None = set() if levels.count(_HASH) > 1 else None
        path: list[str] = []

        def walk(node: dict, i: int) -> None:
            if i == n:
                if _END in node:
                    found["/".join(path)] = None
                return
            level = levels[i]
            if level == _HASH:
                if seen is not None:  # with one '#', no (node, i) is reached twice
                    key = (id(node), i)
                    if key in seen:
                        return
                    seen.add(key)
                walk(node, i + 1)  # '#' absorbs no level
                ends_here = tail_hash[i]  # the rest is '#' only: a leaf below matches
                for name, child in node.items():  # '#' absorbs this level and stays at i
                    if child is _LEAF:  # also the _END mark, whose topic walk() just saw
                        if ends_here and name is not _END:
                            path.append(name)
                            found["/".join(path)] = None
                            path.pop()
                        continue
                    path.append(name)
                    walk(child, i)
                    path.pop()
                return
            ends_here = tail_hash[i + 1]
            if level == _PLUS:
                for name, child in node.items():
                    if child is _LEAF:
                        if ends_here and name is not _END:
                            path.append(name)
                            found["/".join(path)] = None
                            path.pop()
                        continue
                    path.append(name)
                    walk(child, i + 1)
                    path.pop()
                return
            child = node.get(level)
            if child is None:
                return
            path.append(level)
            if child is not _LEAF:
                walk(child, i + 1)
            elif ends_here:
                found["/".join(path)] = None
            path.pop()

        walk(self._root, 0)
        return list(found)
