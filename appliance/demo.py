"""The interim end-to-end demo (``make demo`` / ``topicwire demo``), until the appliance lands.

What it runs, all for real on this host:
1. a market-data topic tree registered in a ``KeyRegistry`` (topics -> 64-bit keys);
2. subscribers with wildcard patterns and partial unsubscribes (seed 000 lists), indexed in a
   ``TopicIndex``; the per-key delivery decision is compiled once per key;
3. a publisher packing messages into native frames (``FrameWriter``) and sending them over a
   real UDP socket on loopback, captured by tcpdump;
4. a receiver draining its socket, batch-decoding frames with the numba kernel and delivering
   each message to the subscribers whose lists accept its topic;
5. the capture dissected with the pcap tool (scapy + codec).
It checks that every subscriber received exactly what a naive replay of its requests says it
should, and that the capture holds every message sent. Exit code 0 only if all of it holds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from datapath.config import MAX_FRAME_BYTES
from datapath.errors import UserError
from datapath.protocol.batch import decode_frames, new_message_batch
from datapath.protocol.codec import FrameWriter
from datapath.protocol.message_layout import Qos
from datapath.topics.index import TopicIndex
from datapath.topics.registry import KeyRegistry
from datapath.topics.sublist import SubscriptionList, naive_decision

DEMO_FRAME_BYTES = 1_400
"""Frames sized for an Ethernet MTU, as a real fabric link would carry them."""
DEMO_RECV_SLOTS = 256
"""Receive ring: datagrams drained per batch decode."""
DEMO_SOCKET_BUFFER_BYTES = 8 << 20
CAPTURE_START_TIMEOUT_S = 10.0
CAPTURE_SETTLE_S = 0.5
"""The capture is complete when the file has not grown for this long."""
DEMO_SEED = 7
CAPTURE_STOP_TIMEOUT_S = 10.0

REGIONS = ("us", "eu", "apac")
EXCHANGES = {"us": ("nyse", "nasdaq"), "eu": ("lse", "xetra"), "apac": ("tse", "hkex")}
SYMBOLS = ("ibm", "aapl", "msft", "vod", "sap", "sony", "tencent", "bmw")
FIELDS = ("trade", "quote", "status")

SUBSCRIBERS = {
    "us-desk": ["+us/#", "-us/+/+/status"],
    "ibm-watcher": ["+#/ibm/#"],
    "quotes-not-apac": ["+#/quote", "-apac/#"],
    "nyse-all-but-ibm": ["+us/nyse/#", "-us/nyse/ibm/#", "+us/nyse/ibm/trade"],
    "everything-then-nothing": ["+#", "-#"],
    "trades": ["+#/trade"],
}
"""Subscriber -> its requests in order ('+' subscribe, '-' unsubscribe), as a client makes them."""


@dataclass
class DemoResult:
    sent: int = 0
    frames_sent: int = 0
    received: int = 0
    malformed: int = 0
    delivered: Counter = field(default_factory=Counter)
    expected: Counter = field(default_factory=Counter)
    lists: dict[str, list[str]] = field(default_factory=dict)
    captured_messages: int | None = None
    capture_note: str = ""
    pcap_lines: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        delivered_ok = self.delivered == self.expected and self.received == self.sent
        capture_ok = self.captured_messages in (None, self.sent)
        return delivered_ok and capture_ok and self.malformed == 0


def topic_tree() -> list[str]:
    return [f"{r}/{x}/{s}/{f}" for r in REGIONS for x in EXCHANGES[r] for s in SYMBOLS
            for f in FIELDS]


def _start_capture(port: int, path: Path) -> subprocess.Popen | None:
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None or os.geteuid() != 0:
        return None
    proc = subprocess.Popen(
        [tcpdump, "-i", "lo", "--immediate-mode", "-U", "-B", "16384", "-w", str(path),
         f"udp port {port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # tcpdump says "listening on lo" once its capture socket is open: only then send.
    deadline = time.monotonic() + CAPTURE_START_TIMEOUT_S
    line = b""
    while proc.poll() is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if b"listening on" in line:
            return proc
    proc.kill()
    proc.wait()
    return None


def _stop_capture(proc: subprocess.Popen, path: Path) -> str:
    # tcpdump writes each packet as it reads it (--immediate-mode -U); SIGINT discards what
    # it has not read yet, so wait until the file stops growing before stopping it.
    deadline = time.monotonic() + CAPTURE_STOP_TIMEOUT_S
    size = -1
    while time.monotonic() < deadline:
        now = path.stat().st_size if path.exists() else 0
        if now == size:
            break
        size = now
        time.sleep(CAPTURE_SETTLE_S)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=CAPTURE_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err.decode(errors="replace").strip().splitlines()[-1] if err else ""


def run_demo(messages: int, port: int, out_dir: Path, capture: bool = True) -> DemoResult:
    """Run the demo; see the module docstring."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = DemoResult()
    registry = KeyRegistry()
    topics = topic_tree()
    keys = np.array([registry.key_for(t) for t in topics], dtype=np.uint64)
    registry.save(out_dir / "registry.json")

    lists: dict[str, SubscriptionList] = {}
    index: TopicIndex[str] = TopicIndex()
    for name, requests in SUBSCRIBERS.items():
        sublist = SubscriptionList()
        for request in requests:
            sublist.apply(request)
        lists[name] = sublist
        result.lists[name] = [str(e) for e in sublist.entries]
        for entry in sublist.entries:
            if entry.positive:
                index.add(entry.pattern, name)
    # Compiled decision per key: who receives it (the offload tables will hold exactly this).
    receivers_of_key = {
        int(k): sorted(s for s in index.match(t) if lists[s].decides(t))
        for k, t in zip(keys, topics)}

    picks = np.random.default_rng(DEMO_SEED).integers(0, len(topics), messages)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, DEMO_SOCKET_BUFFER_BYTES)
        try:
            rx.bind(("127.0.0.1", port))
        except OSError as exc:
            raise UserError(f"cannot bind 127.0.0.1:{port} ({exc.strerror}); pass --port with a "
                            "free UDP port", component="demo") from None
        rx.setblocking(False)
        pcap_path = out_dir / "demo.pcap"
        proc = _start_capture(port, pcap_path) if capture else None
        if capture and proc is None:
            result.capture_note = "capture skipped: needs root and tcpdump (make demo installs it)"
        started = time.perf_counter()
        _publish_and_receive(picks, port, keys, receivers_of_key, tx, rx, result)
        result.elapsed_s = time.perf_counter() - started
        if proc is not None:
            result.capture_note = _stop_capture(proc, pcap_path)
            _dissect(pcap_path, port, registry, result)
    finally:
        rx.close()
        tx.close()

    counts = Counter(int(i) for i in picks)
    for name, requests in SUBSCRIBERS.items():
        result.expected[name] = sum(n for i, n in counts.items()
                                    if naive_decision(requests, topics[i]))
    return result


