"""Generated telemetry with known shapes, for tests, the benchmark and demonstrations.

``synthetic_windows`` builds rows of ``WINDOW_SCHEMA`` for links u -> v whose latency in each
window is given: every row holds ``spread`` adjacent latency buckets centred on the bucket of
that latency (counts around ``samples / spread``), so the median sits in that bucket.
Vectorized: a million rows take about a second.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from appliance.ops.telemetry.config import LATENCY_BUCKETS, WINDOW_NS
from appliance.ops.telemetry.windows import WINDOW_SCHEMA, bucket_bounds, bucket_index


def synthetic_windows(links: Sequence[tuple[str, str]], latency_us: np.ndarray, *,
                      start_ns: int, window_ns: int = WINDOW_NS,
                      loss: np.ndarray | None = None, samples: int = 200, spread: int = 8,
                      probes: int = 100, channel: str = "fabric",
                      seed: int = 0) -> pa.Table:
    """Rows for every (link, window): ``latency_us[i, w]`` is link i's latency in window w,
    ``loss[i, w]`` its probe loss fraction (default 0). A link (u, v) is reported by v
    (``appliance`` = v, ``neighbour`` = u)."""
    lat = np.asarray(latency_us, dtype=np.float64)
    n_links, n_windows = lat.shape
    if len(links) != n_links:
        raise ValueError("telemetry: one latency row per link")
    rows = n_links * n_windows
    rng = np.random.default_rng(seed)
    centre = bucket_index((lat.reshape(-1) * 1e3).astype(np.int64))
    centre = np.clip(centre, spread // 2, LATENCY_BUCKETS - spread + spread // 2)
    buckets = centre[:, None] + np.arange(spread)[None, :] - spread // 2
    counts = 1 + rng.poisson(max(samples / spread - 1, 0), (rows, spread))
    lat_count = counts.sum(axis=1)
    lo, _ = bucket_bounds(buckets[:, 0])
    _, hi = bucket_bounds(buckets[:, -1])
    loss_f = np.zeros(rows) if loss is None else np.asarray(loss, dtype=np.float64).reshape(-1)
    lost = np.rint(loss_f * probes).astype(np.int64)
    link_idx = np.repeat(np.arange(n_links), n_windows)
    win_idx = np.tile(np.arange(n_windows), n_links)
    names_v = np.array([v for _, v in links], dtype=object)[link_idx]
    names_u = np.array([u for u, _ in links], dtype=object)[link_idx]
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * spread)
    columns = {
        "appliance": pa.array(names_v, pa.string()),
        "neighbour": pa.array(names_u, pa.string()),
        "channel": pa.array(np.full(rows, channel, dtype=object), pa.string()),
        "window_start_ns": pa.array(start_ns + win_idx * window_ns, pa.int64()),
        "window_ns": pa.array(np.full(rows, window_ns), pa.int64()),
        "frames": pa.array(lat_count, pa.int64()),
        "messages": pa.array(lat_count * 4, pa.int64()),
        "bytes": pa.array(lat_count * 512, pa.int64()),
        "lat_count": pa.array(lat_count, pa.int64()),
        "lat_negative": pa.array(np.zeros(rows, np.int64)),
        "lat_overflow": pa.array(np.zeros(rows, np.int64)),
        "lat_min_ns": pa.array(lo, pa.int64()),
        "lat_max_ns": pa.array(hi - 1, pa.int64()),
        "lat_buckets": pa.ListArray.from_arrays(
            offsets, pa.array(buckets.reshape(-1).astype(np.int32))),
        "lat_counts": pa.ListArray.from_arrays(
            offsets, pa.array(counts.reshape(-1).astype(np.int64))),
        "jitter_ns": pa.array(lat.reshape(-1) * 1e3 * 0.05),
        "expected": pa.array(np.full(rows, probes), pa.int64()),
        "lost": pa.array(lost, pa.int64()),
        "naks": pa.array(lost, pa.int64()),
        "retransmissions": pa.array(lost * 2, pa.int64()),
    }
    return pa.table(columns, schema=WINDOW_SCHEMA)


def exact_window(appliance: str, neighbour: str, latencies_ns: np.ndarray, *,
                 window_start_ns: int, window_ns: int = WINDOW_NS, channel: str = "fabric",
                 expected: int = 0, lost: int = 0, jitter_ns: float = 0.0) -> pa.Table:
    """One row holding exactly these latency samples (>= 0), for known-answer tests."""
    from appliance.ops.telemetry.windows import sparse_buckets

    lat = np.asarray(latencies_ns, dtype=np.int64)
    b, c, overflow = sparse_buckets(lat)
    row = {
        "appliance": appliance, "neighbour": neighbour, "channel": channel,
        "window_start_ns": window_start_ns, "window_ns": window_ns,
        "frames": len(lat), "messages": len(lat), "bytes": 100 * len(lat),
        "lat_count": int(c.sum()), "lat_negative": 0, "lat_overflow": overflow,
        "lat_min_ns": int(lat.min()) if len(lat) else 0,
        "lat_max_ns": int(lat.max()) if len(lat) else 0,
        "lat_buckets": b.tolist(), "lat_counts": c.tolist(), "jitter_ns": jitter_ns,
        "expected": expected, "lost": lost, "naks": 0, "retransmissions": 0,
    }
    return pa.Table.from_pylist([row], schema=WINDOW_SCHEMA)
