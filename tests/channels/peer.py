"""The other process of the channel tests: ``python -m tests.channels.peer send|recv KIND ...``.

Frames are deterministic (``make_frame(key, i)``: one DATA message with topic_key ``key``,
sequence ``i`` and a payload whose length and bytes depend on ``i``), so the receiver checks
every byte it gets (except ``send_ts_ns``, which the channel stamps). The receiver prints
``READY <port>`` once it listens, then one JSON line with what it saw.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from channels.base import FrameBatch, decode_batch
from datapath.protocol.batch import new_message_batch
from datapath.protocol.codec import encode_data_frame

SLOT_BYTES = 2048
BATCH = 32


def payload(i: int) -> bytes:
    return bytes((i * 7 + j) & 0xFF for j in range(i % 211))


def make_frame(key: int, i: int) -> bytes:
    return encode_data_frame([{"topic_key": key, "sequence": i, "payload": payload(i),
                               "namespace_id": 3, "schema_id": 5}],
                             source_session=key, stream_id=1, send_ts_ns=0)


def without_ts(frame: bytes) -> bytes:
    return frame[:24] + frame[32:]


def open_channel(args: argparse.Namespace, role: str):
    from channels.multicast import MulticastChannel
    from channels.shm import ShmChannel
    from channels.tcp import TcpChannel
    from channels.udp import UdpChannel

    if args.kind == "udp":
        if role == "recv":
            return UdpChannel(bind=(args.host, args.port))
        return UdpChannel(bind=(args.host, 0), dest=(args.host, args.port))
    if args.kind == "mcast":
        return MulticastChannel(args.group, args.port, interface=args.interface,
                                join=role == "recv")
    if args.kind == "shm":
        if role == "recv":
            return ShmChannel(rx=args.ring, producers=args.producers, ring_bytes=args.ring_bytes)
        return ShmChannel(tx=args.ring)
    if args.kind == "tcp":
        if role == "recv":
            return TcpChannel(listen=(args.host, args.port))
        return TcpChannel(connect=(args.host, args.port))
    raise SystemExit(f"unknown kind {args.kind}")


def send(args: argparse.Namespace) -> None:
    with open_channel(args, "send") as ch:
        batch = FrameBatch(BATCH, SLOT_BYTES)
        i = 0
        while i < args.count:
            batch.clear()
            for j in range(i, min(i + BATCH, args.count)):
                batch.append(make_frame(args.key, j))
            done = 0
            while done < batch.count:
                a = batch.arrays()
                done += ch.send((a.buf, a.offsets[done:], a.lengths[done:], batch.count - done))
                if done < batch.count:
                    time.sleep(0.0005)
            i += batch.count
            if args.pause_s:
                time.sleep(args.pause_s)
        if args.kind == "tcp":  # let the send buffer drain before closing
            while ch.pending_bytes():
                ch.receive(FrameBatch(1, SLOT_BYTES), timeout_ns=1_000_000)
        print(json.dumps({"sent": i, "stats": ch.stats.snapshot()}, default=str))


def recv(args: argparse.Namespace) -> None:
    with open_channel(args, "recv") as ch:
        port = ch.local_address[1] if hasattr(ch, "local_address") else 0
        print(f"READY {port}", flush=True)
        batch = FrameBatch(BATCH, SLOT_BYTES)
        messages = new_message_batch(BATCH * 4)
        status = np.zeros(BATCH, np.uint8)
        types = np.zeros(BATCH, np.uint8)
        expected: dict[int, int] = {}
        content_ok = in_order = True
        total = 0
        deadline = time.monotonic() + args.timeout_s
        want = args.count * args.producers
        while total < want and time.monotonic() < deadline:
            n = ch.receive(batch, timeout_ns=50_000_000)
            if not n:
                continue
            decode_batch(batch, messages, status, types, ch.stats)
            for k in range(n):
                frame = bytes(batch.frame(k))
                key = int.from_bytes(frame[12:16], "big")
                seq = int.from_bytes(frame[32 + 8 : 32 + 16], "big")
                if without_ts(frame) != without_ts(make_frame(key, seq)):
                    content_ok = False
                if int.from_bytes(frame[24:32], "big") == 0:
                    content_ok = False
                if seq != expected.get(key, 0):
                    in_order = False
                expected[key] = seq + 1
            total += n
        snap = ch.stats.snapshot()
        print(json.dumps({"frames": total, "by_key": {str(k): v for k, v in expected.items()},
                          "content_ok": content_ok, "in_order": in_order,
                          "malformed": snap["malformed"], "latency_count": snap["latency_count"],
                          "peers": sorted({int(p) for p in batch.peer_ids[: batch.count]})}),
              flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["send", "recv"])
    p.add_argument("kind", choices=["udp", "mcast", "shm", "tcp"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--group", default="239.7.7.7")
    p.add_argument("--interface", default=None)
    p.add_argument("--ring", default="peer")
    p.add_argument("--ring-bytes", type=int, default=1 << 16)
    p.add_argument("--producers", type=int, default=1)
    p.add_argument("--key", type=int, default=1)
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--pause-s", type=float, default=0.0)
    p.add_argument("--timeout-s", type=float, default=20.0)
    args = p.parse_args(argv)
    (send if args.role == "send" else recv)(args)


if __name__ == "__main__":
    sys.exit(main())
