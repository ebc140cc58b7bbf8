"""Topic algebra: validation, ``matches``, ``includes`` and ``overlaps`` (seed 000).

Topics are levels separated by ``/``. In patterns ``+`` stands for exactly one level and ``#``
for zero or more levels, at ANY level and any number of times (``#/a``, ``a/#/b/#``).

Exactness: ``includes(x, y)`` is language inclusion L(y) <= L(x) and ``overlaps(x, y)`` is
L(x) & L(y) != {}. Level-by-level symbolic matching is not exact once ``#`` may stand anywhere
(``+/#`` and ``#/+`` denote the same set), so both are decided on automata. Only the literal
levels that occur in x or y can be told apart by either pattern, so the alphabet is those
literals plus one symbol OTHER standing for every other level name; over that finite alphabet
inclusion is an on-the-fly subset construction of x's NFA run against y's, and overlap is
reachability in the product of the two NFAs. The witness path of that search is
``overlap_example``, with OTHER written as a level name that neither pattern uses (seed 000
uses "xxx"). Seed 000's own example construction is ``seed_example``: it agrees with the
exact method on the seed's figures but not in general (docs/topics.md has a counterexample).
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

from datapath.config import MAX_TOPIC_BYTES, MAX_TOPIC_LEVELS
from datapath.errors import UserError

SEPARATOR = "/"
SINGLE = "+"
MULTI = "#"
WILDCARDS = (SINGLE, MULTI)
_OTHER = None  # the alphabet symbol for "any level name not mentioned"
_CACHE_ENTRIES = 65_536


class TopicError(UserError):
    """An invalid topic or pattern."""

    component = "topics"


def _split(text: object, kind: str) -> tuple[str, ...]:
    if not isinstance(text, str):
        raise TopicError(f"invalid {kind} {text!r}: a {kind} is a string")
    if not text:
        raise TopicError(f"invalid {kind} '': a {kind} needs at least one character")
    if "\x00" in text:
        raise TopicError(f"invalid {kind} {text!r}: the NUL character is not allowed")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_TOPIC_BYTES:
        raise TopicError(f"invalid {kind}: {size} bytes, at most {MAX_TOPIC_BYTES} "
                         "(UTF-8) are allowed; shorten it")
    levels = tuple(text.split(SEPARATOR))
    if len(levels) > MAX_TOPIC_LEVELS:
        raise TopicError(f"invalid {kind} {text!r}: {len(levels)} levels, at most "
                         f"{MAX_TOPIC_LEVELS} are allowed")
    return levels


def split_pattern(pattern: str) -> tuple[str, ...]:
    """Validate a pattern and return its levels; wildcards must occupy whole levels."""
    levels = _split(pattern, "pattern")
    for level in levels:
        if level in WILDCARDS:
            continue
        for wildcard in WILDCARDS:
            if wildcard in level:
                fixed = SEPARATOR.join(_split_wildcards(lv) for lv in levels)
                raise TopicError(
                    f"invalid pattern {pattern!r}: a wildcard must occupy a whole level "
                    f"(level {level!r}); write e.g. {fixed!r}")
    return levels


def _split_wildcards(level: str) -> str:
    """'b#' -> 'b/#', 'a+b' -> 'a/+/b': the whole-level spelling a user probably meant."""
    if level in WILDCARDS:
        return level
    parts: list[str] = []
    current = ""
    for char in level:
        if char in WILDCARDS:
            if current:
                parts.append(current)
            parts.append(char)
            current = ""
        else:
            current += char
    if current:
        parts.append(current)
    return SEPARATOR.join(parts)


def split_topic(topic: str) -> tuple[str, ...]:
    """Validate a concrete topic (no wildcards) and return its levels."""
    levels = _split(topic, "topic")
    for level in levels:
        for wildcard in WILDCARDS:
            if wildcard in level:
                raise TopicError(
                    f"invalid topic {topic!r}: {wildcard!r} is a wildcard and may appear only in "
                    "subscription patterns, not in a published topic")
    return levels


def is_pattern(text: str) -> bool:
    """True if ``text`` has a wildcard level."""
    return any(level in WILDCARDS for level in text.split(SEPARATOR))


def normalize_levels(levels: tuple[str, ...]) -> tuple[str, ...]:
    """Rewrite each run of wildcard levels as its ``+`` levels followed by one ``#`` if any.

    A run with k ``+`` and at least one ``#`` means "k or more levels" however it is ordered,
    so ``#/+`` becomes ``+/#`` and ``#/#`` becomes ``#``; the set denoted does not change.
    """
    out: list[str] = []
    run_single = 0
    run_multi = False
    for level in (*levels, "\x00end"):
        if level == SINGLE:
            run_single += 1
        elif level == MULTI:
            run_multi = True
        else:
            out.extend([SINGLE] * run_single)
            if run_multi:
                out.append(MULTI)
            run_single, run_multi = 0, False
            out.append(level)
    return tuple(out[:-1])


def normalize_pattern(pattern: str) -> str:
    """``normalize_levels`` on a pattern string (validated)."""
    return SEPARATOR.join(normalize_levels(split_pattern(pattern)))


# --- automata over levels ------------------------------------------------------------------
# A pattern of n levels is an NFA with states 0..n; state i has consumed levels[:i].
# Epsilon: i -> i+1 when levels[i] is '#'. On a symbol s: '#' loops (i -> i), '+' advances,
# a literal advances only on itself. OTHER is never equal to a literal.


def _closure(levels: tuple[str, ...], states: frozenset[int]) -> frozenset[int]:
    out = set(states)
    stack = list(states)
    while stack:
        i = stack.pop()
        if i < len(levels) and levels[i] == MULTI and i + 1 not in out:
            out.add(i + 1)
            stack.append(i + 1)
    return frozenset(out)


def _step(levels: tuple[str, ...], states: frozenset[int], symbol: str | None) -> frozenset[int]:
    nxt = set()
    for i in states:
        if i == len(levels):
            continue
        level = levels[i]
        if level == MULTI:
            nxt.add(i)
        elif level == SINGLE or level == symbol:
            nxt.add(i + 1)
    return _closure(levels, frozenset(nxt))


# What a level sequence read so far spells: nothing, the empty string (one empty level), or
# a topic (any other non-empty sequence). Only the last kind is a topic. OTHER is always
# written as a non-empty name, so only the literal '' can lead to _EMPTY_STRING.
_EMPTY, _EMPTY_STRING, _TOPIC = 0, 1, 2


def _shape(shape: int, symbol: str | None) -> int:
    return _EMPTY_STRING if shape == _EMPTY and symbol == "" else _TOPIC


def _alphabet(*patterns: tuple[str, ...]) -> tuple[str | None, ...]:
    literals = sorted({lv for p in patterns for lv in p if lv not in WILDCARDS})
    return (*literals, _OTHER)


@lru_cache(maxsize=_CACHE_ENTRIES)
def matches_levels(pattern: tuple[str, ...], topic: tuple[str, ...]) -> bool:
    """``matches`` on validated level tuples."""
    states = _closure(pattern, frozenset({0}))
    for level in topic:
        states = _step(pattern, states, level)
        if not states:
            return False
    return len(pattern) in states


@lru_cache(maxsize=_CACHE_ENTRIES)
def includes_levels(x: tuple[str, ...], y: tuple[str, ...]) -> bool:
    """``includes`` on validated level tuples: L(y) is a subset of L(x).

    Only sequences that spell a non-empty string are topics (``_shape``).
    """
    alphabet = _alphabet(x, y)
    start = (_closure(y, frozenset({0})), _closure(x, frozenset({0})), _EMPTY)
    seen = {start}
    queue = deque([start])
    while queue:
        ys, xs, shape = queue.popleft()
        if shape == _TOPIC and len(y) in ys and len(x) not in xs:
            return False
        for symbol in alphabet:
            ys2 = _step(y, ys, symbol)
            if not ys2:
                continue
            state = (ys2, _step(x, xs, symbol), _shape(shape, symbol))
            if state not in seen:
                seen.add(state)
                queue.append(state)
    return True


def _witness(x: tuple[str, ...], y: tuple[str, ...]) -> tuple[str | None, ...] | None:
    """Shortest level sequence that is a topic in both languages (OTHER as None), or None."""
    alphabet = _alphabet(x, y)
    start = (_closure(x, frozenset({0})), _closure(y, frozenset({0})), _EMPTY)
    parents: dict[tuple, tuple | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        xs, ys, shape = node
        if shape == _TOPIC and len(x) in xs and len(y) in ys:
            path: list[str | None] = []
            while parents[node] is not None:
                node, symbol = parents[node]  # type: ignore[misc]
                path.append(symbol)
            return tuple(reversed(path))
        for symbol in alphabet:
            nxt = (_step(x, xs, symbol), _step(y, ys, symbol), _shape(shape, symbol))
            if nxt[0] and nxt[1] and nxt not in parents:
                parents[nxt] = (node, symbol)
                queue.append(nxt)
    return None


@lru_cache(maxsize=_CACHE_ENTRIES)
def overlaps_levels(x: tuple[str, ...], y: tuple[str, ...]) -> bool:
    """``overlaps`` on validated level tuples."""
    return _witness(x, y) is not None


def _fresh_level(*patterns: tuple[str, ...]) -> str:
    used = {lv for p in patterns for lv in p}
    candidate = "xxx"
    while candidate in used:
        candidate += "x"
    return candidate


def matches(pattern: str, topic: str) -> bool:
    """True if the concrete ``topic`` is one of the topics ``pattern`` denotes."""
    return matches_levels(split_pattern(pattern), split_topic(topic))


def includes(x: str, y: str) -> bool:
    """True if every topic ``y`` denotes is denoted by ``x`` (y equals or is a subset of x)."""
    return includes_levels(split_pattern(x), split_pattern(y))


def overlaps(x: str, y: str) -> bool:
    """True if some topic is denoted by both ``x`` and ``y``."""
    return overlaps_levels(split_pattern(x), split_pattern(y))


def overlap_example(x: str, y: str) -> str | None:
    """A concrete topic denoted by both ``x`` and ``y`` (a shortest one), or None."""
    xl, yl = split_pattern(x), split_pattern(y)
    path = _witness(xl, yl)
    if path is None:
        return None
    fresh = _fresh_level(xl, yl)
    return SEPARATOR.join(fresh if symbol is _OTHER else symbol for symbol in path)


def seed_example(topic1: str, topic2: str) -> str:
    """Seed 000's example construction: a representative topic of ``topic2`` built from
    ``topic1``, which the seed then tests against ``topic1`` to decide overlap.

    Step 2 for each level of topic2: '+' takes topic1's corresponding level if that is a
    literal, else "xxx"; a literal is copied; '#' contributes nothing. After each level,
    topic1's first remaining level is dropped if it is '+' or equals the current level.
    Kept for the record and the tests: ``overlaps`` does not use it (it is not exact).
    """
    t1 = list(split_pattern(topic1))
    example: list[str] = []
    for level in split_pattern(topic2):
        if level == SINGLE:
            head = t1[0] if t1 else None
            example.append(head if head is not None and head not in WILDCARDS else "xxx")
        elif level != MULTI:
            example.append(level)
        if t1 and (t1[0] == SINGLE or t1[0] == level):
            t1.pop(0)
    return SEPARATOR.join(example)
