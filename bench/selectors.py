"""``topicwire bench selectors``: JMS selectors matched through shared lists vs one by one.

The question (seed 003): an event arrives; which of N subscribers' selectors hold for it?
``topicwire`` answers with ``SelectorIndex`` (predicates of all subscribers in sorted lists
per attribute and operator, one binary search per event attribute and list, each candidate
selector's AND/OR structure evaluated with short-circuit); the baseline ``per_selector``
evaluates every subscriber's compiled selector on the event, as a JMS provider's
subscription list does. Both are measured in the same run over the same events, and must
return the same subscribers for every event the baseline sees.

The workload is market data: events carry ``symbol`` (popular symbols far more often),
``venue``, ``region``, ``side``, ``price``, ``qty`` and sometimes ``urgent``; selectors mix
equality on a symbol or venue with price/quantity ranges, IN lists, LIKE, NOT, OR, and a few
with arithmetic. Progress goes to stderr, the report (``bench.report``) to stdout.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from bench.report import build_report, median_of, positive_int, progress, rate_per_s
from datapath.config import BENCH_REPEATS
from datapath.errors import TopicwireError
from nic_offload.selectors import SelectorIndex, compile_selector
from nic_offload.selectors.evaluator import Selector

NAME = "selectors"
HELP = "event -> subscribers whose JMS selector holds (shared lists vs one by one)"

SYMBOLS = 2_000
"""Distinct symbols in the workload."""
VENUES = ("nyse", "nasdaq", "arca", "bats", "iex", "lse", "xetra", "tse", "hkex", "asx")
REGIONS = ("us", "eu", "apac")
BASELINE_EVENTS = 50
"""Default events per repeat for the baseline (each evaluates every selector)."""

SELECTOR_SHAPES: tuple[tuple[float, str], ...] = (
    (0.40, "symbol = '{s}' AND price > {p}"),
    (0.12, "symbol IN ('{s}', '{s2}', '{s3}') AND qty >= {q}"),
    (0.08, "symbol = '{s}' AND (side = 'B' OR qty > {q}) AND region <> '{r}'"),
    (0.08, "venue = '{v}' AND price BETWEEN {p} AND {p2}"),
    (0.08, "price > {p2} AND qty < {q}"),
    (0.06, "region = '{r}' AND NOT (urgent = TRUE) AND qty NOT BETWEEN {q} AND {q2}"),
    (0.06, "symbol LIKE '{prefix}%' AND side = 'S'"),
    (0.05, "(symbol = '{s}' OR symbol = '{s2}') AND urgent IS NOT NULL"),
    (0.04, "venue NOT IN ('{v}', 'iex') AND price < {p} AND qty > {q}"),
    (0.03, "qty * price > {notional} AND symbol = '{s}'"),
)
"""Weight and shape of the subscribers' selectors."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("--subscribers", type=positive_int, default=10_000,
                        help="subscribers, one selector each (default 10000)")
    parser.add_argument("--events", type=positive_int, default=2_000,
                        help="events matched through the shared lists per repeat "
                             "(default 2000)")
    parser.add_argument("--baseline-events", type=positive_int, default=BASELINE_EVENTS,
                        help="events evaluated selector by selector per repeat "
                             f"(default {BASELINE_EVENTS})")
    parser.add_argument("--repeats", type=positive_int, default=BENCH_REPEATS,
                        help=f"repeats per figure, medians reported (default {BENCH_REPEATS})")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")




# --- workload ---------------------------------------------------------------------------------
def _symbol(rng: random.Random) -> str:
    """A symbol; low numbers (popular symbols) far more often."""
    return f"S{min(SYMBOLS - 1, int(SYMBOLS * rng.random() ** 3)):04d}"


def selector_texts(count: int, rng: random.Random) -> list[str]:
    """``count`` selectors drawn from ``SELECTOR_SHAPES`` (duplicates happen)."""
    weights = [w for w, _ in SELECTOR_SHAPES]
    shapes = [s for _, s in SELECTOR_SHAPES]
    texts = []
    for shape in rng.choices(shapes, weights, k=count):
        price = round(rng.uniform(80, 120), 1)
        qty = rng.randrange(1, 1000)
        texts.append(shape.format(
            s=_symbol(rng), s2=_symbol(rng), s3=_symbol(rng), p=price,
            p2=round(price + rng.uniform(0, 20), 1), q=qty, q2=qty + rng.randrange(1, 500),
            v=rng.choice(VENUES), r=rng.choice(REGIONS), prefix=_symbol(rng)[:3],
            notional=rng.randrange(10_000, 100_000)))
    return texts


