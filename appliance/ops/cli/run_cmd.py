"""``topicwire run --config FILE``: run one appliance until a signal ends it.

The config is read and checked first (docs/appliance.md lists the keys); any refusal prints
one message naming the key and exits 2 with nothing started. Once every channel is open and
both agents run, one line ``topicwire: appliance NAME (id N) ready`` goes to standard output.

Signals (docs/appliance.md, "Signals and reload"): SIGTERM, SIGINT and SIGQUIT end the
process the same clean way (logins refused, clients and neighbours logged out, queued frames
drained within ``appliance.drain_timeout_ms``, channels closed and the shared-memory ring
removed), exit code 0. SIGHUP reloads the config file (``reload``): a config that does not
pass the checks is refused with one log line and the running one stays in force; otherwise
what can change at run time is applied and every other changed key is logged as needing a
restart. SIGPIPE is ignored (a closed socket is an error of one send, not the process's end).

The management API's ``POST /shutdown`` (the ``shutdown`` command) ends it the same clean way;
its exit code is ``--shutdown-exit-code`` (default 0), so that an init system can tell a
requested shutdown from a stop it made itself (the appliance image's unit powers the guest
off on it: docs/images.md, "Shutdown").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

    from appliance.node import Appliance

WATCH_INTERVAL_S = 0.2
"""How often the main thread checks the agents while waiting for a signal."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``run``."""
    parser = subparsers.add_parser("run", help="run an appliance (core or edge) from a TOML "
                                   "config")
    parser.add_argument("--config", required=True, type=Path, metavar="FILE",
                        help="the appliance's TOML config (docs/appliance.md)")
    parser.add_argument("--shutdown-exit-code", type=_exit_code, default=0, metavar="N",
                        help="exit code after the management API's shutdown command drained "
                        "and stopped the appliance (default 0, as after SIGTERM; 3-125: one "
                        "an init system can tell from a stop of its own)")
    parser.set_defaults(handler=run)


def _exit_code(text: str) -> int:
    """``--shutdown-exit-code``: 0, or 3-125 (1 and 2 mean a failure and a refused config,
    126 and up are the shell's)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value != 0 and not 3 <= value <= 125:
        raise argparse.ArgumentTypeError(f"run: --shutdown-exit-code {text!r}: give 0 or a "
                                         "number from 3 to 125 (1 is a failure, 2 a refused "
                                         "config)")
    return value


STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGQUIT")
"""Signals that drain and stop the appliance (exit code 0)."""


def run(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from appliance.config import load_config

    config = load_config(args.config)
    configured = not logging.getLogger().handlers
    if configured:  # [log]: text or JSON lines on standard error
        from appliance.ops.mgmt.logs import configure

        configure(config.log, config.name)
    log = logging.getLogger("topicwire.appliance")
    wake = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)  # handled by the main loop below, not in the handler
        wake.set()

    sys.setswitchinterval(config.switch_interval_us / 1e6)  # a process of its own
    if config.role == "edge":  # an edge runs its protocol servers too (docs/mqtt.md)
        from appliance.edge.node import EdgeAppliance

        appliance = EdgeAppliance(config)
    else:  # runs [cache] when configured (docs/fault-tolerance.md)
        from appliance.cache.node import CachingAppliance

        appliance = CachingAppliance(config)
    # handlers first: a signal during the start waits for it, then is handled as below
    handled = [getattr(signal, name) for name in (*STOP_SIGNALS, "SIGHUP")]
    previous = {sig: signal.signal(sig, on_signal) for sig in handled}
    previous[signal.SIGPIPE] = signal.signal(signal.SIGPIPE, signal.SIG_IGN)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    try:
        appliance.start()  # opens everything or raises, leaving nothing open
    except BaseException:
        restore()
        raise
    why, api_last = "stop", False
    try:
        print(f"topicwire: appliance {config.name} (id {config.node_id}) ready", flush=True)
        while True:
            wake.wait(WATCH_INTERVAL_S)
            wake.clear()
            failure = appliance.failure()
            if failure is not None:
                print(f"topicwire: appliance {config.name} failed: {failure!r}",
                      file=sys.stderr)
                why = "failure"
                return 1
            reason = appliance.shutdown_requested()
            if reason is not None:
                why, api_last = f"shutdown through the management API: {reason}", True
                log.info("%s: %s: shutting down", config.name, why)
                return args.shutdown_exit_code
            stop_signal = None
            while received:
                signum = received.pop(0)
                if signum == signal.SIGHUP:
                    reload(appliance, args.config, configured, log)
                else:
                    stop_signal = signal.Signals(signum).name
                    break
            if stop_signal is not None:
                why = stop_signal
                log.info("%s: %s received: shutting down", config.name, stop_signal)
                return 0
    finally:
        appliance.stop(why, api_last=api_last)
        restore()


def reload(appliance: Appliance, path: Path, configured: bool, log: logging.Logger) -> None:
    """SIGHUP: read ``path`` again with the checks made at start; refuse it (one log line,
    the running config stays in force) or apply it (``Appliance.reload``, then the logging
    when this process configured it) and log one line saying what was reloaded."""
    import logging

    from appliance.config import load_config
    from appliance.errors import ConfigError

    name = appliance.config.name
    try:
        outcome = appliance.reload(load_config(path))
    except ConfigError as exc:
        log.error("topicwire: %s (reload refused; the running config stays in force)", exc)
        return
    except Exception as exc:  # a bug must not end a running appliance
        log.error("%s: reload of %s failed; the running config stays in force", name, path,
                  exc_info=exc)
        return
    log.info("%s: reload of %s: %s", name, path, outcome.summary())
    if any(key.startswith("log.") for key in outcome.applied):
        if configured:
            from appliance.ops.mgmt.logs import configure

            configure(outcome.config.log, name)
        else:  # someone else's handlers: the level only
            logging.getLogger().setLevel(str(outcome.config.log.get("level", "info")).upper())
