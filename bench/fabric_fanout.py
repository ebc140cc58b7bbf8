"""``topicwire bench fabric --publishers N --subscribers M``: fan-out through one hop.

N publishers, each on its own topic (``bench/fabric/fanout/<i>``), and M subscribers, each
subscribed to all N topics, on 127.0.0.1, through the same hops as bench/fabric.py:

    N publisher sockets --UDP--> hop --UDP--> M subscriber sockets

- ``topicwire``: ``topicwire run`` (bench.fabric.Appliance). Every publisher socket logs in
  as a client session of its own and registers its topic; every subscriber socket logs in
  as a session of its own and subscribes to the N topics, so the appliance frames every
  message for each of the M subscriber sessions.
- ``c_relay``: bench/c/udp_relay.c given the M subscriber ports: every datagram it receives
  goes to each of them (the same delivery work, without parsing or routing).

Processes: **one publisher process drives the N publisher sockets and one subscriber process
holds the M subscriber sockets** (each socket its own session with the appliance), the same
two processes for both hops (not measured the other way: reasoned). 16 + 16 processes on the
2-core machine this runs on would likely measure mostly the scheduler (every process wakes
for every message it handles, and the hop would wait for a core behind them); one process per
role keeps the measuring side to what the single-pair bench has. What that costs: the
publishers' messages leave one after another (which a total rate spread over N publishers
does anyway), and a subscriber's datagrams may wait in its socket while the process reads
another's; latency is taken at the kernel's
receive timestamp (SO_TIMESTAMPNS) of each datagram, so that wait is not in the figure.
For the same reason the subscriber process reads its sockets every ``SUB_READ_INTERVAL_NS``
(1 ms: what came to each socket in one call) rather than waking for each datagram: at 10,000
msgs/s to 16 subscribers up to 160,000 datagrams/s arrive, and every CPU second it spends is
taken from the hop on 2 cores. Measured on the loaded 2-core machine (2-s latency runs, both
hops, 8 runs each way): 0.5 to 1.2 CPU seconds per run read every 1 ms, 0.6 to 1.4 woken by
epoll for each datagram (about 20 % more); the latency figures moved far more with the
machine's other load than with this. Its socket buffers (4 MiB asked) hold far more than
1 ms of either hop's traffic.

- latency: ``--rate`` messages/s in all for ``--duration-s``, one message per frame, sent by
  the publishers in turn (message i by publisher i mod N); p50/p99/p99.9 of publish time to
  the kernel receive time, merged over every message at every subscriber.
- throughput: ``--messages`` messages in all (rounded up to whole frames per publisher), the
  publishers sending ``--batch`` frames each in turn as fast as they can; ``msgs_per_s`` is
  what the subscribers received, summed, from the first send to the last receive; ``lost``
  what some subscriber never got (sent times M, less received, plus duplicates).

Sequence numbers are unique over the run: publisher p sends ``p * K + 1`` to ``p * K + K``
(K its message count), in order, so each subscriber finds duplicates and losses with one
bitmap (bench/_fabric_kernels.py ``account``, one array set per subscriber). Probes (first
payload byte not 0) go from every publisher until every subscriber has one on every topic.
"""

from __future__ import annotations

import argparse
import json
import math
import select
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import fabric
from bench.fabric import (
    CHILD_EXIT_GRACE_S,
    LOOPBACK,
    PROBE_FLAG,
    PROBE_INTERVAL_NS,
    PROBE_SETTLE_NS,
    STEP_TIMEOUT_S,
    SUB_BATCH_FRAMES,
    SUB_DRAIN_IDLE_NS,
    SUB_RECEIVE_TIMEOUT_NS,
    SUB_SLOT_BYTES,
    _Child,
    _Frames,
    _stdin_line,
)
from bench.procstat import appliance_cpu_seconds
from bench.report import build_report, progress
from datapath.errors import DeviceError, UserError

