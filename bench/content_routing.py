"""``topicwire bench content-routing``: flooded interest vs rendezvous by attribute popularity.

A simulation of a fabric of ``--cores`` cores (a full mesh, every core one hop from every
other, or with ``--degree`` a sparser graph whose shortest paths are counted in hops)
holding ``--subscriptions`` content subscriptions (JMS selectors), with events whose
attributes follow a skewed (Zipf-like) presence distribution. Two ways to route them:

- ``flood`` (today's mechanism, the baseline): every subscription's selector is flooded with
  the interest to every core; the core where an event is published matches it against all of
  them and sends one copy to each other core that has a matching subscriber.
- ``topicwire`` (rendezvous, seed 001, ``appliance.control.content_routing``): each core
  counts the attributes of the events published at it during a history phase; the counts are
  merged (every core shares its counts with every other) into one popular set (MPAS: carried
  by more than ``--popular-share`` of the events); the cores form a DHT (consistent hashing
  of attribute names); a subscription is registered at the rendezvous core of one popular
  attribute its selector requires (``nic_offload.selectors.required``), else of its least
  popular required attribute, or flooded when it requires none; an event goes to the
  rendezvous cores of the routing keys it carries (attributes with registrations), each
  matches it against the subscriptions registered there and sends one copy to each other
  core with a matching subscriber; flooded subscriptions are matched at the ingress core.

The matching is real: every core's subscriptions are a ``SelectorIndex``, and the run checks
that both modes deliver exactly the same (event, subscription) pairs, each once (raising
otherwise). Figures per mode: fabric messages per event, matching load per core (index
matches run and subscriptions held by the indexes they ran against, i.e. what one-by-one
evaluation would cost; and the measured matching time), routing state per core
(subscriptions stored), registration messages per subscription (the announcement of
non-popular routing keys rides on the periodic popularity round, not counted), copies a
subscriber core receives more than once for one event (it delivers the first and drops the
rest), and ``messages_per_event_replying``: the messages of a variant where each rendezvous
core answers the ingress with the cores it matched and the ingress sends one copy per core
(no duplicates, a third hop of latency).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from appliance.control.content_routing import (
    POPULAR_SHARE,
    AttributeCounts,
    RendezvousRing,
    carried_attributes,
    event_keys,
    rendezvous_key,
)
from bench.report import build_report, positive_int, progress
from datapath.errors import TopicwireError
from nic_offload.selectors import SelectorIndex, compile_selector
from nic_offload.selectors.required import required_attributes

NAME = "content-routing"
HELP = "simulated fabric: flooded interest vs rendezvous by attribute popularity (seed 001)"

ATTRIBUTES = 200
"""Attribute names in the workload (``a000`` .. ``a199``)."""
PRESENCE_EXPONENT = 0.8
"""Attribute i is carried by an event with probability min(1, 1.6 / (i + 1) ** this)."""
VALUES = 100
"""Default value domain: attribute values are integers 0..VALUES-1, low values far more
often (``--values``; a larger domain makes equality and IN predicates more selective)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("--cores", type=positive_int, default=64,
                        help="cores of the simulated fabric (default 64)")
    parser.add_argument("--subscriptions", type=positive_int, default=100_000,
                        help="content subscriptions, one selector each (default 100000)")
    parser.add_argument("--events", type=positive_int, default=500,
                        help="events routed and matched in both modes (default 500)")
    parser.add_argument("--history", type=positive_int, default=5_000,
                        help="events counted to learn attribute popularity (default 5000)")
    parser.add_argument("--popular-share", type=float, default=POPULAR_SHARE,
                        help="seed 001's k: popular = carried by more than this share of "
                             f"events (default {POPULAR_SHARE})")
    parser.add_argument("--publishers", type=positive_int, default=None,
                        help="cores where events are published (default: every core; "
                             "1 = one feed core publishes everything)")
    parser.add_argument("--values", type=positive_int, default=VALUES,
                        help="distinct values per attribute (default 100; more values, "
                             "more selective subscriptions)")
    parser.add_argument("--key-choice", choices=("popular", "rarest"), default="popular",
                        help="where a subscription registers: a required popular attribute "
                             "first (seed 001's MPAS, default), or its rarest required one")
    parser.add_argument("--degree", type=int, default=0,
                        help="links per core of the simulated fabric: 0 = full mesh "
                             "(default); else a ring with random chords, messages cross "
                             "shortest paths (fabric hops counted)")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")


# --- workload ---------------------------------------------------------------------------------
def presence(i: int) -> float:
    """Probability that an event carries attribute ``i``."""
    return min(1.0, 1.6 / (i + 1) ** PRESENCE_EXPONENT)


