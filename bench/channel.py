"""``topicwire bench channel --kind udp|mcast|shm --size 64``: two processes vs sockperf.

(``--kind rdma`` is measured against perftest instead: ``bench.channel_rdma``.)

Two figures, each measured side by side with sockperf (the UDP baseline, ``sockperf sr`` plus
``sockperf tp``/``pp`` on 127.0.0.1 only, same message size):

- throughput (``msgs_per_s``): this process sends ``--messages`` frames of ``--size`` bytes
  in batches of ``--batch`` as fast as the channel takes them; a child process receives them
  and reports the rate it *received* at (from the first send to the last frame received;
  both processes read CLOCK_MONOTONIC) and how many never came
  (``lost``; UDP drops when the receiver falls behind, the ring pushes back instead).
  ``sent_msgs_per_s`` is the sending side's rate. sockperf ``tp`` reports only its sender's
  rate: its figure appears under both names, so compare ``sent_msgs_per_s`` like for like.
- latency (``p50_us``/``p99_us``/``p999_us``): ping-pong for ``--duration-s``, one frame at a
  time echoed by the child; one-way latency is half the round trip, as sockperf ``pp``
  reports it. ``header_p50_us``/``header_p99_us`` are the child's own one-way figures from the
  frames' ``send_ts_ns`` to the kernel receive time (the channel's latency histogram).
  ``--idle block`` (default) waits in ``poll`` between frames on both ends, like sockperf's
  default epoll; ``--idle spin`` busy-polls (``receive`` with no wait, in a loop: the appliance
  agents' ``BusySpinIdle``) on both ends, and sockperf runs with ``--nonblocked`` (its busy
  ``recvfrom`` loop) so the baseline idles the same way.

Frames carry a native header (``frame_len`` = size, ``send_ts_ns`` stamped by the channel) and
an opaque body, so a 64-byte frame is the same datagram as sockperf's 64-byte message.
Multicast runs on loopback with ``IP_MULTICAST_IF=127.0.0.1`` and TTL 0; nothing leaves the
host. Figures are medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from bench import channel_rdma
from bench.report import build_report, positive_int
from datapath.config import BENCH_REPEATS
from datapath.errors import DeviceError, UserError

NAME = "channel"
HELP = "channel msgs/s and one-way latency between two processes vs sockperf (UDP, loopback)"

KINDS = ("udp", "mcast", "shm", "rdma")
IDLES = ("block", "spin")
BENCH_MESSAGES = 200_000
"""Frames per throughput run."""
BENCH_BATCH_FRAMES = 64
BENCH_DURATION_S = 2.0
"""Length of each ping-pong run (sockperf's -t, rounded up to whole seconds for it)."""
WARMUP_PINGS = 500
RECEIVE_IDLE_END_NS = 500_000_000
"""The throughput receiver stops after this long without a frame."""
CHILD_START_TIMEOUT_S = 60.0
MCAST_GROUPS = ("239.255.77.1", "239.255.77.2")
"""Administratively scoped groups used on loopback (there and back)."""
LOOPBACK = "127.0.0.1"
SOCKPERF = "sockperf"
STOP_STREAM_ID = 0xFFFF_FFFF
"""A ping with this stream id tells the echoing child to stop."""
_COMPONENT = "bench"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=KINDS, default="udp", help="channel kind")
    parser.add_argument("--size", type=_size, default=64,
                        help="bytes per frame (= sockperf's --msg-size); a multiple of 8, >= 32")
    parser.add_argument("--messages", type=positive_int, default=BENCH_MESSAGES,
                        help="frames per throughput run")
    parser.add_argument("--batch", type=positive_int, default=BENCH_BATCH_FRAMES,
                        help="frames per send call")
    parser.add_argument("--duration-s", type=float, default=BENCH_DURATION_S,
                        help="seconds of each ping-pong run")
    parser.add_argument("--repeats", type=positive_int, default=BENCH_REPEATS)
    parser.add_argument("--idle", choices=IDLES, default="block",
                        help="between ping-pong frames: wait in poll (block) or busy-poll "
                             "(spin); sockperf idles the same way")
    channel_rdma.add_arguments(parser)



def _size(text: str) -> int:
    value = int(text)
    if value < 32 or value % 8 or value > 65_504:
        raise argparse.ArgumentTypeError("frame size must be a multiple of 8 in [32, 65504] "
                                         "(a native frame header is 32 bytes)")
    return value


# --- frames --------------------------------------------------------------------------------

