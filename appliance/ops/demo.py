"""``make demo`` / ``topicwire demo``: an embedded fabric on this host, live.

Everything runs on this host and nothing leaves it (loopback, shared memory, multicast with
``IP_MULTICAST_IF`` = 127.0.0.1 and TTL 0):

```
   pm  (P&M, embedded in an appliance of its own)
   |  \\
 core1 ==== core2 ---- edge        ==== fabric group: UDP multicast on 127.0.0.1, TTL 0
   |          |          |          ---- UDP unicast
 worker     worker     worker      clients over shared memory (the appliance's bus)
```

- four ``topicwire run`` processes with configs generated in a temporary directory: ``pm``
  (P&M, role core, no clients), ``core1`` and ``core2`` (cores on one fabric group), ``edge``
  (role edge: until MQTT arrives in a later issue, it relays native clients like a core);
- three worker processes (``python -m appliance.ops.demo worker``), one per appliance with
  clients, holding that appliance's publishers and subscribers (client API over shared
  memory). Publishers send a few hundred topics (``topic_tree``) with a ``tick`` schema
  payload; subscribers use wildcard lists (with partial unsubscribes), selectors on schema
  fields, and best-effort or guaranteed QoS.

Phases: start the appliances, set up the clients, warm up (every topic registered and seen
through the fabric), then publish for ``--seconds`` at ``--rate`` per publisher while a live
table shows each (subscriber, origin) path's rate and latency percentiles; drain; summary.
Each publisher computes, for every message it sends, which subscribers must receive it
(``naive_decision`` of their requests, the topic algebra's reference, and their selector on
the payload): the summary's *expected*. *Lost* is expected minus delivered; a subscriber
counts each message once however many of its subscriptions match it (duplicates are
counted separately). Exit code 0 when every subscriber got exactly what it should, 1 when
not, 130 when interrupted (Ctrl-C stops every process the demo started, also then).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datapath.errors import UserError

# --- tunables --------------------------------------------------------------------------------
DEMO_SECONDS = 20
"""How long the measured phase lasts (``--seconds``)."""
DEMO_RATE_PER_PUBLISHER = 1_000
"""Messages per second each publisher sends in the measured phase (``--rate``)."""
DEMO_HEARTBEAT_MS = 100
"""Heartbeat of the demo's appliances."""
DEMO_IDLE = "sleep"
"""The appliances' and clients' idle strategy: seven Python processes share this host's
cores, so an idle thread sleeps (1 ms) instead of spinning first."""
DEMO_NEIGHBOUR_DEAD_MS = 2_000
"""A neighbour silent this long is down: generous, so that a busy host (seven Python
processes on a few cores) does not make links flap."""
START_TIMEOUT_S = 60.0
"""How long an appliance or worker may take to say it is ready."""
DEMO_REQUEST_TIMEOUT_S = 30.0
"""How long a demo client waits for an answer (a topic's registration): the fabric starts on
the user's machine, busy or slow as it may be, with its first snapshots still being made;
the demo measures delivery, not how fast a cold appliance answers."""
WARMUP_TIMEOUT_S = 60.0
"""How long the fabric may take to carry every publisher's sync messages to every worker."""
DRAIN_QUIET_S = 2.0
"""After publishing stops, the drain ends when nothing new arrived for this long..."""
DRAIN_MAX_S = 15.0
"""...or at the latest after this long."""
REPORT_INTERVAL_S = 0.5
"""Workers report their counts this often; the live table refreshes at this pace."""
PUBLISH_TICK_S = 0.005
"""Publishers send in bursts this far apart (rate / (1 / tick) messages each)."""
STOP_TIMEOUT_S = 15.0
"""How long a process may take to exit after SIGTERM before it is killed."""
LATENCY_HIGHEST_NS = 60_000_000_000

REGIONS = ("us", "eu", "apac")
EXCHANGES = {"us": ("nyse", "nasdaq"), "eu": ("lse", "xetra"), "apac": ("tse", "hkex")}
SYMBOLS = ("ibm", "aapl", "msft", "vod", "sap", "sony", "bmw", "hsbc", "tsla", "nvda", "intc",
           "orcl", "shel", "nesn", "asml", "baba")
FIELDS = ("trade", "quote", "status")

TICK_SCHEMA_ID = 7
TICK_FIELDS = [["price", 0, "u32"], ["size", 4, "u32"], ["symbol", 8, "ascii", 8],
               ["publisher", 16, "u32"], ["seq", 24, "u64"]]
