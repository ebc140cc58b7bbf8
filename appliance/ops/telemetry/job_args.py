"""The command line of the route job (``topicwire routes compute``, and the job's own when
spark-submit runs ``routes_job.py``): one definition for both, without importing the job."""

from __future__ import annotations

import argparse
import re

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
    from appliance.ops.telemetry.config import (
        EVAL_WINDOW_NS,
        FOLLOW_TRIGGER_S,
        HYSTERESIS_MARGIN,
        HYSTERESIS_MIN_GAIN,
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
    parser.add_argument("--min-gain", type=float, default=HYSTERESIS_MIN_GAIN, metavar="COST",
                        help="... and at least this much cheaper, in cost units (weighted "
                        f"microseconds; default {HYSTERESIS_MIN_GAIN:g})")
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
