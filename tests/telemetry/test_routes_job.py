"""The route job on Spark (one shared local session): the same aggregation as the pandas
twin, known routes and hysteresis on generated telemetry, bad files and rows reported and
left out, and --follow emitting a new table when the routes change."""

import json
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from appliance.ops.telemetry import routes_job
from appliance.ops.telemetry.aggregate import aggregate
from appliance.ops.telemetry.errors import RoutesError
from appliance.ops.telemetry.store import TelemetryStore, read_windows
from tests.telemetry.scenario import (
    DEGRADED_FROM,
    LINKS,
    T0,
    WINDOWS,
    S,
    job,
    routes_of,
    scenario,
)

pytestmark = pytest.mark.spark


def test_spark_aggregation_equals_the_pandas_twin(spark, tmp_path):
    TelemetryStore(tmp_path).write(scenario())
    df = routes_job.read_windows_df(spark, tmp_path)
    key = lambda s: (s.appliance, s.neighbour, s.channel, s.eval_start_ns)  # noqa: E731
    got = sorted(routes_job._stats_of(
        routes_job.aggregate_df(df.filter(df.reason.isNull()), 4 * S).collect()), key=key)
    table, _ = read_windows(tmp_path)
    want = sorted(aggregate(table, 4 * S), key=key)
    assert len(got) == len(want) == len(LINKS) * WINDOWS // 4
    for g, w in zip(got, want):
        for name in w.__dataclass_fields__:
            a, b = getattr(g, name), getattr(w, name)
            assert a == (b if isinstance(b, str) else pytest.approx(b, rel=1e-12)), (name, g, w)


def test_the_route_moves_after_k_windows_of_a_slow_link(spark, tmp_path):
    TelemetryStore(tmp_path).write(scenario())
    doc = job(spark, tmp_path)
    routes = routes_of(doc)
    assert routes[("a", "d")] == (["a", "c", "d"], ["a", "b", "d"])
    assert routes[("b", "d")] == (["b", "a", "c", "d"], ["b", "d"])
    assert routes[("d", "a")] == (["d", "b", "a"], ["d", "c", "a"])  # d->b stayed fast
    moved = {(c["source"], c["destination"]): c for c in doc["changes"]}
    assert set(moved) == {("a", "d"), ("b", "d")}
    assert routes[("c", "a")][0] == ["c", "d", "b", "a"]  # the lossy direct link costs more
    # degraded from evaluation window 5 (windows 10-11): better there and in 6 -> moves at 6
    assert moved[("a", "d")]["eval_start_ns"] == T0 + 12 * S
    assert moved[("a", "d")]["from"] == ["a", "b", "d"] and moved[("a", "d")]["reason"] == "better"
    # the last evaluation window ends with the telemetry: not decided before 2 s lateness
    assert doc["excluded"] == [] and doc["evaluation"]["windows"] == WINDOWS // 2 - 1
    paths = {(p["appliance"], p["neighbour"]): p for p in doc["paths"]}
    assert paths[("a", "c")]["loss"] == pytest.approx(0.02)
    assert 900 < paths[("d", "b")]["p50_us"] < 1_100
    assert paths[("d", "b")]["p50_us"] < paths[("d", "b")]["p99_us"] <= paths[("d", "b")][
        "p999_us"]


