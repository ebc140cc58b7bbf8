"""Checks and aggregation of telemetry windows with pyarrow and pandas on one core.

``check_rows`` splits a table of windows into usable rows and problems (the same row rules
as the Spark job: negative latencies from clock skew, inconsistent values); ``aggregate``
merges the usable windows per (path, evaluation window) into ``PathStats`` exactly as the
Spark job does (same sums, same percentile interpolation). ``routes report`` and the
benchmark's ``pandas`` baseline use it; the tests hold the Spark job to it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from appliance.ops.telemetry.config import LATENCY_BUCKETS
from appliance.ops.telemetry.costs import QUANTILES, PathStats
from appliance.ops.telemetry.store import Problem
from appliance.ops.telemetry.windows import PATH_COLUMNS, bucket_bounds

KEYS = [*PATH_COLUMNS, "eval_start_ns"]
NEGATIVE = "negative latencies (clock skew)"
INVALID = "invalid values"


def path_name(appliance: str, neighbour: str, channel: str) -> str:
    """How a path is named in reports: ``appliance<-neighbour/channel``."""
    return f"{appliance}<-{neighbour}/{channel}"


def check_rows(table: pa.Table) -> tuple[pa.Table, list[Problem]]:
    """(usable rows, problems per path and reason)."""
    if table.num_rows == 0:
        return table, []
    n_rows = table.num_rows
    lens_b = pc.list_value_length(table["lat_buckets"]).fill_null(-1).to_numpy()
    lens_c = pc.list_value_length(table["lat_counts"]).fill_null(-2).to_numpy()
    flat_b = pc.list_flatten(table["lat_buckets"]).to_numpy()
    flat_c = pc.list_flatten(table["lat_counts"]).to_numpy()
    row_b = np.repeat(np.arange(n_rows), np.maximum(lens_b, 0))
    row_c = np.repeat(np.arange(n_rows), np.maximum(lens_c, 0))
    invalid = (table["window_ns"].to_numpy() <= 0) | (lens_b != lens_c)
    for name in table.column_names:
        if table[name].null_count:
            invalid |= pc.is_null(table[name]).to_numpy(zero_copy_only=False)
    invalid |= table["lat_count"].to_numpy() < 0
    invalid |= np.bincount(row_b[(flat_b < 0) | (flat_b >= LATENCY_BUCKETS)],
                           minlength=n_rows) > 0
    invalid |= np.bincount(row_c[flat_c < 0], minlength=n_rows) > 0
    invalid |= np.bincount(row_c, weights=flat_c, minlength=n_rows) != \
        table["lat_count"].to_numpy()
    negative = (table["lat_negative"].to_numpy() > 0) & ~invalid
    problems = []
    for mask, reason in ((negative, NEGATIVE), (invalid, INVALID)):
        if mask.any():
            sub = table.filter(pa.array(mask)).select(list(PATH_COLUMNS)).to_pandas()
            for key, n in sub.groupby(list(PATH_COLUMNS)).size().items():
                problems.append(Problem(path_name(*key), reason, int(n)))
    return table.filter(pa.array(~(negative | invalid))), problems


def aggregate(table: pa.Table, eval_ns: int) -> list[PathStats]:
    """``PathStats`` per (path, evaluation window) of usable rows (see ``check_rows``)."""
    if table.num_rows == 0:
        return []
    cols = ["frames", "bytes", "lat_count", "expected", "lost", "naks", "retransmissions",
            "window_ns", "window_start_ns", "lat_min_ns", "jitter_ns"]
    df = table.select([*PATH_COLUMNS, *cols]).to_pandas()
    df["eval_start_ns"] = df["window_start_ns"] - df["window_start_ns"] % eval_ns
    df["jw"] = df["jitter_ns"] * df["lat_count"]
    df["floor"] = df["lat_min_ns"].where(df["lat_count"] > 0)
    df["end"] = df["window_start_ns"] + df["window_ns"]
    grouped = df.groupby(KEYS, sort=True)
    gid = grouped.ngroup().to_numpy()
    scal = grouped.agg(windows=("frames", "size"), samples=("lat_count", "sum"),
                       frames=("frames", "sum"), bytes=("bytes", "sum"),
                       expected=("expected", "sum"), lost=("lost", "sum"),
                       naks=("naks", "sum"), retransmissions=("retransmissions", "sum"),
                       span_ns=("window_ns", "sum"), jw=("jw", "sum"),
                       floor_ns=("floor", "min"), end_ns=("end", "max")).reset_index()
    pct = _percentiles(table, gid, len(scal))
    out = []
    for i, row in enumerate(scal.itertuples(index=False)):
        samples = int(row.samples)
        out.append(PathStats(
            appliance=row.appliance, neighbour=row.neighbour, channel=row.channel,
            eval_start_ns=int(row.eval_start_ns), windows=int(row.windows), samples=samples,
            p50_ns=pct["p50"][i], p99_ns=pct["p99"][i], p999_ns=pct["p999"][i],
            jitter_ns=float(row.jw) / samples if samples else 0.0,
            frames=int(row.frames), bytes=int(row.bytes), expected=int(row.expected),
            lost=int(row.lost), naks=int(row.naks), retransmissions=int(row.retransmissions),
            span_ns=int(row.span_ns),
            floor_ns=None if pd.isna(row.floor_ns) else int(row.floor_ns),
            end_ns=int(row.end_ns)))
    return out


def _percentiles(table: pa.Table, gid: np.ndarray, groups: int) -> dict[str, list]:
    lens = pc.list_value_length(table["lat_buckets"]).to_numpy()
    g = np.repeat(gid, lens)
    b = pc.list_flatten(table["lat_buckets"]).to_numpy().astype(np.int64)
    n = pc.list_flatten(table["lat_counts"]).to_numpy()
    # merge: one (group, bucket) key, summed; sorted by group then bucket
    key = g * LATENCY_BUCKETS + b
    uniq, inverse = np.unique(key, return_inverse=True)
    merged = np.bincount(inverse, weights=n).astype(np.int64)
    ug = uniq // LATENCY_BUCKETS
    ub = uniq % LATENCY_BUCKETS
    total = np.bincount(ug, weights=merged, minlength=groups).astype(np.int64)
    cum = np.cumsum(merged)
    starts = np.searchsorted(ug, np.arange(groups), side="left")
    before = np.concatenate([[0], cum])[starts]  # cumulative count before each group
    cum_in = cum - before[ug]
    lo, hi = bucket_bounds(ub)
    out: dict[str, list] = {}
    for name, q in QUANTILES.items():
        target = q * total
        hit = cum_in >= target[ug]
        # the first hit of each group: hits are sorted by (group, bucket)
        idx = np.flatnonzero(hit)
        first = np.full(groups, -1)
        if len(idx):
            grp = ug[idx]
            keep = np.concatenate([[True], grp[1:] != grp[:-1]])
            first[grp[keep]] = idx[keep]
        values = []
        for gi in range(groups):
            j = first[gi]
            if j < 0 or total[gi] == 0:
                values.append(None)
                continue
            below = float(cum_in[j] - merged[j])
            values.append(float(lo[j]) + (target[gi] - below) / float(merged[j])
                          * float(hi[j] - lo[j]))
        out[name] = values
    return out
