"""``topicwire bench client``: publish-to-callback through the client API, beside the raw hop.

What an application sees: a publisher process and a subscriber process, each using the
client API (``appliance.client.connect``) over shared memory or UDP, through one appliance
(``topicwire run``, the same one for every measurement). The baseline, measured in the same
run through the same appliance, is the raw hop of ``topicwire bench fabric``: hand-built
native frames over UDP, the subscriber's figure taken from the kernel's receive timestamp,
so it holds the appliance's share alone; the difference is the client API's.

- latency (``p50_us``/``p99_us``/``p999_us``): ``--rate`` messages of ``--size`` bytes a
  second for ``--duration-s``, each published with ``flush=True``; the figure is the
  message's publish time (stamped by the publishing client) to the subscriber's callback
  (``Message.latency_ns``), both processes on this host's CLOCK_REALTIME.
- throughput (``msgs_per_s``): ``--messages`` messages published as fast as the publisher
  can with ``publish_batch`` (``--batch`` messages a call, rows of one numpy array), received
  by a poll subscription (``Client.poll``, ``POLL_LIMIT`` messages a call, a handler that
  checks every message's sequence); the subscriber's rate from the start of its first poll
  that handed over messages to the end of its last. Every message is accounted for:
  ``received``, ``lost`` (never arrived: sequence gaps plus what never came) and, of those
  lost, what was dropped and reported on the way (``dropped_at_send`` by the publishing client,
  ``appliance_dropped_frames``: the appliance's back-pressure drop counters, which count
  frames, each ``frame_messages`` messages of the publisher's frames, ``poll_dropped`` by the
  subscribing client, ``udp_rcvbuf_errors``: the host's UDP receive-buffer overflows (of
  datagrams, each one frame) during the run, from /proc/net/snmp, host-wide);
  ``unreported`` is what is lost beyond those (frames counted as ``frame_messages``).
  ``raw_hop_throughput``: bench fabric's throughput run (hand-built frames of
  ``--raw-per-frame`` messages over UDP, 16 by default) through the same appliance, the
  baseline (a run that fails is reported with ``failed`` and 0 msgs/s, not fatal).

Figures are medians over ``--repeats``. Transports: ``--transport shm|udp|both``; the
report's ``topicwire`` is the first of them (shm with ``both``), ``topicwire_udp`` the
second, ``raw_hop`` the latency baseline and ``raw_hop_throughput`` the throughput one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import fabric
from bench.report import build_report, positive_int, progress
from datapath.config import BENCH_REPEATS
from datapath.errors import DeviceError, UserError

NAME = "client"
HELP = ("publish-to-callback latency and msgs/s through the client API (shm, udp), one "
        "appliance, vs the raw hop of bench fabric in the same run")

TRANSPORTS = ("shm", "udp")
CLIENT_RATE_PER_S = 10_000
CLIENT_DURATION_S = 2.0
CLIENT_MESSAGES = 100_000
CLIENT_SIZE_BYTES = 64
TOPIC = "bench/client"
PROBE_TOPIC = "bench/probe"
"""The throughput run's probes (a callback subscription beside the measured poll one)."""
CLIENT_BATCH_MESSAGES = 4_096
RAW_PER_FRAME = 16
"""Messages per frame of the raw hop's throughput run (bench fabric's ``--per-frame``)."""
"""Messages per ``publish_batch`` call of the throughput run."""
APPLIANCE_DROP_COUNTERS = ("shm_backpressure_drops", "clients-udp_backpressure_drops",
                           "shm_send_failed", "shm_no_session", "inbox_full", "outbox_full")
