"""The route job on Spark: telemetry windows -> per-path statistics -> route table.

Run it as ``topicwire routes compute --telemetry DIR --out routes.json`` (embedded Spark,
``local[*]``, UI off) or unchanged on a cluster::

    PYSPARK_PYTHON=/opt/topicwire/.venv/bin/python \\
    spark-submit --master spark://HOST:7077 appliance/ops/telemetry/routes_job.py \\
        --telemetry /shared/telemetry --out /shared/routes.json --window 60s

The DataFrame part (``aggregate_df``) runs on the executors with Spark SQL only (no Python
UDFs, so executors need no project code): rows are checked (``row_reason``), histogram
buckets of every (path, evaluation window) are merged (explode, group, sum), percentiles come
from a running sum over the merged buckets, the other figures from plain sums. The driver
collects one small row per (path, evaluation window) and runs ``costs.select_routes`` on it
(the mesh is small: Dijkstra on the driver).

Bad telemetry is reported and left out, never fatal: a file Spark cannot read
(``spark.sql.files.ignoreCorruptFiles``) is found by listing the directory on the driver and
checking the footers of the files that produced no rows; rows with missing columns (nulls),
negative latencies or inconsistent values are counted per file or path and filtered.

``--follow`` runs the same checks and sums on each micro-batch of a Structured Streaming file
source over the directory, merges them into driver-side state and replays the selector over
every evaluation window, so the table it writes equals what the batch job would write on
the same files; it writes ``--out`` (atomically) each time the table changes.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file by spark-submit
    import os as _os
    import sys as _sys

    _here = _os.path.dirname(_os.path.abspath(__file__))
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
    from appliance.ops.telemetry.routes_job import main as _main

    _sys.exit(_main())

import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from appliance.ops.telemetry.config import (
    EVAL_WINDOW_NS,
    FOLLOW_MAX_WINDOWS,
    FOLLOW_TRIGGER_S,
    HYSTERESIS_MARGIN,
    HYSTERESIS_MIN_GAIN,
    HYSTERESIS_WINDOWS,
    LATENCY_BUCKETS,
    LATENCY_SUB_BUCKETS,
    LATENCY_UNIT_NS,
    LATENESS_NS,
)
from appliance.ops.telemetry.costs import (
    QUANTILES,
    PathStats,
    parse_weights,
    percentile_ns,
    route_table,
    select_routes,
)
from appliance.ops.telemetry.errors import RoutesError
from appliance.ops.telemetry.store import check_file, data_files
from appliance.ops.telemetry.windows import PATH_COLUMNS, REQUIRED_COLUMNS, WINDOW_SCHEMA
from datapath.errors import UserError

log = logging.getLogger("topicwire.routes")
SHUFFLE_PARTITIONS = 16
"""``spark.sql.shuffle.partitions`` of the job (the data per shuffle is small)."""
KEYS = [*PATH_COLUMNS, "eval_start_ns"]
MISSING = "missing columns"
NEGATIVE = "negative latencies (clock skew)"
INVALID = "invalid values"


# --- Spark ---------------------------------------------------------------------------------------
def spark_session(master: str | None = None, app: str = "topicwire-routes") -> Any:
    """A SparkSession: ``master`` if given; under spark-submit the one it chose; else
    ``local[*]``. UI off, corrupt files skipped (and reported by the job), UTC."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):  # nothing listens beyond loopback
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    return (builder.config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.files.ignoreCorruptFiles", "true")
            .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate())


def spark_schema() -> Any:
    """``WINDOW_SCHEMA`` as a Spark StructType."""
    from pyspark.sql import types as T

    def of(arrow_type: Any) -> Any:
        import pyarrow as pa

        if pa.types.is_list(arrow_type):
            return T.ArrayType(of(arrow_type.value_type))
        return {pa.string(): T.StringType(), pa.int64(): T.LongType(),
                pa.int32(): T.IntegerType(), pa.float64(): T.DoubleType()}[arrow_type]

    return T.StructType([T.StructField(f.name, of(f.type)) for f in WINDOW_SCHEMA])


