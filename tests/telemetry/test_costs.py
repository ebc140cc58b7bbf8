"""The driver's half of the route job without Spark: percentiles of merged buckets, row checks,
the pandas aggregation, link costs, best/backup paths and hysteresis, on known answers."""

import numpy as np
import pyarrow as pa
import pytest

from appliance.ops.telemetry.aggregate import INVALID, NEGATIVE, aggregate, check_rows
from appliance.ops.telemetry.config import COST_WEIGHTS
from appliance.ops.telemetry.costs import (
    PathStats,
    RouteSelector,
    backup_of,
    graph_of,
    link_cost,
    parse_weights,
    percentile_ns,
    select_routes,
    shortest,
)
from appliance.ops.telemetry.errors import RoutesError
from appliance.ops.telemetry.synth import exact_window, synthetic_windows
from appliance.ops.telemetry.windows import bucket_bounds, sparse_buckets

T0 = 1_735_732_800 * 1_000_000_000
S = 1_000_000_000


def test_percentiles_interpolate_inside_the_bucket_that_holds_the_rank():
    # 100 samples of 1,000 ns: bucket [960, 1024); rank 50 of 100 -> 960 + 0.5 * 64
    b, c, _ = sparse_buckets(np.full(100, 1_000))
    assert bucket_bounds(b)[0].tolist() == [960]
    assert percentile_ns(b, c, 0.5) == pytest.approx(992.0)
    assert percentile_ns(b, c, 0.99) == pytest.approx(960 + 0.99 * 64)
    # 90 samples at 10 us, 10 at 1 ms: p50 in the first bucket, p99 in the second
    b, c, _ = sparse_buckets(np.array([10_000] * 90 + [1_000_000] * 10))
    lo, hi = bucket_bounds(b)
    assert percentile_ns(b, c, 0.5) == pytest.approx(lo[0] + 50 / 90 * (hi[0] - lo[0]))
    assert percentile_ns(b, c, 0.99) == pytest.approx(lo[1] + (99 - 90) / 10 * (hi[1] - lo[1]))
    assert percentile_ns([], [], 0.5) is None


@pytest.mark.parametrize("seed", range(5))
def test_percentiles_are_within_a_bucket_width_of_the_exact_ones(seed):
    rng = np.random.default_rng(seed)
    lat = rng.lognormal(np.log(50_000), 1.0, 20_000).astype(np.int64)
    b, c, _ = sparse_buckets(lat)
    for q in (0.5, 0.99, 0.999):
        exact = np.quantile(lat, q)
        assert abs(percentile_ns(b, c, q) - exact) <= exact / 16 + 64


def test_merging_windows_gives_the_percentiles_of_all_their_samples():
    rng = np.random.default_rng(7)
    parts = [rng.integers(1_000, 900_000, 3_000) for _ in range(4)]
    table = pa.concat_tables([exact_window("b", "a", p, window_start_ns=T0 + i * S,
                                           expected=100, lost=i, jitter_ns=1_000.0 * (i + 1))
                              for i, p in enumerate(parts)])
    [stats] = aggregate(table, 4 * S)
    b, c, _ = sparse_buckets(np.concatenate(parts))
    for name, q in (("p50_ns", 0.5), ("p99_ns", 0.99), ("p999_ns", 0.999)):
        assert getattr(stats, name) == pytest.approx(percentile_ns(b, c, q), rel=1e-12)
    assert (stats.windows, stats.samples, stats.expected, stats.lost) == (4, 12_000, 400, 6)
    assert stats.loss == pytest.approx(6 / 400)
    assert stats.jitter_ns == pytest.approx(2_500.0)  # equal samples: the plain mean
    assert stats.span_ns == 4 * S
    assert stats.throughput_bps == pytest.approx(12_000 * 100 * 8 / 4)
    assert stats.floor_ns == min(int(p.min()) for p in parts)


def test_evaluation_windows_split_on_multiples_of_their_length():
    table = synthetic_windows([("a", "b")], np.full((1, 7), 100.0), start_ns=T0 + 3 * S)
    stats = aggregate(table, 5 * S)
    assert [(s.eval_start_ns - T0, s.windows) for s in stats] == [(0, 2), (5 * S, 5)]