"""The payload: price (cents), size, symbol, and the demo's own publisher index and sequence
number (0: a warm-up message, not counted)."""
_TICK = struct.Struct(">II8sIxxxxQ")
SYNC_PREFIX = "demo/sync/"
SUMMARY_COUNTERS = (
    "transit_frames", "group_data_frames", "guaranteed_offered", "guaranteed_received",
    "guaranteed_recovered", "guaranteed_retransmitted", "guaranteed_lost_messages",
    "guaranteed_held", "loss_notices_sent", "parked", "parked_expired", "off_path",
    "unroutable", "no_port", "publish_denied", "shm_backpressure_drops",
    "fabric_backpressure_drops", "group_backpressure_drops", "clients-udp_backpressure_drops",
    "shm_send_failed", "inbox_full", "outbox_full")
"""Appliance counters the summary reports (status ``counters``; docs/appliance.md)."""

APPLIANCES = ("pm", "core1", "core2", "edge")
LINKS = (("pm", "core1"), ("pm", "core2"), ("core1", "core2"), ("core2", "edge"))
GROUP_LINKS = (("core1", "core2"),)
"""Links whose ends are neighbours on the fabric group (UDP multicast)."""


@dataclass(frozen=True)
class PublisherSpec:
    name: str
    appliance: str
    regions: tuple[str, ...]
    qos: str


@dataclass(frozen=True)
class SubscriberSpec:
    name: str
    appliance: str
    requests: tuple[str, ...]
    """Seed 000 requests in order: '+pattern' subscribes, '-pattern' unsubscribes."""
    selector: str | None
    qos: str


PUBLISHERS = (
    PublisherSpec("feed-a", "core1", ("us", "eu"), "guaranteed"),
    PublisherSpec("feed-b", "core2", ("apac",), "best-effort"),
)
SUBSCRIBERS = (
    SubscriberSpec("us-desk", "edge", ("+us/#", "-us/+/+/status"), None, "best-effort"),
    SubscriberSpec("big-trades", "edge", ("+#/trade",), "size >= 500", "guaranteed"),
    SubscriberSpec("ibm-watch", "core2", ("+#/ibm/#",), None, "guaranteed"),
    SubscriberSpec("dear-quotes", "core2", ("+#/quote", "-apac/#"), "price > 50000",
                   "best-effort"),
    SubscriberSpec("nyse-local", "core1", ("+us/nyse/#", "-us/nyse/ibm/#",
                                           "+us/nyse/ibm/trade"), None, "best-effort"),
    SubscriberSpec("apac-all", "core1", ("+apac/#",), None, "guaranteed"),
)


def topic_tree(regions: tuple[str, ...] = REGIONS) -> list[str]:
    """The demo's topics: region/exchange/symbol/field."""
    return [f"{r}/{x}/{s}/{f}" for r in regions for x in EXCHANGES[r] for s in SYMBOLS
            for f in FIELDS]


def node_ids() -> dict[int, str]:
    from appliance.config import node_id_of

    return {node_id_of(name): name for name in APPLIANCES}


def path_of(source: str, destination: str) -> str:
    """The path the appliances compute (same link state, same tie-break), as text."""
    from appliance.config import node_id_of
    from appliance.control.routing import Lsa, all_paths, graph_of

    if source == destination:
        return f"{source} (local, shm)"
    ids = {name: node_id_of(name) for name in APPLIANCES}
    said: dict[int, list[tuple[int, int]]] = {}
    for a, b in LINKS:
        said.setdefault(ids[a], []).append((ids[b], 1))
        said.setdefault(ids[b], []).append((ids[a], 1))
    lsas = {n: Lsa(n, "", 1, 1, tuple(links)) for n, links in said.items()}
    _, path = all_paths(graph_of(lsas))[(ids[source], ids[destination])]
    names = {v: k for k, v in ids.items()}
    out = names[path[0]]
    for a, b in zip(path, path[1:]):
        link = (names[a], names[b])
        mcast = link in GROUP_LINKS or link[::-1] in GROUP_LINKS
        out += (" =mcast=> " if mcast else " -> ") + names[b]
    return out


# --- configs and processes -------------------------------------------------------------------

def _free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_tcp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loopback_multicast_ready() -> None:
    """The fabric group needs multicast on ``lo``: turn it on as root, else say how."""
    from appliance.dataplane.open import loopback_multicast

    if loopback_multicast():
        return
    if os.geteuid() == 0 and shutil.which("ip"):
        subprocess.run(["ip", "link", "set", "lo", "multicast", "on"], check=False)
        if loopback_multicast():
            return
    raise UserError("the loopback interface has multicast off and the cores' fabric group "
                    "needs it: run `ip link set lo multicast on` as root (or run the demo as "
                    "root)", component="demo")