def row_reason() -> Any:
    """Why a row is left out (a Column: null when usable)."""
    from pyspark.sql import functions as F

    any_null = None
    for name in REQUIRED_COLUMNS:
        test = F.col(name).isNull()
        any_null = test if any_null is None else any_null | test
    b, c = F.col("lat_buckets"), F.col("lat_counts")
    invalid = ((F.col("window_ns") <= 0) | (F.size(b) != F.size(c)) | (F.col("lat_count") < 0)
               | F.exists(b, lambda x: (x < 0) | (x >= LATENCY_BUCKETS))
               | F.exists(c, lambda x: x < 0)
               | (F.aggregate(c, F.lit(0).cast("long"), lambda acc, x: acc + x)
                  != F.col("lat_count")))
    return (F.when(any_null, F.lit(MISSING))
            .when(invalid, F.lit(INVALID))
            .when(F.col("lat_negative") > 0, F.lit(NEGATIVE)))


def checked_df(df: Any) -> Any:
    """``df`` with ``file`` (where each row came from) and ``reason`` columns."""
    from pyspark.sql import functions as F

    if "file" not in df.columns:
        df = df.withColumn("file", F.col("_metadata.file_path"))
    return df.withColumn("reason", row_reason())


def read_windows_df(spark: Any, directory: str | os.PathLike[str]) -> Any:
    """Every telemetry file under ``directory`` (hidden and temporary names skipped)."""
    return checked_df(spark.read.schema(spark_schema())
                      .option("recursiveFileLookup", "true")
                      .option("pathGlobFilter", "*.parquet")
                      .parquet(str(directory)))


def _bounds(bucket: Any) -> tuple[Any, Any]:
    """(lower, width) in ns of a bucket Column (windows.py's layout, in SQL)."""
    from pyspark.sql import functions as F

    e = F.greatest(F.floor(bucket / LATENCY_SUB_BUCKETS) - 1, F.lit(0))
    m = bucket - e * LATENCY_SUB_BUCKETS
    scale = F.pow(F.lit(2.0), e) * LATENCY_UNIT_NS
    return m * scale, scale


