"""Link costs, best and backup paths, and route hysteresis (the driver's part of the job).

The route job merges telemetry windows into one ``PathStats`` per (path, evaluation window);
this module prices them (``link_cost``), builds each evaluation window's directed graph
(neighbour -> appliance, the cheapest channel between two appliances), and runs
``RouteSelector`` over the evaluation windows in time order:

- best path per (source, destination): Dijkstra on the link costs, ties broken by the
  lexicographically smallest sequence of appliance names;
- hysteresis: the current path is replaced only when the best path costs at most
  ``(1 - margin)`` x the current path's cost and at least ``min_gain`` less (both priced in
  the same window) in ``k`` consecutive evaluation windows; a current path that lost a link
  (no telemetry on it in the window) is replaced at once;
- backup path: the cheapest path sharing no link with the current one; when there is none,
  the cheapest path other than the current one (it avoids at least one of its links).

Percentiles of a merged histogram (``percentile_ns``): for quantile q of N samples, the
target rank is t = q N; in the first bucket whose cumulative count C reaches t (holding n
samples, C - n below it), the value is ``lower + (t - (C - n)) / n x (upper - lower)``.
The Spark job computes the same expression in SQL; this is its Python twin.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from appliance.ops.telemetry.config import (
    COST_WEIGHTS,
    HYSTERESIS_MARGIN,
    HYSTERESIS_MIN_GAIN,
    HYSTERESIS_WINDOWS,
    MIN_LATENCY_SAMPLES,
)
from appliance.ops.telemetry.errors import RoutesError
from appliance.ops.telemetry.windows import bucket_bounds

QUANTILES = {"p50": 0.5, "p99": 0.99, "p999": 0.999}


def parse_weights(items: Iterable[str]) -> dict[str, float]:
    """``["p99_us=2", ...]`` over the defaults (``COST_WEIGHTS``)."""
    weights = dict(COST_WEIGHTS)
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in weights:
            raise RoutesError(f"--weight {item!r}: give NAME=VALUE with NAME one of "
                              + ", ".join(weights))
        try:
            weights[name] = float(value)
        except ValueError:
            raise RoutesError(f"--weight {item!r}: {value!r} is not a number") from None
        if weights[name] < 0:
            raise RoutesError(f"--weight {item!r}: weights must be >= 0")
    return weights


def percentile_ns(buckets: Sequence[int], counts: Sequence[int], q: float) -> float | None:
    """Quantile ``q`` of a merged histogram (module docstring); None when empty."""
    order = np.argsort(np.asarray(buckets, dtype=np.int64), kind="stable")
    b = np.asarray(buckets, dtype=np.int64)[order]
    n = np.asarray(counts, dtype=np.int64)[order]
    keep = n > 0
    b, n = b[keep], n[keep]
    total = int(n.sum())
    if total == 0:
        return None
    cum = np.cumsum(n)
    target = q * total
    i = int(np.searchsorted(cum, target, side="left"))
    i = min(i, len(cum) - 1)
    lo, hi = bucket_bounds(b[i : i + 1])
    below = float(cum[i] - n[i])
    return float(lo[0]) + (target - below) / float(n[i]) * float(hi[0] - lo[0])


@dataclass(frozen=True)
class PathStats:
    """One path (neighbour -> appliance on a channel) merged over one evaluation window."""

    appliance: str
    neighbour: str
    channel: str
    eval_start_ns: int
    windows: int
    samples: int
    p50_ns: float | None
    p99_ns: float | None
    p999_ns: float | None
    jitter_ns: float
    frames: int
    bytes: int
    expected: int
    lost: int
    naks: int
    retransmissions: int
    span_ns: int
    """Sum of the windows' lengths."""
    floor_ns: int | None
    """Lowest latency seen (min of the windows' ``lat_min_ns``)."""
    end_ns: int = 0
    """End of the latest telemetry window merged (its start + length)."""

    @property
    def loss(self) -> float:
        return self.lost / self.expected if self.expected > 0 else 0.0

    @property
    def throughput_bps(self) -> float:
        return self.bytes * 8e9 / self.span_ns if self.span_ns > 0 else 0.0

    @property
    def retransmit_rate(self) -> float:
        """Retransmitted messages per second."""
        return self.retransmissions * 1e9 / self.span_ns if self.span_ns > 0 else 0.0

    @staticmethod
    def from_row(row: Mapping[str, Any]) -> PathStats:
        return PathStats(**{f: row[f] for f in PathStats.__dataclass_fields__})


