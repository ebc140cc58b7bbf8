"""``topicwire bench routes``: telemetry windows aggregated per second, Spark vs pandas.

The workload: ``--windows`` telemetry windows (1 s each, 8 latency buckets a row, as the
appliances write them) over ``--paths`` links of a full mesh, written to a telemetry store
(Parquet, date/hour partitions) in a temporary directory. ``topicwire`` is the route job's
aggregation on Spark (``--master``, default ``local[2]``): read, row checks, histogram merge
and percentiles per (path, evaluation window), collected on the driver; the baseline
``pandas`` does the same aggregation with pyarrow and pandas on one core
(``appliance.ops.telemetry.aggregate``, pyarrow limited to one thread). Both read the same files
in the same run and must give the same statistics. ``windows_per_s`` is windows divided by
the median aggregation time (after one warm-up run each); ``run_s`` is the median of the
route job's whole run (``routes_job.compute``: checks, aggregation, route selection),
``start_s`` the Spark session's start.
"""

from __future__ import annotations

import argparse
import math
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from bench.report import build_report, positive_int, progress
from datapath.errors import TopicwireError

NAME = "routes"
HELP = "telemetry windows -> per-path statistics: the Spark route job vs pandas on one core"
EXTRA_MODULES = ("pyspark", "pandas")
"""What it needs of the ``bench`` extra (`topicwire bench` checks before it runs)."""
REPEATS = 3
"""Default repeats per figure (each one reads and aggregates every window)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("--windows", type=positive_int, default=1_000_000,
                        help="telemetry windows (rows) to aggregate (default 1000000)")
    parser.add_argument("--paths", type=positive_int, default=56,
                        help="paths (links of a full mesh; default 56: 8 appliances)")
    parser.add_argument("--eval", type=positive_int, default=60, metavar="SECONDS",
                        help="evaluation window in seconds (default 60)")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--repeats", type=positive_int, default=REPEATS,
                        help=f"repeats per figure, medians reported (default {REPEATS})")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")


def mesh_links(paths: int) -> list[tuple[str, str]]:
    """The first ``paths`` directed links of the smallest full mesh that has them."""
    n = 2
    while n * (n - 1) < paths:
        n += 1
    names = [f"core{i}" for i in range(n)]
    return [(u, v) for u in names for v in names if u != v][:paths]


def _timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark; returns the report (``bench.report.build_report``)."""
    import pyarrow as pa

    from appliance.ops.telemetry import routes_job
    from appliance.ops.telemetry.aggregate import aggregate, check_rows
    from appliance.ops.telemetry.costs import PathStats
    from appliance.ops.telemetry.store import TelemetryStore, read_windows
    from appliance.ops.telemetry.synth import synthetic_windows

    links = mesh_links(args.paths)
    per_path = math.ceil(args.windows / len(links))
    eval_ns = args.eval * 1_000_000_000
    rng = np.random.default_rng(args.seed)
    lat = rng.uniform(50, 500, (len(links), 1)) * rng.uniform(0.8, 1.25, (len(links), per_path))
    directory = tempfile.mkdtemp(prefix="topicwire-bench-routes-")
    try:
        progress(NAME, f"writing {args.windows} windows over {len(links)} paths")
        table = synthetic_windows(links, lat, start_ns=1_735_689_600 * 1_000_000_000,
                                  seed=args.seed)
        table = table.slice(0, args.windows)
        store = TelemetryStore(directory)
        for start in range(0, table.num_rows, 250_000):
            store.write(table.slice(start, 250_000))
        del table
        files = store.files()

        progress(NAME, f"pandas on one core x {args.repeats + 1}")
        cpu, io = pa.cpu_count(), pa.io_thread_count()
        pa.set_cpu_count(1)
        pa.set_io_thread_count(1)
        try:
            def baseline() -> list[PathStats]:
                usable, _ = check_rows(read_windows(directory, files)[0])
                return aggregate(usable, eval_ns)

            base_times = [_timed(baseline) for _ in range(args.repeats + 1)]
        finally:
            pa.set_cpu_count(cpu)
            pa.set_io_thread_count(io)
        want = _sorted(base_times[0][1])

        progress(NAME, f"Spark {args.master}: starting")
        from pyspark.sql import SparkSession

        own = SparkSession.getActiveSession() is None
        start_s, spark = _timed(lambda: routes_job.spark_session(args.master,
                                                                 app="topicwire-bench-routes"))
        try:
            spark.sparkContext.setLogLevel("ERROR")

            def spark_aggregate() -> list[PathStats]:
                df = routes_job.read_windows_df(spark, directory)
                rows = routes_job.aggregate_df(df.filter(df.reason.isNull()), eval_ns).collect()
                return routes_job._stats_of(rows)

            progress(NAME, f"Spark aggregation x {args.repeats + 1}")
            spark_times = [_timed(spark_aggregate) for _ in range(args.repeats + 1)]
            progress(NAME, f"route job x {args.repeats}")
            job_times = [_timed(lambda: routes_job.compute(spark, directory, eval_ns=eval_ns))
                         for _ in range(args.repeats)]
            master = spark.sparkContext.master
        finally:
            if own:
                spark.stop()
        got = _sorted(spark_times[0][1])
        _check(got, want)
        routes = len(job_times[0][1]["routes"])
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    def median(times: list[tuple[float, Any]]) -> float:
        return float(np.median([t for t, _ in times]))

    spark_s = median(spark_times[1:])
    pandas_s = median(base_times[1:])
    params = {
        "windows": args.windows, "paths": len(links), "windows_per_path": per_path,
        "eval_s": args.eval, "buckets_per_window": 8, "files": len(files),
        "groups": len(want), "routes": routes, "master": master, "repeats": args.repeats,
        "seed": args.seed,
    }
    results = {
        "topicwire": {"windows_per_s": args.windows / spark_s, "aggregate_s": spark_s,
                      "first_aggregate_s": spark_times[0][0], "run_s": median(job_times),
                      "start_s": start_s},
        "pandas": {"windows_per_s": args.windows / pandas_s, "aggregate_s": pandas_s,
                   "first_aggregate_s": base_times[0][0]},
    }
    progress(NAME, "done")
    return build_report(NAME, params, results)


def _sorted(stats: list[Any]) -> list[Any]:
    return sorted(stats, key=lambda s: (s.appliance, s.neighbour, s.channel, s.eval_start_ns))


def _check(got: list[Any], want: list[Any]) -> None:
    """Spark and pandas must agree on every figure."""
    if len(got) != len(want):
        raise TopicwireError(f"Spark found {len(got)} (path, window) groups, pandas "
                             f"{len(want)}; this is a bug, report it with the seed",
                             component="bench")
    for g, w in zip(got, want):
        for name in w.__dataclass_fields__:
            a, b = getattr(g, name), getattr(w, name)
            same = a == b if isinstance(b, str) or a is None or b is None else \
                math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
            if not same:
                raise TopicwireError(f"{name} of {w.neighbour}->{w.appliance} at "
                                     f"{w.eval_start_ns}: Spark {a}, pandas {b}; this is a "
                                     "bug, report it with the seed", component="bench")
