"""A fabric node for the route-loop test: tests.fabric.node plus channel-layer delay injection
and numbered publishing with a QoS.

    python -m tests.telemetry.fabric_node CONFIG.toml

Extra commands: ``delay`` {peer: "IP:PORT", delay_us}: frames arriving on the fabric channel
from that address are held ``delay_us`` before the data path gets them (the kernel here has
no netem, so delay is injected where the channel hands frames over; the receive timestamp is
the release time, so telemetry sees the delay); ``pubstream`` {client, topic, qos,
interval_s, burst}: publish numbered payloads in the background until ``end_stream``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter, deque

from channels.base import FrameBatch
from channels.udp import peer_id_of
from tests.fabric.node import Node


class DelayedReceive:
    """A channel whose frames from one peer reach the caller ``delay_ns`` late."""

    def __init__(self, inner: object, peer: int, delay_ns: int) -> None:
        self.inner = inner
        self.peer = peer
        self.delay_ns = delay_ns
        self.held: deque = deque()
        self.scratch: FrameBatch | None = None

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def receive(self, batch: FrameBatch, timeout_ns: int = 0) -> int:
        if self.scratch is None:
            self.scratch = FrameBatch(batch.capacity, batch.slot_bytes)
        scratch = self.scratch
        n = self.inner.receive(scratch, 0)
        now = time.time_ns()
        batch.count = 0
        for i in range(n):
            data = bytes(scratch.frame(i))
            peer = int(scratch.peer_ids[i])
            if peer == self.peer:
                self.held.append((now + self.delay_ns, data, peer))
                continue
            slot = batch.append(data, peer)
            batch.recv_ts_ns[slot] = scratch.recv_ts_ns[i]
        while self.held and self.held[0][0] <= now and batch.count < batch.capacity:
            _, data, peer = self.held.popleft()
            slot = batch.append(data, peer)
            batch.recv_ts_ns[slot] = now
        return batch.count


class LoopNode(Node):
    def handle(self, cmd: dict) -> dict:
        op = cmd["cmd"]
        if op == "delay":
            host, port = cmd["peer"].split(":")
            dp = self.app.dataplane
            inner = dp.channels["fabric"]
            inner = getattr(inner, "inner", inner)
            delayed = DelayedReceive(inner, peer_id_of(host, int(port)),
                                     int(cmd["delay_us"]) * 1_000)
            done = threading.Event()

            def swap() -> None:  # on the data-path thread, between two duty cycles
                dp.replace_channel("fabric", delayed)
                done.set()

            dp.commands.offer(swap)
            if not done.wait(10):
                return {"ok": False, "error": "the data path did not take the delayed channel"}
            return {"ok": True}
        if op == "pubstream":
            client = self.clients[cmd["client"]]
            stop, counts = threading.Event(), Counter()

            def run():
                seq = 0
                while not stop.is_set():
                    for _ in range(cmd.get("burst", 1)):
                        client.publish(cmd["topic"], str(seq).encode(),
                                       qos=cmd.get("qos", "best-effort"))
                        seq += 1
                        counts[cmd["topic"]] += 1
                    client.flush()
                    time.sleep(cmd.get("interval_s", 0.01))
            thread = threading.Thread(target=run, daemon=True)
            self.streams[cmd["client"]] = (stop, thread, counts)
            thread.start()
            return {"ok": True}
        return super().handle(cmd)


def main() -> int:
    node = LoopNode(sys.argv[1])
    print(json.dumps({"ok": True, "ready": node.config.name}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            answer = node.handle(cmd)
        except Exception as exc:
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
        if cmd["cmd"] == "quit":
            return 0
    node.app.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