def test_rows_with_negative_latencies_or_inconsistent_values_are_reported_and_left_out():
    good = synthetic_windows([("a", "b"), ("c", "b")], np.full((2, 3), 100.0), start_ns=T0)
    rows = good.to_pylist()
    rows[0]["lat_negative"] = 4                       # a->b, clock skew
    rows[1]["lat_buckets"] = [1, 2]                   # a->b, lengths disagree
    rows[3]["lat_buckets"] = [5000] * 8               # c->b, bucket out of range
    rows[4]["lat_count"] += 1                         # c->b, count does not add up
    rows[5]["window_ns"] = 0                          # c->b
    usable, problems = check_rows(pa.Table.from_pylist(rows, schema=good.schema))
    assert usable.num_rows == 1
    assert sorted((p.what, p.reason, p.rows) for p in problems) == [
        ("b<-a/fabric", INVALID, 1), ("b<-a/fabric", NEGATIVE, 1), ("b<-c/fabric", INVALID, 3)]


def stats_of(link_us, eval_start=T0, loss=None):
    """PathStats of links {(u, v): latency_us} in one evaluation window."""
    links = list(link_us)
    lat = np.array([[link_us[x]] for x in links])
    loss_arr = None if loss is None else np.array([[loss.get(x, 0.0)] for x in links])
    return aggregate(synthetic_windows(links, lat, start_ns=eval_start, loss=loss_arr), S)


def test_link_cost_follows_the_documented_formula():
    s = PathStats("b", "a", "fabric", T0, 1, 10, 100_000.0, 300_000.0, 500_000.0, 20_000.0,
                  10, 10_000, 200, 4, 1, 30, S, 90_000)
    w = dict(COST_WEIGHTS)
    expected = (1.0 * 100 + 0.5 * 300 + 0.25 * 500 + 1.0 * 20 + 100_000 * 4 / 200
                + 0.0 * 30 + 1.0)
    assert link_cost(s, w) == pytest.approx(expected)
    assert link_cost(s, w, floor_ns=90_000) == pytest.approx(
        10 + 0.5 * 210 + 0.25 * 410 + 20 + 2_000 + 1)
    w2 = parse_weights(["p50_us=0", "p99_us=0", "p999_us=0", "jitter_us=0", "hop_us=5"])
    assert link_cost(s, w2) == pytest.approx(2_000 + 5)


def test_bad_weights_are_refused_with_the_names():
    for bad in (["p42=1"], ["p50_us"], ["p50_us=x"], ["loss=-1"]):
        with pytest.raises(RoutesError, match="routes: --weight"):
            parse_weights(bad)


SQUARE = {("a", "b"): 100, ("b", "a"): 100, ("b", "d"): 100, ("d", "b"): 100,
          ("a", "c"): 150, ("c", "a"): 150, ("c", "d"): 150, ("d", "c"): 150}


def test_best_path_and_a_link_disjoint_backup_over_the_directed_graph():
    graph, links = graph_of(stats_of(SQUARE), COST_WEIGHTS)
    cost, path = shortest(graph, "a", "d")
    assert path == ("a", "b", "d")
    assert cost == pytest.approx(graph["a"]["b"] + graph["b"]["d"])
    assert backup_of(graph, path)[1] == ("a", "c", "d")
    assert links[("a", "b")][0] == "fabric"
    # a line has no disjoint backup and no other path
    line, _ = graph_of(stats_of({("a", "b"): 10, ("b", "c"): 10}), COST_WEIGHTS)
    assert shortest(line, "a", "c")[1] == ("a", "b", "c")
    assert backup_of(line, ("a", "b", "c")) is None
    assert shortest(line, "c", "a") is None  # links are directed


def test_without_a_disjoint_path_the_backup_is_the_next_cheapest_path():
    # a->b->d and a->b->c->d share a->b
    graph, _ = graph_of(stats_of({("a", "b"): 10, ("b", "d"): 10, ("b", "c"): 10,
                                  ("c", "d"): 10}), COST_WEIGHTS)
    assert backup_of(graph, ("a", "b", "d"))[1] == ("a", "b", "c", "d")


def run_windows(per_window, min_gain=50.0):
    """Selector over evaluation windows given as {(u, v): latency_us} dicts."""
    stats = []
    for i, links in enumerate(per_window):
        stats += stats_of(links, T0 + i * S)
    return select_routes(stats, COST_WEIGHTS, margin=0.2, k=3, min_gain=min_gain)[0]


