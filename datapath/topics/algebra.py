"""Topic algebra: validation, ``matches``, ``includes`` and ``overlaps`` (seed 000).

Topics are levels separated by ``/``. In patterns ``+`` stands for exactly one level and ``#``
for zero or more levels, at ANY level and any number of times (``#/a``, ``a/#/b/#``).

Why automata: ``includes(x, y)`` is language inclusion L(y) <= L(x) and ``overlaps(x, y)`` is
L(x) & L(y) != {}. Comparing two patterns level by level is not exact once ``#`` may stand
anywhere (``+/#`` and ``#/+`` denote the same set), so both are decided on automata over
levels. Only the literal levels that occur in x or y can be told apart by either pattern, so
the alphabet is those literals plus one symbol OTHER standing for every other level name.

- ``overlaps`` is reachability in the product of the two NFAs (pairs of single states, so
  polynomial); the shortest path found is ``overlap_example``, with OTHER written as a level
  name that neither pattern uses (seed 000 uses "xxx").
- ``includes`` runs x's NFA as an on-the-fly subset construction against y's NFA and fails if
  y accepts where the x-set does not. Inclusion of such patterns is coNP-hard in general, so
  the search keeps only minimal x-sets per y-state (an antichain: a larger x-set can only
  accept more) and gives up with a ``TopicError`` past ``INCLUDES_STATE_LIMIT`` states instead
  of running for ever on an adversarial pair. Patterns without ``#`` on the y side take a
  one-match fast path.

Seed 000's own example construction is ``seed_example``/``seed_overlaps``: it agrees with the
exact method on the seed's figure 3 but not in general (docs/topics.md has counterexamples).
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
SEED_EXAMPLE_LEVEL = "xxx"
"""Seed 000's "arbitrary matching string" for a level; also the first choice for OTHER."""

ALGEBRA_CACHE_ENTRIES = 65_536
"""Bound of each per-pattern-pair result cache (``matches/includes/overlaps_levels``)."""

INCLUDES_STATE_LIMIT = 200_000
"""Most automaton states ``includes`` explores before refusing the pair as too complex. Real
patterns need a few dozen; only many ``+`` levels after a ``#`` (``#/a/+/+/+/...``) come near."""

_OTHER = None  # the alphabet symbol for "any level name that neither pattern mentions"
Symbol = str | None
Levels = tuple[str, ...]


class TopicError(UserError):
    """An invalid topic or pattern, or a pair of patterns too complex to compare."""

    component = "topics"


# --- validation ------------------------------------------------------------------------------


def _split(text: object, kind: str) -> Levels:
    if not isinstance(text, str):
        raise TopicError(f"invalid {kind} {text!r}: a {kind} is a string of levels "
                         "separated by '/'")
    if not text:
        raise TopicError(f"invalid {kind} '': a {kind} needs at least one character")
    if "\x00" in text:
        raise TopicError(f"invalid {kind} {text!r}: the NUL character is not allowed; "
                         "remove it")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise TopicError(f"invalid {kind} {text!r}: it is not valid UTF-8 (it holds a lone "
                         "surrogate); send well-formed text") from None
    if size > MAX_TOPIC_BYTES:
        raise TopicError(f"invalid {kind} {text[:32]!r}...: {size} UTF-8 bytes, at most "
                         f"{MAX_TOPIC_BYTES} are allowed; shorten it")
    levels = tuple(text.split(SEPARATOR))
    if len(levels) > MAX_TOPIC_LEVELS:
        raise TopicError(f"invalid {kind} {text!r}: {len(levels)} levels, at most "
                         f"{MAX_TOPIC_LEVELS} are allowed; use fewer levels")
    return levels


def _whole_levels(level: str) -> str:
    """'b#' -> 'b/#', 'a+b' -> 'a/+/b': the whole-level spelling a user probably meant."""
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