TOPIC_PREFIX = "bench/fabric/fanout/"
"""Publisher i publishes on ``TOPIC_PREFIX + str(i)``."""
FANOUT_MAX_PEERS = 64
"""Publishers or subscribers at most (the relay's RELAY_MAX_DESTS)."""
SESSIONS_PER_CLIENT = 2
"""``clients.max_sessions`` of the appliance: this many per publisher and subscriber (room for
the last measurement's sessions while their logouts are still on the way)."""
SUB_READ_INTERVAL_NS = 1_000_000
"""The subscriber process reads its M sockets this often (then everything that came), instead
of waking for every datagram."""
HOPS = ("topicwire", "c_relay")
REPORTED = ("msgs_per_s", "sent_msgs_per_s", "lost", "duplicates", "frames_per_msg",
            "p50_us", "p99_us", "p999_us", "latency_lost", "latency_hop_cpu_us_per_delivery")
"""The figures in the report (medians); the others stay in ``params["runs"]``, among them the
CPU seconds of the publisher, the subscriber and the hop process (``hop_cpu_s``: all the
appliance's threads, its idle spinning included, or the relay) from GO to the subscriber's
result, and the hop's CPU per delivered message (``hop_cpu_us_per_delivery``)."""
GOALS = {"p50_us topicwire/c_relay": ("<=", 1.2), "p999_us topicwire/c_relay": ("<=", 2.0),
         "msgs_per_s topicwire/c_relay": (">=", 0.8)}
"""Issue 15's goals at N = M = 16, 10,000 msgs/s: reported with the figures, not asserted."""
_COMPONENT = "bench"


def topic(i: int) -> str:
    return f"{TOPIC_PREFIX}{i}"


def plan(spec: dict[str, Any]) -> tuple[int, int]:
    """``(total, per_publisher)``: messages sent in all, and the sequence block K of each
    publisher (latency: message i by publisher i mod N; throughput: whole frames)."""
    n = spec["publishers"]
    if spec["mode"] == "latency":
        total = max(1, int(spec["rate"] * spec["duration_s"]))
        return total, math.ceil(total / n)
    per_frame = spec["per_frame"]
    per_publisher = math.ceil(spec["messages"] / (n * per_frame)) * per_frame
    return n * per_publisher, per_publisher


# --- the child processes -----------------------------------------------------------------------

def _request_all(channel: Any, batch: Any, ftype: Any, entries: list, session: int) -> None:
    """Send ``entries`` in one request frame and wait for one accepted result per entry."""
    from datapath.protocol import admin_layout as al
    from datapath.protocol import frame_layout as fl
    from datapath.protocol.codec import decode_frame

    fabric._admin(channel, ftype, entries, session)
    answers = 0
    deadline = time.monotonic() + STEP_TIMEOUT_S / 4
    while answers < len(entries):
        if time.monotonic() > deadline:
            raise DeviceError(f"the appliance answered {answers} of {len(entries)} requests "
                              f"within {STEP_TIMEOUT_S / 4} s", component=_COMPONENT)
        for i in range(channel.receive(batch, SUB_RECEIVE_TIMEOUT_NS)):
            frame = decode_frame(batch.frame(i).tobytes())
            if frame.header.frame_type is not fl.FrameType.CONTROL:
                continue
            for entry in frame.admin()[1]:
                if entry.kind is al.ControlKind.REQUEST_RESULT:
                    doc = json.loads(entry.document)
                    if not doc.get("accepted"):
                        raise DeviceError(f"the appliance refused {doc.get('request')}: "
                                          f"{doc.get('reason')}", component=_COMPONENT)
                    answers += 1