def write_configs(workdir: Path, tag: str, mgmt: dict[str, int]) -> dict[str, Path]:
    """One TOML config per appliance (docs/appliance.md keys); returns name -> path.
    ``mgmt``: appliance -> TCP port of its management API on 127.0.0.1."""
    key = workdir / "fabric.key"
    key.write_text(secrets.token_hex(32) + "\n")
    ports = {name: _free_udp_port() for name in APPLIANCES}
    group = f"239.255.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 1}"
    group_port = _free_udp_port()
    paths = {}
    for name in APPLIANCES:
        lines = [
            "[appliance]", f'name = "{name}"', f'role = "{"edge" if name == "edge" else "core"}"',
            f"heartbeat_interval_ms = {DEMO_HEARTBEAT_MS}", "lsa_refresh_ms = 1000",
            f"neighbour_dead_ms = {DEMO_NEIGHBOUR_DEAD_MS}", f'idle = "{DEMO_IDLE}"',
            "[fabric]", f'listen = "127.0.0.1:{ports[name]}"', f'key_file = "{key}"',
        ]
        if any(name in link for link in GROUP_LINKS):
            lines += ["[[fabric.groups]]", 'name = "cores"', f'address = "{group}:{group_port}"',
                      'interface = "127.0.0.1"', "ttl = 0"]
        for a, b in LINKS:
            if name in (a, b):
                other = b if a == name else a
                lines += ["[[neighbours]]", f'name = "{other}"',
                          f'address = "127.0.0.1:{ports[other]}"']
                if (a, b) in GROUP_LINKS:
                    lines.append('group = "cores"')
        if name != "pm":
            lines += ["[clients]", f'shm = "{ring_name(tag, name)}"']
        if name == "pm":
            lines += ["[pm]", 'mode = "embedded"', "require_passwords = false",
                      "[pm.identities.feed]",
                      f'publish = ["us/#", "eu/#", "apac/#", "{SYNC_PREFIX}#"]',
                      "subscribe = []",
                      "[pm.identities.desk]", "publish = []", 'subscribe = ["#"]',
                      "[pm.schemas.tick]", f"id = {TICK_SCHEMA_ID}",
                      f"fields = {json.dumps(TICK_FIELDS)}"]
        else:
            lines += ["[pm]", 'mode = "remote"']
        lines += ["[mgmt]", f'listen = "127.0.0.1:{mgmt[name]}"', "[log]", 'level = "info"']
        path = workdir / f"{name}.toml"
        path.write_text("\n".join(lines) + "\n")
        paths[name] = path
    return paths


def ring_name(tag: str, appliance: str) -> str:
    return f"twdemo-{tag}-{appliance}"


class Child:
    """A process the demo started, in a session of its own (the demo stops it)."""

    def __init__(self, name: str, argv: list[str], log_path: Path, stdin: bool = False) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "w")  # closed in stop()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env=env, start_new_session=True)
        self._buffer = ""
        self.eof = False

    def lines(self, timeout_s: float) -> list[str]:
        """Complete lines that arrived within ``timeout_s`` (maybe none); after the process
        closed its output, none (``eof``); a process that failed raises."""
        out = self.proc.stdout
        assert out is not None
        if self.eof:
            self.check()
            time.sleep(timeout_s)
            return []
        ready, _, _ = select.select([out], [], [], timeout_s)
        if not ready:
            return []
        chunk = os.read(out.fileno(), 65_536).decode(errors="replace")
        if not chunk:
            self.eof = True
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            self.check()
            return []
        self._buffer += chunk
        *complete, self._buffer = self._buffer.split("\n")
        return [line for line in complete if line.strip()]

    def check(self) -> None:
        """Raise if the process exited with an error."""
        code = self.proc.poll()
        if code not in (None, 0):
            raise UserError(f"{self.name} exited with {code}: {self.tail()}", component="demo")

    def send(self, doc: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(doc) + "\n")
        self.proc.stdin.flush()

    def tail(self) -> str:
        try:
            return " | ".join(self.log_path.read_text().strip().splitlines()[-3:])
        except OSError:
            return ""

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _appliance_argv(config: Path) -> list[str]:
    return [sys.executable, "-c", "import sys; from appliance.ops.cli import main; "
            "sys.exit(main(sys.argv[1:]))", "run", "--config", str(config)]


# --- the model the live table and the summary read ---------------------------------------------

@dataclass
class PathStats:
    subscriber: str
    origin: str
    delivered: int = 0
    window: int = 0
    window_s: float = REPORT_INTERVAL_S
    p50_us: float = 0.0
    p99_us: float = 0.0