def _bench_batch(count: int, size: int, stream_id: int = 1):  # noqa: ANN202 - FrameBatch
    from channels.base import FrameBatch
    from datapath.protocol import frame_layout as fl

    batch = FrameBatch(count, max(size, 64))
    header = fl.FRAME_HEADER_STRUCT.pack(fl.FRAME_MAGIC, fl.PROTOCOL_VERSION, fl.FrameType.DATA,
                                         0, 1, size, 1, 0, stream_id, 0)
    frame = header + bytes(size - len(header))
    for _ in range(count):
        batch.append(frame)
    return batch


# --- channels on both ends -----------------------------------------------------------------

def _open(kind: str, role: str, spec: dict[str, Any]):  # noqa: ANN202 - Channel
    """The channel of ``role`` (``parent`` or ``child``) for ``kind``; ``spec`` is shared."""
    from channels.multicast import MulticastChannel
    from channels.shm import ShmChannel
    from channels.udp import UdpChannel

    mine, theirs = (0, 1) if role == "child" else (1, 0)
    if kind == "udp":
        return UdpChannel(bind=(LOOPBACK, 0))
    if kind == "shm":  # each end consumes its own ring; connect() claims the other's
        return ShmChannel(rx=spec["rings"][mine], ring_bytes=spec["ring_bytes"])
    if kind == "mcast":
        return _McastPair(MulticastChannel(MCAST_GROUPS[mine], spec["mcast_port"],
                                           interface=LOOPBACK, ttl=0),
                          MulticastChannel(MCAST_GROUPS[theirs], spec["mcast_port"],
                                           interface=LOOPBACK, ttl=0, join=False))
    raise UserError(f"unknown channel kind {kind!r}", component=_COMPONENT)


class _McastPair:
    """Receive on one group, send to the other: a two-way path made of two multicast channels."""

    def __init__(self, rx: Any, tx: Any) -> None:
        self.rx, self.tx = rx, tx
        self.stats = rx.stats

    def receive(self, batch: Any, timeout_ns: int = 0) -> int:
        return self.rx.receive(batch, timeout_ns)

    def send(self, frames: Any, dest: Any = None) -> int:
        return self.tx.send(frames)

    def close(self) -> None:
        self.tx.close()
        self.rx.close()


# --- the child process ---------------------------------------------------------------------

def _child_main(argv: list[str]) -> None:
    """Entry of the child: ``throughput`` (count what arrives) or ``echo`` (ping-pong)."""
    mode, kind, spec = argv[0], argv[1], json.loads(argv[2])
    import channels
    from channels.base import EACH_SLOT, FrameBatch

    channels.warm_up()
    channel = _open(kind, "child", spec)
    try:
        port = channel.local_address[1] if kind == "udp" else 0
        batch = FrameBatch(BENCH_BATCH_FRAMES, max(spec["size"], 64))
        print(f"READY {port}", flush=True)
        if kind == "shm":  # the parent made its ring before starting this child
            channel.connect(spec["rings"][1])
        if mode == "throughput":
            print(json.dumps(count_frames(channel, batch, spec["messages"])), flush=True)
        else:
            dest = EACH_SLOT if kind == "udp" else None
            print(json.dumps(echo(channel, batch, dest, spec["idle"] == "spin")), flush=True)
    finally:
        channel.close()


def count_frames(channel: Any, batch: Any, messages: int,
                 idle_end_ns: int = RECEIVE_IDLE_END_NS) -> dict[str, int]:
    """Receive until ``messages`` frames came or none for ``idle_end_ns``: how many, and when
    the last one came (CLOCK_MONOTONIC, the sender's clock too)."""
    received, last = 0, 0
    while received < messages:
        n = channel.receive(batch, idle_end_ns if received else
                            int(CHILD_START_TIMEOUT_S * 1e9))
        if not n:
            break
        received += n
        last = time.monotonic_ns()
    return {"received": received, "last_ns": last}


def echo(channel: Any, batch: Any, dest: Any, spin: bool) -> dict[str, int]:
    """Send every batch back until the stop ping; the channel's own one-way figures."""
    while True:
        if not _receive(channel, batch, int(CHILD_START_TIMEOUT_S * 1e9), spin):
            break
        if int.from_bytes(bytes(batch.frame(0)[20:24]), "big") == STOP_STREAM_ID:
            break
        channel.send(batch, dest)
    stats = channel.stats
    return {"header_p50_ns": stats.latency_ns_at(50), "header_p99_ns": stats.latency_ns_at(99)}


def _receive(channel: Any, batch: Any, timeout_ns: int, spin: bool) -> int:
    """One receive that waits up to ``timeout_ns``: in ``poll`` or, with ``spin``, busy."""
    if not spin:
        return channel.receive(batch, timeout_ns)
    deadline = time.monotonic_ns() + timeout_ns
    while True:
        n = channel.receive(batch, 0)
        if n or time.monotonic_ns() > deadline:
            return n