"""Appliance status counters that count messages or frames it dropped (reported)."""
SETTLE_S = 0.5
"""After the subscription is made, the publisher waits this long (its interest reaches the
appliance's tables) and then sends probes until the subscriber has one."""
RESULT_TIMEOUT_S = 120.0
QUIET_S = 2.0
"""A subscriber that has had nothing for this long after its first message stops waiting
for the rest (counted lost)."""
_COMPONENT = "bench client"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transport", choices=(*TRANSPORTS, "both"), default="both",
                        help="how the clients reach the appliance (default: both)")
    parser.add_argument("--rate", type=positive_int, default=CLIENT_RATE_PER_S,
                        help="messages per second of the latency run")
    parser.add_argument("--duration-s", type=float, default=CLIENT_DURATION_S,
                        help="seconds of each latency run")
    parser.add_argument("--messages", type=positive_int, default=CLIENT_MESSAGES,
                        help="messages per throughput run")
    parser.add_argument("--size", type=fabric._size, default=CLIENT_SIZE_BYTES,
                        help="payload bytes per message")
    parser.add_argument("--batch", type=positive_int, default=CLIENT_BATCH_MESSAGES,
                        help="messages per publish_batch call of the throughput run")
    parser.add_argument("--raw-per-frame", type=positive_int, default=RAW_PER_FRAME,
                        help="messages per frame of the raw hop's throughput run (baseline)")
    parser.add_argument("--repeats", type=positive_int, default=BENCH_REPEATS)
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the raw hop (bench fabric's latency run) in the same run")


# --- the children: one subscriber, one publisher, each a client API process -------------------

class _Driver:
    """A subscriber process's lines with the bench: STOP on its stdin ends it; PROBED is
    printed once, when its first probe has come (``probed``)."""

    def __init__(self, probed: threading.Event) -> None:
        self.probed = probed
        self.told = False

    def stopped(self, wait_s: float) -> bool:
        """Whether the bench said STOP (waiting up to ``wait_s`` for a line); says PROBED."""
        import select

        ready, _, _ = select.select([sys.stdin], [], [], wait_s)
        if ready and sys.stdin.readline().strip() == "STOP":
            return True
        if self.probed.is_set() and not self.told:
            self.told = True
            print("PROBED", flush=True)
        return False


def _subscriber(spec: dict[str, Any]) -> None:
    """Subscribe, say READY, count and time every message until ``expect`` arrived or STOP
    (on stdin) comes; print the figures as one JSON line."""

    from appliance.client import connect
    from appliance.client.stats import SubStats

    stats = SubStats()
    times: list[int] = []
    """Monotonic time of the first measured message, then of the last."""
    probed = threading.Event()

    def on_message(msg: Any) -> None:
        if msg.payload[:1] == b"p":  # a probe: counted apart
            probed.set()
            return
        stats.on_message(msg)
        if len(times) < 2:
            times.append(time.monotonic_ns())
        else:
            times[1] = time.monotonic_ns()

    with connect(spec["url"], "bench", session_timeout_s=60.0) as client:
        client.subscribe(TOPIC, callback=on_message)
        print("READY", flush=True)
        deadline = time.monotonic() + RESULT_TIMEOUT_S
        seen, quiet_since = 0, time.monotonic()
        driver = _Driver(probed)
        while stats.received < spec["expect"] and time.monotonic() < deadline:
            if driver.stopped(0.05):
                break
            if stats.received != seen:
                seen, quiet_since = stats.received, time.monotonic()
            elif seen and time.monotonic() - quiet_since > QUIET_S:
                break  # the rest never comes: what is missing is counted lost
        summary = stats.summary()
        count = stats.latency.get_total_count()
        summary["latency_p999_us"] = round(
            stats.latency.get_value_at_percentile(99.9) / 1e3, 3) if count else 0.0
        span_ns = times[-1] - times[0] if len(times) == 2 else 0
        summary["msgs_per_s"] = (stats.received - 1) * 1e9 / span_ns if span_ns else 0.0
        summary["first_ns"] = times[0] if times else 0
        print(json.dumps(summary), flush=True)


class _Tally:
    """The poll handler of the throughput run: every message counted, its sequence
    checked (one publisher, one topic: contiguous from 1)."""

    __slots__ = ("received", "expected_seq", "gaps", "duplicates")

    def __init__(self) -> None:
        self.received = 0
        self.expected_seq = 1
        self.gaps = 0
        self.duplicates = 0

    def on_view(self, view: Any) -> None:
        seq = view.sequence
        if seq != self.expected_seq:
            if seq < self.expected_seq:
                self.duplicates += 1
                return
            self.gaps += seq - self.expected_seq
        self.expected_seq = seq + 1
        self.received += 1


def _poll_subscriber(spec: dict[str, Any]) -> None:
    """The throughput run's subscriber: a poll subscription to the measured topic (and a
    callback one to the probes'); polls until ``expect`` arrived, STOP, or a quiet spell."""

    from appliance.client import connect
    from appliance.client.settings import POLL_LIMIT

    tally = _Tally()
    handler = tally.on_view
    probed = threading.Event()
    with connect(spec["url"], "bench", session_timeout_s=60.0) as client:
        client.subscribe(PROBE_TOPIC, callback=lambda msg: probed.set())
        sub = client.subscribe(TOPIC, poll=True)
        print("READY", flush=True)
        deadline = time.monotonic() + RESULT_TIMEOUT_S
        first_ns = last_ns = 0
        driver = _Driver(probed)
        poll = client.poll
        clock = time.monotonic_ns
        wait_s = 0.0
        while tally.received < spec["expect"]:
            started = clock()
            if poll(handler, POLL_LIMIT, timeout_s=wait_s):
                last_ns = clock()
                if not first_ns:  # (from the start of the first poll that handed any over)
                    first_ns = started
                wait_s = 0.0
                continue
            wait_s = 0.001  # nothing: the next poll waits for a frame (up to 1 ms)
            if tally.received + sum(sub.policy_drops.values()) >= spec["expect"]:
                break  # the rest was dropped by the flow-control policy, and reported
            now = time.monotonic()
            if now > deadline:
                break
            if driver.stopped(0):
                break
            if first_ns and now - last_ns / 1e9 > QUIET_S:
                break  # the rest never comes: what is missing is counted lost
        span_ns = last_ns - first_ns
        counters = client.poll_counters()
        print(json.dumps({
            "received": tally.received, "gaps": tally.gaps, "duplicates": tally.duplicates,
            "msgs_per_s": tally.received * 1e9 / span_ns if span_ns else 0.0,
            "poll_dropped": counters["dropped_messages"] + counters["unresolved"],
            # what the appliance's flow-control policy dropped for this slow subscriber and
            # reported to it (CONTROL policy_drops: drop-oldest, conflate, throttle)
            "policy_dropped": sum(sub.policy_drops.values())}),
            flush=True)


def _publisher(spec: dict[str, Any]) -> None:
    """Send probes until GO (the subscriber has one), then the measured messages: paced at
    ``rate`` with a flush each (latency), or as fast as possible (``rate`` 0); print JSON."""
    import select

    import numpy as np

    from appliance.client import connect

    payload = b"m" * spec["size"]
    probe_topic = TOPIC if spec["rate"] else PROBE_TOPIC
    with connect(spec["url"], "bench", session_timeout_s=60.0) as client:
        time.sleep(SETTLE_S)
        while True:
            client.publish(probe_topic, b"p", flush=True)
            ready, _, _ = select.select([sys.stdin], [], [], 0.005)
            if ready and sys.stdin.readline().strip() == "GO":
                break
        count, rate = spec["count"], spec["rate"]
        started = time.monotonic_ns()
        if rate:  # paced as bench fabric's publisher: sleeps (timer slack 1 us), then spins
            fabric._precise_sleep()  # the last PACE_SPIN_NS; a publisher spinning all the
            interval = 1e9 / rate    # time would take a core the hop and subscriber need
            publish = client.publish
            for i in range(count):
                fabric.wait_until_ns(started + int(i * interval))
                publish(TOPIC, payload, flush=True)
        else:
            rows = np.full((spec["batch"], spec["size"]), ord("m"), np.uint8)
            publish_batch = client.publish_batch
            left = count
            while left:
                n = min(left, len(rows))
                publish_batch(TOPIC, rows[:n])
                left -= n
        took = time.monotonic_ns() - started
        counters = client.connection_counters()
        print(json.dumps({"sent": count, "sent_msgs_per_s": count * 1e9 / max(took, 1),
                          "dropped_at_send": counters.get("messages_dropped_at_send", 0)}),
              flush=True)


def _child_main(argv: list[str]) -> None:
    role, spec = argv[0], json.loads(argv[1])
    {"sub": _subscriber, "poll": _poll_subscriber, "pub": _publisher}[role](spec)


_CHILD_CODE = "import sys; from bench.client import _child_main; _child_main(sys.argv[1:])"


def _child(role: str, spec: dict[str, Any]) -> fabric._Child:
    return fabric._Child([sys.executable, "-c", _CHILD_CODE, role, json.dumps(spec)],
                         {"sub": "subscriber (client API)", "poll": "subscriber (client poll)",
                          "pub": "publisher (client API)"}[role])


def _free_tcp_port() -> int:
    """A TCP port on loopback free now (for the appliance's management API)."""
    import socket

    with socket.socket() as sock:
        sock.bind((fabric.LOOPBACK, 0))
        return sock.getsockname()[1]


def _udp_rcvbuf_errors() -> int:
    """The host's UDP receive-buffer overflows so far (/proc/net/snmp; 0 where absent)."""
    try:
        lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()
                 if line.startswith("Udp:")]
        return int(lines[1][lines[0].index("RcvbufErrors")])
    except (OSError, ValueError, IndexError):
        return 0