def split_pattern(pattern: str) -> Levels:
    """Validate a pattern and return its levels; ``+`` and ``#`` must be whole levels."""
    levels = _split(pattern, "pattern")
    for number, level in enumerate(levels, start=1):
        if level not in WILDCARDS and (SINGLE in level or MULTI in level):
            fixed = SEPARATOR.join(lv if lv in WILDCARDS else _whole_levels(lv) for lv in levels)
            raise TopicError(f"invalid pattern {pattern!r}: a wildcard must occupy a whole "
                             f"level (level {number} is {level!r}); write {fixed!r}")
    return levels


def split_topic(topic: str) -> Levels:
    """Validate a concrete topic (no wildcards) and return its levels."""
    if (type(topic) is str and topic and topic.isascii() and len(topic) <= MAX_TOPIC_BYTES
            and SINGLE not in topic and MULTI not in topic and "\x00" not in topic):
        # the usual topic, checked at once: ASCII is its UTF-8 (one byte a character, no
        # lone surrogate), no NUL and no wildcard character anywhere (issue 19: a batched
        # registration splits 100,000 topics)
        levels = tuple(topic.split(SEPARATOR))
        if len(levels) <= MAX_TOPIC_LEVELS:
            return levels
    levels = _split(topic, "topic")
    for number, level in enumerate(levels, start=1):
        if SINGLE in level or MULTI in level:
            raise TopicError(f"invalid topic {topic!r}: level {number} is {level!r}, but '+' "
                             "and '#' are wildcards that may appear only in subscription "
                             "patterns; publish to a topic without them")
    return levels


def is_pattern(s: str) -> bool:
    """True if ``s`` has a wildcard level (``+`` or ``#`` as a whole level)."""
    return any(level in WILDCARDS for level in s.split(SEPARATOR))


def normalize_levels(levels: Levels) -> Levels:
    """Rewrite each run of wildcard levels as its ``+`` levels followed by one ``#`` if any.

    A run with k ``+`` and at least one ``#`` means "k or more levels" however it is ordered,
    so ``#/+`` becomes ``+/#`` and ``#/#`` becomes ``#``; the set denoted does not change.
    """
    out: list[str] = []
    singles, multi = 0, False
    for level in levels:
        if level == SINGLE:
            singles += 1
        elif level == MULTI:
            multi = True
        else:
            out += [SINGLE] * singles + [MULTI] * multi + [level]
            singles, multi = 0, False
    out += [SINGLE] * singles + [MULTI] * multi
    return tuple(out)


def normalize_pattern(p: str) -> str:
    """``normalize_levels`` on a pattern string (validated): ``'#/+/#/a'`` -> ``'+/#/a'``."""
    return SEPARATOR.join(normalize_levels(split_pattern(p)))


# --- automata over levels --------------------------------------------------------------------
# A pattern of n levels is an NFA with states 0..n; state i has consumed levels[:i] and n
# accepts. Epsilon: i -> i+1 when levels[i] is '#'. On a symbol: '#' loops (i -> i), '+'
# advances, a literal advances only on itself. OTHER (None) never equals a literal.
#
# A topic is a non-empty string, so the level sequences that are topics are those of one or
# more levels except ('',) (the empty string). Searches carry a "shape" of what was read:
_EMPTY, _EMPTY_STRING, _TOPIC = 0, 1, 2


def _shape(shape: int, symbol: Symbol) -> int:
    return _EMPTY_STRING if shape == _EMPTY and symbol == "" else _TOPIC


@lru_cache(maxsize=ALGEBRA_CACHE_ENTRIES)
def _closures(levels: Levels) -> tuple[frozenset[int], ...]:
    """For each state i, the states reachable from it by epsilon moves (itself included)."""
    out: list[frozenset[int]] = []
    for i in range(len(levels) + 1):
        j = i
        while j < len(levels) and levels[j] == MULTI:
            j += 1
        out.append(frozenset(range(i, j + 1)))
    return tuple(out)


def _takes(level: str, symbol: Symbol) -> bool:
    return level in WILDCARDS or level == symbol


def _step1(levels: Levels, closures: tuple[frozenset[int], ...], i: int,
           symbol: Symbol) -> frozenset[int]:
    """States after reading ``symbol`` in state ``i`` (epsilon-closed)."""
    if i == len(levels) or not _takes(levels[i], symbol):
        return frozenset()
    return closures[i] if levels[i] == MULTI else closures[i + 1]


