"""``topicwire warm``: compile every kernel into numba's cache with real traffic (see
appliance/ops/warm.py); ``make setup`` runs it, and it is a no-op until a kernel source changes."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``warm``."""
    parser = subparsers.add_parser(
        "warm", help="compile the numba kernels with real traffic into the cache appliances "
        "and clients load at start (make setup runs it; a no-op when current)")
    parser.add_argument("--force", action="store_true",
                        help="run the traffic even though the cache is current")
    parser.add_argument("--check", action="store_true",
                        help="only say whether the cache is warm for these kernel sources "
                        "(exit 0) or not (exit 1)")
    parser.add_argument("--reproducible", action="store_true",
                        help="then compile the cache again in a fixed order, address space "
                        "randomisation off, so two warm-ups give the same bytes (the image "
                        "build uses it; a few minutes more)")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from datapath import jit

    if args.check:
        ok = jit.warmed()
        print(f"warm: {jit.cache_dir()} is {'warm' if ok else 'not warm'} for these kernel "
              "sources")
        return 0 if ok else 1
    import logging

    from appliance.ops.warm import run_warm

    # the appliances inside say the cache is cold: that is what this command mends
    logging.getLogger("topicwire.jit").setLevel(logging.ERROR)
    record = run_warm(force=args.force, reproducible=args.reproducible,
                      say=lambda text: print(text, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(record))
    elif record.get("skipped"):
        print(f"warm: {jit.cache_dir()} is already warm for these kernel sources")
    return 0
