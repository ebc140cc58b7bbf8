"""``topicwire bench fabric --transport udp``: one appliance hop vs a C UDP relay.

Three processes per measurement, the same publisher and subscriber for every hop:

    publisher --UDP--> hop --UDP--> subscriber          (all on 127.0.0.1)

- ``topicwire``: the hop is an appliance, ``topicwire run`` with a generated config (one
  client UDP endpoint, anonymous P&M), started once per benchmark run. The publisher and
  the subscriber log in as clients (the client protocol of docs/appliance.md), the
  subscriber subscribes to the topic, the publisher registers it; every message then goes
  through the appliance's data path (classify, software NIC tables, per-destination framing).
- ``c_relay`` (the baseline): ``bench/c/udp_relay.c``, a plain recvmmsg/sendmmsg relay that
  forwards every datagram unchanged to the subscriber; built here with the system C compiler
  (``cc -O2``) into ``$XDG_CACHE_HOME/topicwire/bench`` (by default ``~/.cache``), once per
  source version.
- ``direct`` (reference, with ``--direct``): no hop, the publisher sends to the subscriber:
  what the publisher and subscriber themselves can do on this machine.

The publisher sends native DATA frames of ``--per-frame`` messages (``--size`` payload bytes,
one topic). Before each measurement it sends probe messages until the subscriber has one
(the hop's tables are in place and its code is warm); probes are not counted.

- throughput (``msgs_per_s``): ``--messages`` messages as fast as the publisher can send them
  (``--batch`` frames per sendmmsg); the subscriber's rate from the first send to the last
  message received (both processes read CLOCK_MONOTONIC). ``lost`` counts messages that
  never arrived (UDP drops when a hop or the subscriber falls behind), ``duplicates`` those
  that arrived twice; ``sent_msgs_per_s`` is the publisher's rate.
- latency (``p50_us``/``p99_us``/``p999_us``): ``--rate`` messages per second for
  ``--duration-s``, one message per frame, from the publish timestamp in the message
  (CLOCK_REALTIME at send) to the kernel's receive timestamp of the datagram at the
  subscriber (SO_TIMESTAMPNS), so the subscriber's own wake-up is not in the figure.

Figures are medians over ``--repeats``; each repeat measures every hop, one after another.
The relay forwards frames as they come, so at one message per frame its subscriber handles
one datagram per message and may be what bounds ``c_relay``'s rate (``--direct`` shows what
the subscriber takes without a hop); the appliance reframes (``frames_per_msg``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.procstat import appliance_cpu_seconds
from bench.report import build_report, positive_int, progress
from datapath.config import BENCH_REPEATS
from datapath.errors import DeviceError, UserError

NAME = "fabric"
HELP = ("one appliance hop (publisher -> topicwire run -> subscriber, separate processes) "
        "msgs/s and latency vs a C recvmmsg/sendmmsg UDP relay")

TRANSPORTS = ("udp",)
FABRIC_MESSAGES = 200_000
"""Messages per throughput run."""
FABRIC_SIZE_BYTES = 64
"""Payload bytes per message."""
FABRIC_BATCH_FRAMES = 64
"""Frames per sendmmsg of the throughput publisher."""
FABRIC_RATE_PER_S = 10_000
"""Messages per second of the latency run."""
FABRIC_DURATION_S = 2.0
"""Seconds of each latency run."""
PROBE_INTERVAL_NS = 5_000_000
"""The publisher sends a probe this often until the subscriber has seen one."""
PROBE_SETTLE_NS = 100_000_000
"""After the last probe, the publisher waits this long before measuring (probes drain)."""
SUB_DRAIN_IDLE_NS = 500_000_000
"""Once the publisher is done, the subscriber stops after this long without a message."""
SUB_RECEIVE_TIMEOUT_NS = 50_000_000
"""One receive call of the subscriber waits at most this long."""
SUB_SLOT_BYTES = 65_504
"""The subscriber's receive slots hold the largest frame an appliance sends to a client."""
SUB_BATCH_FRAMES = 64
STEP_TIMEOUT_S = 120.0
"""A child that does not answer a step within this long has failed."""
CHILD_EXIT_GRACE_S = 10.0
"""After its result a publisher or subscriber logs out of the appliance and exits; it is
killed only if it has not within this long (killed at once, its session stayed at the
appliance and every later message went to it too: one more subscriber per measurement)."""
PACE_SPIN_NS = 20_000
"""The latency publisher sleeps until this close to the next send, then spins (a spinning
publisher would take one of the few cores the hop and the subscriber need)."""
LATENCY_HIGHEST_NS = 60_000_000_000
PR_SET_TIMERSLACK = 29
PUBLISHER_TIMER_SLACK_NS = 1_000
"""The publisher's timer slack (``_precise_sleep``)."""
LOOPBACK = "127.0.0.1"
TOPIC = "bench/fabric/t"
IDENTITY = "bench"
PROBE_FLAG = 1
"""First payload byte of probe messages (measured messages carry 0)."""
RELAY_SOURCE = Path(__file__).resolve().parent / "c" / "udp_relay.c"
RELAY_CFLAGS = ("-O2", "-Wall")
HOPS = ("topicwire", "c_relay", "direct")
LOADED = "topicwire_control_load"
"""The result of the latency run through the appliance under ``--control-load``..."""
ELSEWHERE = "topicwire_load_elsewhere"
"""...and through the same appliance while the same load goes to a second appliance on the
host (its data path and control plane on the clients' CPUs): what the load does to the
host's clients and kernel alone, the reference that tells the appliance's own share."""
_COMPONENT = "bench"
CONTROL_LOAD_REQUESTS_PER_S = 1_000
"""``--control-load``: subscribe/unsubscribe requests per second a client sends the
appliance (each waits for its answer, as an application's would)..."""
CONTROL_LOAD_STATUS_PER_S = 100
"""...while another thread reads ``/status`` from its management API this often."""
CONTROL_LOAD_PATTERNS = 100
"""The load client subscribes and unsubscribes these many patterns in turn."""
SCRAPED_IN_PROCESS = "topicwire_in_process"
"""``--scrape-hz``: the latency run through the appliance whose management API is on a thread
of its own process (``mgmt.process = false``), quiet..."""
QUIET_PROCESS = "topicwire_process"
"""...the same through the appliance whose API runs in a process of its own, quiet (measured
next to its scraped run, as the in-process pair is)..."""
SCRAPED = {True: "topicwire_scrape_process", False: "topicwire_scrape_in_process"}
"""...and through each appliance while its management API is scraped: with the API in its
own process (``mgmt.process = true``, the default), and on a thread of the appliance's."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transport", choices=TRANSPORTS, default="udp",
                        help="how clients reach the hop (udp: loopback UDP)")
    parser.add_argument("--messages", type=positive_int, default=FABRIC_MESSAGES,
                        help="messages per throughput run")
    parser.add_argument("--size", type=_size, default=FABRIC_SIZE_BYTES,
                        help="payload bytes per message (>= 1)")
    parser.add_argument("--per-frame", type=positive_int, default=1,
                        help="messages per publisher frame in the throughput run")
    parser.add_argument("--batch", type=positive_int, default=FABRIC_BATCH_FRAMES,
                        help="frames per send call of the throughput publisher")
    parser.add_argument("--rate", type=positive_int, default=FABRIC_RATE_PER_S,
                        help="messages per second of the latency run")
    parser.add_argument("--duration-s", type=float, default=FABRIC_DURATION_S,
                        help="seconds of each latency run")
    parser.add_argument("--repeats", type=positive_int, default=BENCH_REPEATS)
    parser.add_argument("--idle", choices=("block", "busy", "backoff", "sleep"), default="block",
                        help="the appliance's data-path idle strategy (appliance.idle)")
    parser.add_argument("--idle-spin-us", type=int, default=None,
                        help="the appliance's appliance.idle_spin_us (default: its own)")
    parser.add_argument("--priority", type=int, default=None,
                        help="the appliance's appliance.priority, the data-path thread's nice "
                             "value, and the C relay's nice value, so both hops run at the "
                             "same priority (default: the appliance's own, 0; below 0 needs "
                             "root)")
    parser.add_argument("--switch-interval-us", type=int, default=None,
                        help="the appliance's appliance.switch_interval_us (its interpreter "
                        "switch interval; default Python's 5,000)")
    parser.add_argument("--dataplane", choices=("process", "thread"), default=None,
                        help="the appliance's appliance.dataplane: its data path in a process "
                        "of its own, or on a thread beside the control plane (default: the "
                        "appliance's own, process)")
    parser.add_argument("--isolate", action="store_true",
                        help="run the hop (the appliance's data path, appliance.dataplane_cpus; "
                        "the C relay) alone on the last CPU, and every other process of the "
                        "bench (publisher, subscriber, load, the appliance's control plane) on "
                        "the others, as an appliance host with a core for its data path")
    parser.add_argument("--control-load", action="store_true",
                        help=f"also measure latency while a client sends "
                        f"{CONTROL_LOAD_REQUESTS_PER_S:,} subscribe/unsubscribe requests per "
                        f"second and /status is read {CONTROL_LOAD_STATUS_PER_S} times a "
                        "second (result topicwire_control_load)")
    parser.add_argument("--scrape-hz", type=int, default=0, metavar="N",
                        help="also measure latency while /status and /metrics are each read N "
                        "times a second from the appliance's management API, with the API in a "
                        "process of its own (mgmt.process = true) and on a thread of the "
                        "appliance (mgmt.process = false, a second appliance), side by side "
                        f"(results {SCRAPED[True]}, {SCRAPED[False]}, {SCRAPED_IN_PROCESS})")
    parser.add_argument("--direct", action="store_true",
                        help="also measure publisher -> subscriber without a hop (reference)")
    parser.add_argument("--publishers", type=positive_int, default=1,
                        help="publishers, each on its own topic; above 1 (or with "
                        "--subscribers above 1) the fan-out bench (bench/fabric_fanout.py)")
    parser.add_argument("--subscribers", type=positive_int, default=1,
                        help="subscribers, each subscribed to every publisher's topic; the "
                        "C relay sends every datagram to each of them")


def _size(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 8_192:
        raise argparse.ArgumentTypeError("payload size must be in [1, 8192] bytes")
    return value


# --- the C relay -----------------------------------------------------------------------------

def cache_dir() -> Path:
    """Where the relay binary is kept: ``$XDG_CACHE_HOME/topicwire/bench``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "topicwire" / "bench"