@dataclass
class DemoResult:
    seconds: float = 0.0
    sent: int = 0
    expected: Counter = field(default_factory=Counter)
    delivered: Counter = field(default_factory=Counter)
    duplicates: Counter = field(default_factory=Counter)
    order_errors: Counter = field(default_factory=Counter)
    loss_events: Counter = field(default_factory=Counter)
    lost_reported: Counter = field(default_factory=Counter)
    paths: dict[tuple[str, str], PathStats] = field(default_factory=dict)
    histogram: Any = None
    converge_s: float = 0.0
    interrupted: bool = False
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    """Appliance -> its nonzero SUMMARY_COUNTERS at the end."""

    @property
    def lost(self) -> int:
        return sum(max(self.expected[s] - self.delivered[s], 0) for s in self.expected)

    @property
    def ok(self) -> bool:
        return (not self.interrupted and self.sent > 0 and sum(self.expected.values()) > 0
                and all(self.delivered[s] == self.expected[s] for s in self.expected)
                and not sum(self.duplicates.values()) and not sum(self.order_errors.values()))

    def latency_us(self, percentile: float) -> float:
        if self.histogram is None or not self.histogram.get_total_count():
            return 0.0
        return round(self.histogram.get_value_at_percentile(percentile) / 1e3, 1)

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 2), "sent": self.sent,
            "expected": sum(self.expected.values()), "delivered": sum(self.delivered.values()),
            "lost": self.lost, "duplicates": sum(self.duplicates.values()),
            "order_errors": sum(self.order_errors.values()),
            "loss_events": sum(self.loss_events.values()),
            "latency_p50_us": self.latency_us(50), "latency_p99_us": self.latency_us(99),
            "converge_s": round(self.converge_s, 2), "ok": self.ok,
            "appliances": self.counters,
            "subscribers": {s.name: {"appliance": s.appliance, "qos": s.qos,
                                     "expected": self.expected[s.name],
                                     "delivered": self.delivered[s.name],
                                     "duplicates": self.duplicates[s.name],
                                     "loss_events": self.loss_events[s.name]}
                            for s in SUBSCRIBERS},
        }


def render(result: DemoResult, phase: str) -> Any:
    """The live view: one row per (subscriber, origin) path, one per subscriber."""
    from rich.console import Group
    from rich.table import Table

    done = phase == "done" and result.seconds > 0  # then the rate over the measured phase
    paths = Table(title=f"topicwire demo: {phase}", title_justify="left")
    for column in ("subscriber", "qos", "path", "avg msg/s" if done else "msg/s", "delivered",
                   "p50 µs", "p99 µs"):
        paths.add_column(column, no_wrap=column == "path",
                         justify="right" if column[0] in "mdp" and column != "path"
                         else "left")
    qos = {s.name: s.qos for s in SUBSCRIBERS}
    for (sub, origin), p in sorted(result.paths.items()):
        paths.add_row(sub, qos[sub], path_of(origin, _appliance_of(sub)),
                      f"{(p.delivered / result.seconds if done else p.window / p.window_s):,.0f}",
                      f"{p.delivered:,}", f"{p.p50_us:,.0f}",
                      f"{p.p99_us:,.0f}")
    subs = Table(show_header=True)
    for column in ("subscriber", "at", "requests", "selector", "expected", "delivered", "lost"):
        subs.add_column(column)
    for s in SUBSCRIBERS:
        expected = result.expected.get(s.name)
        subs.add_row(s.name, s.appliance, " ".join(s.requests), s.selector or "",
                     "" if expected is None else f"{expected:,}",
                     f"{result.delivered[s.name]:,}",
                     "" if expected is None else f"{max(expected - result.delivered[s.name], 0):,}")
    return Group(paths, subs)


def _appliance_of(subscriber: str) -> str:
    return next(s.appliance for s in SUBSCRIBERS if s.name == subscriber)


# --- the conductor ---------------------------------------------------------------------------