def _appliance_drops(mgmt_port: int | None) -> int:
    """The appliance's drop counters (``APPLIANCE_DROP_COUNTERS``) summed, from /status."""
    if mgmt_port is None:
        return 0
    with urllib.request.urlopen(f"http://{fabric.LOOPBACK}:{mgmt_port}/status",
                                timeout=10) as reply:
        counters = json.load(reply).get("counters", {})
    return sum(int(counters.get(name, 0)) for name in APPLIANCE_DROP_COUNTERS)


# --- the parent ---------------------------------------------------------------------------------

def measure(url: str, mode: str, args: argparse.Namespace,
            mgmt_port: int | None = None) -> dict[str, float]:
    """One run through the client API at ``url``: ``mode`` latency or throughput."""
    latency = mode == "latency"
    count = (max(1, int(args.rate * args.duration_s)) if latency else args.messages)
    sub = _child("sub" if latency else "poll", {"url": url, "expect": count})
    pub = None
    drops_before = _appliance_drops(mgmt_port)
    rcvbuf_before = _udp_rcvbuf_errors()
    try:
        sub.expect("READY")
        pub = _child("pub", {"url": url, "count": count, "size": args.size,
                             "rate": args.rate if latency else 0, "batch": args.batch})
        sub.expect("PROBED")
        time.sleep(fabric.PROBE_SETTLE_NS / 1e9)  # the probes in flight drain first
        pub.tell("GO")
        sent = pub.result()
        got = sub.result()
    finally:
        for child in (pub, sub):
            if child is not None:
                child.kill(fabric.CHILD_EXIT_GRACE_S)
    lost = got["gaps"] + max(0, count - got["received"] - got["gaps"])
    if mode == "latency":
        return {"latency_received": got["received"], "latency_lost": lost,
                "latency_duplicates": got["duplicates"],
                "latency_dropped_at_send": sent["dropped_at_send"],
                "p50_us": got["latency_p50_us"], "p99_us": got["latency_p99_us"],
                "p999_us": got["latency_p999_us"]}
    frames = {"appliance_dropped_frames": _appliance_drops(mgmt_port) - drops_before,
              "udp_rcvbuf_errors": (_udp_rcvbuf_errors() - rcvbuf_before
                                    if url.startswith("udp://") else 0)}
    messages = {"dropped_at_send": sent["dropped_at_send"], "poll_dropped": got["poll_dropped"],
                "policy_dropped": got["policy_dropped"]}
    per_frame = frame_messages(args.size)
    explained = sum(messages.values()) + sum(frames.values()) * per_frame
    return {"sent": count, "sent_msgs_per_s": sent["sent_msgs_per_s"],
            "msgs_per_s": got["msgs_per_s"], "received": got["received"], "lost": lost,
            "duplicates": got["duplicates"], **messages, **frames,
            "frame_messages": per_frame, "unreported": max(0, lost - explained)}