def events(count: int, rng: random.Random) -> list[dict[str, object]]:
    """``count`` market-data events."""
    out = []
    for _ in range(count):
        event: dict[str, object] = {
            "symbol": _symbol(rng), "venue": rng.choice(VENUES), "region": rng.choice(REGIONS),
            "side": rng.choice("BS"), "price": round(rng.uniform(70, 130), 2),
            "qty": rng.randrange(1, 1500),
        }
        if rng.random() < 0.7:
            event["urgent"] = rng.random() < 0.2
        out.append(event)
    return out


# --- measurement ------------------------------------------------------------------------------
def match_one_by_one(selectors: Sequence[tuple[Hashable, Selector]],
                     event: Mapping[str, object]) -> set[Hashable]:
    """The baseline: every subscriber's selector evaluated on ``event``."""
    return {sub for sub, selector in selectors if selector.evaluate(event)}


def _latencies_us(fn: Any, items: Sequence[Any]) -> list[float]:
    out = []
    for item in items:
        start = time.perf_counter_ns()
        fn(item)
        out.append((time.perf_counter_ns() - start) / 1e3)
    return out


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark; returns the report (``bench.report.build_report``)."""
    rng = random.Random(args.seed)
    repeats = args.repeats
    progress(NAME, f"generating {args.subscribers} selectors and {args.events} events")
    texts = selector_texts(args.subscribers, rng)
    workload = events(args.events, rng)
    baseline_events = workload[: args.baseline_events]

    progress(NAME, "compiling selectors and building the shared lists")
    start = time.perf_counter()
    one_by_one = [(sub, compile_selector(text)) for sub, text in enumerate(texts)]
    compile_s = time.perf_counter() - start
    index = SelectorIndex()
    start = time.perf_counter()
    for sub, text in enumerate(texts):
        index.add(sub, text)
    stats = index.stats()  # builds the lists
    build_s = time.perf_counter() - start

    progress(NAME, f"per selector: {len(baseline_events)} events x {repeats}")
    expected: list[set[Hashable]] = []

    def baseline() -> None:
        expected[:] = [match_one_by_one(one_by_one, e) for e in baseline_events]

    baseline_rate = median_of(repeats, lambda: rate_per_s(len(baseline_events), baseline))
    for i, event in enumerate(baseline_events):
        ours = index.match(event)
        if ours != expected[i]:
            raise TopicwireError(
                f"subscribers for event {i} differ: the shared lists found {len(ours)}, "
                f"one-by-one evaluation {len(expected[i])}; this is a bug in "
                "nic_offload/selectors/index.py, report it with the seed", component="bench")

    progress(NAME, f"shared lists: {len(workload)} events x {repeats}")
    matched: list[int] = []

    def shared() -> None:
        match = index.match
        matched[:] = [len(match(e)) for e in workload]

    rate = median_of(repeats, lambda: rate_per_s(len(workload), shared))
    ours_us = _latencies_us(index.match, workload)
    theirs_us = _latencies_us(lambda e: match_one_by_one(one_by_one, e), baseline_events)

    params = {
        "subscribers": args.subscribers,
        "distinct_selectors": stats["selectors"],
        "shared_predicates": stats["predicates"],
        "attributes": stats["attributes"],
        "anchored_selectors": stats["anchored"],
        "always_visited_selectors": stats["always"],
        "events": len(workload),
        "baseline_events": len(baseline_events),
        "checked_events": len(baseline_events),
        "repeats": repeats,
        "seed": args.seed,
        "mean_subscribers_per_event": round(statistics.mean(matched), 1),
    }
    results = {
        "topicwire": {
            "msgs_per_s": rate,
            "ns_per_msg": 1e9 / rate,
            "p50_us": _percentile(ours_us, 0.50),
            "p99_us": _percentile(ours_us, 0.99),
            "build_s": build_s,
        },
        "per_selector": {
            "msgs_per_s": baseline_rate,
            "ns_per_msg": 1e9 / baseline_rate,
            "p50_us": _percentile(theirs_us, 0.50),
            "p99_us": _percentile(theirs_us, 0.99),
            "build_s": compile_s,
        },
    }
    progress(NAME, "done")
    return build_report(NAME, params, results)