class Demo:
    """Starts, drives and stops everything; ``run()`` returns the result."""

    def __init__(self, seconds: float, rate: int, console: Any, live: bool = True,
                 keep: bool = False) -> None:
        self.seconds = seconds
        self.keep = keep
        self.rate = rate
        self.console = console
        self.live = live
        self.tag = f"{os.getpid()}"
        self.children: list[Child] = []
        self.workers: dict[str, Child] = {}
        self.result = DemoResult()
        self.workdir: Path | None = None

    # one place that stops everything, whatever happened
    def close(self) -> None:
        for group in (list(self.workers.values()), list(reversed(self.children))):
            for child in group:  # all of a kind at once, then wait for each
                child.terminate()
            for child in group:
                child.stop()
        for path in Path("/dev/shm").glob(f"topicwire-twdemo-{self.tag}-*"):
            path.unlink(missing_ok=True)
        if self.workdir is not None and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def run(self) -> DemoResult:
        _loopback_multicast_ready()
        self.workdir = Path(tempfile.mkdtemp(prefix="topicwire-demo-"))
        self.mgmt = {name: _free_tcp_port() for name in APPLIANCES}
        configs = write_configs(self.workdir, self.tag, self.mgmt)
        self.console.print(f"starting {', '.join(APPLIANCES)} (topicwire run, configs in "
                           f"{self.workdir}; management API: " + ", ".join(
                               f"{n} 127.0.0.1:{p}" for n, p in self.mgmt.items()) + ") ...")
        for name in APPLIANCES:
            self.children.append(Child(name, _appliance_argv(configs[name]),
                                       self.workdir / f"{name}.log"))
        for child in self.children:
            self._wait_for(child, lambda line: line.endswith(" ready"), "ready")
        self._start_workers()
        started = time.monotonic()
        self._broadcast({"cmd": "warmup"})
        pending = {(w, p.name) for w in self.workers for p in PUBLISHERS}
        deadline = time.monotonic() + WARMUP_TIMEOUT_S
        while pending:
            for name, event in self._events(0.2):
                self._apply(event)
                if event.get("event") == "synced":
                    pending.discard((name, event["publisher"]))
            if time.monotonic() > deadline:
                raise UserError(f"the fabric did not carry every publisher's sync messages to "
                                f"every worker within {WARMUP_TIMEOUT_S} s: {sorted(pending)}",
                                component="demo")
        self.result.converge_s = time.monotonic() - started
        self.console.print(f"fabric ready: every worker hears every publisher "
                           f"({self.result.converge_s:.1f} s); publishing for {self.seconds:g} s "
                           f"at {self.rate:,} msg/s per publisher ...")
        self._measure()
        return self.result

    def status(self, name: str) -> dict:
        """An appliance's status snapshot from its management API ({} if it does not
        answer)."""
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.mgmt[name]}/status",
                                        timeout=5) as answer:
                return json.loads(answer.read())
        except (OSError, ValueError):
            return {}

    def collect_counters(self) -> None:
        """The appliances' counters the summary shows (fabric figures)."""
        for name in APPLIANCES:
            counters = self.status(name).get("counters", {})
            self.result.counters[name] = {k: v for k, v in counters.items()
                                          if v and k in SUMMARY_COUNTERS}

    def _wait_for(self, child: Child, predicate: Any, what: str) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in child.lines(0.2):
                if predicate(line):
                    return line
            if child.proc.poll() is not None:
                raise UserError(f"{child.name} exited ({child.proc.returncode}) before it was "
                                f"{what}: {child.tail()}", component="demo")
        raise UserError(f"{child.name} not {what} within {START_TIMEOUT_S} s: {child.tail()}",
                        component="demo")

    def _start_workers(self) -> None:
        schema = {"name": "tick", "id": TICK_SCHEMA_ID, "fields": TICK_FIELDS}
        everyone = [s.__dict__ for s in SUBSCRIBERS]
        for appliance in ("core1", "core2", "edge"):
            assert self.workdir is not None
            child = Child(f"worker@{appliance}", [sys.executable, "-m", "appliance.ops.demo",
                                                  "worker"],
                          self.workdir / f"worker-{appliance}.log", stdin=True)
            self.workers[appliance] = child
            child.send({
                "ring": ring_name(self.tag, appliance), "appliance": appliance,
                "publishers": [dict(p.__dict__, index=i + 1) for i, p in enumerate(PUBLISHERS)
                               if p.appliance == appliance],
                "subscribers": [s.__dict__ for s in SUBSCRIBERS if s.appliance == appliance],
                "everyone": everyone, "schema": schema, "nodes": node_ids(),
                "publisher_names": [p.name for p in PUBLISHERS]})
        for child in self.workers.values():
            self._wait_for(child, lambda line: '"ready"' in line, "ready")

    def _broadcast(self, doc: dict) -> None:
        for child in self.workers.values():
            child.send(doc)

    def _events(self, timeout_s: float) -> list[tuple[str, dict]]:
        out = []
        deadline = time.monotonic() + timeout_s
        for name, child in self.workers.items():
            if child.eof:
                child.check()
                continue
            left = max(deadline - time.monotonic(), 0.0)
            for line in child.lines(left if not out else 0.0):
                try:
                    out.append((name, json.loads(line)))
                except ValueError:
                    continue
        return out

    def _apply(self, event: dict) -> None:
        kind = event.get("event")
        r = self.result
        if kind == "error":
            raise UserError(f"a worker failed: {event['error']}", component="demo")
        if kind == "stats":
            for row in event["paths"]:
                key = (row["subscriber"], row["origin"])
                p = r.paths.setdefault(key, PathStats(*key))
                p.delivered, p.window = row["delivered"], row["window"]
                p.window_s, p.p50_us, p.p99_us = row["window_s"], row["p50_us"], row["p99_us"]
            for name, count in event["delivered"].items():
                r.delivered[name] = count
        elif kind == "published":
            r.sent += event["sent"]
            r.expected.update(event["expected"])
        elif kind == "final":
            from hdrh.histogram import HdrHistogram

            for name, doc in event["subscribers"].items():
                r.delivered[name] = doc["delivered"]
                r.duplicates[name] = doc["duplicates"]
                r.order_errors[name] = doc["order_errors"]
                r.loss_events[name] = doc["loss_events"]
                r.lost_reported[name] = doc["lost_reported"]
            if r.histogram is None:
                r.histogram = HdrHistogram(1, LATENCY_HIGHEST_NS, 3)
            for encoded in event["histograms"]:
                r.histogram.decode_and_add(encoded)

    def _measure(self) -> None:
        from rich.live import Live

        r = self.result
        published = 0
        with Live(render(r, "starting"), console=self.console, refresh_per_second=4,
                  auto_refresh=self.live, transient=False) as live:
            self._broadcast({"cmd": "go", "seconds": self.seconds, "rate": self.rate})
            start = time.monotonic()
            while published < len(PUBLISHERS):
                for _, event in self._events(0.2):
                    self._apply(event)
                    published += event.get("event") == "published"
                left = self.seconds - (time.monotonic() - start)
                live.update(render(r, f"publishing, {max(left, 0):.0f} s left"))
                if time.monotonic() - start > self.seconds + START_TIMEOUT_S:
                    raise UserError("the publishers did not finish", component="demo")
            r.seconds = time.monotonic() - start
            # drain: until every subscriber has what it should, or nothing moves any more
            last_total, quiet_since, drain_start = -1, time.monotonic(), time.monotonic()
            while time.monotonic() - drain_start < DRAIN_MAX_S:
                for _, event in self._events(0.2):
                    self._apply(event)
                total = sum(r.delivered.values())
                if total != last_total:
                    last_total, quiet_since = total, time.monotonic()
                if all(r.delivered[s] >= r.expected[s] for s in r.expected) or \
                        time.monotonic() - quiet_since > DRAIN_QUIET_S:
                    break
                live.update(render(r, "draining"))
            self._broadcast({"cmd": "finish"})
            finals = 0
            deadline = time.monotonic() + START_TIMEOUT_S
            while finals < len(self.workers) and time.monotonic() < deadline:
                for _, event in self._events(0.2):
                    self._apply(event)
                    finals += event.get("event") == "final"
            live.update(render(r, "done"))
        self.collect_counters()


