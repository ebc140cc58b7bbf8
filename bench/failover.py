"""``topicwire bench failover``: how long a client session takes to move to its standby
when its appliance is killed, and what its guaranteed subscriber loses (the goal: nothing).

One standby appliance (in this process: P&M and ``[cache]`` keeping ``bench/#``) and, per
kill, a primary (a ``topicwire run`` process, the standby's neighbour on loopback). A
guaranteed publisher at the standby sends numbered messages at ``--rate`` per second; a
subscriber connected to the primary with ``standby=`` takes them. Once it has taken
``WARM_MESSAGES`` of a round, the primary gets SIGKILL; the round ends when the subscriber has
taken every message of the round, once and in order, or ``ROUND_TIMEOUT_S`` passed (what is
missing then is counted lost). Per kill:

- ``detect_ms``: SIGKILL to the client's ``lost`` state (the session timeout's work);
- ``failover_ms``: SIGKILL to ``reconnected`` at the standby (detection, the login there,
  the subscriptions made again and the gap filled from the standby's cache);
- lost, duplicated and out-of-order messages;
- ``extra_moves``: moves besides the one the kill caused (a stall of the host longer than
  the session timeout moves a session too: it cannot tell a slow appliance from a dead one).

The baseline ``session_timeout`` is the detection floor itself (``--session-timeout``): the
ratios say what the move adds to the silence that has to pass before anyone can tell a
killed appliance from a slow one. Figures are medians and the 99th percentile over the
kills. Goal (issue 21): failover p50 under 300 ms, 0 lost.
"""

from __future__ import annotations

import argparse
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.report import build_report, positive_int, progress
from datapath.errors import DeviceError, UserError

NAME = "failover"
HELP = ("a client session's move to its standby when its appliance is SIGKILLed: failover "
        "time p50/p99 and messages lost (vs the session timeout)")
LOOPBACK = "127.0.0.1"
WARM_MESSAGES = 300
"""Messages a round's subscriber takes from the primary before it is killed."""
ROUND_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 120.0
_COMPONENT = "bench"
_CLI = "import sys; from appliance.ops.cli import main; sys.exit(main(sys.argv[1:]))"
IDENTITIES = {"feed": {"publish": ["bench/#"], "subscribe": []},
              "reader": {"subscribe": ["bench/#"]}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kills", type=positive_int, default=20,
                        help="primaries killed, one per round (default 20)")
    parser.add_argument("--rate", type=positive_int, default=2_000,
                        help="guaranteed messages per second from the publisher (default 2000)")
    parser.add_argument("--session-timeout", type=float, default=0.2, metavar="S",
                        help="the subscriber's session timeout (default 0.2)")
    parser.add_argument("--messages", type=positive_int, default=3_000,
                        help="messages per round (default 3000)")
    parser.add_argument("--subscriptions", type=int, default=0, metavar="N",
                        help="best-effort subscriptions the subscriber holds beside its "
                        "guaranteed one (default 0; made again, or found made, at each move)")
    parser.add_argument("--mirror", action="store_true",
                        help="the primaries mirror their sessions to the standby "
                        "(clients.mirror_to; docs/fault-tolerance.md, \"The standby's mirror\")")