def attribute_name(i: int) -> str:
    return f"a{i:03d}"


def _value(rng: random.Random, values: int) -> int:
    return int(values * rng.random() ** 2)


def events(count: int, rng: random.Random, values: int = VALUES) -> list[dict[str, object]]:
    """``count`` events: attribute i present with ``presence(i)``, skewed integer values."""
    probs = [presence(i) for i in range(ATTRIBUTES)]
    out = []
    for _ in range(count):
        out.append({attribute_name(i): _value(rng, values)
                    for i, p in enumerate(probs) if rng.random() < p})
    return out


def _predicate(name: str, rng: random.Random, values: int) -> str:
    v = _value(rng, values)
    shape = rng.random()
    if shape < 0.4:
        return f"{name} = {v}"
    if shape < 0.6:
        return f"{name} > {v}"
    if shape < 0.8:
        return f"{name} BETWEEN {v} AND {v + rng.randrange(1, max(2, values * 3 // 10))}"
    return f"{name} IN ({v}, {_value(rng, values)}, {_value(rng, values)})"


def selector_texts(count: int, rng: random.Random, values: int = VALUES) -> list[str]:
    """``count`` selectors: ANDs of 1-3 attributes (chosen as often as events carry them),
    some ORs across attributes and some ``IS NULL`` terms (these may require nothing)."""
    names = [attribute_name(i) for i in range(ATTRIBUTES)]
    weights = [presence(i) for i in range(ATTRIBUTES)]
    texts = []
    for _ in range(count):
        attrs = list(dict.fromkeys(rng.choices(names, weights, k=rng.choice((1, 2, 2, 3)))))
        terms = [_predicate(a, rng, values) for a in attrs]
        roll = rng.random()
        if roll < 0.08:  # an OR across attributes: requires only what both branches do
            other = rng.choices(names, weights)[0]
            terms[0] = f"({terms[0]} OR {_predicate(other, rng, values)})"
        elif roll < 0.12:
            terms.append(f"{rng.choices(names, weights)[0]} IS NULL")
        texts.append(" AND ".join(terms))
    return texts


def hop_matrix(cores: int, degree: int, rng: random.Random) -> list[list[int]]:
    """Fabric hops between every two cores: 1 everywhere for a full mesh (``degree`` 0),
    else shortest paths over a ring with random chords until each core has ``degree``
    links (or as close as the draw allows)."""
    if degree <= 0 or degree >= cores - 1:
        return [[0 if a == b else 1 for b in range(cores)] for a in range(cores)]
    links = [set() for _ in range(cores)]
    for a in range(cores):
        links[a].add((a + 1) % cores)
        links[(a + 1) % cores].add(a)
    for _ in range(cores * degree * 4):
        a, b = rng.randrange(cores), rng.randrange(cores)
        if a != b and b not in links[a] and len(links[a]) < degree and len(links[b]) < degree:
            links[a].add(b)
            links[b].add(a)
    out = []
    for src in range(cores):
        dist = [-1] * cores
        dist[src] = 0
        frontier = [src]
        while frontier:
            nxt = []
            for a in frontier:
                for b in links[a]:
                    if dist[b] < 0:
                        dist[b] = dist[a] + 1
                        nxt.append(b)
            frontier = nxt
        out.append(dist)
    return out


# --- the two modes ----------------------------------------------------------------------------
@dataclass
class _Core:
    """One simulated core's routing state and load."""

    index: SelectorIndex = field(default_factory=SelectorIndex)
    state: int = 0            # subscriptions stored for routing
    match_calls: int = 0      # SelectorIndex.match runs
    match_work: int = 0       # subscriptions held by the indexes those runs matched against
    match_ns: int = 0


@dataclass
class _Outcome:
    pairs: Counter = field(default_factory=Counter)   # (event, subscription) -> deliveries
    messages: list[int] = field(default_factory=list)  # fabric messages per event
    hops: list[int] = field(default_factory=list)      # link traversals per event
    duplicate_copies: int = 0
    replying: list[int] = field(default_factory=list)  # messages if rendezvous cores replied
    registration_messages: int = 0


def _match(core: _Core, event: dict[str, object], size: int) -> set[Hashable]:
    start = time.perf_counter_ns()
    found = core.index.match(event)
    core.match_ns += time.perf_counter_ns() - start
    core.match_calls += 1
    core.match_work += size
    return found


def _send(sender: int, subs: set[Hashable], home: Sequence[int],
          copies: Counter) -> set[int]:
    """Copies from ``sender`` to the cores of ``subs`` (not itself); counts arrivals."""
    targets = {home[s] for s in subs} - {sender}
    copies.update(targets)
    return targets


