"""``topicwire bench mqtt-codec``: the MQTT edge's decoding of a read, compiled against Python.

A buffer holds ``--packets`` PUBLISHes (``--topic-bytes`` topic, ``--payload-bytes`` payload,
QoS ``--qos``, MQTT 3.1.1), as one read of a connection would; each call takes every packet
of it:

- ``topicwire``: the edge's read loop now, ``fastcodec.Framer.take``: one call of the
  compiled kernel frames and decodes every packet to offsets, then the ``Publish`` objects
  the handlers take are made from them; ``kernel_pkts_per_s`` is the kernel's call alone
  (offsets, no Python objects);
- ``codec.py`` (baseline): the read loop before, per packet ``codec.read_remaining_length``,
  the body copied out, ``codec.decode`` (its inline 3.1.1 PUBLISH decoder).

Both must give the same packets (checked before measuring). Encoding, per packet: the
edge's Python ``codec.encode_ack`` (PUBACK) and ``codec.encode_publish`` (a delivery) under
``topicwire``, against the compiled encoders of bench/_mqtt_codec_kernels.py under
``numba``: one call per packet (as the edge sends them) and, for PUBACKs, ``--packets`` in
one call. Figures are medians over ``--repeats`` of the thread's CPU time (the machine is
shared). Progress to stderr.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.report import build_report, positive_int, progress

NAME = "mqtt-codec"
HELP = "MQTT edge: a read's PUBLISHes decoded by the compiled kernel vs codec.py (and encoding)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--packets", type=positive_int, default=64,
                        help="PUBLISHes per read (default 64)")
    parser.add_argument("--topic-bytes", type=positive_int, default=32,
                        help="topic length (default 32)")
    parser.add_argument("--payload-bytes", type=int, default=100,
                        help="payload length (default 100)")
    parser.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    parser.add_argument("--rounds", type=positive_int, default=2_000,
                        help="calls per measurement (default 2000)")
    parser.add_argument("--repeats", type=positive_int, default=5)


def _cpu_ns(step: Callable[[], Any], rounds: int) -> float:
    """CPU time of this thread per call of ``step``."""
    start = time.thread_time_ns()
    for _ in range(rounds):
        step()
    return (time.thread_time_ns() - start) / rounds


def _python_read(data: bytes, version: int) -> list:
    """What ``MqttConnection._take`` and ``codec.decode`` did with a read."""
    from appliance.edge.mqtt import codec

    buf = bytearray(data)
    pos, out = 0, []
    while pos < len(buf):
        first = buf[pos]
        length, used = codec.read_remaining_length(buf[pos + 1:pos + 5])  # type: ignore[misc]
        start = pos + 1 + used
        pos = start + length
        out.append(codec.decode(first, bytes(buf[start:pos]), version))
    return out


def _decoding(args: argparse.Namespace) -> dict[str, float]:
    from appliance.edge.mqtt import _kernels as K
    from appliance.edge.mqtt import codec, fastcodec

    fastcodec.warm_up()
    topic = ("t/" + "x" * args.topic_bytes)[:args.topic_bytes]
    data = b"".join(codec.encode_publish(topic, b"p" * args.payload_bytes, args.qos, False,
                                         False, i % 65_535 + 1 if args.qos else 0)
                    for i in range(args.packets))
    framer = fastcodec.Framer(1 << 28, max(args.packets, fastcodec.ROWS))

    def compiled() -> list:
        out: list = []
        framer.take(bytearray(data), 0, codec.V311, out)
        return out

    if compiled() != _python_read(data, codec.V311):
        raise RuntimeError("bench mqtt-codec: the kernel and codec.py decoded differently")
    buf = bytearray(data)
    out = np.zeros((max(args.packets, 1), K.OUT_COLUMNS), np.int64)

    def kernel() -> None:
        K.frame_one(np.frombuffer(buf, np.uint8), 0, len(buf), codec.V311, 1 << 28, out)

    n = args.packets
    return {"compiled": n * 1e9 / _cpu_ns(compiled, args.rounds),
            "kernel": n * 1e9 / _cpu_ns(kernel, args.rounds),
            "python": n * 1e9 / _cpu_ns(lambda: _python_read(data, codec.V311), args.rounds)}


def _encoding(args: argparse.Namespace) -> dict[str, float]:
    from appliance.edge.mqtt import codec
    from appliance.edge.mqtt.codec import PacketType
    from bench import _mqtt_codec_kernels as E

    n, rounds = args.packets, args.rounds * 10
    topic = ("t/" + "x" * args.topic_bytes)[:args.topic_bytes]
    payload = b"p" * args.payload_bytes
    topic_arr = np.frombuffer(topic.encode(), np.uint8).copy()
    out = np.zeros(8 + len(topic_arr) + 4 * n, np.uint8)
    ids = np.arange(1, n + 1, dtype=np.int64)
    size = 2 + len(topic_arr) + 2 + len(payload)

    def numba_publish() -> bytes:
        head = E.encode_publish_head(out, 0x32, topic_arr, 7, size)
        return bytes(out[:head]) + payload

    if numba_publish() != codec.encode_publish(topic, payload, 1, False, False, 7) or \
            bytes(out[:E.encode_acks(out, 0x40, ids, 1)]) != codec.encode_ack(PacketType.PUBACK, 1):
        raise RuntimeError("bench mqtt-codec: the compiled encoders disagree with codec.py")
    return {
        "ack_python": _cpu_ns(lambda: codec.encode_ack(PacketType.PUBACK, 300), rounds),
        "ack_numba": _cpu_ns(lambda: bytes(out[:E.encode_acks(out, 0x40, ids, 1)]), rounds),
        "ack_numba_batch": _cpu_ns(lambda: bytes(out[:E.encode_acks(out, 0x40, ids, n)]),
                                   args.rounds) / n,
        "publish_python": _cpu_ns(lambda: codec.encode_publish(topic, payload, 1, False, False,
                                                               7), rounds),
        "publish_numba": _cpu_ns(numba_publish, rounds)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Decoding and encoding ``--repeats`` times each; medians."""
    dec, enc = [], []
    for r in range(args.repeats):
        progress(NAME, f"repeat {r + 1}/{args.repeats}")
        dec.append(_decoding(args))
        enc.append(_encoding(args))

    def med(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(x[key] for x in runs)

    results = {
        "topicwire": {"pkts_per_s": med(dec, "compiled"),
                      "kernel_pkts_per_s": med(dec, "kernel"),
                      "puback_encode_ns": med(enc, "ack_python"),
                      "publish_encode_ns": med(enc, "publish_python")},
        "codec.py": {"pkts_per_s": med(dec, "python")},
        "numba": {"puback_encode_ns": med(enc, "ack_numba"),
                  "publish_encode_ns": med(enc, "publish_numba"),
                  "puback_encode_batched_ns": med(enc, "ack_numba_batch")},
    }
    params = {"packets": args.packets, "topic_bytes": args.topic_bytes,
              "payload_bytes": args.payload_bytes, "qos": args.qos, "version": "3.1.1",
              "rounds": args.rounds, "repeats": args.repeats,
              "timing": "thread CPU time per call"}
    return build_report(NAME, params, results)