def aggregate_df(good: Any, eval_ns: int) -> Any:
    """One row per (path, evaluation window) with ``PathStats``'s columns (and ``jw``, the
    jitter weighted by samples, divided on the driver)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    scal, hist = _partials(good, eval_ns)
    upto = Window.partitionBy(*KEYS).orderBy("bucket").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    hist = (hist.withColumn("cum", F.sum("n").over(upto))
            .withColumn("total", F.sum("n").over(Window.partitionBy(*KEYS))))
    firsts = [F.min(F.when(F.col("cum") >= F.lit(q) * F.col("total"),
                           F.struct("bucket", "cum", "n"))).alias(name)
              for name, q in QUANTILES.items()]
    pct = hist.groupBy(*KEYS).agg(F.first("total").alias("total"), *firsts)
    values = []
    for name, q in QUANTILES.items():
        hit = F.col(name)
        lower, width = _bounds(hit.bucket)
        below = hit.cum - hit.n
        values.append(F.when(hit.isNotNull(), lower + (F.lit(q) * F.col("total") - below)
                             / hit.n * width).alias(f"{name}_ns"))
    pct = pct.select(*KEYS, *values)
    return scal.join(pct, KEYS, "left")


def _stats_of(rows: Sequence[Any]) -> list[PathStats]:
    out = []
    for r in rows:
        d = r.asDict()
        samples = int(d["samples"] or 0)
        d["jitter_ns"] = float(d.pop("jw") or 0.0) / samples if samples else 0.0
        for name in ("windows", "samples", "frames", "bytes", "expected", "lost", "naks",
                     "retransmissions", "span_ns", "eval_start_ns", "end_ns"):
            d[name] = int(d[name] or 0)
        out.append(PathStats.from_row(d))
    return out


def _problem(what: str, reason: str, rows: int) -> dict[str, Any]:
    return {"what": what, "reason": reason, "rows": rows}


def _file_problems(directory: str | os.PathLike[str], seen: set[str]) -> list[dict[str, Any]]:
    """Files that gave no rows and whose footer does not read (corrupt, truncated)."""
    out = []
    for path in data_files(directory):
        if path.resolve().as_uri() in seen or str(path) in seen:
            continue
        problem = check_file(path)
        if problem is not None:
            out.append(_problem(problem.what, problem.reason, 0))
    return out


def _row_problems(counts: Sequence[Any]) -> tuple[list[dict[str, Any]], set[str]]:
    """Problems from (file, appliance, neighbour, channel, reason, count) rows; files seen."""
    from appliance.ops.telemetry.aggregate import path_name

    seen: set[str] = set()
    per_file: Counter[tuple[str, str]] = Counter()
    per_path: Counter[tuple[str, str]] = Counter()
    for r in counts:
        seen.add(r["file"])
        if r["reason"] is None:
            continue
        if r["reason"] == MISSING:
            per_file[(_local(r["file"]), MISSING)] += r["count"]
        else:
            per_path[(path_name(r["appliance"], r["neighbour"], r["channel"]),
                      r["reason"])] += r["count"]
    problems = [_problem(what, reason, n) for (what, reason), n in sorted(per_file.items())]
    problems += [_problem(what, reason, n) for (what, reason), n in sorted(per_path.items())]
    return problems, {_local(f) for f in seen} | seen


def _local(uri: str) -> str:
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri


def _problem_counts(df: Any) -> list[Any]:
    return df.groupBy("file", *PATH_COLUMNS, "reason").count().collect()


def compute(spark: Any, directory: str | os.PathLike[str], *, eval_ns: int = EVAL_WINDOW_NS,
            weights: dict[str, float] | None = None, margin: float = HYSTERESIS_MARGIN,
            k: int = HYSTERESIS_WINDOWS, min_gain: float = HYSTERESIS_MIN_GAIN,
            clock: str = "shared", lateness_ns: int = LATENESS_NS) -> dict[str, Any]:
    """The route table of everything under ``directory`` (see the module docstring)."""
    weights = weights or parse_weights([])
    data_files(directory)  # a missing directory is a user error, before Spark runs
    df = read_windows_df(spark, directory)
    problems, seen = _row_problems(_problem_counts(df))
    problems = _file_problems(directory, seen) + problems
    stats = _stats_of(aggregate_df(df.filter(df.reason.isNull()), eval_ns).collect())
    return _table(stats, problems, eval_ns=eval_ns, weights=weights, margin=margin, k=k,
                  min_gain=min_gain, clock=clock, lateness_ns=lateness_ns)


def _table(stats: list[PathStats], problems: list[dict[str, Any]], *, eval_ns: int,
           weights: dict[str, float], margin: float, k: int, min_gain: float, clock: str,
           lateness_ns: int) -> dict[str, Any]:
    """The route table over the complete evaluation windows of ``stats`` (those the newest
    telemetry passed by ``lateness_ns``)."""
    if not stats:
        detail = "; ".join(f"{p['what']}: {p['reason']}" for p in problems[:5])
        raise RoutesError("no usable telemetry windows"
                          + (f" ({len(problems)} excluded: {detail})" if problems else "")
                          + "; point --telemetry at the directory the appliances write to")
    watermark = max(s.end_ns for s in stats) - lateness_ns
    stats = [s for s in stats if s.eval_start_ns + eval_ns <= watermark]
    if not stats:
        raise RoutesError(f"no complete evaluation window yet: the telemetry must pass the end "
                          f"of one --window ({eval_ns / 1e9:g} s) by --lateness "
                          f"({lateness_ns / 1e9:g} s); wait, or give a shorter --window")
    selector, _, floors = select_routes(stats, weights, margin=margin, k=k, min_gain=min_gain,
                                        clock=clock)
    return route_table(selector, stats, weights, eval_ns=eval_ns, clock=clock, floors=floors,
                       excluded=problems, generated_at_ns=time.time_ns())


def write_table(doc: dict[str, Any], out: str | os.PathLike[str]) -> Path:
    """Write the route table atomically (temporary file + rename)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


