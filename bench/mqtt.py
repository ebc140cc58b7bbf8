"""``topicwire bench mqtt``: the edge appliance's MQTT server vs mosquitto, same load, one run.

Scenarios after EMQ's open MQTT benchmark (``--clients`` changes the counts):

- ``p2p``: N publishers to N subscribers, a topic per pair (``bench/p2p/<i>``; N = 10).
- ``fanout``: 1 publisher to 100 subscribers of one topic.
- ``fanin``: 100 publishers (a topic each) to one subscriber of the shared subscription
  ``$share/g/bench/fanin/+``.
- ``conns``: N connections (5,000 asked), each subscribed to its own topic and publishing to
  it at 1 msg/s. The edge's MQTT sessions of one identity share one native client session
  (appliance/edge/mqtt/identities.py), so both brokers hold the asked count (at most
  ``EDGE_MAX_CONNECTIONS``, the edge's own bound).

The load is bench/c/mqtt_load.c (C on Debian's libmosquitto, one epoll loop per process),
built here with ``cc -O2 ... -lmosquitto`` into ``$XDG_CACHE_HOME/topicwire/bench`` once per
source version, as bench/c/udp_relay.c is: one process for the publishers, one for the
subscribers (conns: one process whose clients do both). Brokers, each started by the bench
on a free loopback port: ``topicwire`` is ``topicwire run`` of an edge appliance (an
``[mqtt]`` listener, anonymous clients, docs/mqtt.md), ``mosquitto`` is Debian's mosquitto
with persistence off. MQTT 3.1.1, ``--payload-bytes`` payloads carrying the publish time.

Per broker and repeat, two runs of ``--duration-s`` each (the same publishers, subscribers
and topics for both brokers):

- full rate: each publisher publishes as fast as its window lets it (at most ``--window``
  messages published and not yet done: written to the socket at QoS 0, PUBACKed at QoS 1),
  so the broker sets the pace (conns: 1 msg/s per connection, the scenario's rate).
- half: at half of mosquitto's full rate of the same repeat (its deliveries per second,
  divided by the subscribers each message reaches; ``--rate`` instead: that many publishes
  per second over all publishers), spread evenly over time and stamped with the time each
  message was due (an open loop: a broker that falls behind shows as latency).

Figures: ``msgs_per_s`` (messages delivered to subscribers per second, from the first publish
to the last delivery), ``pub_msgs_per_s``, ``lost`` (expected deliveries that had not come
60 s after the last publish: QoS 0 dropped, QoS 1 acknowledged and then dropped, or not
yet read by the broker when the publishers closed, 30 s after their last publish),
``duplicates``, ``p50_us``/``p99_us``/``p999_us`` (publish to delivery, CLOCK_MONOTONIC in
both processes), ``cpu_pct`` (the broker's CPU over the publishing time, from
/proc/PID/stat: 100 is one core; mosquitto is single-threaded, near 100 at full rate means
the load drove it to its limit) and ``gen_cpu_pct`` (the load generator's processes). The
half-rate run's figures carry the prefix ``half_``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.fabric import _Child as _LineChild
from bench.fabric import cache_dir
from bench.procstat import appliance_cpu_seconds
from bench.report import build_report, positive_int, progress
from datapath.errors import DeviceError, UserError

NAME = "mqtt"
HELP = ("the edge's MQTT server (topicwire run, role edge) vs mosquitto: msgs/s, latency and "
        "CPU under the same libmosquitto load (p2p, fanout, fanin, conns)")

SCENARIOS = ("p2p", "fanout", "fanin", "conns")
DEFAULT_CLIENTS = {"p2p": 10, "fanout": 100, "fanin": 100, "conns": 5_000}
"""``--clients`` per scenario: pairs (p2p), subscribers (fanout), publishers (fanin),
connections (conns)."""
CONNS_RATE_PER_CLIENT = 1.0
"""conns: messages per second each connection publishes."""
MQTT_DURATION_S = 5.0
MQTT_PAYLOAD_BYTES = 64
MQTT_WINDOW = 20
"""Messages a publisher has published and not yet done (libmosquitto's and mosquitto's
default inflight window)."""
MQTT_REPEATS = 1
LOOPBACK = "127.0.0.1"
LOAD_SOURCE = Path(__file__).resolve().parent / "c" / "mqtt_load.c"
LOAD_CFLAGS = ("-O2", "-Wall")
LOAD_LIBS = ("-lmosquitto",)
EDGE_MAX_CONNECTIONS = 100_000
"""The most ``mqtt.max_connections`` an edge takes (appliance/config.py)."""
EDGE_SPARE_CONNECTIONS = 16
EDGE_MAX_SUBSCRIPTIONS = 65_536
"""The edge's ``clients.max_subscriptions``: every connection's filter is an entry (two, one
per native class) of the one native session of the bench's identity."""
EDGE_START_TIMEOUT_S = 600.0
"""A first start after a source change compiles numba kernels (`topicwire warm` does it ahead)."""
EDGE_IDLE_TIMEOUT_S = 120.0
EDGE_SESSION_DEAD_MS = 30_000
"""The edge's ``clients.session_dead_ms``: a native session whose logout was lost (UDP, under
a flood) ends this soon, and frees its place for the next measurement's connections."""
PROBE_WAIT_S = 1.0
"""After each probe round the parent waits this long for FLOWING before sending another."""
PROBE_TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 300.0
"""Every client of a generator process connected (and subscribed) within."""
RESULT_GRACE_S = 120.0
"""A generator's result comes within its duration plus this (mqtt_load waits at most 30 s
for acknowledgements, and its subscribers at most 60 s after END)."""
EDGE_LOG_TAIL_LINES = 20
"""Lines of the edge's log an error of the bench quotes."""
_COMPONENT = "bench mqtt"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", choices=SCENARIOS, default="p2p",
                        help="p2p: N publishers to N subscribers; fanout: 1 to 100; fanin: "
                        "100 to one shared subscription; conns: 5,000 connections at 1 msg/s")
    parser.add_argument("--qos", type=int, choices=(0, 1), default=0)
    parser.add_argument("--rate", type=_positive_float, default=None,
                        help="publishes per second of the second run, over all publishers "
                        "(default: half of mosquitto's full rate in this run)")
    parser.add_argument("--duration-s", type=_positive_float, default=MQTT_DURATION_S,
                        help="seconds of publishing per run")
    parser.add_argument("--clients", type=positive_int, default=None,
                        help="pairs (p2p), subscribers (fanout), publishers (fanin) or "
                        "connections (conns); default " + ", ".join(
                            f"{k} {v:,}" for k, v in DEFAULT_CLIENTS.items()))
    parser.add_argument("--payload-bytes", type=_payload, default=MQTT_PAYLOAD_BYTES)
    parser.add_argument("--window", type=positive_int, default=MQTT_WINDOW,
                        help="messages each publisher may have published and not yet done")
    parser.add_argument("--repeats", type=positive_int, default=MQTT_REPEATS)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _payload(text: str) -> int:
    value = int(text)
    if not 16 <= value <= 65_536:
        raise argparse.ArgumentTypeError("payload must be in [16, 65536] bytes (16: the "
                                         "timestamp, publisher and sequence number)")
    return value