def build_relay(directory: Path | None = None) -> Path:
    """Compile ``udp_relay.c`` with the system compiler unless this version is built."""
    source = RELAY_SOURCE.read_bytes()
    digest = hashlib.blake2b(source + " ".join(RELAY_CFLAGS).encode(),
                             digest_size=8).hexdigest()
    directory = directory or cache_dir()
    exe = directory / f"udp_relay-{digest}"
    if exe.is_file() and os.access(exe, os.X_OK):
        return exe
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise UserError("no C compiler to build the relay baseline; install one (Debian: "
                        "apt-get install gcc) or set CC", component=_COMPONENT)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".udp_relay-{digest}.{os.getpid()}"
    done = subprocess.run([cc, *RELAY_CFLAGS, "-o", str(tmp), str(RELAY_SOURCE)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise DeviceError(f"{cc} could not build {RELAY_SOURCE}: {done.stderr[-2000:]}",
                          component=_COMPONENT)
    os.replace(tmp, exe)
    return exe


# --- the child processes: publisher and subscriber --------------------------------------------

def _wait_for(channel: Any, batch: Any, kind: Any, timeout_s: float) -> dict[str, Any]:
    """The next CONTROL document of ``kind`` the appliance sends (login/request results)."""
    from datapath.protocol import frame_layout as fl
    from datapath.protocol.codec import decode_frame

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        n = channel.receive(batch, SUB_RECEIVE_TIMEOUT_NS)
        for i in range(n):
            frame = decode_frame(batch.frame(i).tobytes())
            if frame.header.frame_type is not fl.FrameType.CONTROL:
                continue
            for entry in frame.admin()[1]:
                if entry.kind is kind:
                    return json.loads(entry.document)
    raise DeviceError(f"the appliance did not answer ({kind.name}) within {timeout_s} s",
                      component=_COMPONENT)


def _admin(channel: Any, ftype: Any, entries: list, session: int = 0,
           body_header: dict | None = None) -> None:
    from channels.base import FrameBatch
    from datapath.protocol.codec import encode_admin

    frame = encode_admin(ftype, entries, body_header=body_header, source_session=session,
                         send_ts_ns=time.time_ns())
    batch = FrameBatch(1, max(64, (len(frame) + 7) // 8 * 8))
    batch.append(frame)
    if channel.send(batch) != 1:
        raise DeviceError("could not send to the appliance", component=_COMPONENT)


def _login(channel: Any, batch: Any, identity: str = IDENTITY) -> int:
    from datapath.protocol import admin_layout as al
    from datapath.protocol import frame_layout as fl

    _admin(channel, fl.FrameType.CONTROL, [al.Control(al.ControlKind.LOGIN, json.dumps(
        {"identity": identity, "ring": None}))])
    doc = _wait_for(channel, batch, al.ControlKind.LOGIN_RESULT, STEP_TIMEOUT_S / 4)
    if not doc.get("accepted"):
        raise DeviceError(f"the appliance refused the login: {doc.get('reason')}",
                          component=_COMPONENT)
    return int(doc["session"])


def _request(channel: Any, batch: Any, ftype: Any, entries: list, session: int,
             body_header: dict | None = None) -> None:
    from datapath.protocol import admin_layout as al

    _admin(channel, ftype, entries, session, body_header)
    doc = _wait_for(channel, batch, al.ControlKind.REQUEST_RESULT, STEP_TIMEOUT_S / 4)
    if not doc.get("accepted"):
        raise DeviceError(f"the appliance refused {doc.get('request')}: {doc.get('reason')}",
                          component=_COMPONENT)


def _logout(channel: Any, session: int) -> None:
    from datapath.protocol import admin_layout as al
    from datapath.protocol import frame_layout as fl

    if session:
        _admin(channel, fl.FrameType.CONTROL, [al.Control(al.ControlKind.LOGOUT, json.dumps(
            {"reason": "benchmark done"}))], session)


def _stdin_line(timeout_s: float) -> str | None:
    ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
    if not ready:
        return None
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("bench fabric: the parent went away")
    return line.strip()


class _Frames:
    """``frames`` DATA frames of ``per_frame`` messages each, built once; sequence numbers and
    timestamps are rewritten in place before each send."""

    def __init__(self, frames: int, per_frame: int, size: int, session: int, key: int,
                 flag: int) -> None:
        import numpy as np

        from channels.base import FrameBatch
        from datapath.protocol import message_layout as ml
        from datapath.protocol.codec import FrameWriter

        msg_bytes = ml.message_bytes(size)
        frame_bytes = 32 + per_frame * msg_bytes
        self.batch = FrameBatch(frames, max(64, frame_bytes))
        payload = bytes([flag]) + bytes(size - 1)
        writer = FrameWriter(memoryview(self.batch.buf), 0, frame_bytes)
        for i in range(frames):
            writer.begin(source_session=session, stream_id=session,
                         offset=int(self.batch.offsets[i]))
            for _ in range(per_frame):
                writer.append(key, 0, 0, payload)
            self.batch.lengths[i] = writer.finish(0)
        self.batch.count = frames
        starts = (self.batch.offsets[:frames, None] + 32
                  + np.arange(per_frame)[None, :] * msg_bytes).reshape(-1)
        self.seq_at = starts + ml.SEQUENCE_OFFSET
        self.ts_at = starts + ml.PUBLISH_TS_OFFSET
        self.per_frame = per_frame

    def stamp(self, frames: int, first_seq: int, ts_ns: int) -> None:
        from bench import _fabric_kernels

        _fabric_kernels.stamp(self.batch.buf, self.seq_at, self.ts_at, frames * self.per_frame,
                              first_seq, ts_ns)


def _precise_sleep() -> None:
    """This process's sleeps end within microseconds of when they should (timer slack 1 us,
    prctl(2)): with the default 50 us the paced publisher's sleeps overshot by ~56 us, so
    at 10,000 msgs/s its messages left irregularly instead of one every 100 us."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, PUBLISHER_TIMER_SLACK_NS,
                                               0, 0, 0) != 0:
        raise DeviceError(f"prctl(PR_SET_TIMERSLACK): {os.strerror(ctypes.get_errno())}",
                          component=_COMPONENT)


def _send_all(channel: Any, batch: Any, count: int) -> None:
    """Send frames 0..count of ``batch``, waiting while the socket buffer is full."""
    taken = 0
    while taken < count:
        k = channel.send((batch.buf, batch.offsets[taken:count], batch.lengths[taken:count],
                          count - taken))
        taken += k
        if taken < count:
            time.sleep(0)


def _publisher(spec: dict[str, Any]) -> None:
    import channels
    from channels.base import FrameBatch
    from channels.udp import UdpChannel
    from datapath.protocol import admin_layout as al
    from datapath.protocol import frame_layout as fl
    from datapath.topics.registry import KeyRegistry

    channels.warm_up()
    _precise_sleep()
    target = (LOOPBACK, spec["port"])
    channel = UdpChannel((LOOPBACK, 0), dest=target, name="bench-pub")
    batch = FrameBatch(8, SUB_SLOT_BYTES)
    key = KeyRegistry().key_of(TOPIC, 0)
    session = 0
    try:
        if spec["login"]:
            session = _login(channel, batch)
            _request(channel, batch, fl.FrameType.REGISTRY_UPDATE,
                     [al.RegistryEntry(key, 0, TOPIC)], session, {"version": 0})
        latency = spec["mode"] == "latency"
        per_frame = 1 if latency else spec["per_frame"]
        frames = 1 if latency else spec["batch"]
        data = _Frames(frames, per_frame, spec["size"], session, key, 0)
        probe = _Frames(1, 1, spec["size"], session, key, PROBE_FLAG)
        print("READY", flush=True)
        if _stdin_line(STEP_TIMEOUT_S) != "PROBE":
            raise SystemExit("bench fabric: expected PROBE")
        probes = 0
        while True:
            probe.stamp(1, 0, time.time_ns())
            _send_all(channel, probe.batch, 1)
            probes += 1
            if _stdin_line(PROBE_INTERVAL_NS / 1e9) == "GO":
                break
        time.sleep(PROBE_SETTLE_NS / 1e9)
        if latency:
            total = max(1, int(spec["rate"] * spec["duration_s"]))
            result = _paced(channel, data, total, spec["rate"])
        else:
            result = _blast(channel, data, spec["messages"])
        result["probes"] = probes
        print(json.dumps(result), flush=True)
    finally:
        try:
            _logout(channel, session)
        finally:
            channel.close()


def _blast(channel: Any, data: _Frames, messages: int) -> dict[str, Any]:
    per_frame = data.per_frame
    frames_total = math.ceil(messages / per_frame)
    sent_frames = 0
    start = time.monotonic_ns()
    while sent_frames < frames_total:
        frames = min(data.batch.capacity, frames_total - sent_frames)
        data.stamp(frames, sent_frames * per_frame + 1, time.time_ns())
        _send_all(channel, data.batch, frames)
        sent_frames += frames
    end = time.monotonic_ns()
    return {"sent": sent_frames * per_frame, "start_ns": start, "end_ns": end}


def wait_until_ns(due: int) -> None:
    """Until ``time.monotonic_ns()`` reaches ``due``: sleeps (precise with
    ``_precise_sleep``), then spins the last ``PACE_SPIN_NS`` (a paced publisher)."""
    while True:
        left = due - time.monotonic_ns()
        if left <= 0:
            return
        if left > PACE_SPIN_NS:
            time.sleep((left - PACE_SPIN_NS) / 1e9)


def _paced(channel: Any, data: _Frames, total: int, rate: int) -> dict[str, Any]:
    interval = 1e9 / rate
    start = time.monotonic_ns()
    for i in range(total):
        due = start + int(i * interval)
        wait_until_ns(due)
        data.stamp(1, i + 1, time.time_ns())
        _send_all(channel, data.batch, 1)
    return {"sent": total, "start_ns": start, "end_ns": time.monotonic_ns()}


def _subscriber(spec: dict[str, Any]) -> None:
    import numpy as np
    from hdrh.histogram import HdrHistogram

    import channels
    from bench import _fabric_kernels
    from channels.base import FrameBatch
    from channels.udp import UdpChannel
    from datapath.protocol import admin_layout as al
    from datapath.protocol import frame_layout as fl
    from datapath.protocol.batch import decode_frames, new_message_batch

    channels.warm_up()
    dest = (LOOPBACK, spec["port"]) if spec["login"] else None
    channel = UdpChannel((LOOPBACK, 0), dest=dest, name="bench-sub")
    batch = FrameBatch(SUB_BATCH_FRAMES, SUB_SLOT_BYTES)
    out = new_message_batch(65_536)
    status = np.zeros(SUB_BATCH_FRAMES, np.uint8)
    types = np.zeros(SUB_BATCH_FRAMES, np.uint8)
    session = 0
    latency = spec["mode"] == "latency"
    expected = (max(1, int(spec["rate"] * spec["duration_s"])) if latency
                else math.ceil(spec["messages"] / spec["per_frame"]) * spec["per_frame"])
    seen = np.zeros(expected + 2, dtype=bool)
    latencies = np.zeros(expected + 2 if latency else 0, np.int64)
    totals = np.zeros(_fabric_kernels.TOTAL_WORDS, np.int64)
    received = malformed = probes = 0
    first_ns = last_ns = 0
    try:
        if spec["login"]:
            session = _login(channel, batch)
            _request(channel, batch, fl.FrameType.SUBSCRIBE,
                     [al.Subscription(1, 0, 0, 0, TOPIC)], session)
        print(f"READY {channel.local_address[1]}", flush=True)
        sent = None
        flowing = False
        idle_since = time.monotonic_ns()
        loops = 0
        while True:
            n = channel.receive(batch, SUB_RECEIVE_TIMEOUT_NS)
            now = time.monotonic_ns()
            loops += 1
            if n:
                done = 0
                while done < n:
                    res = decode_frames(batch.buf, batch.offsets[done:n], batch.lengths[done:n],
                                        out, status, types)
                    step = max(res.frames, 1)
                    malformed += int(np.count_nonzero(status[:step]))
                    if res.messages:
                        _fabric_kernels.account(batch.buf, out, res.messages, batch.recv_ts_ns,
                                                done, seen, latencies, totals)
                    done += step
                probes = int(totals[_fabric_kernels.PROBES])
                if totals[_fabric_kernels.RECEIVED] != received:  # measured messages came
                    received = int(totals[_fabric_kernels.RECEIVED])
                    first_ns = first_ns or now
                    last_ns = now
                if not flowing and probes:
                    flowing = True
                    print("FLOWING", flush=True)
                idle_since = now
            if sent is None and (not n or loops % 64 == 0):
                line = _stdin_line(0)
                if line is not None and line.startswith("END"):
                    sent = int(line.split()[1])
            if sent is not None and (received >= sent or now - idle_since > SUB_DRAIN_IDLE_NS):
                break
        histogram = HdrHistogram(1, LATENCY_HIGHEST_NS, 3)
        for value in latencies[: totals[_fabric_kernels.SAMPLES]].tolist():
            if 0 < value <= LATENCY_HIGHEST_NS:
                histogram.record_value(value)
        count = histogram.get_total_count()

        def at(p: float) -> float:
            return histogram.get_value_at_percentile(p) / 1e3 if count else 0.0

        print(json.dumps({"received": received,
                          "duplicates": int(totals[_fabric_kernels.DUPLICATES]),
                          "frames": int(totals[_fabric_kernels.FRAMES]),
                          "malformed": malformed, "probes": probes, "first_ns": first_ns,
                          "last_ns": last_ns, "p50_us": at(50), "p99_us": at(99),
                          "p999_us": at(99.9), "samples": histogram.get_total_count()}), flush=True)
    finally:
        try:
            _logout(channel, session)
        finally:
            channel.close()


def _control_load(spec: dict[str, Any]) -> None:
    """``--control-load``: SUBSCRIBE/UNSUBSCRIBE requests at ``CONTROL_LOAD_REQUESTS_PER_S``
    from one logged-in session (sent at that pace, answers counted as they come: an
    application with many subscriptions in flight) and ``/status`` reads at
    ``CONTROL_LOAD_STATUS_PER_S``, until told ``STOP``; prints what it made."""
    import threading
    import urllib.request

    from channels.base import FrameBatch
    from channels.udp import UdpChannel
    from datapath.protocol import admin_layout as al
    from datapath.protocol import frame_layout as fl
    from datapath.protocol.codec import decode_frame

    stop = threading.Event()
    counts = {"requests": 0, "answers": 0, "status_reads": 0}

    def poll_status() -> None:
        url = f"http://{LOOPBACK}:{spec['mgmt_port']}/status"
        period = 1 / CONTROL_LOAD_STATUS_PER_S
        next_at = time.monotonic()
        while not stop.is_set():
            with urllib.request.urlopen(url, timeout=10) as answer:
                answer.read()
            counts["status_reads"] += 1
            next_at += period
            stop.wait(max(0.0, next_at - time.monotonic()))

    def count_answers(batch: FrameBatch) -> None:
        for i in range(channel.receive(batch, 0)):
            frame = decode_frame(batch.frame(i).tobytes())
            if frame.header.frame_type is fl.FrameType.CONTROL:
                counts["answers"] += sum(1 for e in frame.admin()[1]
                                         if e.kind is al.ControlKind.REQUEST_RESULT)

    channel = UdpChannel((LOOPBACK, 0), dest=(LOOPBACK, spec["port"]), name="bench-load")
    batch = FrameBatch(SUB_BATCH_FRAMES, SUB_SLOT_BYTES)
    session = _login(channel, batch)
    poller = threading.Thread(target=poll_status, daemon=True)
    poller.start()
    print("READY", flush=True)
    period = 1 / CONTROL_LOAD_REQUESTS_PER_S
    next_at = time.monotonic()
    i = 0
    try:
        while _stdin_line(0) is None:
            n = i % CONTROL_LOAD_PATTERNS
            add = (i // CONTROL_LOAD_PATTERNS) % 2 == 0
            entry = al.Subscription(n + 1, 0, 0, 0, f"bench/load/{n}/#")
            _admin(channel, fl.FrameType.SUBSCRIBE if add else fl.FrameType.UNSUBSCRIBE,
                   [entry], session)
            counts["requests"] += 1
            i += 1
            count_answers(batch)
            next_at += period
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        deadline = time.monotonic() + STEP_TIMEOUT_S / 4
        while counts["answers"] < counts["requests"] and time.monotonic() < deadline:
            count_answers(batch)
            time.sleep(0.001)
    finally:
        stop.set()
        poller.join(10)
        _logout(channel, session)
        channel.close()
    print(json.dumps(counts), flush=True)


def _scrape(spec: dict[str, Any]) -> None:
    """``--scrape-hz``: ``GET /status`` and ``GET /metrics`` of the management API at
    ``spec["mgmt_port"]``, each ``spec["hz"]`` times a second (one connection per request, as
    a Prometheus scraper and ``topicwire status`` make), until told ``STOP``; prints what it
    made then, and when told ``COUNT``, what it made so far."""
    import urllib.error
    import urllib.request

    counts = {"status_reads": 0, "metrics_reads": 0, "errors": 0}
    base = f"http://{LOOPBACK}:{spec['mgmt_port']}"
    period = 1 / spec["hz"]
    print("READY", flush=True)
    next_at = time.monotonic()
    while True:
        line = _stdin_line(0)
        if line == "COUNT":
            print(json.dumps(counts), flush=True)
        elif line is not None:
            break
        for path, key in (("/status", "status_reads"), ("/metrics", "metrics_reads")):
            try:
                with urllib.request.urlopen(base + path, timeout=10) as answer:
                    answer.read()
                counts[key] += 1
            except (OSError, urllib.error.URLError):
                counts["errors"] += 1
        next_at += period
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            next_at = time.monotonic()  # behind: do not burst to catch up
    print(json.dumps(counts), flush=True)


def _child_main(argv: list[str]) -> None:
    """Entry of a child process: ``pub SPEC``, ``sub SPEC``, ``load SPEC`` or ``scrape SPEC``
    (JSON)."""
    role, spec = argv[0], json.loads(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    {"pub": _publisher, "sub": _subscriber, "load": _control_load, "scrape": _scrape}[role](spec)


# --- the parent: processes and measurements --------------------------------------------------

class _Child:
    """A process that talks in lines: ``expect`` a line that starts with a word, ``tell``."""

    def __init__(self, argv: list[str], what: str, stdin: bool = True,
                 nice: int | None = None, cpus: set[int] | None = None) -> None:
        """``nice``: the process's nice value (setpriority(2) before it starts); ``cpus``:
        the CPUs it may run on (default: the bench's)."""
        self.what = what

        def place() -> None:
            if nice is not None:
                os.setpriority(os.PRIO_PROCESS, 0, nice)
            if cpus:
                os.sched_setaffinity(0, cpus)

        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=None if nice is None and not cpus else place)

    def expect(self, word: str, timeout_s: float = STEP_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    break
                if line.startswith(word):
                    return line.strip()
            elif self.proc.poll() is not None:
                break
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            err = (self.proc.communicate(timeout=10)[1] or "")[-3000:]
        except (subprocess.TimeoutExpired, ValueError):
            err = ""
        raise DeviceError(f"the {self.what} did not say {word!r} (exit {self.proc.returncode})"
                          f": {err}", component=_COMPONENT)

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        return json.loads(self.expect("{"))

    def kill(self, grace_s: float = 0.0) -> None:
        """Stop the process: it may end by itself within ``grace_s`` (a client logs out of
        the appliance after its result), else it is killed."""
        if grace_s > 0:
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.communicate(timeout=10)
        except (subprocess.TimeoutExpired, ValueError):
            pass


_CHILD_CODE = "import sys; from bench.fabric import _child_main; _child_main(sys.argv[1:])"


def _child(role: str, spec: dict[str, Any]) -> _Child:
    return _Child([sys.executable, "-c", _CHILD_CODE, role, json.dumps(spec)],
                  {"pub": "publisher", "sub": "subscriber", "load": "control load",
                   "scrape": "scraper"}[role])


class Appliance:
    """``topicwire run`` with a generated config: one client UDP endpoint on loopback."""

    def __init__(self, idle: str, workdir: Path, spin_us: int | None = None,
                 priority: int | None = None, mgmt_port: int | None = None,
                 switch_us: int | None = None, max_sessions: int = 16,
                 mgmt_process: bool | None = None, name: str = "appliance",
                 dataplane: str | None = None, dataplane_cpus: set[int] | None = None,
                 shm: str | None = None) -> None:
        """``mgmt_port``: the appliance's management API on 127.0.0.1 at that port (none by
        default), ``mgmt_process`` its ``mgmt.process`` (default: the appliance's own);
        ``max_sessions``: its ``clients.max_sessions``; ``name``: its config file's name;
        ``shm``: a shared-memory client ring of that name too (``clients.shm``)."""
        from channels.udp import UdpChannel

        probe = UdpChannel((LOOPBACK, 0))
        self.port = probe.local_address[1]
        probe.close()
        self.config = workdir / f"{name}.toml"
        self.config.write_text(
            f'[appliance]\nname = "bench-fabric"\nidle = "{idle}"\n'
            + ("" if spin_us is None else f"idle_spin_us = {spin_us}\n")
            + ("" if priority is None else f"priority = {priority}\n")
            + ("" if switch_us is None else f"switch_interval_us = {switch_us}\n")
            + ("" if dataplane is None else f'dataplane = "{dataplane}"\n')
            + ("" if not dataplane_cpus else f"dataplane_cpus = {sorted(dataplane_cpus)}\n") +
            f'[clients]\nudp = "{LOOPBACK}:{self.port}"\nmax_sessions = {max_sessions}\n'
            + ("" if shm is None else f'shm = "{shm}"\n') +
            'session_dead_ms = 3600000\n[pm]\nanonymous = true\n'
            'require_passwords = false\n[log]\nlevel = "warning"\n'
            + ("" if mgmt_port is None else f'[mgmt]\nlisten = "{LOOPBACK}:{mgmt_port}"\n')
            + ("" if mgmt_port is None or mgmt_process is None else
               f"process = {str(mgmt_process).lower()}\n"))
        code = "import sys; from appliance.ops.cli import main; sys.exit(main(sys.argv[1:]))"
        self.child = _Child([sys.executable, "-c", code, "run", "--config", str(self.config)],
                            "appliance (topicwire run)", stdin=False)
        self.child.expect("topicwire: appliance")

    def stop(self) -> int:
        proc = self.child.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.child.kill()
        return proc.returncode


def _isolate(args: argparse.Namespace) -> None:
    """``--isolate``: this process (and every child it starts from now on) leaves the last
    CPU to the hop; ``_hop_cpus`` names it."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise UserError(f"--isolate needs at least 2 CPUs; this process may use {cpus}",
                        component=_COMPONENT)
    args.hop_cpus = {cpus[-1]}
    os.sched_setaffinity(0, set(cpus[:-1]))


def _hop_cpus(args: argparse.Namespace) -> set[int] | None:
    """The CPUs of the hop under ``--isolate`` (None otherwise)."""
    return getattr(args, "hop_cpus", None)


def measure(hop: str, mode: str, args: argparse.Namespace, appliance: Appliance | None,
            relay: Path | None) -> dict[str, float]:
    """One measurement (``mode`` throughput or latency) through ``hop``."""
    base = {"mode": mode, "size": args.size, "per_frame": args.per_frame, "batch": args.batch,
            "messages": args.messages, "rate": args.rate, "duration_s": args.duration_s,
            "login": hop == "topicwire"}
    children: list[_Child] = []
    relay_child = None
    finished = False
    try:
        sub = _child("sub", {**base, "port": appliance.port if appliance else 0})
        children.append(sub)
        sub_port = int(sub.expect("READY").split()[1])
        if hop == "topicwire":
            assert appliance is not None
            port = appliance.port
        elif hop == "c_relay":
            assert relay is not None
            relay_child = _Child([str(relay), "0", LOOPBACK, str(sub_port)], "C relay",
                                 stdin=False, nice=getattr(args, "priority", None),
                                 cpus=_hop_cpus(args))
            port = int(relay_child.expect("READY").split()[1])
        else:
            port = sub_port
        pub = _child("pub", {**base, "port": port})
        children.append(pub)
        pub.expect("READY")
        pub.tell("PROBE")
        sub.expect("FLOWING")
        pub.tell("GO")
        sent = pub.result()
        sub.tell(f"END {sent['sent']}")
        got = sub.result()
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
        raise DeviceError(f"{hop}: the subscriber received none of {sent['sent']} messages",
                          component=_COMPONENT)
    prefix = "" if mode == "throughput" else "latency_"
    figures = {prefix + "sent": float(sent["sent"]), prefix + "received": float(got["received"]),
               prefix + "lost": float(sent["sent"] - got["received"] + got["duplicates"]),
               prefix + "duplicates": float(got["duplicates"])}
    if mode == "throughput":
        span = max(got["last_ns"] - sent["start_ns"], 1)
        figures.update(msgs_per_s=got["received"] * 1e9 / span,
                       sent_msgs_per_s=sent["sent"] * 1e9 / max(sent["end_ns"] - sent["start_ns"],
                                                                 1),
                       frames_per_msg=got["frames"] / got["received"])
        if relay_counts is not None:
            figures["relay_batches"] = float(relay_counts["batches"])
    else:
        figures.update(p50_us=got["p50_us"], p99_us=got["p99_us"], p999_us=got["p999_us"])
    return figures


def _loaded(args: argparse.Namespace, appliance: Appliance, relay: Path, target: Appliance,
            mgmt_port: int, into: list[dict[str, float]]) -> dict[str, Any]:
    """The latency run through ``appliance`` (appended to ``into``) while the control load
    goes to ``target`` (``appliance`` itself, or another); what the load made."""
    load = _child("load", {"port": target.port, "mgmt_port": mgmt_port})
    try:
        load.expect("READY")
        started = time.monotonic()
        into.append(measure("topicwire", "latency", args, appliance, relay))
        load.tell("STOP")
        counts = load.result()
        counts["seconds"] = round(time.monotonic() - started, 1)
        return counts
    finally:
        load.kill(CHILD_EXIT_GRACE_S)


def _ratio(results: dict[str, dict[str, float]], hop: str, base: str, key: str
           ) -> float | None:
    return results[hop][key] / results[base][key] if results[base].get(key) else None


def _free_tcp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _with_cpu(appliance: Appliance, run: Any) -> dict[str, float]:
    """``run()``'s figures and ``appliance_cpu_pct``: the CPU the appliance's process and its
    data path's used meanwhile, in percent of one core (its management API's own process not
    counted)."""
    pid = appliance.child.proc.pid
    cpu, start = appliance_cpu_seconds(pid), time.monotonic()
    figures = run()
    figures["appliance_cpu_pct"] = (100 * (appliance_cpu_seconds(pid) - cpu)
                                    / (time.monotonic() - start))
    return figures


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    return {k: statistics.median(r[k] for r in runs) for k in keys}


REPORTED = ("msgs_per_s", "sent_msgs_per_s", "lost", "duplicates", "frames_per_msg",
            "p50_us", "p99_us", "p999_us", "appliance_cpu_pct")
"""The figures in the report (medians); the others stay in the runs."""


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every hop ``--repeats`` times (throughput and latency each); medians. One
    publisher and one subscriber (``topicwire bench fabric`` takes more to the fan-out bench:
    bench/fabric_bench.py). The CPUs this process may use are as before afterwards
    (``--isolate`` narrows them while it runs)."""
    before = os.sched_getaffinity(0)
    try:
        return _run(args)
    finally:
        os.sched_setaffinity(0, before)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    if getattr(args, "publishers", 1) > 1 or getattr(args, "subscribers", 1) > 1:
        raise UserError("bench/fabric.py measures one publisher and one subscriber: more go "
                        "through bench.fabric_bench.run (topicwire bench fabric)",
                        component=_COMPONENT)
    if args.duration_s <= 0:
        raise UserError("--duration-s must be positive", component=_COMPONENT)
    relay = build_relay()
    if getattr(args, "isolate", False):
        _isolate(args)
    hops = [h for h in HOPS if h != "direct" or args.direct]
    runs: dict[str, list[dict[str, float]]] = {h: [] for h in hops}
    control_load = getattr(args, "control_load", False)
    if control_load:
        runs[LOADED] = []
        runs[ELSEWHERE] = []
    load_counts: dict[str, list[dict[str, int]]] = {LOADED: [], ELSEWHERE: []}
    scrape_hz = getattr(args, "scrape_hz", 0) or 0
    if scrape_hz < 0:
        raise UserError("--scrape-hz must be positive", component=_COMPONENT)
    scrape_counts: dict[str, list[dict[str, int]]] = {k: [] for k in SCRAPED.values()}
    quiet = {True: QUIET_PROCESS, False: SCRAPED_IN_PROCESS}
    if scrape_hz:
        runs.update({k: [] for k in (*quiet.values(), *SCRAPED.values())})
    with tempfile.TemporaryDirectory(prefix="tw-bench-fabric-") as tmp:
        progress(NAME, "starting the appliance (topicwire run)")
        mgmt_port = _free_tcp_port() if control_load or scrape_hz else None
        appliance = Appliance(args.idle, Path(tmp), args.idle_spin_us, args.priority,
                              mgmt_port=mgmt_port,
                              switch_us=getattr(args, "switch_interval_us", None),
                              mgmt_process=True if scrape_hz else None,
                              dataplane=getattr(args, "dataplane", None),
                              dataplane_cpus=_hop_cpus(args))
        in_process = other = None
        elsewhere: tuple[Appliance, int] | None = None
        try:
            if control_load:
                progress(NAME, "starting a second appliance, for the load elsewhere")
                other_port = _free_tcp_port()
                other = Appliance(args.idle, Path(tmp), args.idle_spin_us, args.priority,
                                  mgmt_port=other_port, name="elsewhere",
                                  dataplane=getattr(args, "dataplane", None))
                elsewhere = (other, other_port)
            if scrape_hz:
                progress(NAME, "starting a second appliance, its management API in-process")
                in_process_port = _free_tcp_port()
                in_process = Appliance(args.idle, Path(tmp), args.idle_spin_us, args.priority,
                                       mgmt_port=in_process_port,
                                       switch_us=getattr(args, "switch_interval_us", None),
                                       mgmt_process=False, name="in-process",
                                       dataplane=getattr(args, "dataplane", None),
                                       dataplane_cpus=_hop_cpus(args))
                scraped = {True: (appliance, mgmt_port), False: (in_process, in_process_port)}
            for repeat in range(args.repeats):
                progress(NAME, f"repeat {repeat + 1}/{args.repeats}")
                for hop in hops:
                    figures = measure(hop, "throughput", args, appliance, relay)
                    figures.update(measure(hop, "latency", args, appliance, relay))
                    runs[hop].append(figures)
                if control_load:  # the load on the measured appliance, and elsewhere
                    assert elsewhere is not None and mgmt_port is not None
                    targets = [(LOADED, appliance, mgmt_port), (ELSEWHERE, *elsewhere)]
                    for result, target, port in targets[:: 1 if repeat % 2 == 0 else -1]:
                        counts = _loaded(args, appliance, relay, target, port, runs[result])
                        load_counts[result].append(counts)
                if scrape_hz:  # each appliance quiet, then scraped, one after the other
                    for process in ((True, False) if repeat % 2 == 0 else (False, True)):
                        hop, port = scraped[process]
                        runs[quiet[process]].append(_with_cpu(hop, lambda h=hop: measure(
                            "topicwire", "latency", args, h, relay)))
                        scraper = _child("scrape", {"mgmt_port": port, "hz": scrape_hz})
                        try:
                            scraper.expect("READY")
                            runs[SCRAPED[process]].append(_with_cpu(hop, lambda h=hop: measure(
                                "topicwire", "latency", args, h, relay)))
                            scraper.tell("STOP")
                            scrape_counts[SCRAPED[process]].append(scraper.result())
                        finally:
                            scraper.kill(CHILD_EXIT_GRACE_S)
        finally:
            for extra in (in_process, other):
                if extra is not None:
                    extra.stop()
            code = appliance.stop()
        if code != 0:
            raise DeviceError(f"the appliance exited with {code} at the end of the run",
                              component=_COMPONENT)
    results = {h: {k: v for k, v in _medians(r).items() if k in REPORTED}
               for h, r in runs.items()}
    params = {"transport": args.transport, "messages": args.messages, "size": args.size,
              "per_frame": args.per_frame, "batch": args.batch, "rate": args.rate,
              "duration_s": args.duration_s, "repeats": args.repeats, "idle": args.idle,
              "idle_spin_us": args.idle_spin_us, "priority": args.priority,
              "control_load": control_load,
              "isolate": ({"hop_cpus": sorted(_hop_cpus(args)),
                           "other_cpus": sorted(os.sched_getaffinity(0))}
                          if getattr(args, "isolate", False) else None),
              "dataplane": getattr(args, "dataplane", None) or "process",
              "switch_interval_us": getattr(args, "switch_interval_us", None),
              "baseline": "c_relay: bench/c/udp_relay.c (recvmmsg/sendmmsg, 64 per call, "
                          "blocking), same publisher and subscriber processes, at the "
                          "appliance's --priority",
              "goals": {"msgs_per_s topicwire/c_relay": ">= 0.8",
                        "p50_us topicwire/c_relay": "<= 1.5"},
              "latency": "publish timestamp to the subscriber's kernel receive timestamp, "
                         f"{args.rate} msg/s, one message per frame",
              "note": "the relay forwards the publisher's frames as they are, so at "
                      "--per-frame 1 the subscriber takes one datagram per message and can "
                      "bound c_relay's msgs_per_s (compare with direct, --direct); the "
                      "appliance reframes, so its subscriber takes large frames "
                      "(frames_per_msg)",
              "runs": runs}
    if control_load:
        params["control_load"] = {
            "requests_per_s": CONTROL_LOAD_REQUESTS_PER_S,
            "status_reads_per_s": CONTROL_LOAD_STATUS_PER_S,
            "made": load_counts[LOADED],
            "made_elsewhere": load_counts[ELSEWHERE],
            "p99_us loaded/quiet": _ratio(results, LOADED, "topicwire", "p99_us"),
            "p99_us loaded/elsewhere": _ratio(results, LOADED, ELSEWHERE, "p99_us"),
            "p99_us elsewhere/quiet": _ratio(results, ELSEWHERE, "topicwire", "p99_us"),
            "elsewhere": "the same load sent to a second appliance on this host: the "
                         "clients and the kernel share the host's other CPUs with it as "
                         "they do with the measured appliance's control plane, whose data "
                         "path is left alone; loaded/elsewhere is the appliance's own share",
            "goal": "p99 under control load within 1.5x of the quiet figure"}
    if scrape_hz:
        params["scrape"] = {
            "hz": scrape_hz,
            "what": f"GET /status and GET /metrics, each {scrape_hz} times a second",
            "made": scrape_counts,
            "quiet": {"process": QUIET_PROCESS, "in_process": SCRAPED_IN_PROCESS},
            **{f"{key} {SCRAPED[p]}/quiet": _ratio(results, SCRAPED[p], quiet[p], key)
               for p in (True, False) for key in ("p50_us", "p99_us", "appliance_cpu_pct")},
            "median of per-repeat ratios": {
                f"{key} {SCRAPED[p]}/quiet": statistics.median(
                    a[key] / b[key] for a, b in zip(runs[SCRAPED[p]], runs[quiet[p]])
                    if b.get(key))
                for p in (True, False) for key in ("p50_us", "p99_us")},
            "appliance_cpu_pct": "CPU of the appliance's process during the latency run, "
                                 "percent of one core (the API's own process not counted)",
            "goal": "scraping never moves the hop's latency (the API in its own process)"}
    return build_report(NAME, params, results)