def link_cost(s: PathStats, weights: Mapping[str, float], floor_ns: float = 0.0) -> float:
    """The cost of one link in microseconds-equivalent (docs/routing.md, "The cost model")::

        cost = w_p50 p50 + w_p99 p99 + w_p999 p999 + w_jitter jitter      (us)
             + w_loss loss_fraction + w_retx retransmitted_msgs_per_s + w_hop

    ``floor_ns`` is subtracted from the percentiles first (``--clock relative``)."""
    def us(v: float | None) -> float:
        return max((v or 0.0) - floor_ns, 0.0) / 1e3

    return (weights["p50_us"] * us(s.p50_ns) + weights["p99_us"] * us(s.p99_ns)
            + weights["p999_us"] * us(s.p999_ns) + weights["jitter_us"] * s.jitter_ns / 1e3
            + weights["loss"] * s.loss + weights["retransmit_rate"] * s.retransmit_rate
            + weights["hop_us"])


Graph = dict[str, dict[str, float]]


def graph_of(stats: Iterable[PathStats], weights: Mapping[str, float], *,
             floors: Mapping[tuple[str, str, str], float] | None = None
             ) -> tuple[Graph, dict[tuple[str, str], tuple[str, float]]]:
    """The directed graph {u: {v: cost}} of links u -> v with telemetry (at least
    ``MIN_LATENCY_SAMPLES`` samples), the cheapest channel per link, and
    {(u, v): (channel, cost)}."""
    links: dict[tuple[str, str], tuple[str, float]] = {}
    for s in stats:
        if s.samples < MIN_LATENCY_SAMPLES or s.appliance == s.neighbour:
            continue
        floor = (floors or {}).get((s.appliance, s.neighbour, s.channel), 0.0)
        cost = link_cost(s, weights, floor)
        key = (s.neighbour, s.appliance)
        if key not in links or (cost, s.channel) < (links[key][1], links[key][0]):
            links[key] = (s.channel, cost)
    graph: Graph = {}
    for (u, v), (_, cost) in links.items():
        graph.setdefault(u, {})[v] = cost
        graph.setdefault(v, {})
    return graph, links


Path = tuple[str, ...]


def shortest(graph: Graph, source: str, dest: str,
             banned: frozenset[tuple[str, str]] = frozenset()) -> tuple[float, Path] | None:
    """Cheapest simple path (ties: smallest name sequence) avoiding ``banned`` links."""
    heap: list[tuple[float, Path]] = [(0.0, (source,))]
    done: set[str] = set()
    while heap:
        cost, path = heapq.heappop(heap)
        node = path[-1]
        if node == dest:
            return cost, path
        if node in done:
            continue
        done.add(node)
        for nxt, link in graph.get(node, {}).items():
            if nxt not in done and (node, nxt) not in banned:
                heapq.heappush(heap, (cost + link, (*path, nxt)))
    return None


def path_cost(graph: Graph, path: Sequence[str]) -> float | None:
    """Cost of ``path`` in ``graph``; None when a link of it is missing."""
    total = 0.0
    for a, b in zip(path, path[1:]):
        link = graph.get(a, {}).get(b)
        if link is None:
            return None
        total += link
    return total


def backup_of(graph: Graph, path: Path) -> tuple[float, Path] | None:
    """The backup of ``path`` (module docstring): link-disjoint if possible, else the
    cheapest other path."""
    links = frozenset(zip(path, path[1:]))
    disjoint = shortest(graph, path[0], path[-1], links)
    if disjoint is not None:
        return disjoint
    best: tuple[float, Path] | None = None
    for link in sorted(links):
        other = shortest(graph, path[0], path[-1], frozenset({link}))
        if other is not None and other[1] != path and (best is None or other < best):
            best = other
    return best


@dataclass
class Route:
    path: Path
    cost: float
    since_ns: int
    streak: int = 0
    backup: Path | None = None
    backup_cost: float | None = None