def _publish_and_receive(picks: np.ndarray, port: int, keys: np.ndarray,
                         receivers_of_key: dict[int, list[str]], tx: socket.socket,
                         rx: socket.socket, result: DemoResult) -> None:
    send_buf = bytearray(MAX_FRAME_BYTES)
    writer = FrameWriter(send_buf, capacity_bytes=DEMO_FRAME_BYTES)
    payload = bytearray(24)
    recv_arena = np.zeros(DEMO_RECV_SLOTS * DEMO_FRAME_BYTES, dtype=np.uint8)
    slots = memoryview(recv_arena)
    offsets = np.arange(DEMO_RECV_SLOTS, dtype=np.int64) * DEMO_FRAME_BYTES
    lengths = np.zeros(DEMO_RECV_SLOTS, dtype=np.int64)
    batch = new_message_batch(DEMO_RECV_SLOTS * (DEMO_FRAME_BYTES // 40))
    status = np.zeros(DEMO_RECV_SLOTS, dtype=np.uint8)
    types = np.zeros(DEMO_RECV_SLOTS, dtype=np.uint8)
    dest = ("127.0.0.1", port)

    def drain(wait_s: float = 0.0) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            n = 0
            while n < DEMO_RECV_SLOTS:
                try:
                    size = rx.recv_into(slots[offsets[n]:offsets[n] + DEMO_FRAME_BYTES])
                except BlockingIOError:
                    break
                lengths[n] = size
                n += 1
            if n:
                decoded = decode_frames(recv_arena, offsets[:n], lengths[:n], batch, status,
                                        types)
                result.malformed += int(np.count_nonzero(status[:n]))
                result.received += decoded.messages
                for key in batch["topic_key"][: decoded.messages].tolist():
                    for name in receivers_of_key.get(key, ()):
                        result.delivered[name] += 1
            if result.received >= result.sent or (n == 0 and time.monotonic() >= deadline):
                return
            if n == 0:
                time.sleep(0.001)

    writer.begin(source_session=1, stream_id=1)
    for seq, pick in enumerate(picks.tolist(), start=1):
        now = time.time_ns()
        payload[0:8] = now.to_bytes(8, "big")
        fits = writer.append(int(keys[pick]), seq, now, payload, qos=Qos.BEST_EFFORT)
        if not fits:
            tx.sendto(memoryview(send_buf)[: writer.finish()], dest)
            result.frames_sent += 1
            drain()
            writer.begin(source_session=1, stream_id=1)
            writer.append(int(keys[pick]), seq, now, payload, qos=Qos.BEST_EFFORT)
        result.sent += 1
    if writer.message_count:
        tx.sendto(memoryview(send_buf)[: writer.finish()], dest)
        result.frames_sent += 1
    drain(wait_s=5.0)


def _dissect(path: Path, port: int, registry: KeyRegistry, result: DemoResult) -> None:
    from datapath.protocol.pcap import CaptureSummary, dissect, format_record

    summary = CaptureSummary()

    def topic_name(key: int) -> str | None:
        found = registry.lookup(key)
        return found[1] if found else None

    for i, record in enumerate(dissect(path, port, topic_name, summary)):
        if i < 5:
            result.pcap_lines.append(format_record(record))
    result.captured_messages = summary.messages