# --- the load generator -----------------------------------------------------------------------

def build_load(directory: Path | None = None) -> Path:
    """Compile ``mqtt_load.c`` against libmosquitto unless this version is built."""
    source = LOAD_SOURCE.read_bytes()
    flags = " ".join(LOAD_CFLAGS + LOAD_LIBS).encode()
    digest = hashlib.blake2b(source + flags, digest_size=8).hexdigest()
    directory = directory or cache_dir()
    exe = directory / f"mqtt_load-{digest}"
    if exe.is_file() and os.access(exe, os.X_OK):
        return exe
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise UserError("no C compiler to build the MQTT load generator; install one "
                        "(Debian: apt-get install gcc) or set CC", component=_COMPONENT)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".mqtt_load-{digest}.{os.getpid()}"
    done = subprocess.run([cc, *LOAD_CFLAGS, "-o", str(tmp), str(LOAD_SOURCE), *LOAD_LIBS],
                          capture_output=True, text=True)
    if done.returncode != 0:
        hint = (" (libmosquitto's header is missing: apt-get install libmosquitto-dev, "
                "or make setup)" if "mosquitto.h" in done.stderr else "")
        raise DeviceError(f"{cc} could not build {LOAD_SOURCE}{hint}: {done.stderr[-2000:]}",
                          component=_COMPONENT)
    os.replace(tmp, exe)
    return exe