def _publisher(spec: dict[str, Any]) -> None:
    """N sockets, each its own session and topic; PROBE, GO, then the measurement."""
    import channels
    from channels.base import FrameBatch
    from channels.udp import UdpChannel
    from datapath.protocol import admin_layout as al
    from datapath.protocol import frame_layout as fl
    from datapath.topics.registry import KeyRegistry

    channels.warm_up()
    fabric._precise_sleep()
    n = spec["publishers"]
    registry = KeyRegistry()
    chans = [UdpChannel((LOOPBACK, 0), dest=(LOOPBACK, spec["port"]), name=f"bench-pub{i}")
             for i in range(n)]
    sessions = [0] * n
    try:
        batch = FrameBatch(8, SUB_SLOT_BYTES)
        for i, channel in enumerate(chans):
            if spec["login"]:
                sessions[i] = fabric._login(channel, batch)
                key = registry.key_of(topic(i), 0)
                fabric._request(channel, batch, fl.FrameType.REGISTRY_UPDATE,
                                [al.RegistryEntry(key, 0, topic(i))], sessions[i],
                                {"version": 0})
        latency = spec["mode"] == "latency"
        per_frame = 1 if latency else spec["per_frame"]
        frames = 1 if latency else spec["batch"]
        keys = [registry.key_of(topic(i), 0) for i in range(n)]
        data = [_Frames(frames, per_frame, spec["size"], sessions[i], keys[i], 0)
                for i in range(n)]
        probes = [_Frames(1, 1, spec["size"], sessions[i], keys[i], PROBE_FLAG)
                  for i in range(n)]
        print("READY", flush=True)
        if _stdin_line(STEP_TIMEOUT_S) != "PROBE":
            raise SystemExit("bench fabric: expected PROBE")
        cpu_ready = _cpu_s()
        rounds = 0
        while True:
            for channel, probe in zip(chans, probes):
                probe.stamp(1, 0, time.time_ns())
                fabric._send_all(channel, probe.batch, 1)
            rounds += 1
            if _stdin_line(PROBE_INTERVAL_NS / 1e9) == "GO":
                break
        time.sleep(PROBE_SETTLE_NS / 1e9)
        total, per_publisher = plan(spec)
        if latency:
            result = _paced(chans, data, total, per_publisher, spec["rate"])
        else:
            result = _blast(chans, data, per_publisher)
        result["probes"] = rounds * n
        result["cpu_s"] = _cpu_s() - cpu_ready
        print(json.dumps(result), flush=True)
        # log out once the subscribers are done: right after a full-rate blast the hop's
        # socket is still full and the logouts were lost (stale sessions piled up)
        _stdin_line(STEP_TIMEOUT_S)
    finally:
        _log_out(chans, sessions)


def _log_out(chans: list, sessions: list[int]) -> None:
    """Log every session out and close its socket (a socket closes even if its logout
    fails)."""
    for channel, session in zip(chans, sessions):
        try:
            fabric._logout(channel, session)
        finally:
            channel.close()


