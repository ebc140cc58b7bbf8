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
from bench.channel_loops import (
    _COMPONENT,
    BENCH_BATCH_FRAMES,
    CHILD_START_TIMEOUT_S,
    count_frames,
    echo,
    latency_figures,
    ping_pong,
    send_all,
    throughput_figures,
)
from bench.report import build_report, positive_int
from datapath.config import BENCH_REPEATS
from datapath.errors import DeviceError, UserError

NAME = "channel"
HELP = "channel msgs/s and one-way latency between two processes vs sockperf (UDP, loopback)"

KINDS = ("udp", "mcast", "shm", "rdma")
IDLES = ("block", "spin")
BENCH_MESSAGES = 200_000
"""Frames per throughput run."""
BENCH_DURATION_S = 2.0
"""Length of each ping-pong run (sockperf's -t, rounded up to whole seconds for it)."""
MCAST_GROUPS = ("239.255.77.1", "239.255.77.2")
"""Administratively scoped groups used on loopback (there and back)."""
LOOPBACK = "127.0.0.1"
SOCKPERF = "sockperf"


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