@dataclass(frozen=True)
class Shape:
    """Who publishes where and who subscribes to what, in one scenario."""

    publishers: int
    subscribers: int
    topic: str
    """Publish topic, ``%d``: the publisher's index."""
    filter: str
    """Subscription filter, ``%d``: the subscriber's index."""
    streams: int
    """(publisher, subscriber) pairs: each message of a publisher reaches ``per_message``."""
    per_message: int
    echo: bool = False
    """conns: one process whose clients both subscribe and publish (``publishers``)."""

    @property
    def connections(self) -> int:
        return self.publishers if self.echo else self.publishers + self.subscribers


def shape(scenario: str, clients: int) -> Shape:
    if scenario == "p2p":
        return Shape(clients, clients, "bench/p2p/%d", "bench/p2p/%d", clients, 1)
    if scenario == "fanout":
        return Shape(1, clients, "bench/fanout/0", "bench/fanout/0", clients, clients)
    if scenario == "fanin":
        return Shape(clients, 1, "bench/fanin/%d", "$share/g/bench/fanin/+", clients, 1)
    return Shape(clients, clients, "bench/conns/%d", "bench/conns/%d", clients, 1, echo=True)


EDGE_MAX_QUEUED = 1_000_000
"""The edge's ``mqtt.max_queued`` here (its largest): QoS 1 messages waiting for a
subscriber's inflight slot are kept as mosquitto's are with ``max_queued_messages 0``, not
dropped past the default 1,000 when a subscriber falls behind (fan-out on a loaded host)."""


# --- the brokers -------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, what: str, timeout_s: float,
                    log_path: Path | None = None) -> None:
    """Until ``port`` takes a connection; a ``DeviceError`` with the end of the process's
    standard error (piped, or in ``log_path``) when it exits or times out first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((LOOPBACK, port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                err: bytes = b""
                if proc.poll() is None:
                    proc.kill()
                try:
                    err = (proc.communicate(timeout=10)[1] or b"")[-2000:]
                    if log_path is not None:
                        err = log_path.read_bytes()[-2000:]
                except (subprocess.TimeoutExpired, ValueError, OSError):
                    pass
                raise DeviceError(f"{what} did not listen on {LOOPBACK}:{port} (exit "
                                  f"{proc.returncode}): {err!r}", component=_COMPONENT) from None
            time.sleep(0.05)


class Broker:
    """A broker process on a free loopback port; ``cpu_s()`` reads its CPU time."""

    name = ""
    port = 0
    proc: subprocess.Popen

    def wait_idle(self) -> None:
        """Return once the previous measurement's clients are gone."""

    def diagnosis(self) -> str:
        """What the broker says about refused or closed connections (for an error)."""
        return ""

    def cpu_s(self) -> float:
        return _cpu_s(self.proc.pid)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            self.proc.communicate(timeout=10)
        except (subprocess.TimeoutExpired, ValueError):
            pass
        return self.proc.returncode