# --- streaming -----------------------------------------------------------------------------------
class FollowState:
    """Driver-side merged sums per (path, evaluation window), fed by micro-batches."""

    SUMS = ("windows", "samples", "frames", "bytes", "expected", "lost", "naks",
            "retransmissions", "span_ns", "jw")

    def __init__(self) -> None:
        self.sums: dict[tuple, dict[str, float]] = {}
        self.floor: dict[tuple, int] = {}
        self.end: dict[tuple, int] = {}
        self.hist: dict[tuple, Counter[int]] = {}
        self.problems: dict[tuple[str, str], int] = {}
        self.seen_files: set[str] = set()
        self.reported_files: set[str] = set()

    def merge(self, scal: Sequence[Any], hist: Sequence[Any]) -> None:
        for r in scal:
            key = tuple(r[c] for c in KEYS)
            acc = self.sums.setdefault(key, dict.fromkeys(self.SUMS, 0))
            for name in self.SUMS:
                acc[name] += r[name] or 0
            if r["floor_ns"] is not None:
                self.floor[key] = min(self.floor.get(key, r["floor_ns"]), r["floor_ns"])
            self.end[key] = max(self.end.get(key, 0), int(r["end_ns"] or 0))
        for r in hist:
            key = tuple(r[c] for c in KEYS)
            self.hist.setdefault(key, Counter())[int(r["bucket"])] += int(r["n"])
        evals = sorted({key[3] for key in self.sums})
        if len(evals) > FOLLOW_MAX_WINDOWS:
            oldest = evals[-FOLLOW_MAX_WINDOWS]
            for table in (self.sums, self.floor, self.end, self.hist):
                for key in [k for k in table if k[3] < oldest]:
                    del table[key]

    def stats(self) -> list[PathStats]:
        out = []
        for key, acc in sorted(self.sums.items()):
            h = self.hist.get(key, Counter())
            buckets, counts = list(h), list(h.values())
            samples = int(acc["samples"])
            pct = {name: percentile_ns(buckets, counts, q) for name, q in QUANTILES.items()}
            out.append(PathStats(
                appliance=key[0], neighbour=key[1], channel=key[2], eval_start_ns=key[3],
                windows=int(acc["windows"]), samples=samples, p50_ns=pct["p50"],
                p99_ns=pct["p99"], p999_ns=pct["p999"],
                jitter_ns=acc["jw"] / samples if samples else 0.0, frames=int(acc["frames"]),
                bytes=int(acc["bytes"]), expected=int(acc["expected"]), lost=int(acc["lost"]),
                naks=int(acc["naks"]), retransmissions=int(acc["retransmissions"]),
                span_ns=int(acc["span_ns"]), floor_ns=self.floor.get(key),
                end_ns=self.end.get(key, 0)))
        return out


def _partials(good: Any, eval_ns: int) -> tuple[Any, Any]:
    """(scalar sums, histogram sums) per (path, evaluation window) of one micro-batch."""
    from pyspark.sql import functions as F

    rows = good.withColumn("eval_start_ns",
                           F.col("window_start_ns") - F.pmod("window_start_ns", F.lit(eval_ns)))
    scal = rows.groupBy(*KEYS).agg(
        F.count(F.lit(1)).alias("windows"), F.sum("lat_count").alias("samples"),
        F.sum("frames").alias("frames"), F.sum("bytes").alias("bytes"),
        F.sum("expected").alias("expected"), F.sum("lost").alias("lost"),
        F.sum("naks").alias("naks"), F.sum("retransmissions").alias("retransmissions"),
        F.sum("window_ns").alias("span_ns"),
        F.sum(F.col("jitter_ns") * F.col("lat_count")).alias("jw"),
        F.min(F.when(F.col("lat_count") > 0, F.col("lat_min_ns"))).alias("floor_ns"),
        F.max(F.col("window_start_ns") + F.col("window_ns")).alias("end_ns"))
    z = rows.select(*KEYS, F.explode(F.arrays_zip("lat_buckets", "lat_counts")).alias("z"))
    hist = (z.select(*KEYS, F.col("z.lat_buckets").alias("bucket"),
                     F.col("z.lat_counts").alias("n"))
            .groupBy(*KEYS, "bucket").agg(F.sum("n").alias("n")))
    return scal, hist