def _step(levels: Levels, closures: tuple[frozenset[int], ...], states: frozenset[int],
          symbol: Symbol) -> frozenset[int]:
    out: set[int] = set()
    for i in states:
        out |= _step1(levels, closures, i, symbol)
    return frozenset(out)


@lru_cache(maxsize=ALGEBRA_CACHE_ENTRIES)
def matches_levels(p: Levels, t: Levels) -> bool:
    """``matches`` on validated level tuples."""
    if MULTI not in p:  # one level per level: no automaton needed
        return len(p) == len(t) and all(a == SINGLE or a == b for a, b in zip(p, t))
    if p[-1] == MULTI and MULTI not in p[:-1]:  # a prefix, then any number of levels
        return len(t) >= len(p) - 1 and all(a == SINGLE or a == b for a, b in zip(p[:-1], t))
    return _matches_automaton(p, t)


def _matches_automaton(p: Levels, t: Levels) -> bool:
    """``matches_levels`` by the pattern's automaton (any pattern)."""
    closures = _closures(p)
    states = closures[0]
    for level in t:
        states = _step(p, closures, states, level)
        if not states:
            return False
    return len(p) in states


def _with_other(levels: Levels, name: str) -> Levels:
    return tuple(name if level == SINGLE else level for level in levels)


def _fresh_level(*patterns: Levels) -> str:
    """A level name no pattern uses: seed 000's "xxx", lengthened until it is fresh."""
    used = {level for p in patterns for level in p}
    candidate = SEED_EXAMPLE_LEVEL
    while candidate in used:
        candidate += SEED_EXAMPLE_LEVEL[0]
    return candidate


@lru_cache(maxsize=ALGEBRA_CACHE_ENTRIES)
def includes_levels(x: Levels, y: Levels) -> bool:
    """``includes`` on validated level tuples: L(y) is a subset of L(x)."""
    if x == y:
        return True
    if MULTI not in y and MULTI not in x:  # same length, and x's literals are y's
        return len(x) == len(y) and all(a == SINGLE or a == b for a, b in zip(x, y))
    if MULTI not in y:
        # L(y) is y with any name at each '+'. If x matches y with a fresh name at every '+',
        # x consumes those levels with wildcards, so it matches every other choice too.
        return matches_levels(x, _with_other(y, _fresh_level(x, y)))
    if MULTI not in x:
        return False  # y has topics of more than one length, x of exactly len(x)
    return _includes_search(normalize_levels(x), normalize_levels(y))


def _includes_search(x: Levels, y: Levels) -> bool:
    """Is there a topic y accepts and x does not? Nodes (y-state, x-set, shape), antichained."""
    xc, yc = _closures(x), _closures(y)
    minimal: dict[tuple[int, int], list[frozenset[int]]] = {}
    queue: deque[tuple[int, frozenset[int], int]] = deque()

    def visit(q: int, xs: frozenset[int], shape: int) -> None:
        sets = minimal.setdefault((q, shape), [])
        if any(seen <= xs for seen in sets):
            return  # a smaller x-set at the same y-state fails whenever this one would
        sets[:] = [seen for seen in sets if not xs <= seen]
        sets.append(xs)
        queue.append((q, xs, shape))

    for q in yc[0]:
        visit(q, xc[0], _EMPTY)
    explored = 0
    while queue:
        q, xs, shape = queue.popleft()
        if xs not in minimal[(q, shape)]:
            continue  # superseded by a smaller x-set since it was queued
        if shape == _TOPIC and q == len(y) and len(x) not in xs:
            return False
        explored += 1
        if explored > INCLUDES_STATE_LIMIT:
            raise TopicError(
                f"cannot compare {SEPARATOR.join(x)!r} with {SEPARATOR.join(y)!r} within "
                f"{INCLUDES_STATE_LIMIT} automaton states; use fewer '+' levels after a '#'")
        if q == len(y):
            continue
        if y[q] in WILDCARDS:  # y takes anything: try each literal x could react to, and OTHER
            symbols: set[Symbol] = {x[i] for i in xs if i < len(x) and x[i] not in WILDCARDS}
            symbols.add(_OTHER)
        else:
            symbols = {y[q]}
        for symbol in symbols:
            xs2 = _step(x, xc, xs, symbol)
            for q2 in _step1(y, yc, q, symbol):
                visit(q2, xs2, _shape(shape, symbol))
    return True