def run_demo(seconds: float, rate: int, console: Any, live: bool = True,
             keep: bool = False) -> DemoResult:
    """Run the whole demo (module docstring); stops every process it started, also on
    Ctrl-C or SIGTERM (the result is then marked ``interrupted``). ``keep``: leave the
    temporary directory (configs, logs) in place."""
    demo = Demo(seconds, rate, console, live, keep)

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return demo.run()
    except KeyboardInterrupt:
        demo.result.interrupted = True
        return demo.result
    finally:
        try:
            demo.close()
        except KeyboardInterrupt:  # a second Ctrl-C: close again, it is idempotent
            demo.close()
        signal.signal(signal.SIGTERM, previous)


# --- the worker: one appliance's clients ------------------------------------------------------

class _Out:
    """JSON lines to the conductor (one writer at a time)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, doc: dict) -> None:
        with self.lock:
            sys.stdout.write(json.dumps(doc) + "\n")
            sys.stdout.flush()


class _Subscriber:
    def __init__(self, spec: dict, client: Any, nodes: dict[int, str]) -> None:
        from hdrh.histogram import HdrHistogram

        self.spec = spec
        self.client = client
        self.nodes = nodes
        self.lock = threading.Lock()
        self.seen: set[tuple[int, int]] = set()
        self.seen_by_sub: set[tuple[int, int, int]] = set()
        self.delivered = 0
        self.duplicates = 0
        self.order_errors = 0
        self.loss_events = 0
        self.lost_reported = 0
        self.last_seq: dict[int, int] = {}
        self.by_origin: Counter = Counter()
        self.window: Counter = Counter()
        self.hist: dict[str, Any] = {}
        self.window_hist: dict[str, Any] = {}
        self._new_hist = lambda: HdrHistogram(1, LATENCY_HIGHEST_NS, 3)

    def on_message(self, sub_id: int, msg: Any) -> None:
        _, _, _, publisher, seq = _TICK.unpack_from(msg.payload, 0)
        if seq == 0:
            return  # warm-up
        with self.lock:
            if (sub_id, publisher, seq) in self.seen_by_sub:
                self.duplicates += 1
                return
            self.seen_by_sub.add((sub_id, publisher, seq))
            if (publisher, seq) in self.seen:
                return  # another of our subscriptions matched it too: one message
            self.seen.add((publisher, seq))
            if self.spec["qos"] == "guaranteed":
                if seq <= self.last_seq.get(publisher, 0):
                    self.order_errors += 1
                self.last_seq[publisher] = seq
            self.delivered += 1
            origin = self.nodes.get(msg.origin, str(msg.origin))
            self.by_origin[origin] += 1
            self.window[origin] += 1
            latency = msg.latency_ns
            if 0 < latency <= LATENCY_HIGHEST_NS:
                for hists in (self.hist, self.window_hist):
                    h = hists.get(origin)
                    if h is None:
                        h = hists[origin] = self._new_hist()
                    h.record_value(latency)

    def on_loss(self, loss: Any) -> None:
        with self.lock:
            self.loss_events += 1
            self.lost_reported += loss.messages

    def report(self, window_s: float) -> list[dict]:
        with self.lock:
            rows = []
            for origin, count in self.by_origin.items():
                h = self.window_hist.get(origin) or self.hist.get(origin)
                rows.append({"subscriber": self.spec["name"], "origin": origin,
                             "delivered": count, "window": self.window[origin],
                             "window_s": window_s,
                             "p50_us": h.get_value_at_percentile(50) / 1e3 if h else 0.0,
                             "p99_us": h.get_value_at_percentile(99) / 1e3 if h else 0.0})
            self.window.clear()
            self.window_hist.clear()
            return rows


class _Publisher:
    def __init__(self, spec: dict, client: Any, everyone: list[dict], schema: Any) -> None:
        from datapath.topics.sublist import naive_decision
        from nic_offload.selectors import compile_selector, message_event

        self.spec = spec
        self.client = client
        self.topics = topic_tree(tuple(spec["regions"]))
        self.index = int(spec["index"])
        self.schema = schema
        self.event = message_event
        self.receivers = [[s["name"] for s in everyone
                           if naive_decision(s["requests"], topic)] for topic in self.topics]
        self.selectors = {s["name"]: compile_selector(s["selector"]) for s in everyone
                          if s["selector"]}
        self.sent = 0
        self.expected: Counter = Counter()
        self.seq = 0
        self.rng = None

    def payload(self, i: int, seq: int) -> bytes:
        import random

        if self.rng is None:
            self.rng = random.Random(self.index)
        symbol = self.topics[i].split("/")[2].encode()
        return _TICK.pack(self.rng.randrange(100, 100_000), self.rng.randrange(1, 1_000),
                          symbol, self.index, seq)

    def publish(self, i: int, seq: int) -> None:
        payload = self.payload(i, seq)
        self.client.publish(self.topics[i], payload, qos=self.spec["qos"],
                            schema_id=TICK_SCHEMA_ID)
        if seq:
            self.sent += 1
            fields = None
            for name in self.receivers[i]:
                selector = self.selectors.get(name)
                if selector is not None:
                    if fields is None:
                        fields = self.event(payload, self.schema)
                    if not selector.evaluate(fields):
                        continue
                self.expected[name] += 1

    def run(self, seconds: float, rate: int) -> None:
        n = len(self.topics)
        per_tick = max(rate * PUBLISH_TICK_S, 0.0)
        owed = 0.0
        start = time.monotonic()
        next_tick = start
        i = 0
        while time.monotonic() - start < seconds:
            owed += per_tick
            while owed >= 1:
                self.seq += 1
                self.publish(i, self.seq)
                i = (i + 1) % n
                owed -= 1
            self.client.flush()
            next_tick += PUBLISH_TICK_S
            time.sleep(max(next_tick - time.monotonic(), 0))
        self.client.flush()


def _connect(ring: str, identity: str) -> Any:
    from appliance.client import ClientError, connect

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:  # an appliance accepts logins once P&M's document has reached it
        try:
            return connect(f"shm://{ring}", identity, idle=DEMO_IDLE,
                           timeout_s=DEMO_REQUEST_TIMEOUT_S)
        except ClientError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def worker_main() -> int:
    """``python -m appliance.ops.demo worker``: one appliance's clients, driven by JSON lines."""
    from nic_offload.schema import Schema

    out = _Out()
    setup = json.loads(sys.stdin.readline())
    nodes = {int(k): v for k, v in setup["nodes"].items()}
    schema = Schema.of(setup["schema"]["name"], setup["schema"]["id"],
                       [tuple(f) for f in setup["schema"]["fields"]])
    clients = []
    subscribers = []
    try:
        for spec in setup["subscribers"]:
            client = _connect(setup["ring"], "desk")
            clients.append(client)
            sub = _Subscriber(spec, client, nodes)
            subscribers.append(sub)
            selector = spec["selector"]
            for number, request in enumerate(spec["requests"]):
                if request[0] == "+":
                    client.subscribe(request[1:], selector, qos=spec["qos"],
                                     callback=lambda m, n=number, s=sub: s.on_message(n, m),
                                     on_loss=sub.on_loss)
                else:
                    client.unsubscribe(request[1:])
        publishers = []
        for spec in setup["publishers"]:
            client = _connect(setup["ring"], "feed")
            clients.append(client)
            publishers.append(_Publisher(spec, client, setup["everyone"], schema))
        sync = _connect(setup["ring"], "desk")  # subscribed last: see the module docstring
        clients.append(sync)
        heard: set[str] = set()
        sync.subscribe(SYNC_PREFIX + "#",
                       callback=lambda m: heard.add(m.topic[len(SYNC_PREFIX):]))
        out({"event": "ready"})
        return _worker_loop(out, setup, publishers, subscribers, heard)
    finally:
        for client in clients:
            client.close()


