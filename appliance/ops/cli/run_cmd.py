"""``topicwire run --config FILE``: run one appliance until SIGTERM/SIGINT.

The config is read and checked first (docs/appliance.md lists the keys); any refusal prints
one message naming the key and exits 2 with nothing started. Once every channel is open and
both agents run, one line ``topicwire: appliance NAME (id N) ready`` goes to standard output.
SIGTERM or SIGINT drains and stops the appliance, exit code 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

WATCH_INTERVAL_S = 0.2
"""How often the main thread checks the agents while waiting for a signal."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``run``."""
    parser = subparsers.add_parser("run", help="run an appliance (core or edge) from a TOML "
                                   "config")
    parser.add_argument("--config", required=True, type=Path, metavar="FILE",
                        help="the appliance's TOML config (docs/appliance.md)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from appliance.config import load_config
    from appliance.node import Appliance

    config = load_config(args.config)
    if not logging.getLogger().handlers:  # [log]: text or JSON lines on standard error
        from appliance.ops.mgmt.logs import configure

        configure(config.log, config.name)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    sys.setswitchinterval(config.switch_interval_us / 1e6)  # a process of its own
    appliance = Appliance(config)
    appliance.start()  # opens everything or raises, leaving nothing open
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        print(f"topicwire: appliance {config.name} (id {config.node_id}) ready", flush=True)
        while not stop.wait(WATCH_INTERVAL_S):
            failure = appliance.failure()
            if failure is not None:
                print(f"topicwire: appliance {config.name} failed: {failure!r}",
                      file=sys.stderr)
                return 1
    finally:
        appliance.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
