"""``topicwire routes compute|report``: route selection from telemetry (docs/routing.md).

``routes compute --telemetry DIR --out routes.json [--master URL] [--window 60s]
[--margin F] [--k N] [--weight NAME=VALUE]... [--clock shared|relative] [--follow
[--trigger 1s] [--for 30s]] [--json]`` runs the Spark job (appliance/telemetry/routes_job.py)
and writes the route table; ``routes report --telemetry DIR --out report.png`` draws
latency percentiles and loss per path over time with the route changes marked.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from datapath.errors import UserError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h)?\s*$")
_UNIT_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
            "h": 3_600_000_000_000}


def duration_ns(text: str) -> int:
    """``"60s"``, ``"500ms"``, ``"2m"``, ``"1h"`` or plain seconds, in ns (> 0)."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 60s, 500ms, 2m)")
    value = int(float(m.group(1)) * _UNIT_NS[m.group(2) or "s"])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be > 0")
    return value


def add_compute_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``routes compute`` (also the Spark job's own command line)."""
    from appliance.telemetry.config import (
        EVAL_WINDOW_NS,
        FOLLOW_TRIGGER_S,
        HYSTERESIS_MARGIN,
        HYSTERESIS_WINDOWS,
        LATENESS_NS,
    )

    parser.add_argument("--telemetry", required=True, metavar="DIR",
                        help="telemetry store directory (the appliances' telemetry.dir)")
    parser.add_argument("--out", required=True, metavar="FILE", help="route table (JSON)")
    parser.add_argument("--master", default=None, metavar="URL",
                        help="Spark master (default: local[*]; under spark-submit its own)")
    parser.add_argument("--window", type=duration_ns, default=EVAL_WINDOW_NS,
                        metavar="DURATION",
                        help=f"evaluation window (default {EVAL_WINDOW_NS // 10**9}s)")
    parser.add_argument("--lateness", type=duration_ns, default=LATENESS_NS, metavar="DURATION",
                        help="an evaluation window is decided once the newest telemetry has "
                        f"passed its end by this much (default {LATENESS_NS // 10**9}s)")
    parser.add_argument("--margin", type=float, default=HYSTERESIS_MARGIN,
                        help="hysteresis: a new path must be this fraction cheaper "
                        f"(default {HYSTERESIS_MARGIN})")
    parser.add_argument("--k", type=int, default=HYSTERESIS_WINDOWS,
                        help="... in this many consecutive evaluation windows "
                        f"(default {HYSTERESIS_WINDOWS})")
    parser.add_argument("--weight", action="append", default=[], metavar="NAME=VALUE",
                        help="cost weight (p50_us, p99_us, p999_us, jitter_us, loss, "
                        "retransmit_rate, hop_us); repeatable")
    parser.add_argument("--clock", choices=("shared", "relative"), default="shared",
                        help="shared: latencies are absolute (same host or synchronised "
                        "clocks); relative: each path's floor is subtracted first")
    parser.add_argument("--follow", action="store_true",
                        help="Structured Streaming: rewrite --out whenever the table changes")
    parser.add_argument("--trigger", type=duration_ns, default=int(FOLLOW_TRIGGER_S * 1e9),
                        metavar="DURATION", help="--follow: micro-batch interval")
    parser.add_argument("--for", dest="for_ns", type=duration_ns, default=None,
                        metavar="DURATION", help="--follow: stop after this long")
    parser.add_argument("--json", action="store_true", help="print the route table as JSON")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``routes compute`` and ``routes report``."""
    parser = subparsers.add_parser("routes", help="route selection from path telemetry")
    commands = parser.add_subparsers(dest="routes_command", metavar="COMMAND", required=True)
    compute = commands.add_parser("compute", help="run the Spark job: telemetry -> route table")
    add_compute_arguments(compute)
    compute.set_defaults(handler=run_compute)
    report = commands.add_parser("report", help="draw latency and loss per path over time")
    report.add_argument("--telemetry", required=True, metavar="DIR")
    report.add_argument("--out", required=True, metavar="FILE", help="image (PNG)")
    report.add_argument("--window", type=duration_ns, default=None, metavar="DURATION",
                        help="points every DURATION (default: the telemetry windows, at "
                        "most 2,000 points per path)")
    report.add_argument("--routes", default=None, metavar="FILE",
                        help="a route table whose changes to mark (default: computed from "
                        "the same telemetry with the default hysteresis)")
    report.add_argument("--margin", type=float, default=None)
    report.add_argument("--k", type=int, default=None)
    report.set_defaults(handler=run_report)


def run_compute(args: argparse.Namespace) -> int:
    from appliance.telemetry import routes_job
    from appliance.telemetry.costs import parse_weights

    weights = parse_weights(args.weight)
    if not 0 <= args.margin < 1 or args.k < 1:
        raise UserError("--margin must be in [0, 1) and --k >= 1", component="routes")
    spark = routes_job.spark_session(args.master)
    try:
        if args.follow:
            def show(doc: dict) -> None:
                print(json.dumps(doc) if args.json else routes_job.summary(doc), flush=True)

            routes_job.follow(spark, args.telemetry, args.out, eval_ns=args.window,
                              weights=weights, margin=args.margin, k=args.k, clock=args.clock,
                              lateness_ns=args.lateness, trigger_s=args.trigger / 1e9,
                              duration_s=None if args.for_ns is None else args.for_ns / 1e9,
                              on_table=show)
            return 0
        doc = routes_job.compute(spark, args.telemetry, eval_ns=args.window, weights=weights,
                                 margin=args.margin, k=args.k, clock=args.clock,
                                 lateness_ns=args.lateness)
    finally:
        spark.stop()
    routes_job.write_table(doc, args.out)
    print(json.dumps(doc) if args.json else routes_job.summary(doc))
    return 0


def run_report(args: argparse.Namespace) -> int:
    from appliance.telemetry.report import render

    out = render(args.telemetry, args.out, step_ns=args.window, routes=args.routes,
                 margin=args.margin, k=args.k)
    print(f"routes report: {out}", file=sys.stderr)
    return 0