def follow(spark: Any, directory: str | os.PathLike[str], out: str | os.PathLike[str], *,
           eval_ns: int = EVAL_WINDOW_NS, weights: dict[str, float] | None = None,
           margin: float = HYSTERESIS_MARGIN, k: int = HYSTERESIS_WINDOWS,
           min_gain: float = HYSTERESIS_MIN_GAIN, clock: str = "shared",
           lateness_ns: int = LATENESS_NS,
           trigger_s: float = FOLLOW_TRIGGER_S,
           stop: threading.Event | None = None, duration_s: float | None = None,
           on_table: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Structured Streaming over ``directory``; writes ``out`` whenever the route table
    changes. Runs until ``stop`` is set or ``duration_s`` passed; returns tables written."""
    weights = weights or parse_weights([])
    data_files(directory)
    state = FollowState()
    last: list[Any] = [None]
    written = [0]
    stopping = threading.Event()

    def on_batch(batch_df: Any, batch_id: int) -> None:
        if stopping.is_set():
            return
        df = checked_df(batch_df)
        counts = _problem_counts(df)
        problems, seen = _row_problems(counts)
        state.seen_files |= seen
        for p in problems:
            key = (p["what"], p["reason"])
            state.problems[key] = state.problems.get(key, 0) + p["rows"]
        for p in _file_problems(directory, state.seen_files | state.reported_files):
            state.reported_files.add(p["what"])
            state.problems[(p["what"], p["reason"])] = 0
            log.warning("routes: %s: %s (excluded)", p["what"], p["reason"])
        scal, hist = _partials(df.filter(df.reason.isNull()), eval_ns)
        state.merge(scal.collect(), hist.collect())
        stats = state.stats()
        if not stats or stopping.is_set():
            return
        excluded = [_problem(w, r, n) for (w, r), n in sorted(state.problems.items())]
        try:
            doc = _table(stats, excluded, eval_ns=eval_ns, weights=weights, margin=margin,
                         k=k, min_gain=min_gain, clock=clock, lateness_ns=lateness_ns)
        except RoutesError:  # no complete evaluation window yet
            return
        key = json.dumps(doc["routes"], sort_keys=True)
        if key != last[0]:
            last[0] = key
            write_table(doc, out)
            written[0] += 1
            if on_table is not None:
                on_table(doc)

    checkpoint = tempfile.mkdtemp(prefix="topicwire-routes-ckpt-")
    stream = (spark.readStream.schema(spark_schema())
              .option("recursiveFileLookup", "true")
              .option("pathGlobFilter", "*.parquet")
              .parquet(str(directory)))
    stream = stream.withColumn("file", stream["_metadata.file_path"])
    query = (stream.writeStream.foreachBatch(on_batch)
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime=f"{max(trigger_s, 0.1)} seconds").start())
    deadline = None if duration_s is None else time.monotonic() + duration_s
    try:
        while query.isActive:
            if stop is not None and stop.is_set():
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            query.awaitTermination(0.2)
    finally:
        # let a running micro-batch finish: stopping inside one interrupts its Spark jobs
        stopping.set()
        settle = time.monotonic() + 60
        while query.isActive and query.status["isTriggerActive"] and time.monotonic() < settle:
            time.sleep(0.05)
        query.stop()
        import shutil

        shutil.rmtree(checkpoint, ignore_errors=True)
    if query.exception() is not None:
        raise RoutesError(f"the streaming query failed: {query.exception()}")
    return written[0]


# --- the command ---------------------------------------------------------------------------------
def summary(doc: dict[str, Any]) -> str:
    """One line per route, then the exclusions."""
    lines = []
    for r in doc["routes"]:
        backup = " / backup " + " > ".join(r["backup"]) if r["backup"] else ""
        lines.append(f"{r['source']} -> {r['destination']}: {' > '.join(r['path'])} "
                     f"(cost {r['cost']:.1f}){backup}")
    for p in doc["excluded"]:
        rows = f" ({p['rows']} rows)" if p["rows"] else ""
        lines.append(f"excluded: {p['what']}: {p['reason']}{rows}")
    lines.append(f"{len(doc['routes'])} routes, {len(doc['changes'])} changes over "
                 f"{doc['evaluation']['windows']} evaluation windows")
    return "\n".join(lines)


def run_compute(args: Any) -> int:
    """``routes compute``: the job over the store, the table written (and followed)."""
    from appliance.ops.telemetry.costs import parse_weights

    weights = parse_weights(args.weight)
    if not 0 <= args.margin < 1 or args.k < 1 or not args.min_gain >= 0:
        raise UserError("--margin must be in [0, 1), --k >= 1 and --min-gain >= 0",
                        component="routes")
    spark = spark_session(args.master)
    try:
        if args.follow:
            def show(doc: dict) -> None:
                print(json.dumps(doc) if args.json else summary(doc), flush=True)

            follow(spark, args.telemetry, args.out, eval_ns=args.window, weights=weights,
                   margin=args.margin, k=args.k, min_gain=args.min_gain, clock=args.clock,
                   lateness_ns=args.lateness, trigger_s=args.trigger / 1e9,
                   duration_s=None if args.for_ns is None else args.for_ns / 1e9,
                   on_table=show)
            return 0
        doc = compute(spark, args.telemetry, eval_ns=args.window, weights=weights,
                                 margin=args.margin, k=args.k, min_gain=args.min_gain,
                                 clock=args.clock,
                                 lateness_ns=args.lateness)
    finally:
        spark.stop()
    write_table(doc, args.out)
    print(json.dumps(doc) if args.json else summary(doc))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``routes compute`` as a program (spark-submit runs this)."""
    import argparse

    from appliance.ops.telemetry.job_args import add_compute_arguments

    parser = argparse.ArgumentParser(prog="routes_job.py",
                                     description="topicwire route job (routes compute)")
    add_compute_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_compute(args)
    except RoutesError as exc:
        print(f"topicwire: {exc}", file=sys.stderr)
        return 2