def test_bad_files_and_rows_are_reported_and_left_out(spark, tmp_path):
    store = TelemetryStore(tmp_path)
    store.write(scenario())
    clean = routes_of(job(spark, tmp_path))
    [good] = store.files()
    part = good.parent
    (part / "part-garbage.parquet").write_bytes(b"PAR1 not parquet at all PAR1")
    (part / "part-truncated.parquet").write_bytes(good.read_bytes()[:good.stat().st_size // 2])
    (part / ".part-half-written.parquet.tmp").write_bytes(b"hidden: never read")
    pq.write_table(pa.table({"appliance": ["d"], "neighbour": ["b"],
                             "window_start_ns": [T0]}), part / "part-columns.parquet")
    skewed = scenario(0, 3).to_pylist()
    for row in skewed:
        row["lat_negative"] = 7
        row["lat_counts"] = [c * 1000 for c in row["lat_counts"]]  # would dominate if used
        row["lat_count"] *= 1000
    invalid = scenario(3, 4).to_pylist()
    for row in invalid:
        row["lat_buckets"] = [b + 10_000 for b in row["lat_buckets"]]
    bad = pa.Table.from_pylist(skewed + invalid, schema=scenario().schema)
    pq.write_table(bad, part / "part-bad-rows.parquet")
    doc = job(spark, tmp_path)
    assert routes_of(doc) == clean
    reasons = {(p["what"] if "<-" in p["what"] else p["what"].rsplit("/", 1)[-1],
                p["reason"].split(":")[0]): p["rows"] for p in doc["excluded"]}
    assert reasons.pop(("part-garbage.parquet", "corrupt file")) == 0
    assert reasons.pop(("part-truncated.parquet", "corrupt file")) == 0
    assert reasons.pop(("part-columns.parquet", "missing columns")) == 1
    negative = {k: v for k, v in reasons.items() if k[1] == routes_job.NEGATIVE}
    assert sorted(negative) == sorted((f"{v}<-{u}/fabric", routes_job.NEGATIVE) for u, v in LINKS)
    assert set(negative.values()) == {3}
    invalid_rows = {k: v for k, v in reasons.items() if k[1] == routes_job.INVALID}
    assert len(invalid_rows) == len(LINKS) and set(invalid_rows.values()) == {1}
    assert len(reasons) == 2 * len(LINKS)


def test_nothing_usable_is_a_clear_error(spark, tmp_path):
    (tmp_path / "part-garbage.parquet").write_bytes(b"nope")
    with pytest.raises(RoutesError, match="routes: no usable telemetry windows .*corrupt"):
        job(spark, tmp_path)


def test_follow_writes_a_new_table_when_the_routes_change(spark, tmp_path):
    store = TelemetryStore(tmp_path / "t")
    out = tmp_path / "routes.json"
    tables = []
    stop = threading.Event()
    result = {}

    def run():
        try:
            result["written"] = routes_job.follow(
                spark, tmp_path / "t", out, eval_ns=2 * S, margin=0.2, k=2, trigger_s=0.5,
                stop=stop, on_table=tables.append)
        except BaseException as exc:  # surfaced below
            result["error"] = exc

    def wait_for(n):
        deadline = time.monotonic() + 90
        while len(tables) < n and time.monotonic() < deadline and "error" not in result:
            time.sleep(0.2)
        assert "error" not in result, result.get("error")
        assert len(tables) >= n

    thread = threading.Thread(target=run)
    store.write(scenario(0, DEGRADED_FROM))
    thread.start()
    try:
        wait_for(1)
        assert routes_of(tables[0])[("a", "d")][0] == ["a", "b", "d"]
        assert json.loads(out.read_text())["routes"] == tables[0]["routes"]
        (store.root / "part-garbage.parquet").write_bytes(b"not parquet")
        for w in range(DEGRADED_FROM, WINDOWS, 2):  # the appliances keep writing
            store.write(scenario(w, w + 2))
            time.sleep(0.3)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (
                not tables or routes_of(tables[-1])[("a", "d")][0] != ["a", "c", "d"]):
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(60)
    assert "error" not in result, result.get("error")
    final = tables[-1]
    assert routes_of(final)[("a", "d")][0] == ["a", "c", "d"]
    assert result["written"] == len(tables) >= 2
    # a new table only when routes changed: no two consecutive tables alike
    assert all(a["routes"] != b["routes"] for a, b in zip(tables, tables[1:]))
    assert any(p["what"].endswith("part-garbage.parquet") for p in final["excluded"])
    # the streamed table equals the batch job on the same files
    batch = job(spark, tmp_path / "t")
    assert routes_of(final) == routes_of(batch)
    assert [(c["source"], c["destination"], c["eval_start_ns"]) for c in final["changes"]] == [
        (c["source"], c["destination"], c["eval_start_ns"]) for c in batch["changes"]]
