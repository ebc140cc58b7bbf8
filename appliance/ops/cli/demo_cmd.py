"""``topicwire demo``: an embedded fabric on this host, live (see appliance/ops/demo.py)."""

from __future__ import annotations

import argparse
import json

DEMO_LOG_WIDTH = 160
"""Columns of the tables when the output is not a terminal."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``demo``."""
    from appliance.ops.demo import DEMO_RATE_PER_PUBLISHER, DEMO_SECONDS

    parser = subparsers.add_parser(
        "demo", help="run P&M, two cores and an edge on this host with publishers and "
        "subscribers; live per-path rates and latency; a summary")
    parser.add_argument("--seconds", type=_positive, default=DEMO_SECONDS,
                        help=f"how long to publish (default {DEMO_SECONDS})")
    parser.add_argument("--rate", type=_positive, default=DEMO_RATE_PER_PUBLISHER,
                        help="messages per second per publisher (default "
                        f"{DEMO_RATE_PER_PUBLISHER})")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (configs and process logs)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as one JSON object as the last line")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from appliance.ops.demo import run_demo

    console = Console()
    if not console.is_terminal:  # a log or a pipe: wide enough that table rows stay whole
        console = Console(width=DEMO_LOG_WIDTH)
    result = run_demo(args.seconds, args.rate, console, keep=args.keep)
    summary = result.summary()
    if result.interrupted:
        console.print("demo: interrupted; every process it started has stopped")
        return 130
    console.print(
        f"sent {summary['sent']:,} messages in {summary['seconds']:.1f} s; subscribers should "
        f"get {summary['expected']:,}, got {summary['delivered']:,}; lost {summary['lost']:,}, "
        f"duplicates {summary['duplicates']:,}, loss events {summary['loss_events']:,}; "
        f"latency p50 {summary['latency_p50_us']:,.1f} µs, p99 "
        f"{summary['latency_p99_us']:,.1f} µs (publish to callback, across processes)")
    console.print("demo: OK" if result.ok else "demo: MISMATCH (see the tables above)")
    if args.json:
        print(json.dumps(summary), flush=True)
    return 0 if result.ok else 1
