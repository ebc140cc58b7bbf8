"""``topicwire routes compute|report``: route selection from telemetry (docs/routing.md).

``routes compute --telemetry DIR --out routes.json [--master URL] [--window 60s]
[--margin F] [--k N] [--min-gain COST] [--weight NAME=VALUE]... [--clock shared|relative] [--follow
[--trigger 1s] [--for 30s]] [--json]`` runs the Spark job (appliance/ops/telemetry/routes_job.py)
and writes the route table; ``routes report --telemetry DIR --out report.png`` draws
latency percentiles and loss per path over time with the route changes marked.
"""

from __future__ import annotations

import argparse
import sys

from appliance.ops.cli.extras import require
from appliance.ops.telemetry.job_args import add_compute_arguments, duration_ns


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
    report.add_argument("--min-gain", type=float, default=None, metavar="COST")
    report.set_defaults(handler=run_report)


def run_compute(args: argparse.Namespace) -> int:
    require("routes", "routes compute", ("pyspark",))
    from appliance.ops.telemetry.routes_job import run_compute as run

    return run(args)


def run_report(args: argparse.Namespace) -> int:
    require("routes", "routes report", ("pandas", "matplotlib"))
    from appliance.ops.telemetry.report import render

    out = render(args.telemetry, args.out, step_ns=args.window, routes=args.routes,
                 margin=args.margin, k=args.k, min_gain=args.min_gain)
    print(f"routes report: {out}", file=sys.stderr)
    return 0