class Mosquitto(Broker):
    """Debian's mosquitto, persistence off, anonymous clients, no limit on a client's queue
    (``max_queued_messages 0``), its defaults otherwise."""

    name = "mosquitto"

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("mosquitto") or ("/usr/sbin/mosquitto"
                                            if Path("/usr/sbin/mosquitto").exists() else None)
        if exe is None:
            raise UserError("mosquitto is not installed (Debian: apt-get install mosquitto, "
                            "or make setup)", component=_COMPONENT)
        self.port = _free_port()
        conf = workdir / f"mosquitto-{self.port}.conf"
        conf.write_text(f"listener {self.port} {LOOPBACK}\nallow_anonymous true\n"
                        "persistence false\nlog_dest none\n"
                        # mosquitto drops QoS 1 messages beyond 1,000 queued for a client by
                        # default (a fan-in's one subscriber falls that far behind at full
                        # rate); unbounded, as the edge queues, so both deliver everything
                        "max_queued_messages 0\n"
                        + ("user root\n" if os.geteuid() == 0 else ""))
        self.proc = subprocess.Popen([exe, "-c", str(conf)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait_listening(self.port, self.proc, "mosquitto", 30.0)


class Edge(Broker):
    """``topicwire run`` of an edge appliance: ``[mqtt]`` on a free loopback port, anonymous
    clients allowed to publish and subscribe ``bench/#``, room for ``connections``."""

    name = "topicwire"

    def __init__(self, workdir: Path, connections: int, qos: int) -> None:
        self.port = _free_port()
        self.mgmt_port = _free_port()
        config = workdir / f"edge-{self.port}.toml"
        config.write_text(
            '[appliance]\nname = "bench-mqtt"\nrole = "edge"\n'
            f'[clients]\nudp = "{LOOPBACK}:{_free_udp_port()}"\n'
            f"max_subscriptions = {EDGE_MAX_SUBSCRIPTIONS}\n"
            f"session_dead_ms = {EDGE_SESSION_DEAD_MS}\n"
            '[pm.identities.anonymous]\npublish = ["bench/#"]\nsubscribe = ["bench/#"]\n'
            f'[mqtt]\nlisten = "{LOOPBACK}:{self.port}"\n'
            f"max_connections = {connections + EDGE_SPARE_CONNECTIONS}\n"
            f"max_queued = {EDGE_MAX_QUEUED}\n"
            'allow_anonymous = true\n[log]\nlevel = "warning"\n'
            f'[mgmt]\nlisten = "{LOOPBACK}:{self.mgmt_port}"\n')
        code = "import sys; from appliance.ops.cli import main; sys.exit(main(sys.argv[1:]))"
        # its log goes to a file: a pipe nobody reads while it runs fills up (64 KiB) and
        # then blocks the edge's next log line, and the loop with it
        self.log_path = workdir / f"edge-{self.port}.log"
        with open(self.log_path, "wb") as log_file:
            self.proc = subprocess.Popen([sys.executable, "-c", code, "run", "--config",
                                          str(config)], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log_file)
        _wait_listening(self.port, self.proc, "the edge (topicwire run)", EDGE_START_TIMEOUT_S,
                        self.log_path)

    def log_tail(self) -> str:
        """The last lines of the edge's log."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-EDGE_LOG_TAIL_LINES:])

    def _status(self) -> dict[str, Any]:
        import json
        import urllib.request

        url = f"http://{LOOPBACK}:{self.mgmt_port}/status"
        with urllib.request.urlopen(url, timeout=30) as answer:
            return json.load(answer)

    def diagnosis(self) -> str:
        try:
            counters = self._status()["mqtt"]["counters"]
        except (OSError, ValueError, KeyError):
            return ""
        why = {k: v for k, v in counters.items()
               if v and k.startswith(("closed_", "connect_refused_", "refused_"))}
        tail = self.log_tail()
        return f" (the edge's counters: {why}" + (f"; its log ends:\n{tail})" if tail else ")")

    def wait_idle(self) -> None:
        """Until the previous measurement's connections and their native client sessions are
        gone (``/status``): the next one's would otherwise find ``mqtt.max_connections`` or
        ``clients.max_sessions`` taken (CONNACK 3, server unavailable)."""
        deadline = time.monotonic() + EDGE_IDLE_TIMEOUT_S
        while True:
            status = self._status()
            # /status is a snapshot up to ~300 ms old (the API's own process): right after
            # the start it may predate the MQTT server, and have no mqtt section yet
            mqtt, native = status.get("mqtt"), len(status.get("clients", ()))
            if mqtt is not None and mqtt["connections"] == 0 and mqtt["sessions"] == 0 \
                    and native == 0:
                return
            if mqtt is None:
                mqtt = {"connections": "?", "sessions": "?"}
            if time.monotonic() > deadline:
                raise DeviceError(f"the edge still has {mqtt['connections']} connections, "
                                  f"{mqtt['sessions']} sessions and {native} native client "
                                  f"sessions {EDGE_IDLE_TIMEOUT_S} s after a measurement",
                                  component=_COMPONENT)
            time.sleep(0.1)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _cpu_s(pid: int) -> float:
    """CPU seconds of a process and, for an appliance, of its data path's process (0 once it
    is gone)."""
    try:
        return appliance_cpu_seconds(pid)
    except OSError:
        return 0.0


# --- one measurement ---------------------------------------------------------------------------

def measure(broker: Broker, load: Path, sh: Shape, qos: int, rate: float, duration_s: float,
            window: int, payload_bytes: int, tag: str) -> dict[str, float]:
    """Publishers and subscribers of ``sh`` against ``broker`` for ``duration_s``: at ``rate``
    publishes per second over all publishers, or with ``rate`` 0 as fast as the windows let
    them. Returns the figures (see the module's docstring)."""
    broker.wait_idle()
    port = str(broker.port)
    pub_argv = [str(load), "echo" if sh.echo else "pub", port, str(sh.publishers), str(qos),
                sh.topic, repr(float(rate)), repr(float(duration_s)), str(window),
                str(payload_bytes), f"tw-bench-{tag}-p"]
    children: list[_LoadChild] = []
    try:
        sub = None
        if not sh.echo:
            sub = _LoadChild([str(load), "sub", port, str(sh.subscribers), str(qos), sh.filter,
                          str(sh.streams), f"tw-bench-{tag}-s"], "subscribers (mqtt_load sub)")
            children.append(sub)
            sub_connect_ms = float(sub.expect("READY", CONNECT_TIMEOUT_S).split()[1])
        pub = _LoadChild(pub_argv, "publishers (mqtt_load)")
        children.append(pub)
        pub_connect_ms = float(pub.expect("READY", CONNECT_TIMEOUT_S).split()[1])
        flowing = sub or pub
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while True:  # one probe per publisher until every stream had one: routes are in place
            pub.tell("PROBE")
            try:
                flowing.expect("FLOWING", PROBE_WAIT_S)
                break
            except _NotYet:
                if time.monotonic() > deadline:
                    raise DeviceError(f"{broker.name}: the subscribers did not get the probes "
                                      f"within {PROBE_TIMEOUT_S} s", component=_COMPONENT) \
                        from None
        gen_pids = [c.proc.pid for c in children]
        cpu0, gen0, t0 = broker.cpu_s(), sum(_cpu_s(p) for p in gen_pids), time.monotonic()
        pub.tell("GO")
        sent = pub.result_within(duration_s + RESULT_GRACE_S)
        wall = max(time.monotonic() - t0, 1e-9)
        cpu1, gen1 = broker.cpu_s(), sum(_cpu_s(p) for p in gen_pids)
        expected = sent["sent"] * sh.per_message
        if sub is not None:
            sub.tell(f"END {expected}")
            got = sub.result_within(RESULT_GRACE_S)
        else:
            got = sent
    except DeviceError as exc:
        raise DeviceError(f"{broker.name}: {exc}{broker.diagnosis()}",
                          component=_COMPONENT) from None
    finally:
        for child in children:
            child.kill(10.0)
    span_ns = max(got["last_ns"] - sent["start_ns"], 1)
    return {
        "msgs_per_s": got["received"] * 1e9 / span_ns,
        "pub_msgs_per_s": sent["sent"] * 1e9 / max(sent["end_ns"] - sent["start_ns"], 1),
        "sent": float(sent["sent"]), "received": float(got["received"]),
        "lost": float(expected - got["received"]), "duplicates": float(got["duplicates"]),
        "p50_us": got["p50_us"], "p99_us": got["p99_us"], "p999_us": got["p999_us"],
        "max_us": got["max_us"],
        "cpu_pct": 100.0 * (cpu1 - cpu0) / wall,
        "gen_cpu_pct": 100.0 * (gen1 - gen0) / wall,
        "connect_ms": pub_connect_ms if sh.echo else max(pub_connect_ms, sub_connect_ms),
    }


class _NotYet(DeviceError):
    pass


def _expect(child: _LineChild, word: str, timeout_s: float) -> str:
    """``_Child.expect`` that leaves a process that is still running alive on a timeout (the
    probes: FLOWING may take several rounds)."""
    import select

    deadline = time.monotonic() + timeout_s
    out = child.proc.stdout
    assert out is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([out], [], [], max(0.0, min(0.2, deadline
                                                                 - time.monotonic())))
        if ready:
            line = out.readline()
            if not line:
                break
            if line.startswith(word):
                return line.strip()
        elif child.proc.poll() is not None:
            break
    if child.proc.poll() is None:
        raise _NotYet(f"the {child.what} did not say {word!r} yet", component=_COMPONENT)
    return _LineChild.expect(child, word, 0.1)  # it ended: its exit and stderr in the error


class _LoadChild(_LineChild):
    """An mqtt_load process: lines on its standard input and output."""

    def expect(self, word: str, timeout_s: float = RESULT_GRACE_S) -> str:  # type: ignore[override]
        try:
            return _expect(self, word, timeout_s)
        except _NotYet:
            if word == "FLOWING":
                raise
            self.proc.kill()
            return _LineChild.expect(self, word, 0.1)

    def result_within(self, timeout_s: float) -> dict[str, Any]:
        import json

        return json.loads(self.expect("{", timeout_s))


# --- the run -----------------------------------------------------------------------------------

REPORTED = ("msgs_per_s", "pub_msgs_per_s", "lost", "duplicates", "p50_us", "p99_us",
            "p999_us", "cpu_pct", "gen_cpu_pct", "connect_ms")


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both brokers, ``--repeats`` times: a full-rate run each, then a run each at half of
    mosquitto's full publish rate (or ``--rate``); medians."""
    scenario, qos = args.scenario, args.qos
    asked = args.clients or DEFAULT_CLIENTS[scenario]
    if shape(scenario, asked).connections > EDGE_MAX_CONNECTIONS - EDGE_SPARE_CONNECTIONS:
        raise UserError(f"--clients {asked}: {shape(scenario, asked).connections} connections, "
                        f"the edge holds at most {EDGE_MAX_CONNECTIONS - EDGE_SPARE_CONNECTIONS}"
                        " here (mqtt.max_connections)", component=_COMPONENT)
    sh = shape(scenario, asked)
    load = build_load()
    runs: dict[str, list[dict[str, float]]] = {"topicwire": [], "mosquitto": []}
    half_rates: list[float] = []
    common = {"qos": qos, "duration_s": args.duration_s, "window": args.window,
              "payload_bytes": args.payload_bytes}
    start_load = os.getloadavg()
    full_rate = CONNS_RATE_PER_CLIENT * sh.publishers if sh.echo else 0.0
    with tempfile.TemporaryDirectory(prefix="tw-bench-mqtt-") as tmp:
        workdir = Path(tmp)
        progress(NAME, f"{scenario}, QoS {qos}: {sh.connections:,} connections")
        for repeat in range(args.repeats):
            # one broker at a time (an idle edge still takes CPU: its native clients poll):
            # mosquitto at full rate, then at half of that; the edge at both rates
            figures: dict[str, dict[str, float]] = {}
            half = args.rate or 0.0
            for name in ("mosquitto", "topicwire"):
                progress(NAME, f"repeat {repeat + 1}/{args.repeats}: starting {name}")
                broker = Mosquitto(workdir) if name == "mosquitto" else Edge(
                    workdir, sh.connections, qos)
                try:
                    progress(NAME, f"repeat {repeat + 1}/{args.repeats}: {name}, full rate")
                    figures[name] = measure(broker, load, sh, rate=full_rate,
                                            tag=f"{repeat}f", **common)
                    if not half:
                        # half of what mosquitto delivered, in publishes (fanout: one publish
                        # reaches every subscriber); at QoS 0 its full-rate publishes may run
                        # far ahead of its deliveries (it buffers them)
                        half = figures[name]["msgs_per_s"] / sh.per_message / 2
                    progress(NAME, f"repeat {repeat + 1}/{args.repeats}: {name}, "
                             f"{half:,.0f} publishes/s")
                    paced = measure(broker, load, sh, rate=half, tag=f"{repeat}h", **common)
                    figures[name].update({f"half_{k}": v for k, v in paced.items()})
                finally:
                    code = broker.stop()
                if name == "topicwire" and code not in (0, -signal.SIGTERM):
                    raise DeviceError(f"the edge exited with {code} at the end of its runs",
                                      component=_COMPONENT)
            half_rates.append(half)
            for name, fig in figures.items():
                runs[name].append(fig)
    keep = REPORTED + tuple(f"half_{k}" for k in REPORTED)
    results = {name: {k: v for k, v in _medians(r).items() if k in keep}
               for name, r in runs.items()}
    params: dict[str, Any] = {
        "scenario": scenario, "qos": qos, "connections": sh.connections,
        "publishers": sh.publishers, "subscribers": sh.subscribers if not sh.echo else
        sh.publishers, "topic": sh.topic, "filter": sh.filter,
        "payload_bytes": args.payload_bytes, "window": args.window,
        "duration_s": args.duration_s, "repeats": args.repeats,
        "full_rate": ("1 msg/s per connection" if sh.echo else
                      "as fast as each publisher's window allows"),
        "half_rate_publishes_per_s": statistics.median(half_rates),
        "rate_given": args.rate,
        "protocol": "MQTT 3.1.1", "load": "bench/c/mqtt_load.c (libmosquitto, epoll)",
        "baseline": ("mosquitto: Debian's, persistence off, anonymous, max_queued_messages 0, "
                     "defaults otherwise"),
        "goals": {"msgs_per_s topicwire/mosquitto": ">= 1.0",
                  "half_p99_us topicwire/mosquitto": "<= 1.0"},
        "loadavg": {"start": start_load, "end": os.getloadavg()},
        "runs": runs,
    }
    return build_report(NAME, params, results)
