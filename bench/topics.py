"""``topicwire bench topics``: topic matching through the index vs a linear scan of the patterns.

Two questions, each answered side by side with its naive baseline (``linear_scan``):

- data path: a concrete topic -> the subscribers whose pattern matches it, per second
  (``msgs_per_s``: ``TopicIndex`` without its cache; ``msgs_per_s_cached``: with it), vs testing
  every distinct pattern with ``algebra.matches_levels``;
- control path: a new pattern -> every registered topic it matches (``new_pattern_ms``, median
  over a fixed set of pattern shapes), ``TopicCatalog.matching`` vs testing every registered
  topic.

The workload is market data, ``region/exchange/symbol/field`` (a few fields are two levels
deep, ``depth/1``), with popular symbols subscribed more often. Both sides must return the
same sets (checked on every baseline lookup); progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.report import build_report, median_of, positive_int, progress, rate_per_s
from datapath.config import BENCH_REPEATS
from datapath.errors import TopicwireError
from datapath.topics import algebra
from datapath.topics.algebra import split_pattern, split_topic
from datapath.topics.index import MATCH_CACHE_ENTRIES, TopicCatalog, TopicIndex

NAME = "topics"
HELP = "topic -> subscribers (index vs linear scan) and new pattern -> registered topics"

EXCHANGES = {
    "us": ("nyse", "nasdaq", "arca", "bats", "iex", "cboe"),
    "eu": ("lse", "xetra", "euronext", "six", "bme", "cboe-eu"),
    "apac": ("tse", "hkex", "sgx", "asx", "nse", "krx"),
    "latam": ("b3", "bmv"),
    "mea": ("tase", "jse", "tadawul"),
}
FIELDS = ("bid", "ask", "last", "volume", "trade", "open", "high", "low", "close", "news",
          "depth/1", "depth/2")
VENUES = tuple((region, exchange) for region, names in EXCHANGES.items() for exchange in names)

LOOKUP_TOPICS = 4_000
"""Distinct concrete topics the lookups draw from (the hot set; fits the default cache)."""

NEW_PATTERNS = (
    "us/nyse/S00042/#",
    "eu/+/S00007/bid",
    "+/+/S00001/#",
    "#/S00100/depth/+",
    "apac/tse/+/last",
    "us/#/volume",
    "#/trade",
)
"""Patterns whose registered topics the control-path figure looks up (narrow to broad)."""

SCAN_LOOKUPS = 20
"""Default lookups per repeat for the linear scan (each tests every distinct pattern)."""

SCAN_REPEATS = 2
"""Default repeats of the linear-scan figures: each lasts seconds, so few repeats suffice."""

# The baseline tests each (pattern, topic) once: algebra's LRU cache (65,536 entries) cannot
# hold 72,000 patterns x 4,000 topics and would only add its overhead, so it is bypassed.
_matches_levels = getattr(algebra.matches_levels, "__wrapped__", algebra.matches_levels)

PATTERN_SHAPES: tuple[tuple[float, str], ...] = (
    (0.50, "{r}/{x}/{s}/{f}"),
    (0.20, "{r}/{x}/{s}/#"),
    (0.04, "{r}/{x}/+/{f}"),
    (0.07, "{r}/+/{s}/{f}"),
    (0.06, "+/+/{s}/#"),
    (0.05, "#/{s}/{f}"),
    (0.04, "{r}/{x}/#/{f}"),
    (0.03, "{r}/#/{s}/#"),
    (0.005, "{r}/#/{f}"),
    (0.003, "{r}/{x}/#"),
    (0.001, "#/{f}"),
)
"""Weight and shape of the subscription patterns: mostly literal, ``+``/``#`` at every level."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("--patterns", type=positive_int, default=100_000,
                        help="subscriptions in the index, one subscriber each (default 100000)")
    parser.add_argument("--topics", type=positive_int, default=1_000_000,
                        help="registered topics in the catalog (default 1000000)")
    parser.add_argument("--lookups", type=positive_int, default=200_000,
                        help="index lookups per repeat (default 200000)")
    parser.add_argument("--scan-lookups", type=positive_int, default=SCAN_LOOKUPS,
                        help=f"linear-scan lookups per repeat (default {SCAN_LOOKUPS})")
    parser.add_argument("--repeats", type=positive_int, default=BENCH_REPEATS,
                        help=f"repeats per figure, medians reported (default {BENCH_REPEATS})")
    parser.add_argument("--scan-repeats", type=positive_int, default=SCAN_REPEATS,
                        help=f"repeats of the linear-scan figures (default {SCAN_REPEATS})")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")