def _witness(x: Levels, y: Levels) -> tuple[Symbol, ...] | None:
    """A shortest level sequence that is a topic in both languages (OTHER as None), or None.

    Breadth-first search of the product NFA: nodes (x-state, y-state, shape).
    """
    xc, yc = _closures(x), _closures(y)
    Node = tuple[int, int, int]
    parents: dict[Node, tuple[Node, Symbol] | None] = {}
    queue: deque[Node] = deque()
    for i in sorted(xc[0]):
        for j in sorted(yc[0]):
            parents[(i, j, _EMPTY)] = None
            queue.append((i, j, _EMPTY))
    while queue:
        node = queue.popleft()
        i, j, shape = node
        if shape == _TOPIC and i == len(x) and j == len(y):
            path: list[Symbol] = []
            link = parents[node]
            while link is not None:
                node, symbol = link
                path.append(symbol)
                link = parents[node]
            return tuple(reversed(path))
        if i == len(x) or j == len(y):
            continue
        literals = sorted({lv for lv in (x[i], y[j]) if lv not in WILDCARDS})
        for symbol in (*literals, _OTHER):
            if not (_takes(x[i], symbol) and _takes(y[j], symbol)):
                continue
            for i2 in sorted(_step1(x, xc, i, symbol)):
                for j2 in sorted(_step1(y, yc, j, symbol)):
                    nxt = (i2, j2, _shape(shape, symbol))
                    if nxt not in parents:
                        parents[nxt] = (node, symbol)
                        queue.append(nxt)
    return None


@lru_cache(maxsize=ALGEBRA_CACHE_ENTRIES)
def overlaps_levels(x: Levels, y: Levels) -> bool:
    """``overlaps`` on validated level tuples."""
    if MULTI not in x and MULTI not in y:  # same length, and the literals agree
        return len(x) == len(y) and all(a == b or a == SINGLE or b == SINGLE
                                        for a, b in zip(x, y))
    return _witness(x, y) is not None


# --- the string API --------------------------------------------------------------------------


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
    """A shortest concrete topic denoted by both ``x`` and ``y``, or None if they are disjoint."""
    xl, yl = split_pattern(x), split_pattern(y)
    path = _witness(xl, yl)
    if path is None:
        return None
    fresh = _fresh_level(xl, yl)
    return SEPARATOR.join(fresh if symbol is _OTHER else symbol for symbol in path)


# --- seed 000's example construction (for the record; not exact) ------------------------------


def seed_example(topic1: str, topic2: str) -> str:
    """Seed 000's steps 1-2: a representative topic of ``topic2``, built with ``topic1``.

    For each level of topic2: '+' takes topic1's first remaining level if that is a literal,
    else "xxx"; a literal is copied; '#' contributes nothing. After each level, topic1's first
    remaining level is dropped if it is '+' or equals the current topic2 level. The result is
    always a topic of topic2 ('' when topic2 is only '#' levels, which is not a topic).
    """
    remaining = list(split_pattern(topic1))
    example: list[str] = []
    for level in split_pattern(topic2):
        if level == SINGLE:
            head = remaining[0] if remaining else None
            example.append(head if head is not None and head not in WILDCARDS
                           else SEED_EXAMPLE_LEVEL)
        elif level != MULTI:
            example.append(level)
        if remaining and (remaining[0] == SINGLE or remaining[0] == level):
            remaining.pop(0)
    return SEPARATOR.join(example)


def seed_overlaps(x: str, y: str) -> bool:
    """Seed 000's topicOverlaps(x, y): build the example of x with y (step 1-2) and test it
    against y (step 3). This argument order reproduces the seed's figure 3. Sound (a True is
    always right, the example lies in both) but incomplete: see docs/topics.md."""
    example = seed_example(y, x)
    return bool(example) and matches(y, example)