def simulate_flood(texts: Sequence[str], home: Sequence[int], ingress: Sequence[int],
                   workload: Sequence[dict[str, object]], cores: int,
                   hops: list[list[int]] | None = None) -> tuple[list[_Core], _Outcome]:
    """Every selector at every core; the ingress core matches and sends to subscriber cores."""
    index = SelectorIndex()
    for sub, text in enumerate(texts):
        index.add(sub, text)
    index.stats()  # build the lists before timing
    table = [_Core(index=index, state=len(texts)) for _ in range(cores)]
    hops = hops or hop_matrix(cores, 0, random.Random(0))
    out = _Outcome(registration_messages=len(texts) * (cores - 1))
    for eid, event in enumerate(workload):
        src = ingress[eid]
        matched = _match(table[src], event, len(texts))
        out.pairs.update((eid, s) for s in matched)
        targets = _send(src, matched, home, Counter())
        out.messages.append(len(targets))
        out.hops.append(sum(hops[src][t] for t in targets))
    return table, out


def simulate_rendezvous(texts: Sequence[str], home: Sequence[int], ingress: Sequence[int],
                        workload: Sequence[dict[str, object]], cores: int,
                        popular: frozenset[str], counts: AttributeCounts,
                        hops: list[list[int]] | None = None, prefer_popular: bool = True,
                        ) -> tuple[list[_Core], _Outcome, dict[str, Any]]:
    """Subscriptions at the rendezvous core of a required popular attribute (or flooded);
    events to the rendezvous cores of their popular attributes."""
    hops = hops or hop_matrix(cores, 0, random.Random(0))
    ring = RendezvousRing(str(c) for c in range(cores))
    table = [_Core() for _ in range(cores)]
    flooded = SelectorIndex()
    out = _Outcome()
    keys: Counter[str] = Counter()
    for sub, text in enumerate(texts):
        key = rendezvous_key(required_attributes(compile_selector(text)), popular,
                             counts.counts, sub, prefer_popular)
        if key is None:
            flooded.add(sub, text)
            out.registration_messages += cores - 1
            continue
        keys[key] += 1
        rdv = int(ring.core_of(key))
        table[rdv].index.add(sub, text)
        table[rdv].state += 1
        out.registration_messages += rdv != home[sub]
    routing_keys = frozenset(keys)
    n_flooded = len(flooded)
    for core in table:
        core.state += n_flooded
        core.index.stats()
    flooded.stats()
    flood_core = [_Core(index=flooded) for _ in range(cores)]  # ingress matching of flooded subs
    for eid, event in enumerate(workload):
        src = ingress[eid]
        copies: Counter = Counter()
        rdvs = {int(c) for c in ring.cores_of(event_keys(carried_attributes(event), routing_keys))}
        messages = len(rdvs - {src})
        hop_count = sum(hops[src][r] for r in rdvs)
        for rdv in rdvs:
            core = table[rdv]
            if not core.state - n_flooded:
                continue  # a rendezvous holding nothing forwards nothing
            matched = _match(core, event, core.state - n_flooded)
            out.pairs.update((eid, s) for s in matched)
            targets = _send(rdv, matched, home, copies)
            messages += len(targets)
            hop_count += sum(hops[rdv][t] for t in targets)
        if n_flooded:
            matched = _match(flood_core[src], event, n_flooded)
            out.pairs.update((eid, s) for s in matched)
            targets = _send(src, matched, home, copies)
            messages += len(targets)
            hop_count += sum(hops[src][t] for t in targets)
        out.messages.append(messages)
        # the variant where each rendezvous core answers the ingress with the cores it
        # matched (a small reply) and the ingress sends one copy per core: no duplicates,
        # one more hop of latency
        out.replying.append(2 * len(rdvs - {src}) + len(set(copies) - {src}))
        out.hops.append(hop_count)
        out.duplicate_copies += sum(n - 1 for n in copies.values())
    for core, extra in zip(table, flood_core):
        core.match_calls += extra.match_calls
        core.match_work += extra.match_work
        core.match_ns += extra.match_ns
    info = {"popular_attributes": len(popular), "flooded_subscriptions": n_flooded,
            "rendezvous_keys": len(keys),
            "subscriptions_at_popular_keys": sum(n for k, n in keys.items() if k in popular),
            "rendezvous_cores": len({ring.core_of(k) for k in keys})}
    return table, out, info