def _reported(out: _Out) -> Any:
    """A worker thread's failure goes to the conductor (which stops the demo with it)."""
    def wrap(fn: Any) -> Any:
        def run(*args: Any, **kw: Any) -> None:
            try:
                fn(*args, **kw)
            except Exception as exc:
                out({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
                raise
        return run
    return wrap


def _worker_loop(out: _Out, setup: dict, publishers: list, subscribers: list,
                 heard: set[str]) -> int:
    reported: set[str] = set()
    stop = threading.Event()
    done = threading.Event()
    threads: list[threading.Thread] = []
    reporter: threading.Thread | None = None
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "warmup":
            @_reported(out)
            def warm() -> None:
                for p in publishers:  # registers every topic and lets it through once
                    for i in range(len(p.topics)):
                        p.publish(i, 0)
                    p.client.flush()
                while not stop.is_set():
                    for p in publishers:
                        p.client.publish(SYNC_PREFIX + p.spec["name"], b"", flush=True)
                    for name in setup["publisher_names"]:
                        if name in heard and name not in reported:
                            reported.add(name)
                            out({"event": "synced", "publisher": name})
                    if len(reported) == len(setup["publisher_names"]) and not publishers:
                        return
                    time.sleep(0.05)
            thread = threading.Thread(target=warm, daemon=True)
            thread.start()
            threads.append(thread)
        elif cmd["cmd"] == "go":
            stop.set()
            for thread in threads:
                thread.join()

            @_reported(out)
            def publish(p: _Publisher, seconds: float = float(cmd["seconds"]),
                        rate: int = int(cmd["rate"])) -> None:
                p.run(seconds, rate)
                out({"event": "published", "publisher": p.spec["name"], "sent": p.sent,
                     "expected": p.expected})

            @_reported(out)
            def report() -> None:
                last = time.monotonic()
                while not done.is_set():
                    done.wait(REPORT_INTERVAL_S)
                    now = time.monotonic()
                    rows = [row for s in subscribers for row in s.report(now - last)]
                    last = now
                    out({"event": "stats", "paths": rows,
                         "delivered": {s.spec["name"]: s.delivered for s in subscribers}})
            for p in publishers:
                threading.Thread(target=publish, args=(p,), daemon=True).start()
            reporter = threading.Thread(target=report, daemon=True)
            reporter.start()
        elif cmd["cmd"] == "finish":
            done.set()
            if reporter is not None:
                reporter.join()
            histograms = [h.encode().decode() for s in subscribers for h in s.hist.values()]
            out({"event": "final", "histograms": histograms, "subscribers": {
                s.spec["name"]: {"delivered": s.delivered, "duplicates": s.duplicates,
                                 "order_errors": s.order_errors, "loss_events": s.loss_events,
                                 "lost_reported": s.lost_reported} for s in subscribers}})
            return 0
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the conductor stops us (SIGTERM)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # clients close on the way
        sys.exit(worker_main())
    print("usage: python -m appliance.ops.demo worker (started by `topicwire demo`)",
          file=sys.stderr)
    sys.exit(2)