def _cpu_s() -> float:
    """CPU seconds this process has used (user and system)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _blast(chans: list, data: list, per_publisher: int) -> dict[str, Any]:
    """Every publisher ``per_publisher`` messages: ``--batch`` frames from each in turn."""
    per_frame = data[0].per_frame
    frames_total = per_publisher // per_frame
    sent_frames = 0
    start = time.monotonic_ns()
    while sent_frames < frames_total:
        frames = min(data[0].batch.capacity, frames_total - sent_frames)
        for p, (channel, frames_p) in enumerate(zip(chans, data)):
            frames_p.stamp(frames, p * per_publisher + sent_frames * per_frame + 1,
                           time.time_ns())
            fabric._send_all(channel, frames_p.batch, frames)
        sent_frames += frames
    end = time.monotonic_ns()
    return {"sent": len(chans) * frames_total * per_frame, "start_ns": start, "end_ns": end}


def _paced(chans: list, data: list, total: int, per_publisher: int,
           rate: int) -> dict[str, Any]:
    """``total`` one-message frames at ``rate`` in all, message i from publisher i mod N."""
    interval = 1e9 / rate
    n = len(chans)
    start = time.monotonic_ns()
    for i in range(total):
        due = start + int(i * interval)
        fabric.wait_until_ns(due)
        p = i % n
        data[p].stamp(1, p * per_publisher + i // n + 1, time.time_ns())
        fabric._send_all(chans[p], data[p].batch, 1)
    return {"sent": total, "start_ns": start, "end_ns": time.monotonic_ns()}


def _subscriber(spec: dict[str, Any]) -> None:
    """M sockets, each its own session subscribed to the N topics; accounts every burst with
    ``_fabric_kernels.account`` into that subscriber's arrays; FLOWING once every subscriber
    has a probe from every topic; stops once told the sent count and everything (or nothing
    for ``SUB_DRAIN_IDLE_NS``) came."""
    import numpy as np
    from hdrh.histogram import HdrHistogram

    import channels
    from bench import _fabric_kernels
    from channels.base import FrameBatch
    from channels.udp import UdpChannel
    from datapath.protocol import admin_layout as al
    from datapath.protocol import frame_layout as fl
    from datapath.protocol.batch import decode_frames, new_message_batch
    from datapath.topics.registry import KeyRegistry

    channels.warm_up()
    n_pub, m = spec["publishers"], spec["subscribers"]
    dest = (LOOPBACK, spec["port"]) if spec["login"] else None
    chans = [UdpChannel((LOOPBACK, 0), dest=dest, name=f"bench-sub{j}") for j in range(m)]
    sessions = [0] * m
    batch = FrameBatch(SUB_BATCH_FRAMES, SUB_SLOT_BYTES)
    out = new_message_batch(65_536)
    status = np.zeros(SUB_BATCH_FRAMES, np.uint8)
    types = np.zeros(SUB_BATCH_FRAMES, np.uint8)
    latency = spec["mode"] == "latency"
    total, per_publisher = plan(spec)
    seen = [np.zeros(n_pub * per_publisher + 2, dtype=bool) for _ in range(m)]
    latencies = [np.zeros(total + 2 if latency else 0, np.int64) for _ in range(m)]
    totals = [np.zeros(_fabric_kernels.TOTAL_WORDS, np.int64) for _ in range(m)]
    wanted = {KeyRegistry().key_of(topic(i), 0) for i in range(n_pub)}
    probed: list[set[int]] = [set() for _ in range(m)]
    malformed = 0
    first_ns = last_ns = 0
    by_fd = {channel.fileno(): j for j, channel in enumerate(chans)}
    try:
        for j, channel in enumerate(chans):
            if spec["login"]:
                sessions[j] = fabric._login(channel, batch)
                _request_all(channel, batch, fl.FrameType.SUBSCRIBE,
                             [al.Subscription(i + 1, 0, 0, 0, topic(i)) for i in range(n_pub)],
                             sessions[j])
        poller = select.epoll()
        for fd in by_fd:
            poller.register(fd, select.EPOLLIN)
        print("READY " + " ".join(str(c.local_address[1]) for c in chans), flush=True)
        cpu_ready = _cpu_s()
        sent = None
        flowing = False
        received = 0
        idle_since = time.monotonic_ns()
        loops = 0
        while True:
            time.sleep(SUB_READ_INTERVAL_NS / 1e9)
            events = poller.poll(0)
            now = time.monotonic_ns()
            loops += 1
            for fd, _ in events:
                j = by_fd[fd]
                n = chans[j].receive(batch, 0)
                done = 0
                while done < n:
                    res = decode_frames(batch.buf, batch.offsets[done:n], batch.lengths[done:n],
                                        out, status, types)
                    step = max(res.frames, 1)
                    malformed += int(np.count_nonzero(status[:step]))
                    if res.messages:
                        _fabric_kernels.account(batch.buf, out, res.messages, batch.recv_ts_ns,
                                                done, seen[j], latencies[j], totals[j])
                        if not flowing:
                            msgs = out[:res.messages]
                            probe = batch.buf[msgs["payload_offset"]] != 0
                            probed[j].update(msgs["topic_key"][probe].tolist())
                    done += step
                    if done == n == batch.capacity:  # a full batch: there may be more
                        n, done = chans[j].receive(batch, 0), 0
            if events:
                now_received = sum(int(t[_fabric_kernels.RECEIVED]) for t in totals)
                if now_received != received:  # measured messages came
                    received = now_received
                    first_ns = first_ns or now
                    last_ns = now
                if not flowing and all(wanted <= keys for keys in probed):
                    flowing = True
                    print("FLOWING", flush=True)
                idle_since = now
            if sent is None and (not events or loops % 64 == 0):
                line = _stdin_line(0)
                if line is not None and line.startswith("END"):
                    sent = int(line.split()[1])
                    idle_since = max(idle_since, now)  # the drain's quiet counts from END
            if sent is not None and (received >= sent * m
                                     or now - idle_since > SUB_DRAIN_IDLE_NS):
                break
        poller.close()
        histogram = HdrHistogram(1, fabric.LATENCY_HIGHEST_NS, 3)
        for j in range(m):
            for value in latencies[j][: totals[j][_fabric_kernels.SAMPLES]].tolist():
                if 0 < value <= fabric.LATENCY_HIGHEST_NS:
                    histogram.record_value(value)
        count = histogram.get_total_count()

        def at(p: float) -> float:
            return histogram.get_value_at_percentile(p) / 1e3 if count else 0.0

        per_sub = [int(t[_fabric_kernels.RECEIVED] - t[_fabric_kernels.DUPLICATES])
                   for t in totals]
        print(json.dumps({
            "received": received,
            "duplicates": sum(int(t[_fabric_kernels.DUPLICATES]) for t in totals),
            "frames": sum(int(t[_fabric_kernels.FRAMES]) for t in totals),
            "distinct_per_subscriber": per_sub, "malformed": malformed,
            "probes": sum(int(t[_fabric_kernels.PROBES]) for t in totals),
            "first_ns": first_ns, "last_ns": last_ns, "p50_us": at(50), "p99_us": at(99),
            "p999_us": at(99.9), "samples": count, "cpu_s": _cpu_s() - cpu_ready}), flush=True)
    finally:
        _log_out(chans, sessions)


def _child_main(argv: list[str]) -> None:
    """Entry of a child process: ``pub SPEC`` or ``sub SPEC`` (JSON)."""
    role, spec = argv[0], json.loads(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    {"pub": _publisher, "sub": _subscriber}[role](spec)


_CHILD_CODE = ("import sys; from bench.fabric_fanout import _child_main; "
               "_child_main(sys.argv[1:])")


def _child(role: str, spec: dict[str, Any]) -> _Child:
    return _Child([sys.executable, "-c", _CHILD_CODE, role, json.dumps(spec)],
                  {"pub": "publisher process", "sub": "subscriber process"}[role])


# --- the parent ----------------------------------------------------------------------------------

def measure(hop: str, mode: str, args: argparse.Namespace, appliance: fabric.Appliance | None,
            relay: Path | None) -> dict[str, float]:
    """One measurement (``mode`` throughput or latency) through ``hop`` with the N publishers
    and M subscribers."""
    m = args.subscribers
    base = {"mode": mode, "size": args.size, "per_frame": args.per_frame, "batch": args.batch,
            "messages": args.messages, "rate": args.rate, "duration_s": args.duration_s,
            "publishers": args.publishers, "subscribers": m, "login": hop == "topicwire"}
    children: list[_Child] = []
    relay_child = None
    finished = False
    try:
        sub = _child("sub", {**base, "port": appliance.port if appliance else 0})
        children.append(sub)
        sub_ports = sub.expect("READY").split()[1:]
        if hop == "topicwire":
            assert appliance is not None
            port = appliance.port
        else:
            assert relay is not None
            relay_child = _Child([str(relay), "0", LOOPBACK, *sub_ports], "C relay",
                                 stdin=False, nice=args.priority)
            port = int(relay_child.expect("READY").split()[1])
        pub = _child("pub", {**base, "port": port})
        children.append(pub)
        pub.expect("READY")
        pub.tell("PROBE")
        sub.expect("FLOWING")
        hop_pid = appliance.child.proc.pid if hop == "topicwire" else relay_child.proc.pid
        hop_cpu_s = -appliance_cpu_seconds(hop_pid)
        pub.tell("GO")
        sent = pub.result()
        sub.tell(f"END {sent['sent']}")
        got = sub.result()
        hop_cpu_s += appliance_cpu_seconds(hop_pid)
        pub.tell("BYE")
        finished = True
    finally:
        for child in children:  # a client killed before its logout stays a session
            child.kill(CHILD_EXIT_GRACE_S if finished else 0.0)
        relay_counts = None
        if relay_child is not None:
            relay_child.proc.send_signal(signal.SIGTERM)
            try:
                relay_counts = relay_child.result()
            except DeviceError:
                relay_counts = None
            relay_child.kill()
    if got["received"] == 0:
        raise DeviceError(f"{hop}: the subscribers received none of {sent['sent']} messages "
                          f"({mode}; publisher {sent}, subscribers {got})", component=_COMPONENT)
    prefix = "" if mode == "throughput" else "latency_"
    expected = sent["sent"] * m
    per_sub = got["distinct_per_subscriber"]
    figures = {prefix + "sent": float(sent["sent"]), prefix + "expected": float(expected),
               prefix + "received": float(got["received"]),
               prefix + "lost": float(expected - got["received"] + got["duplicates"]),
               prefix + "duplicates": float(got["duplicates"]),
               prefix + "min_subscriber_received": float(min(per_sub)),
               prefix + "max_subscriber_received": float(max(per_sub)),
               prefix + "publisher_cpu_s": float(sent["cpu_s"]),
               prefix + "subscriber_cpu_s": float(got["cpu_s"]),
               prefix + "hop_cpu_s": hop_cpu_s,
               prefix + "hop_cpu_us_per_delivery": hop_cpu_s * 1e6 / max(got["received"], 1)}
    if mode == "throughput":
        span = max(got["last_ns"] - sent["start_ns"], 1)
        figures.update(msgs_per_s=got["received"] * 1e9 / span,
                       sent_msgs_per_s=sent["sent"] * 1e9 / max(sent["end_ns"] - sent["start_ns"],
                                                                 1),
                       frames_per_msg=got["frames"] / got["received"])
        if relay_counts is not None:
            figures["relay_datagrams_in"] = float(relay_counts["datagrams_in"])
            figures["relay_datagrams_out"] = float(relay_counts["datagrams_out"])
    else:
        figures.update(p50_us=got["p50_us"], p99_us=got["p99_us"], p999_us=got["p999_us"],
                       latency_samples=float(got["samples"]))
    return figures


def _wait_no_sessions(mgmt_port: int) -> None:
    """Wait until the appliance holds no client session (every client logged out), so no
    stale subscriber takes copies in the next measurement."""
    import urllib.request

    deadline = time.monotonic() + STEP_TIMEOUT_S / 4
    while True:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{mgmt_port}/status",
                                    timeout=10) as reply:
            left = len(json.load(reply)["clients"])
        if left == 0:
            return
        if time.monotonic() > deadline:
            raise DeviceError(f"{left} client sessions stayed at the appliance after a "
                              "measurement (their logouts were lost)", component=_COMPONENT)
        time.sleep(0.05)


def _check(args: argparse.Namespace) -> None:
    if args.duration_s <= 0:
        raise UserError("--duration-s must be positive", component=_COMPONENT)
    for flag, value in (("--publishers", args.publishers), ("--subscribers", args.subscribers)):
        if value > FANOUT_MAX_PEERS:
            raise UserError(f"{flag} {value}: at most {FANOUT_MAX_PEERS} (the C relay's "
                            "destinations)", component=_COMPONENT)
    if (getattr(args, "direct", False) or getattr(args, "control_load", False)
            or getattr(args, "isolate", False)):
        raise UserError("--direct, --control-load and --isolate measure one publisher and "
                        "one subscriber: drop them, or --publishers/--subscribers",
                        component=_COMPONENT)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both hops ``--repeats`` times, throughput and latency each, with N publishers and M
    subscribers; medians."""
    _check(args)
    relay = fabric.build_relay()
    runs: dict[str, list[dict[str, float]]] = {h: [] for h in HOPS}
    sessions = min(400, max(16, SESSIONS_PER_CLIENT * (args.publishers + args.subscribers)))
    with tempfile.TemporaryDirectory(prefix="tw-bench-fanout-") as tmp:
        progress(fabric.NAME, "starting the appliance (topicwire run)")
        mgmt_port = fabric._free_tcp_port()
        appliance = fabric.Appliance(args.idle, Path(tmp), args.idle_spin_us, args.priority,
                                     switch_us=getattr(args, "switch_interval_us", None),
                                     max_sessions=sessions, mgmt_port=mgmt_port)
        try:
            for repeat in range(args.repeats):
                for hop in HOPS:
                    progress(fabric.NAME, f"repeat {repeat + 1}/{args.repeats}: {hop}, "
                             f"{args.publishers} publishers x {args.subscribers} subscribers")
                    figures = {}
                    for mode in ("throughput", "latency"):
                        figures.update(measure(hop, mode, args, appliance, relay))
                        if hop == "topicwire":
                            _wait_no_sessions(mgmt_port)
                    runs[hop].append(figures)
        finally:
            code = appliance.stop()
        if code != 0:
            raise DeviceError(f"the appliance exited with {code} at the end of the run",
                              component=_COMPONENT)
    results = {h: {k: statistics.median(r[k] for r in rs) for k in REPORTED}
               for h, rs in runs.items()}
    report = build_report(fabric.NAME, _params(args, runs), results)
    report["params"]["goals"] = {
        name: {"goal": f"{op} {bound}", "measured": report["ratios"].get(name),
               "met": (name in report["ratios"]
                       and (report["ratios"][name] <= bound if op == "<="
                            else report["ratios"][name] >= bound))}
        for name, (op, bound) in GOALS.items()}
    return report


def _params(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]
            ) -> dict[str, Any]:
    return {"transport": args.transport, "publishers": args.publishers,
            "subscribers": args.subscribers, "messages": args.messages, "size": args.size,
            "per_frame": args.per_frame, "batch": args.batch, "rate": args.rate,
            "duration_s": args.duration_s, "repeats": args.repeats, "idle": args.idle,
            "idle_spin_us": args.idle_spin_us, "priority": args.priority,
            "switch_interval_us": getattr(args, "switch_interval_us", None),
            "processes": "one publisher process with N sockets (a session each), one "
                         "subscriber process with M sockets (a session each), the same for "
                         "both hops",
            "baseline": "c_relay: bench/c/udp_relay.c (recvmmsg/sendmmsg, blocking), every "
                        "datagram sent to each of the M subscribers, at the appliance's "
                        "--priority",
            "latency": f"{args.rate} msg/s in all (message i from publisher i mod N), one "
                       "message per frame, publish timestamp to each subscriber's kernel "
                       "receive timestamp, merged over the subscribers",
            "throughput": "msgs_per_s: messages received by the subscribers, summed, per "
                          "second from the first send to the last receive; lost: sent x M "
                          "less received (plus duplicates)",
            "runs": runs}