def _appliance(workdir: Path, ring: str, mgmt_port: int) -> fabric.Appliance:
    """bench fabric's appliance (``topicwire run``), with a shared-memory client ring too
    and its management API (its drop counters) on ``mgmt_port``."""
    return fabric.Appliance("block", workdir, shm=ring, mgmt_port=mgmt_port)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.duration_s <= 0:
        raise UserError("--duration-s must be positive", component=_COMPONENT)
    transports = TRANSPORTS if args.transport == "both" else (args.transport,)
    # the first transport's figures are "topicwire" (the report's shape); a second's its own
    names = ["topicwire", *(f"topicwire_{t}" for t in transports[1:])]
    baseline = None if args.no_baseline else "raw_hop"
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    if baseline:
        runs[baseline] = []
        runs[THROUGHPUT_BASELINE] = []
    ring = f"twbc{os.getpid()}"
    hop_args = argparse.Namespace(size=args.size, per_frame=1, batch=fabric.FABRIC_BATCH_FRAMES,
                                  messages=args.messages, rate=args.rate,
                                  duration_s=args.duration_s)
    per_frame = args.raw_per_frame
    hop_throughput_args = argparse.Namespace(**{**vars(hop_args), "per_frame": per_frame})
    mgmt_port = _free_tcp_port()
    with tempfile.TemporaryDirectory(prefix="tw-bench-client-") as tmp:
        progress(NAME, "starting the appliance (topicwire run)")
        appliance = _appliance(Path(tmp), ring, mgmt_port)
        try:
            urls = {"shm": f"shm://{ring}", "udp": f"udp://{fabric.LOOPBACK}:{appliance.port}"}
            for repeat in range(args.repeats):
                progress(NAME, f"repeat {repeat + 1}/{args.repeats}")
                for transport, name in zip(transports, names):
                    figures = measure(urls[transport], "latency", args)
                    figures.update(measure(urls[transport], "throughput", args, mgmt_port))
                    runs[name].append(figures)
                if baseline:
                    runs[baseline].append(fabric.measure("topicwire", "latency", hop_args,
                                                         appliance, None))
                    try:
                        runs[THROUGHPUT_BASELINE].append(fabric.measure(
                            "topicwire", "throughput", hop_throughput_args, appliance, None))
                    except DeviceError as exc:  # (a baseline that failed is reported)
                        progress(NAME, f"raw hop throughput run failed: {exc}")
                        runs[THROUGHPUT_BASELINE].append({"msgs_per_s": 0.0, "failed": 1.0})
        finally:
            appliance.stop()
    results = {name: fabric._medians(r) for name, r in runs.items()}
    params = {"transports": list(transports), "topicwire": transports[0],
              "rate": args.rate, "duration_s": args.duration_s, "messages": args.messages,
              "size": args.size, "repeats": args.repeats, "batch": args.batch,
              "raw_per_frame": per_frame,
              "load_avg": [round(x, 2) for x in os.getloadavg()],
              "baseline": "raw_hop: bench fabric's latency run (native frames over UDP, kernel "
                          "receive timestamp) through the same appliance", "runs": runs}
    report = build_report(NAME, params, results)
    if baseline:
        for name in names[1:]:
            for key in ("p50_us", "p99_us"):
                if results[baseline].get(key):
                    report["ratios"][f"{key} {name}/{baseline}"] = (
                        results[name][key] / results[baseline][key])
        for name in names:
            if results[THROUGHPUT_BASELINE].get("msgs_per_s"):
                report["ratios"][f"msgs_per_s {name}/{THROUGHPUT_BASELINE}"] = (
                    results[name]["msgs_per_s"] / results[THROUGHPUT_BASELINE]["msgs_per_s"])
    return report


THROUGHPUT_BASELINE = "raw_hop_throughput"


def frame_messages(size: int) -> int:
    """Messages of ``size`` bytes one publish frame of ``publish_batch`` holds."""
    from datapath.config import MAX_FRAME_BYTES
    from datapath.protocol.frame_layout import AUTH_TRAILER_BYTES, FRAME_HEADER_BYTES, align8
    from datapath.protocol.message_layout import MESSAGE_HEADER_BYTES

    room = ((MAX_FRAME_BYTES - AUTH_TRAILER_BYTES) & ~7) - FRAME_HEADER_BYTES
    return room // (MESSAGE_HEADER_BYTES + align8(size))