def test_a_route_moves_only_after_k_consecutive_better_windows():
    slow = {**SQUARE, ("b", "d"): 1_000}
    sel = run_windows([SQUARE, slow, slow, SQUARE, slow, slow, slow, slow])
    changes = [c for c in sel.changes if (c["source"], c["destination"]) == ("a", "d")]
    # windows 1-2 are better twice, window 3 resets the streak; 4, 5, 6 make three
    assert [(c["eval_start_ns"] - T0) // S for c in changes] == [6]
    assert changes[0]["from"] == ["a", "b", "d"] and changes[0]["to"] == ["a", "c", "d"]
    assert changes[0]["reason"] == "better"
    route = {(r["source"], r["destination"]): r for r in sel.table()}[("a", "d")]
    assert route["path"] == ["a", "c", "d"] and route["backup"] == ["a", "b", "d"]


def test_an_improvement_smaller_than_the_margin_never_moves_the_route():
    # via b becomes 140 + 160 us against 2 x 150 us via c: never 20 % cheaper either way
    worse = {**SQUARE, ("a", "b"): 140, ("b", "d"): 160, ("d", "b"): 160}
    sel = run_windows([SQUARE] + [worse] * 6)
    assert not [c for c in sel.changes if (c["source"], c["destination"]) == ("a", "d")]


def test_a_large_ratio_of_small_costs_moves_the_route_only_past_the_minimum_gain():
    """Fast links: a->c->d costs half of a busy a->b->d, far past the 20 % margin, but less
    than 50 cost units less."""
    fast = {x: v / 20 for x, v in SQUARE.items()}   # b: 5 us a link, c: 7.5 us
    busy_b = {**fast, ("a", "b"): 15, ("b", "d"): 15, ("d", "b"): 15}
    assert not [c for c in run_windows([fast] + [busy_b] * 5).changes
                if (c["source"], c["destination"]) == ("a", "d")]
    [moved] = [c for c in run_windows([fast] + [busy_b] * 5, min_gain=10).changes
               if (c["source"], c["destination"]) == ("a", "d")]
    assert moved["to"] == ["a", "c", "d"] and moved["to_cost"] < 0.6 * moved["from_cost"]
    assert moved["from_cost"] - moved["to_cost"] < 50


def test_a_route_that_lost_a_link_moves_at_once_and_an_unreachable_pair_is_dropped():
    no_bd = {x: v for x, v in SQUARE.items() if x != ("b", "d")}
    sel = run_windows([SQUARE, no_bd])
    [change] = [c for c in sel.changes if (c["source"], c["destination"]) == ("a", "d")]
    assert change["reason"] == "unavailable" and change["to"] == ["a", "c", "d"]
    sel = run_windows([SQUARE, {("a", "b"): 100, ("b", "a"): 100}])
    gone = {(c["source"], c["destination"]) for c in sel.changes if c["reason"] == "unreachable"}
    assert ("a", "d") in gone and ("a", "b") not in gone


def test_relative_clock_subtracts_each_links_floor():
    """a->b's clocks are 400 us apart; the c links queue (100-300 us) where the b links do not
    (100-120 us). Shared clocks avoid a->b; relative clocks see through the offset."""
    rng = np.random.default_rng(3)
    spread = {("a", "b"): (500, 520), ("b", "d"): (100, 120), ("a", "c"): (100, 300),
              ("c", "d"): (100, 300)}
    table = pa.concat_tables([
        exact_window(v, u, rng.integers(lo * 1_000, hi * 1_000, 2_000), window_start_ns=T0)
        for (u, v), (lo, hi) in spread.items()])
    stats = aggregate(table, S)
    shared = select_routes(stats, COST_WEIGHTS, clock="shared")[0].table()
    relative, _, floors = select_routes(stats, COST_WEIGHTS, clock="relative")
    pick = {(r["source"], r["destination"]): r["path"] for r in shared}
    assert pick[("a", "d")] == ["a", "c", "d"]
    pick = {(r["source"], r["destination"]): r["path"] for r in relative.table()}
    assert pick[("a", "d")] == ["a", "b", "d"]
    assert 500_000 <= floors[("b", "a", "fabric")] < 501_000
    with pytest.raises(RoutesError, match="--clock"):
        select_routes(stats, COST_WEIGHTS, clock="ntp")


def test_hysteresis_parameters_are_checked():
    with pytest.raises(RoutesError, match="hysteresis"):
        RouteSelector(margin=1.0)
    with pytest.raises(RoutesError, match="hysteresis"):
        RouteSelector(k=0)
    with pytest.raises(RoutesError, match="minimum gain"):
        RouteSelector(min_gain=-1)