# --- workload ---------------------------------------------------------------------------------
def symbols_for(topic_count: int) -> int:
    """Symbols per exchange so that ``topic_count`` topics cover every venue and field."""
    per_symbol = len(VENUES) * len(FIELDS)
    return max(1, -(-topic_count // per_symbol))


def market_topics(count: int) -> list[str]:
    """``count`` distinct concrete topics; field varies fastest, then venue, then symbol."""
    topics: list[str] = []
    fields, venues = len(FIELDS), len(VENUES)
    for i in range(count):
        region, exchange = VENUES[(i // fields) % venues]
        topics.append(f"{region}/{exchange}/S{i // (fields * venues):05d}/{FIELDS[i % fields]}")
    return topics


def _popular(rng: random.Random, n: int) -> int:
    """An index below ``n``, low ones (popular symbols) far more often."""
    return min(n - 1, int(n * rng.random() ** 3))


def subscription_patterns(count: int, symbols: int, rng: random.Random) -> list[str]:
    """``count`` patterns drawn from ``PATTERN_SHAPES`` (duplicates happen, as in real life)."""
    weights = [w for w, _ in PATTERN_SHAPES]
    shapes = [s for _, s in PATTERN_SHAPES]
    patterns = []
    for shape in rng.choices(shapes, weights, k=count):
        region, exchange = rng.choice(VENUES)
        patterns.append(shape.format(r=region, x=exchange, s=f"S{_popular(rng, symbols):05d}",
                                     f=rng.choice(FIELDS)))
    return patterns


def lookup_topics(topics: Sequence[str], count: int, rng: random.Random) -> list[str]:
    """``count`` lookups drawn from ``LOOKUP_TOPICS`` distinct registered topics."""
    hot = sorted({topics[_popular(rng, len(topics))] for _ in range(LOOKUP_TOPICS)})
    return [rng.choice(hot) for _ in range(count)]


# --- measurements ----------------------------------------------------------------------------
def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class _LinearPatterns:
    """The baseline: every distinct pattern, pre-split, tested against the topic in turn."""

    def __init__(self, patterns: Sequence[str]) -> None:
        groups: dict[str, set[int]] = {}
        for subscriber, pattern in enumerate(patterns):
            groups.setdefault(pattern, set()).add(subscriber)
        self.groups = [(split_pattern(p), subs) for p, subs in groups.items()]

    def match(self, topic: str) -> set[int]:
        levels = split_topic(topic)
        result: set[int] = set()
        for pattern_levels, subs in self.groups:
            if _matches_levels(pattern_levels, levels):
                result |= subs
        return result


def _check_same(what: str, key: str, ours: set | list, theirs: set | list) -> None:
    if set(ours) != set(theirs):
        raise TopicwireError(
            f"{what} for {key!r} differ: topicwire found {len(set(ours))}, the linear scan "
            f"{len(set(theirs))}; this is a bug in datapath/topics/index.py, report it",
            component="bench",
        )


def _timed_ms(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter_ns()
    out = fn()
    return (time.perf_counter_ns() - start) / 1e6, out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark; returns the report (``bench.report.build_report``)."""
    rng = random.Random(args.seed)
    repeats = args.repeats
    symbols = symbols_for(args.topics)

    progress(NAME, f"generating {args.topics} topics and {args.patterns} patterns")
    topics = market_topics(args.topics)
    patterns = subscription_patterns(args.patterns, symbols, rng)
    lookups = lookup_topics(topics, args.lookups, rng)
    scan_lookups = lookups[: args.scan_lookups]

    progress(NAME, "building the indexes")
    uncached: TopicIndex[int] = TopicIndex(cache_entries=0)
    cached: TopicIndex[int] = TopicIndex()
    start = time.perf_counter()
    for subscriber, pattern in enumerate(patterns):
        uncached.add(pattern, subscriber)
    index_build_s = time.perf_counter() - start
    for subscriber, pattern in enumerate(patterns):
        cached.add(pattern, subscriber)
    linear = _LinearPatterns(patterns)

    scan_repeats = args.scan_repeats
    progress(NAME, f"linear scan: {len(scan_lookups)} lookups x {scan_repeats} over "
              f"{len(linear.groups)} distinct patterns")
    expected = {}

    def scan() -> None:
        for topic in scan_lookups:
            expected[topic] = linear.match(topic)

    scan_rate = median_of(scan_repeats, lambda: rate_per_s(len(scan_lookups), scan))
    for topic, subs in expected.items():
        _check_same("subscribers", topic, uncached.match(topic), subs)
        for _ in range(2):  # a miss that fills the cache, then a hit
            _check_same("subscribers (cached)", topic, cached.match(topic), subs)
    matched = statistics.mean(len(s) for s in expected.values())

    progress(NAME, f"index: {len(lookups)} lookups x {repeats}, without and with the cache")

    def lookup_all(index: TopicIndex[int]) -> None:
        match = index.match
        for topic in lookups:
            match(topic)

    rate = median_of(repeats, lambda: rate_per_s(len(lookups), lambda: lookup_all(uncached)))

    def cached_rate() -> float:
        cached.clear_cache()
        return rate_per_s(len(lookups), lambda: lookup_all(cached))

    cached.lookups = cached.cache_hits = 0
    rate_cached = median_of(repeats, cached_rate)
    hit_rate = cached.cache_hits / max(cached.lookups, 1)

    progress(NAME, f"registering {len(topics)} topics in the catalog")
    gc.collect()
    rss_before = _rss_bytes()
    start = time.perf_counter()
    catalog = TopicCatalog(topics)
    catalog_build_s = time.perf_counter() - start
    gc.collect()
    catalog_mb = (_rss_bytes() - rss_before) / 2**20
    start = time.perf_counter()
    topic_levels = [split_topic(t) for t in topics]
    list_build_s = time.perf_counter() - start

    progress(NAME, f"new patterns: {len(NEW_PATTERNS)} x {repeats} through the catalog, "
              f"x {scan_repeats} through the linear scan")
    ours_ms: dict[str, list[float]] = {p: [] for p in NEW_PATTERNS}
    scan_ms: dict[str, list[float]] = {p: [] for p in NEW_PATTERNS}
    found: dict[str, list[str]] = {}
    for _ in range(repeats):
        for pattern in NEW_PATTERNS:
            elapsed, found[pattern] = _timed_ms(lambda p=pattern: catalog.matching(p))
            ours_ms[pattern].append(elapsed)

    def scan_topics(pattern: str) -> list[str]:
        levels = split_pattern(pattern)
        return [t for t, tl in zip(topics, topic_levels) if _matches_levels(levels, tl)]

    for _ in range(scan_repeats):
        for pattern in NEW_PATTERNS:
            elapsed, theirs = _timed_ms(lambda p=pattern: scan_topics(p))
            scan_ms[pattern].append(elapsed)
            _check_same("registered topics", pattern, found[pattern], theirs)

    def per_pattern(times: dict[str, list[float]]) -> list[float]:
        return [statistics.median(t) for t in times.values()]

    params = {
        "patterns": args.patterns,
        "distinct_patterns": len(linear.groups),
        "topics": args.topics,
        "lookups": len(lookups),
        "distinct_lookup_topics": len(set(lookups)),
        "scan_lookups": len(scan_lookups),
        "repeats": repeats,
        "scan_repeats": scan_repeats,
        "seed": args.seed,
        "cache_entries": MATCH_CACHE_ENTRIES,
        "mean_subscribers_per_lookup": round(matched, 1),
        "new_patterns": {p: len(t) for p, t in found.items()},
    }
    results = {
        "topicwire": {
            "msgs_per_s": rate,
            "msgs_per_s_cached": rate_cached,
            "ns_per_msg": 1e9 / rate,
            "cache_hit_rate": hit_rate,
            "index_build_s": index_build_s,
            "new_pattern_ms": statistics.median(per_pattern(ours_ms)),
            "new_pattern_ms_max": max(per_pattern(ours_ms)),
            "catalog_build_s": catalog_build_s,
            "catalog_mb": catalog_mb,
        },
        "linear_scan": {
            "msgs_per_s": scan_rate,
            "ns_per_msg": 1e9 / scan_rate,
            "new_pattern_ms": statistics.median(per_pattern(scan_ms)),
            "new_pattern_ms_max": max(per_pattern(scan_ms)),
            "catalog_build_s": list_build_s,
        },
    }
    progress(NAME, "done")
    return build_report(NAME, params, results)
