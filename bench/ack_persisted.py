"""``topicwire bench ack-persisted``: what ``[cache] acknowledge = "persisted"`` costs a
publisher of guaranteed messages (docs/fault-tolerance.md, "Acknowledged once persisted").

Both sides in one run, alternately per repeat, each with a fresh appliance (``CachingAppliance``,
its data path in a process of its own, as ``topicwire run`` starts it; UDP on 127.0.0.1) and
a fresh cache directory (``--dir``, default the temporary directory; its filesystem type is
in ``params``: on tmpfs an fsync costs nothing): ``topicwire`` acknowledges once the cache's
log has the message on disk (``acknowledge = "persisted"``), ``received`` on receipt (the
default). For each ``fsync`` policy one client publishes ``--messages`` guaranteed messages
of ``--payload-bytes`` on the cache's pattern, each sent at once (``flush=True``), paced at
``--rate`` messages/s; a message's latency is from its publish call to its ``Outcome``
resolving acknowledged. Figures: p50 and p99 of that latency (µs) and the messages
acknowledged per second of the run; medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.persist import _fs_type
from bench.report import build_report, positive_int, progress

NAME = "ack-persisted"
HELP = ("guaranteed publish-to-acknowledgement latency, [cache] acknowledge = persisted vs "
        "received")
POLICIES = ("batch", "interval")
MESSAGES = 5_000
RATE = 2_000
PAYLOAD_BYTES = 64
REPEATS = 3
INTERVAL_MS = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=positive_int, default=MESSAGES,
                        help=f"messages per measurement (default {MESSAGES})")
    parser.add_argument("--rate", type=positive_int, default=RATE,
                        help=f"messages per second published (default {RATE})")
    parser.add_argument("--payload-bytes", type=positive_int, default=PAYLOAD_BYTES,
                        help=f"payload size (default {PAYLOAD_BYTES})")
    parser.add_argument("--interval-ms", type=positive_int, default=INTERVAL_MS,
                        help=f"cache.fsync_interval_ms of the interval policy "
                        f"(default {INTERVAL_MS})")
    parser.add_argument("--repeats", type=positive_int, default=REPEATS,
                        help=f"repeats (default {REPEATS})")
    parser.add_argument("--dir", default=None,
                        help="directory for the cache (default: the temporary directory)")


def _measure(where: Path, acknowledge: str, policy: str,
             args: argparse.Namespace) -> dict[str, float]:
    from appliance.cache.node import CachingAppliance
    from appliance.client import connect
    from appliance.client.outcomes import ACKNOWLEDGED
    from appliance.config import parse_config
    from bench.guaranteed import _free_port

    port = _free_port()
    cache: dict[str, Any] = {"dir": str(where), "patterns": ["bench/#"], "fsync": policy,
                             "acknowledge": acknowledge}
    if policy == "interval":
        cache["fsync_interval_ms"] = args.interval_ms
    cfg = parse_config({
        "appliance": {"name": f"ackbench{port}"},
        "clients": {"udp": f"127.0.0.1:{port}"},
        "pm": {"require_passwords": False,
               "identities": {"bench": {"publish": ["bench/#"], "subscribe": []}}},
        "cache": cache})
    app = CachingAppliance(cfg).start()
    try:
        if not app.cache.ready.wait(60):
            raise RuntimeError("bench ack-persisted: the cache's session did not subscribe")
        n = args.messages
        sent = np.zeros(n, np.int64)
        acked = np.zeros(n, np.int64)
        done = threading.Event()
        count = [0]

        def on_outcome(outcome: Any, i: int) -> None:
            if outcome.state == ACKNOWLEDGED:
                acked[i] = time.perf_counter_ns()
            count[0] += 1
            if count[0] == n:
                done.set()

        payload = bytes(args.payload_bytes)
        with connect(f"udp://127.0.0.1:{port}", "bench") as client:
            client.publish("bench/x", payload, qos="guaranteed")  # registers the topic
            client.flush(timeout=30)
            gap_ns = 1_000_000_000 // args.rate
            start = time.perf_counter_ns()
            for i in range(n):
                due = start + i * gap_ns
                while time.perf_counter_ns() < due:
                    pass
                sent[i] = time.perf_counter_ns()
                client.publish("bench/x", payload, qos="guaranteed", flush=True,
                               on_outcome=lambda o, i=i: on_outcome(o, i))
            if not done.wait(60):
                raise RuntimeError(f"bench ack-persisted: {n - count[0]} outcomes pending")
            client.flush(timeout=30)
        ok = acked > 0
        if not ok.all():
            raise RuntimeError(f"bench ack-persisted: {int((~ok).sum())} messages failed")
        lat_us = (acked - sent) / 1e3
        elapsed_s = (acked.max() - sent[0]) / 1e9
        return {"p50_us": float(np.percentile(lat_us, 50)),
                "p99_us": float(np.percentile(lat_us, 99)),
                "acked_per_s": n / elapsed_s}
    finally:
        app.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="tw-bench-ack-", dir=args.dir))
    figures: dict[str, dict[str, list[float]]] = {"topicwire": {}, "received": {}}
    try:
        for repeat in range(args.repeats):
            for policy in POLICIES:
                order = ("topicwire", "received") if repeat % 2 == 0 else (
                    "received", "topicwire")
                for name in order:
                    progress(NAME, f"repeat {repeat + 1}/{args.repeats}: {policy}, {name}")
                    where = root / f"{name}-{policy}-{repeat}"
                    mode = "persisted" if name == "topicwire" else "received"
                    for metric, value in _measure(where, mode, policy, args).items():
                        figures[name].setdefault(f"{metric}_{policy}", []).append(value)
                    shutil.rmtree(where, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = {name: {metric: statistics.median(values) for metric, values in metrics.items()}
               for name, metrics in figures.items()}
    params = {"messages": args.messages, "rate": args.rate,
              "payload_bytes": args.payload_bytes, "interval_ms": args.interval_ms,
              "repeats": args.repeats, "policies": list(POLICIES), "dir": str(root.parent),
              "fs": _fs_type(root.parent), "transport": "udp 127.0.0.1",
              "dataplane": "process"}
    return build_report(NAME, params, results)
