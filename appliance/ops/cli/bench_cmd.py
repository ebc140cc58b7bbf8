"""``topicwire bench NAME ...``: run one benchmark from ``bench/`` and print its JSON report.

Each benchmark module in ``BENCHMARKS`` exposes ``NAME``, ``HELP``, ``add_arguments(parser)``
and ``run(args) -> dict`` (a report built with ``bench.report.build_report``); one that needs
modules of the ``bench`` extra lists them in ``EXTRA_MODULES`` (checked before it runs).
"""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHMARKS = (
    "bench.topics",
    "bench.channel",
    "bench.selectors",
    "bench.selectors_fabric",
    "bench.content_routing",
    "bench.fabric_bench",
    "bench.client",
    "bench.routes",
    "bench.softnic",
    "bench.idle",
    "bench.guaranteed",
    "bench.frame_mac",
    "bench.persist",
    "bench.ack_persisted",
    "bench.mqtt",
    "bench.mqtt_shared",
    "bench.mqtt_codec",
    "bench.failover",
    "bench.scale",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench`` and one sub-command per benchmark module."""
    parser = subparsers.add_parser("bench", help="run a benchmark and print JSON")
    benches = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name in BENCHMARKS:
        module = importlib.import_module(name)
        bench_parser = benches.add_parser(module.NAME, help=module.HELP)
        module.add_arguments(bench_parser)
        bench_parser.add_argument(
            "--json", action="store_true", help="print JSON (the only format)"
        )
        bench_parser.set_defaults(handler=_runner(module))


def _runner(module: object):  # noqa: ANN202 - returns a handler closure
    def handler(args: argparse.Namespace) -> int:
        from appliance.ops.cli.extras import require
        from bench.report import dumps

        modules = getattr(module, "EXTRA_MODULES", ())
        if modules:
            require("bench", f"bench {module.NAME}", tuple(modules))  # type: ignore[attr-defined]

        report = module.run(args)  # type: ignore[attr-defined]
        sys.stdout.write(dumps(report) + "\n")
        return 0

    return handler