def _figures(table: list[_Core], out: _Outcome, events: int,
             subscriptions: int) -> dict[str, float]:
    states = [c.state for c in table]
    calls = [c.match_calls / events for c in table]
    work = [c.match_work / events for c in table]
    match_ms = [c.match_ns / 1e6 for c in table]
    return {
        "messages_per_event": statistics.mean(out.messages),
        "messages_per_event_max": max(out.messages),
        "hops_per_event": statistics.mean(out.hops),
        "duplicate_copies_per_event": out.duplicate_copies / events,
        "messages_per_event_replying": statistics.mean(out.replying or out.messages),
        "matches_per_event_per_core_mean": statistics.mean(calls),
        "matches_per_event_per_core_max": max(calls),
        "match_load_per_event_per_core_mean": statistics.mean(work),
        "match_load_per_event_per_core_max": max(work),
        "match_ms_per_core_mean": statistics.mean(match_ms),
        "match_ms_per_core_max": max(match_ms),
        "state_per_core_mean": statistics.mean(states),
        "state_per_core_max": max(states),
        "registration_messages_per_subscription": out.registration_messages / subscriptions,
        "deliveries": sum(out.pairs.values()),
    }


def check_same_deliveries(flood: _Outcome, rendezvous: _Outcome) -> None:
    """Both modes deliver the same (event, subscription) pairs, each exactly once."""
    twice = [pair for pair, n in rendezvous.pairs.items() if n > 1]
    twice += [pair for pair, n in flood.pairs.items() if n > 1]
    if twice:
        raise TopicwireError(f"{len(twice)} (event, subscription) pairs delivered more than "
                             f"once, e.g. {twice[0]}; a bug in content routing", component="bench")
    missing = flood.pairs.keys() - rendezvous.pairs.keys()
    extra = rendezvous.pairs.keys() - flood.pairs.keys()
    if missing or extra:
        raise TopicwireError(f"rendezvous routing delivered {len(extra)} pairs flooding did not "
                             f"and missed {len(missing)} it delivered; a bug in content routing",
                             component="bench")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the simulation; returns the report (``bench.report.build_report``)."""
    if not 0.0 <= args.popular_share < 1.0:
        raise TopicwireError(f"--popular-share must be in [0, 1), got {args.popular_share}",
                             component="bench")
    rng = random.Random(args.seed)
    cores = args.cores
    progress(NAME, f"generating {args.subscriptions} selectors, {args.history} history and "
                   f"{args.events} events")
    texts = selector_texts(args.subscriptions, rng, args.values)
    home = [rng.randrange(cores) for _ in texts]
    history = events(args.history, rng, args.values)
    workload = events(args.events, rng, args.values)
    publishers = min(args.publishers or cores, cores)
    ingress = [rng.randrange(publishers) for _ in workload]

    # popularity: each core counts what is published at it, then the counts are shared
    per_core = [AttributeCounts() for _ in range(cores)]
    for event in history:
        per_core[rng.randrange(publishers)].observe(carried_attributes(event))
    merged = AttributeCounts()
    for counts in per_core:
        merged.merge(counts)
    popular = merged.popular(args.popular_share)

    hops = hop_matrix(cores, args.degree, rng)
    if any(d < 0 for row in hops for d in row):
        raise TopicwireError(f"--degree {args.degree} drew a fabric that is not connected; "
                             "try another --seed or degree", component="bench")
    progress(NAME, "flood: building the index and matching")
    flood_table, flood = simulate_flood(texts, home, ingress, workload, cores, hops)
    progress(NAME, f"rendezvous: {len(popular)} popular attributes, registering and matching")
    rdv_table, rdv, info = simulate_rendezvous(texts, home, ingress, workload, cores,
                                               popular, merged, hops,
                                               args.key_choice == "popular")
    check_same_deliveries(flood, rdv)

    params = {
        "cores": cores, "subscriptions": args.subscriptions, "events": args.events,
        "history_events": args.history, "popular_share": args.popular_share,
        "key_choice": args.key_choice, "degree": args.degree, "values": args.values,
        "publishers": publishers,
        "mean_hops_between_cores": statistics.mean(
            d for row in hops for d in row if d),
        "attributes": ATTRIBUTES, "seed": args.seed, "repeats": 1,
        "mean_attributes_per_event": statistics.mean(len(e) for e in workload),
        "mean_deliveries_per_event": sum(flood.pairs.values()) / args.events,
        **info,
        "popularity_messages_per_round": cores * (cores - 1),
        "checked_pairs": len(flood.pairs),
    }
    results = {
        "topicwire": _figures(rdv_table, rdv, args.events, args.subscriptions),
        "flood": _figures(flood_table, flood, args.events, args.subscriptions),
    }
    progress(NAME, "done")
    return build_report(NAME, params, results)