class _Child:
    def __init__(self, mode: str, kind: str, spec: dict[str, Any]) -> None:
        code = "import sys; from bench.channel import _child_main; _child_main(sys.argv[1:])"
        self.proc = subprocess.Popen([sys.executable, "-c", code, mode, kind, json.dumps(spec)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            self.proc.kill()
            raise DeviceError(f"the {kind} {mode} child did not start: "
                              f"{line}{self.proc.stderr.read()[-2000:]}", component=_COMPONENT)
        self.port = int(line.split()[1])

    def result(self) -> dict[str, Any]:
        try:
            out, err = self.proc.communicate(timeout=CHILD_START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise DeviceError("the benchmark child did not finish", component=_COMPONENT) \
                from None
        if self.proc.returncode != 0:
            raise DeviceError(f"the benchmark child failed: {err[-2000:]}", component=_COMPONENT)
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    return {"size": args.size, "messages": args.messages, "idle": args.idle,
            "rings": [f"bench-{tag}-a", f"bench-{tag}-b"], "ring_bytes": 1 << 20,
            "mcast_port": _free_udp_port()}


def _connect(kind: str, spec: dict[str, Any], child: _Child, parent: Any) -> Any:
    """The parent's destination for sends (UDP) after the child is up; attaches shm rings."""
    if kind == "udp":
        return (LOOPBACK, child.port)
    if kind == "shm":
        parent.connect(spec["rings"][0])
    return None


def _cleanup_rings(spec: dict[str, Any]) -> None:
    from channels.shm import ring_path

    for name in spec["rings"]:
        try:
            os.unlink(ring_path(name))
        except FileNotFoundError:
            pass


def measure_throughput(args: argparse.Namespace) -> dict[str, float]:
    """One throughput run: frames sent here, counted by the child."""
    if args.kind == "rdma":
        return channel_rdma.measure_throughput(args)
    import channels

    channels.warm_up()
    spec = _spec(args)
    parent = _open(args.kind, "parent", spec)
    child = None
    try:
        child = _Child("throughput", args.kind, spec)
        dest = _connect(args.kind, spec, child, parent)
        time.sleep(0.05)
        sent, start, elapsed = send_all(parent, dest, args)
        got = child.result()
    finally:
        if child is not None:
            child.kill()
        parent.close()
        _cleanup_rings(spec)
    return throughput_figures(sent, start, elapsed, got)


def send_all(channel: Any, dest: Any, args: argparse.Namespace) -> tuple[int, int, int]:
    """Send ``args.messages`` frames in batches as fast as the channel takes them:
    (sent, start ns, elapsed ns)."""
    batch = _bench_batch(args.batch, args.size)
    sent = 0
    start = time.monotonic_ns()
    while sent < args.messages:
        batch.count = min(args.batch, args.messages - sent)
        taken = channel.send(batch, dest)
        sent += taken
        if taken < batch.count:
            time.sleep(0)
    return sent, start, max(time.monotonic_ns() - start, 1)


def throughput_figures(sent: int, start: int, elapsed: int, got: dict) -> dict[str, float]:
    """Receiver's rate (first send to last frame received), sender's rate, frames lost."""
    span = max(got["last_ns"] - start, 1)
    received = got["received"]
    return {"msgs_per_s": received * 1e9 / span,
            "sent_msgs_per_s": sent * 1e9 / elapsed, "lost": float(sent - received)}


def measure_latency(args: argparse.Namespace) -> dict[str, float]:
    """One ping-pong run: half round trips, in microseconds."""
    if args.kind == "rdma":
        return channel_rdma.measure_latency(args)
    spec = _spec(args)
    parent = _open(args.kind, "parent", spec)
    child = None
    try:
        child = _Child("echo", args.kind, spec)
        dest = _connect(args.kind, spec, child, parent)
        histogram = ping_pong(parent, dest, args)
        child_figures = child.result()
    finally:
        if child is not None:
            child.kill()
        parent.close()
        _cleanup_rings(spec)
    return latency_figures(histogram, child_figures)


def ping_pong(channel: Any, dest: Any, args: argparse.Namespace, *,
              warmup: int = WARMUP_PINGS) -> Any:
    """Ping-pong one frame at a time for ``args.duration_s`` after ``warmup`` pings; the
    HdrHistogram of half round trips (ns). Ends with the stop ping."""
    from hdrh.histogram import HdrHistogram

    from channels.base import FrameBatch

    ping = _bench_batch(1, args.size)
    pong = FrameBatch(BENCH_BATCH_FRAMES, max(args.size, 64))
    histogram = HdrHistogram(1, 60_000_000_000, 3)
    timeout_ns = int(CHILD_START_TIMEOUT_S * 1e9) // 10
    end = None
    pings = 0
    while end is None or time.perf_counter_ns() < end:
        t0 = time.perf_counter_ns()
        ping.count = 1
        if channel.send(ping, dest) != 1:
            continue
        if not _receive(channel, pong, timeout_ns, args.idle == "spin"):
            raise DeviceError(f"{args.kind}: a ping got no answer (lost?); rerun",
                              component=_COMPONENT)
        pings += 1
        if pings == warmup:
            end = time.perf_counter_ns() + int(args.duration_s * 1e9)
        elif pings > warmup:
            histogram.record_value(max((time.perf_counter_ns() - t0) // 2, 1))
    stop = _bench_batch(1, args.size, stream_id=STOP_STREAM_ID)
    while channel.send(stop, dest) != 1:
        time.sleep(0)
    return histogram


def latency_figures(histogram: Any, child_figures: dict) -> dict[str, float]:
    """Percentiles of the half round trips and the echoing end's header figures, in us."""
    return {"p50_us": histogram.get_value_at_percentile(50) / 1e3,
            "p99_us": histogram.get_value_at_percentile(99) / 1e3,
            "p999_us": histogram.get_value_at_percentile(99.9) / 1e3,
            "header_p50_us": child_figures["header_p50_ns"] / 1e3,
            "header_p99_us": child_figures["header_p99_ns"] / 1e3}


# --- sockperf ------------------------------------------------------------------------------

def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _sockperf_path() -> str:
    path = shutil.which(SOCKPERF)
    if path is None:
        raise UserError("sockperf is not installed; `make setup` installs it "
                        "(Debian package sockperf)", component=_COMPONENT)
    return path


def measure_sockperf(args: argparse.Namespace) -> dict[str, float]:
    """sockperf tp and pp against a sockperf sr on 127.0.0.1, same size and duration."""
    exe = _sockperf_path()
    port = _free_udp_port()
    seconds = str(max(1, math.ceil(args.duration_s)))
    idle = ["--nonblocked"] if args.idle == "spin" else []  # sockperf's busy recvfrom loop
    server = subprocess.Popen([exe, "sr", "-i", LOOPBACK, "-p", str(port), *idle],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in server.stdout:
            if "block on socket" in line or "listen on" in line.lower():
                break
        time.sleep(0.1)
        client = [exe, "-i", LOOPBACK, "-p", str(port), "-m", str(args.size), "-t", seconds]
        tp = _run_sockperf([client[0], "tp", *client[1:]])
        pp = _run_sockperf([client[0], "pp", *client[1:], *idle])
    finally:
        server.kill()
        server.communicate()
    rate = _grab(r"Message Rate is ([\d.]+)", tp)
    return {"msgs_per_s": rate, "sent_msgs_per_s": rate,
            "p50_us": _grab(r"percentile 50\.000 =\s+([\d.]+)", pp),
            "p99_us": _grab(r"percentile 99\.000 =\s+([\d.]+)", pp),
            "p999_us": _grab(r"percentile 99\.900 =\s+([\d.]+)", pp)}


def _run_sockperf(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise DeviceError(f"{' '.join(cmd)} failed: {done.stderr[-1000:]}", component=_COMPONENT)
    return done.stdout + done.stderr


def _grab(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    if match is None:
        raise DeviceError(f"sockperf's output has no {pattern!r}; is it version 3.x?",
                          component=_COMPONENT)
    return float(match.group(1))


# --- the report ----------------------------------------------------------------------------

def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure topicwire's channel and sockperf ``--repeats`` times each; medians."""
    if args.kind == "rdma":
        return channel_rdma.run(args)
    if args.duration_s <= 0:
        raise UserError("--duration-s must be positive", component=_COMPONENT)
    _sockperf_path()
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for repeat in range(args.repeats):
        print(f"bench channel: repeat {repeat + 1}/{args.repeats}", file=sys.stderr)
        ours.append({**measure_throughput(args), **measure_latency(args)})
        theirs.append(measure_sockperf(args))
    params = {"kind": args.kind, "size": args.size, "messages": args.messages,
              "batch": args.batch, "duration_s": args.duration_s, "repeats": args.repeats,
              "idle": args.idle,
              "baseline": "sockperf sr + tp/pp, UDP 127.0.0.1, same size"
                          + (", --nonblocked" if args.idle == "spin" else ""),
              "note": "sockperf tp reports its sender's rate (also under msgs_per_s); "
                      "topicwire msgs_per_s is the receiver's rate"}
    return build_report(NAME, params, {"topicwire": _medians(ours), "sockperf": _medians(theirs)})
