"""``topicwire bench frame-mac``: what the DATA frame MAC costs per frame, against a copy.

Every plain DATA frame between appliances is signed as its out queue is sent and checked
as it is received (datapath/protocol/frame_mac.py), in the kernels that send and forward
it; a hop between two appliances pays one signature and one check per frame (a frame in
transit one of each at every appliance it crosses). This bench times the two kernels over
batches of ``--frames`` frames of 1 message, of the fabric's largest frame of 64-byte
messages and of 1 message of ``--large`` bytes, per frame:

- ``topicwire``: ``sign_frames`` then ``check_frames`` over the batch (the trailer appended,
  stamped, BLAKE2b keyed by libsodium, the window advanced, the trailer taken off), the
  frames restored between rounds by copying their unsigned bytes back;
- ``copy`` (baseline): the same restoring copy alone, so the difference is the MAC's.

Figures are medians over ``--repeats`` of the thread's CPU time per frame (the machine is
shared); ``ns_per_message`` divides by the messages a frame carries. Progress to stderr.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from appliance.config import FABRIC_MAX_FRAME_BYTES
from bench.report import build_report, positive_int, progress
from datapath.config import BENCH_REPEATS
from datapath.protocol import _kernels as kern
from datapath.protocol import frame_layout as fl
from datapath.protocol import frame_mac as fm
from datapath.protocol import message_layout as ml

NAME = "frame-mac"
HELP = "DATA frame MAC: sign + check per frame (BLAKE2b, libsodium) vs copying the frame"
_PEER = 7
_SENDER, _RECEIVER = 3, 4
_KEY = bytes(range(32))
_RELIABLE = 0x8000_0000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--frames", type=positive_int, default=256,
                        help="frames per batch (default 256)")
    parser.add_argument("--rounds", type=positive_int, default=200,
                        help="batches per measurement (default 200)")
    parser.add_argument("--large", type=positive_int, default=8_192,
                        help="payload bytes of the large frames (default 8192)")
    parser.add_argument("--repeats", type=positive_int, default=BENCH_REPEATS)


def _batch(n: int, payload: int, messages: int) -> tuple[np.ndarray, ...]:
    """``n`` DATA frames of ``messages`` messages of ``payload`` bytes, in slots with room
    for the trailer: (buffer, offsets, lengths, peer ids, the unsigned bytes)."""
    body = messages * fl.align8(ml.MESSAGE_HEADER_BYTES + payload)
    length = fl.FRAME_HEADER_BYTES + body
    slot = fl.align8(length + fl.AUTH_TRAILER_BYTES)
    buf = np.zeros(n * slot, np.uint8)
    offsets = np.arange(n, dtype=np.int64) * slot
    for i in range(n):
        o = int(offsets[i])
        kern.write_frame_header(buf, o, o + length, messages, int(fl.FrameType.DATA), _SENDER,
                                9, 5, 0)
        buf[o + fl.FRAME_HEADER_BYTES:o + length] = (np.arange(body) + i) % 251
    return buf, offsets, np.full(n, length, np.int64), np.full(n, _PEER, np.int64), buf.copy()


def _cpu_ns_per_frame(step: Any, rounds: int, n: int) -> float:
    start = time.thread_time_ns()
    for _ in range(rounds):
        step()
    return (time.thread_time_ns() - start) / (rounds * n)


def _measure(n: int, rounds: int, payload: int, messages: int) -> dict[str, float]:
    buf, offsets, lengths, peers, clean = _batch(n, payload, messages)
    length = int(lengths[0])
    ab, ac = fm.new_state(_KEY, 1, 1, _SENDER, 1_000)
    cb, cc = fm.new_state(_KEY, 1, 1, _RECEIVER, 0)
    windows = fm.new_windows(1)
    verdicts = np.zeros(n, np.int8)
    frames = np.arange(n, dtype=np.int64)
    neighbours, senders, rows = (np.array([_PEER], np.int64), np.array([_SENDER], np.int64),
                                 np.zeros(1, np.int64))
    receivers = np.array([_RECEIVER], np.int64)
    slot = int(offsets[1] - offsets[0]) if n > 1 else len(buf)

    def restore() -> None:
        np.copyto(buf, clean)
        lengths[:] = length

    def mac_round() -> None:
        restore()
        kern.sign_frames(buf, offsets, lengths, peers, n, slot, neighbours, receivers, -1,
                         1, ab, ac)
        kern.check_frames(buf, offsets, lengths, peers, frames, n, _RELIABLE, neighbours,
                          senders, rows, _RECEIVER, cb, cc, windows, verdicts)

    mac_round()
    if not (verdicts == fm.OK).all():
        raise RuntimeError("bench frame-mac: a signed frame failed its check")
    copy = _cpu_ns_per_frame(restore, rounds, n)
    both = _cpu_ns_per_frame(mac_round, rounds, n)
    return {"copy": copy, "topicwire": both, "bytes": float(length)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Each shape ``--repeats`` times, alternating; medians per shape."""
    room = FABRIC_MAX_FRAME_BYTES - fl.AUTH_TRAILER_BYTES - fl.FRAME_HEADER_BYTES
    per_frame_64 = room // fl.align8(ml.MESSAGE_HEADER_BYTES + 64)
    shapes = {"one_64B_message": (64, 1),
              f"{per_frame_64}_64B_messages": (64, per_frame_64),
              f"one_{args.large}B_message": (args.large, 1)}
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in shapes}
    for r in range(args.repeats):
        for shape, (payload, messages) in shapes.items():
            progress(NAME, f"repeat {r + 1}/{args.repeats}: {shape}")
            runs[shape].append(_measure(args.frames, args.rounds, payload, messages))
    results: dict[str, dict[str, float]] = {"topicwire": {}, "copy": {}}
    for shape, (_, messages) in shapes.items():
        ours = statistics.median(x["topicwire"] for x in runs[shape])
        base = statistics.median(x["copy"] for x in runs[shape])
        results["topicwire"][f"{shape}_ns_per_frame"] = ours
        results["copy"][f"{shape}_ns_per_frame"] = base
        results["topicwire"][f"{shape}_mac_ns_per_frame"] = ours - base
        results["topicwire"][f"{shape}_mac_ns_per_message"] = (ours - base) / messages
        results["topicwire"][f"{shape}_frame_bytes"] = runs[shape][0]["bytes"]
    params = {"frames": args.frames, "rounds": args.rounds, "large": args.large,
              "repeats": args.repeats, "mac": "BLAKE2b-128, libsodium, keyed, salted by link"}
    return build_report(NAME, params, results)