def _port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class _Primary:
    """A ``topicwire run`` appliance, the standby's neighbour, with a client endpoint."""

    def __init__(self, workdir: Path, name: str, fabric: int, standby: str,
                 standby_fabric: int, key: str, mirror: bool = False) -> None:
        self.name = name
        self.clients = _port()
        config = workdir / f"{name}.toml"
        config.write_text("\n".join([
            "[appliance]", f'name = "{name}"', "heartbeat_interval_ms = 50",
            "lsa_refresh_ms = 500", "neighbour_dead_ms = 1000",
            "[fabric]", f'listen = "{LOOPBACK}:{fabric}"', f'key = "{key}"',
            "[[neighbours]]", f'name = "{standby}"', f'address = "{LOOPBACK}:{standby_fabric}"',
            "[clients]", f'udp = "{LOOPBACK}:{self.clients}"',
            *([f'mirror_to = "{standby}"'] if mirror else []),
            "[pm]", 'mode = "remote"', "[log]", 'level = "warning"']) + "\n")
        self.proc = subprocess.Popen([sys.executable, "-c", _CLI, "run", "--config",
                                      str(config)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if " ready" in line:
                return
            if not line and self.proc.poll() is not None:
                break
        self.proc.kill()
        raise DeviceError(f"the primary {name} did not start: "
                          f"{self.proc.stderr.read()[-2000:] if self.proc.stderr else ''}",
                          component=_COMPONENT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


class _Publisher(threading.Thread):
    """Guaranteed messages ``bench/x``: round number and index, paced at ``rate``."""

    def __init__(self, url: str, rate: int) -> None:
        super().__init__(daemon=True, name="bench-failover-publisher")
        self.url, self.rate = url, rate
        self.round = -1
        self.count = 0
        self.go = threading.Event()
        self.idle = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def start_round(self, number: int, count: int) -> None:
        self.idle.clear()
        self.round, self.count = number, count
        self.go.set()

    def run(self) -> None:
        from appliance.client import connect

        try:
            with connect(self.url, "feed") as client:
                while not self.stop.is_set():
                    if not self.go.wait(0.1):
                        continue
                    self.go.clear()
                    start = time.monotonic()
                    for i in range(self.count):
                        client.publish("bench/x", b"%d:%d" % (self.round, i), qos="guaranteed")
                        if i % 10 == 9:
                            client.flush()
                            ahead = start + (i + 1) / self.rate - time.monotonic()
                            if ahead > 0:
                                time.sleep(ahead)
                    client.flush(timeout=ROUND_TIMEOUT_S)
                    self.idle.set()
        except BaseException as exc:  # reported by the round that waits for it
            self.error = exc
            self.idle.set()


def _round(number: int, primary: _Primary, standby: Any, standby_url: str,
           publisher: _Publisher, messages: int, session_timeout: float,
           subscriptions: int = 0, mirror: bool = False) -> dict[str, float]:
    from appliance.client import connect

    states: dict[str, int] = {}
    killed = threading.Event()
    ready = threading.Event()

    def on_state(change: Any) -> None:
        if not killed.is_set():
            return  # a move before the kill (a stall of the host): counted in extra_moves
        states.setdefault(change.state, time.monotonic_ns())
        if change.state in ("reconnected", "closed"):
            ready.set()

    client = connect(f"udp://{LOOPBACK}:{primary.clients}", "reader",
                     standby=standby_url, session_timeout_s=session_timeout,
                     on_state=on_state)
    try:
        sub = client.subscribe("bench/#", qos="guaranteed")
        for i in range(subscriptions):
            client.subscribe(f"bench/other/{i}")
        _wait(lambda: any(s["pattern"] == "bench/#" and s["origin"] == primary.name
                          for s in standby.status()["subscriptions"]),
              f"the subscription at {primary.name} reaching the standby")
        if mirror:  # (the earlier rounds' records went with their moves)
            _wait(lambda: standby.status()["counters"].get(
                "control_mirror_records_subscriptions", 0) >= subscriptions + 1,
                f"the session at {primary.name} mirrored to the standby")
        publisher.start_round(number, messages)
        got: list[int] = []
        killed_ns = 0
        deadline = time.monotonic() + ROUND_TIMEOUT_S
        while len(got) < messages and time.monotonic() < deadline:
            msg = sub.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            if msg is None:
                continue
            rnd, _, index = msg.payload.partition(b":")
            if int(rnd) == number:
                got.append(int(index))
            if len(got) == WARM_MESSAGES and not killed_ns:
                killed_ns = time.monotonic_ns()
                killed.set()
                primary.kill()
        ready.wait(max(0.0, deadline - time.monotonic()))
        publisher.idle.wait(ROUND_TIMEOUT_S)
        if publisher.error is not None:
            raise DeviceError(f"the publisher failed: {publisher.error}", component=_COMPONENT)
        moved = "reconnected" in states and client.moves >= 1
        return {
            "detect_ms": (states.get("lost", killed_ns) - killed_ns) / 1e6,
            "failover_ms": (states.get("reconnected", killed_ns) - killed_ns) / 1e6,
            "moved": float(moved),
            "extra_moves": float(max(0, client.moves - 1)),
            "lost": float(messages - len(set(got))),
            "duplicates": float(len(got) - len(set(got))),
            "out_of_order": float(sum(1 for a, b in zip(got, got[1:]) if b < a)),
            "filled": float(client.filled),
            "restored": float(client.restored_subscriptions),
        }
    finally:
        client.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not 0.2 <= args.session_timeout <= 10:
        raise UserError("--session-timeout must be in [0.2, 10] seconds", component=_COMPONENT)
    if not 0 <= args.subscriptions <= 1_000:
        raise UserError("--subscriptions must be in [0, 1000]", component=_COMPONENT)
    if args.messages <= WARM_MESSAGES:
        raise UserError(f"--messages must be more than {WARM_MESSAGES}", component=_COMPONENT)
    from appliance.cache.node import CachingAppliance
    from appliance.config import parse_config

    key = secrets.token_hex(32)
    standby_fabric, standby_clients = _port(), _port()
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="tw-bench-failover-") as tmp:
        workdir = Path(tmp)
        standby = CachingAppliance(parse_config({
            "appliance": {"name": "standby", "heartbeat_interval_ms": 50,
                          "lsa_refresh_ms": 500, "neighbour_dead_ms": 1000},
            "fabric": {"listen": f"{LOOPBACK}:{standby_fabric}", "key": key},
            "neighbours": [{"name": f"primary{i}", "address": f"{LOOPBACK}:{_port()}"}
                           for i in range(args.kills)],
            "clients": {"udp": f"{LOOPBACK}:{standby_clients}"},
            "cache": {"dir": str(workdir / "cache"), "patterns": ["bench/#"]},
            "pm": {"require_passwords": False, "identities": IDENTITIES}})).start()
        standby_url = f"udp://{LOOPBACK}:{standby_clients}"
        publisher = _Publisher(standby_url, args.rate)
        try:
            if not standby.cache.ready.wait(READY_TIMEOUT_S):
                raise DeviceError("the standby's cache did not start", component=_COMPONENT)
            publisher.start()
            for i in range(args.kills):
                progress(NAME, f"kill {i + 1}/{args.kills}")
                neighbour = standby.config.neighbours[i]
                primary = _Primary(workdir, neighbour.name, neighbour.address[1], "standby",
                                   standby_fabric, key, args.mirror)
                try:
                    _wait_up(standby, neighbour.name)
                    rounds.append(_round(i, primary, standby, standby_url, publisher,
                                         args.messages, args.session_timeout,
                                         args.subscriptions, args.mirror))
                finally:
                    primary.kill()
                if i + 1 < args.kills:
                    _repair(workdir, neighbour, standby, standby_fabric, key)
        finally:
            publisher.stop.set()
            publisher.join(ROUND_TIMEOUT_S)
            standby.stop()
    failover = [r["failover_ms"] for r in rounds]
    detect = [r["detect_ms"] for r in rounds]
    timeout_ms = args.session_timeout * 1e3
    results = {
        "topicwire": {"failover_p50_ms": statistics.median(failover),
                      "failover_p99_ms": _percentile(failover, 0.99),
                      "detect_p50_ms": statistics.median(detect),
                      "lost": sum(r["lost"] for r in rounds),
                      "duplicates": sum(r["duplicates"] for r in rounds),
                      "out_of_order": sum(r["out_of_order"] for r in rounds),
                      "moved": sum(r["moved"] for r in rounds),
                      "restored_subscriptions": sum(r["restored"] for r in rounds),
                      "extra_moves": sum(r["extra_moves"] for r in rounds)},
        "session_timeout": {"failover_p50_ms": timeout_ms, "failover_p99_ms": timeout_ms,
                            "detect_p50_ms": timeout_ms},
    }
    params = {"kills": args.kills, "rate": args.rate, "messages": args.messages,
              "subscriptions": args.subscriptions, "mirror": args.mirror,
              "session_timeout_s": args.session_timeout, "warm_messages": WARM_MESSAGES,
              "rounds": rounds,
              "goal": "failover_p50_ms < 300, lost 0 (issue 21)"}
    return build_report(NAME, params, results)


def _repair(workdir: Path, neighbour: Any, standby: Any, standby_fabric: int,
            key: str) -> None:
    """Bring the killed primary back once, as an operator would, and stop it: its new
    incarnation's interest (none) replaces the guaranteed interest the standby holds for it
    while it is unreachable (docs/fault-tolerance.md, "Failures"). Left dead, every killed
    primary keeps a reliable sender at the standby, and each round is slower than the last."""
    name = neighbour.name
    again = _Primary(workdir, name, neighbour.address[1], "standby", standby_fabric, key)
    try:
        _wait(lambda: not any(s["origin"] == name for s in standby.status()["subscriptions"]),
              f"{name}'s held interest replaced at the standby")
    finally:
        again.kill()


def _wait_up(standby: Any, name: str) -> None:
    _wait(lambda: any(n["name"] == name and n["state"] == "up"
                      for n in standby.status()["neighbours"]),
          f"{name} up as the standby's neighbour")


def _wait(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise DeviceError(f"no {what} within {READY_TIMEOUT_S:g} s", component=_COMPONENT)
        time.sleep(0.02)