@dataclass
class RouteSelector:
    """Best/backup paths per (source, destination) with hysteresis, one evaluation window at a
    time (``step``), in time order."""

    margin: float = HYSTERESIS_MARGIN
    k: int = HYSTERESIS_WINDOWS
    min_gain: float = HYSTERESIS_MIN_GAIN
    routes: dict[tuple[str, str], Route] = field(default_factory=dict)
    changes: list[dict[str, Any]] = field(default_factory=list)
    evaluated: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.margin < 1 or self.k < 1 or not self.min_gain >= 0:
            raise RoutesError("hysteresis: the margin must be in [0, 1), k >= 1 and the "
                              "minimum gain >= 0")

    def step(self, eval_start_ns: int, graph: Graph) -> list[dict[str, Any]]:
        """Decide every pair for one evaluation window; returns this window's changes."""
        self.evaluated += 1
        changes = []
        nodes = sorted(graph)
        seen = set()
        for source in nodes:
            for dest in nodes:
                if source == dest:
                    continue
                best = shortest(graph, source, dest)
                if best is None:
                    continue
                seen.add((source, dest))
                best_cost, best_path = best
                cur = self.routes.get((source, dest))
                reason = None
                if cur is None:
                    cur = self.routes[(source, dest)] = Route(best_path, best_cost, eval_start_ns)
                    reason = "new"
                else:
                    cost = path_cost(graph, cur.path)
                    if cost is None:
                        reason = "unavailable"
                    elif best_path != cur.path and best_cost <= min((1 - self.margin) * cost,
                                                                     cost - self.min_gain):
                        cur.streak += 1
                        if cur.streak >= self.k:
                            reason = "better"
                        else:
                            cur.cost = cost
                    else:
                        cur.streak = 0
                        cur.cost = cost
                    if reason is not None:
                        changes.append({"eval_start_ns": eval_start_ns, "source": source,
                                        "destination": dest, "from": list(cur.path),
                                        "to": list(best_path), "reason": reason,
                                        "from_cost": cost, "to_cost": best_cost})
                        cur.path, cur.cost, cur.since_ns, cur.streak = (
                            best_path, best_cost, eval_start_ns, 0)
                backup = backup_of(graph, cur.path)
                cur.backup, cur.backup_cost = (backup[1], backup[0]) if backup else (None, None)
        for pair in sorted(set(self.routes) - seen):
            gone = self.routes.pop(pair)
            changes.append({"eval_start_ns": eval_start_ns, "source": pair[0],
                            "destination": pair[1], "from": list(gone.path), "to": None,
                            "reason": "unreachable", "from_cost": gone.cost, "to_cost": None})
        self.changes += changes
        return changes

    def table(self) -> list[dict[str, Any]]:
        return [{"source": s, "destination": d, "path": list(r.path), "cost": round(r.cost, 3),
                 "backup": list(r.backup) if r.backup else None,
                 "backup_cost": None if r.backup_cost is None else round(r.backup_cost, 3),
                 "since_ns": r.since_ns, "streak": r.streak}
                for (s, d), r in sorted(self.routes.items())]


def select_routes(stats: Sequence[PathStats], weights: Mapping[str, float], *,
                  margin: float = HYSTERESIS_MARGIN, k: int = HYSTERESIS_WINDOWS,
                  min_gain: float = HYSTERESIS_MIN_GAIN, clock: str = "shared"
                  ) -> tuple[RouteSelector, dict[int, Graph], dict[tuple[str, str, str], float]]:
    """Run the selector over every evaluation window of ``stats`` in time order; returns it,
    the graph of each window and the floors used (``clock`` = "relative")."""
    if clock not in ("shared", "relative"):
        raise RoutesError(f"--clock {clock!r}: use 'shared' or 'relative'")
    floors: dict[tuple[str, str, str], float] = {}
    if clock == "relative":
        for s in stats:
            if s.floor_ns is not None and s.samples > 0:
                key = (s.appliance, s.neighbour, s.channel)
                floors[key] = min(floors.get(key, float(s.floor_ns)), float(s.floor_ns))
    by_eval: dict[int, list[PathStats]] = {}
    for s in stats:
        by_eval.setdefault(s.eval_start_ns, []).append(s)
    selector = RouteSelector(margin, k, min_gain)
    graphs = {}
    for start in sorted(by_eval):
        graph, _ = graph_of(by_eval[start], weights, floors=floors)
        graphs[start] = graph
        selector.step(start, graph)
    return selector, graphs, floors


def route_table(selector: RouteSelector, stats: Sequence[PathStats],
                weights: Mapping[str, float], *, eval_ns: int, clock: str,
                floors: Mapping[tuple[str, str, str], float],
                excluded: Sequence[Mapping[str, Any]], generated_at_ns: int) -> dict[str, Any]:
    """The route table document (docs/routing.md, "Route table")."""
    last = max((s.eval_start_ns for s in stats), default=None)
    paths = []
    for s in sorted((s for s in stats if s.eval_start_ns == last),
                    key=lambda s: (s.appliance, s.neighbour, s.channel)):
        floor = floors.get((s.appliance, s.neighbour, s.channel), 0.0)
        paths.append({
            "appliance": s.appliance, "neighbour": s.neighbour, "channel": s.channel,
            "windows": s.windows, "samples": s.samples,
            "p50_us": _us(s.p50_ns), "p99_us": _us(s.p99_ns), "p999_us": _us(s.p999_ns),
            "jitter_us": round(s.jitter_ns / 1e3, 3), "loss": round(s.loss, 6),
            "throughput_bps": round(s.throughput_bps, 1), "naks": s.naks,
            "retransmissions": s.retransmissions,
            "cost": round(link_cost(s, weights, floor), 3)})
    starts = sorted({s.eval_start_ns for s in stats})
    return {
        "generated_at_ns": generated_at_ns,
        "evaluation": {"window_ns": eval_ns, "windows": len(starts),
                       "first_ns": starts[0] if starts else None,
                       "last_ns": starts[-1] if starts else None},
        "weights": dict(weights), "clock": clock,
        "hysteresis": {"margin": selector.margin, "k": selector.k,
                       "min_gain": selector.min_gain},
        "routes": selector.table(),
        "paths": paths,
        "changes": selector.changes,
        "excluded": list(excluded),
    }


def _us(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e3, 3)
