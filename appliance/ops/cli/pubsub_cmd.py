"""``topicwire pub`` and ``topicwire sub``: publish to and subscribe through an appliance.

    topicwire pub --appliance udp://127.0.0.1:47471 --topic prices/eu/x --count 1000 --rate 500
    topicwire sub --appliance shm://core1 'prices/#' --count 1000 --stats

(mosquitto_pub/sub and ``nats pub/sub`` are the models.) ``--appliance`` takes the client
API's URLs (``udp://HOST:PORT``, ``shm://RING``, ``embedded:``; a bare ``HOST:PORT`` means
UDP). ``sub`` prints one line per message (``--json``: one JSON object per line), or with
``--stats`` one JSON object when it ends: received, gaps and duplicates (per publisher stream
and topic, from the message sequence numbers), latency p50/p99 (publish to receive).
It ends after ``--count`` messages, ``--seconds`` or SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from datapath.errors import UserError

STATS_LATENCY_HIGHEST_NS = 60_000_000_000
"""Largest latency the sub statistics record (60 s)."""
PUB_DEFAULT_SIZE_BYTES = 64
"""Payload size of ``pub`` messages unless ``--size`` says otherwise."""
SUB_POLL_S = 0.1
"""How often ``sub`` checks its end conditions while waiting for messages."""


APPLIANCE_ENV = "TOPICWIRE_APPLIANCE"
"""The environment variable ``--appliance`` defaults to (as ``NATS_URL`` is for nats)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``pub`` and ``sub``."""
    pub = subparsers.add_parser("pub", help="publish messages through an appliance")
    pub.add_argument("--appliance", metavar="ADDR", default=os.environ.get(APPLIANCE_ENV),
                     help="udp://HOST:PORT, shm://RING, embedded: (HOST:PORT means udp); "
                     f"default ${APPLIANCE_ENV}")
    pub.add_argument("--topic", required=True, help="the topic to publish to")
    pub.add_argument("--count", type=int, default=1, help="messages to publish (default 1)")
    pub.add_argument("--rate", type=float, default=0.0,
                     help="messages per second (default: as fast as possible)")
    pub.add_argument("--size", type=int, default=PUB_DEFAULT_SIZE_BYTES,
                     help=f"payload bytes (default {PUB_DEFAULT_SIZE_BYTES})")
    pub.add_argument("--message", help="the payload text (instead of --size bytes)")
    pub.add_argument("--qos", default="best-effort",
                     choices=("best-effort", "last-value", "guaranteed"))
    pub.add_argument("--identity", default="anonymous", help="who to log in as")
    pub.add_argument("--namespace", type=int, default=0)
    pub.add_argument("--json", action="store_true", help="print the summary as JSON")
    pub.set_defaults(handler=run_pub)

    sub = subparsers.add_parser("sub", help="subscribe through an appliance and print messages")
    sub.add_argument("pattern", help="topic pattern, e.g. 'prices/#'")
    sub.add_argument("--appliance", metavar="ADDR", default=os.environ.get(APPLIANCE_ENV),
                     help="udp://HOST:PORT, shm://RING, embedded: (HOST:PORT means udp); "
                     f"default ${APPLIANCE_ENV}")
    sub.add_argument("--selector", help="JMS selector over the message's fields")
    sub.add_argument("--count", type=int, default=0, help="stop after this many messages")
    sub.add_argument("--seconds", type=float, default=0.0, help="stop after this long")
    sub.add_argument("--stats", action="store_true",
                     help="print one JSON object of statistics at the end instead of messages")
    sub.add_argument("--json", action="store_true", help="print messages as JSON lines")
    sub.add_argument("--qos", default="best-effort",
                     choices=("best-effort", "last-value", "guaranteed"))
    sub.add_argument("--identity", default="anonymous", help="who to log in as")
    sub.add_argument("--namespace", type=int, default=0)
    sub.set_defaults(handler=run_sub)


def _url(address: str) -> str:
    return address if "://" in address or address.startswith("embedded:") else f"udp://{address}"


def _connect(args: argparse.Namespace):  # noqa: ANN202 - a Client
    from appliance.client import connect

    if not args.appliance:
        raise UserError(f"give --appliance ADDR (udp://HOST:PORT, HOST:PORT, shm://RING, "
                        f"embedded:) or set ${APPLIANCE_ENV}", component="pubsub")
    if args.count < 0 or getattr(args, "rate", 0) < 0:
        raise UserError("--count and --rate must not be negative", component="pubsub")
    return connect(_url(args.appliance), args.identity)


def run_pub(args: argparse.Namespace) -> int:
    if args.size < 0:
        raise UserError("--size must not be negative", component="pub")
    payload = args.message.encode() if args.message is not None else bytes(
        (i * 7) & 0xFF for i in range(args.size))
    client = _connect(args)
    sent = 0
    start = time.perf_counter()
    try:
        for i in range(args.count):
            if args.rate:
                wait = start + i / args.rate - time.perf_counter()
                if wait > 0:
                    client.flush()
                    time.sleep(wait)
            client.publish(args.topic, payload, qos=args.qos, namespace=args.namespace)
            sent += 1
        client.flush()
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    elapsed = time.perf_counter() - start
    summary = {"sent": sent, "seconds": round(elapsed, 6),
               "msgs_per_s": round(sent / elapsed, 1) if elapsed > 0 else 0.0}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"published {sent} messages to {args.topic} in {elapsed:.3f} s "
              f"({summary['msgs_per_s']} msg/s)", file=sys.stderr)
    return 0


class SubStats:
    """Received, gaps, duplicates (per publisher stream and topic) and latency percentiles."""

    def __init__(self) -> None:
        from hdrh.histogram import HdrHistogram

        self.received = 0
        self.duplicates = 0
        self.lost = 0
        """Messages named by loss events (guaranteed subscriptions)."""
        self._highest: dict[tuple[int, int, int], int] = {}
        self._missing: dict[tuple[int, int, int], set[int]] = {}
        self.latency = HdrHistogram(1, STATS_LATENCY_HIGHEST_NS, 3)

    def on_message(self, msg) -> None:  # noqa: ANN001 - appliance.client.Message
        self.received += 1
        # a guaranteed stream numbers messages per (origin, publisher) across topics
        key = (msg.origin, msg.stream, -1 if msg.guaranteed else msg.topic_key)
        seq = msg.sequence
        highest = self._highest.get(key)
        if highest is None or seq == highest + 1:
            self._highest[key] = seq
        elif seq > highest:
            self._missing.setdefault(key, set()).update(range(highest + 1, seq))
            self._highest[key] = seq
        else:
            missing = self._missing.get(key)
            if missing and seq in missing:
                missing.discard(seq)
            else:
                self.duplicates += 1
        latency = msg.latency_ns
        if 0 < latency <= STATS_LATENCY_HIGHEST_NS:
            self.latency.record_value(latency)

    @property
    def gaps(self) -> int:
        return sum(len(m) for m in self._missing.values())

    def summary(self) -> dict:
        count = self.latency.get_total_count()

        def at(p: float) -> float:
            return round(self.latency.get_value_at_percentile(p) / 1e3, 3) if count else 0.0
        return {"received": self.received, "gaps": self.gaps, "duplicates": self.duplicates,
                "lost": self.lost,
                "streams": len(self._highest), "latency_p50_us": at(50),
                "latency_p99_us": at(99), "latency_max_us": round(
                    self.latency.get_max_value() / 1e3, 3) if count else 0.0}


def _format(msg, as_json: bool) -> str:  # noqa: ANN001 - appliance.client.Message
    try:
        text = msg.payload.decode("utf-8")
        encoding = "utf-8"
    except UnicodeDecodeError:
        text = msg.payload.hex()
        encoding = "hex"
    if as_json:
        return json.dumps({"topic": msg.topic, "payload": text, "encoding": encoding,
                           "sequence": msg.sequence, "qos": msg.qos,
                           "latency_us": round(msg.latency_ns / 1e3, 3)})
    return f"{msg.topic} {text}"


def run_sub(args: argparse.Namespace) -> int:
    import signal
    import threading

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    stats = SubStats()
    client = _connect(args)
    try:
        def on_loss(loss) -> None:  # noqa: ANN001 - appliance.client.Loss
            stats.lost += loss.messages
            if not args.stats:
                print(f"topicwire: lost {loss.messages} messages of origin {loss.origin} "
                      f"stream {loss.stream} ({loss.reason})", file=sys.stderr, flush=True)

        sub = client.subscribe(args.pattern, args.selector, qos=args.qos, on_loss=on_loss,
                               namespace=args.namespace)
        print(f"topicwire: subscribed to {args.pattern} at {client.node}", file=sys.stderr,
              flush=True)
        deadline = time.monotonic() + args.seconds if args.seconds else None
        while not stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            if args.count and stats.received >= args.count:
                break
            if client.logged_out_reason:
                break
            msg = sub.get(timeout=SUB_POLL_S)
            if msg is None:
                continue
            stats.on_message(msg)
            if not args.stats:
                print(_format(msg, args.json), flush=True)
    finally:
        client.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if args.stats:
        print(json.dumps(stats.summary()), flush=True)
    return 0
