"""``topicwire bench guaranteed``: a guaranteed stream across two appliances, signed vs not.

Two appliances in this process on loopback, A (embedded P&M) and D, neighbours over UDP. A
publisher client at A publishes ``--messages`` messages ``qos="guaranteed"`` as fast as the
client library takes them; a subscriber client at D receives them on a guaranteed
subscription. Between A and D they travel on a reliable stream whose frames (DATA, ACK, NAK,
...) carry the fabric MAC trailer (appliance/control/auth.py): that is ``topicwire``. The
baseline ``unsigned`` is the same run with both appliances' guaranteed planes given a signer
that appends nothing and checks nothing (what the stream cost before its frames were
authenticated). After one warm-up measurement of each (not counted), each repeat measures
both, one after the other in alternating order, each on a fresh stream (a new publisher
session); the figure is the subscriber's rate from the first publish to the last message
received, medians over ``--repeats``.

``sign_check_ns_per_frame`` is the cost of signing and checking one frame of the stream's
size (``--frame-bytes``) alone, measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

from bench.report import build_report, positive_int, progress
from datapath.config import BENCH_REPEATS

NAME = "guaranteed"
HELP = "a guaranteed stream across two appliances: frames signed (fabric MAC) vs unsigned"
KEY_HEX = "5a" * 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=positive_int, default=20_000,
                        help="messages per measurement (default 20000)")
    parser.add_argument("--size", type=positive_int, default=64,
                        help="payload bytes (default 64)")
    parser.add_argument("--repeats", type=positive_int, default=BENCH_REPEATS,
                        help=f"repeats (default {BENCH_REPEATS})")
    parser.add_argument("--frame-bytes", type=positive_int, default=1_440,
                        help="frame size of the sign+check micro-measurement (default 1440)")


class _Unsigned:
    """A guaranteed plane's signer that appends and checks nothing (the baseline)."""

    accepted = 0
    incarnation = 0
    """What the plane binds its receiver's frames to (``FabricAuth.incarnation``): unused."""

    def signed_copy(self, frame: Any, bind: int = 0) -> Any:
        return frame

    def check_bytes(self, buf: Any, source: int, dest: int, link: int,
                    bind: int = 0) -> None:
        return None


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pair() -> tuple[Any, Any]:
    from appliance.config import parse_config
    from appliance.node import Appliance

    fa, fd = _free_port(), _free_port()
    common = {"heartbeat_interval_ms": 100, "lsa_refresh_ms": 1_000}
    a = parse_config({
        "appliance": {"name": f"bench-a{fa}", "dataplane": "thread", **common},
        "fabric": {"listen": f"127.0.0.1:{fa}", "key": KEY_HEX},
        "neighbours": [{"name": f"bench-d{fd}", "address": f"127.0.0.1:{fd}"}],
        "clients": {"udp": f"127.0.0.1:{_free_port()}"},
        "pm": {"require_passwords": False,
               "identities": {"feed": {"publish": ["#"], "subscribe": ["#"]}}}})
    d = parse_config({
        "appliance": {"name": f"bench-d{fd}", "dataplane": "thread", **common},
        "fabric": {"listen": f"127.0.0.1:{fd}", "key": KEY_HEX},
        "neighbours": [{"name": f"bench-a{fa}", "address": f"127.0.0.1:{fa}"}],
        "clients": {"udp": f"127.0.0.1:{_free_port()}"},
        "pm": {"mode": "remote"}})
    return Appliance(a).start(), Appliance(d).start()


def _url(app: Any) -> str:
    host, port = app.config.clients_udp
    return f"udp://{host}:{port}"


def _use(app: Any, signer: Any) -> None:
    """Give ``app``'s guaranteed plane ``signer`` and wait until its data path took it."""
    dp = app.dataplane
    done = threading.Event()

    def swap() -> None:
        dp.guaranteed.use_auth(signer)
        done.set()

    dp.commands.offer(swap)
    if not done.wait(10):
        raise RuntimeError("bench guaranteed: the data path did not take the signer")


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench guaranteed: {what} within {timeout_s} s")
        time.sleep(0.02)


def _measure(a: Any, d: Any, messages: int, payload: bytes, topic: str) -> dict[str, float]:
    from appliance.client import connect

    with connect(_url(d), "feed", timeout_s=10) as sc, \
            connect(_url(a), "feed", timeout_s=10) as pc:
        sub = sc.subscribe(topic, qos="guaranteed")
        _wait(lambda: any(s["qos"] == "guaranteed" and s["pattern"] == topic
                          and s["origin"] == d.config.name for s in a.status()["subscriptions"]),
              20, "the subscription did not reach the publisher's appliance")
        pc.publish(topic, b"warm", qos="guaranteed", flush=True)  # the stream and key exist
        if sub.get(timeout=20) is None:
            raise RuntimeError("bench guaranteed: the first message did not arrive")
        start = time.perf_counter()
        for _ in range(messages):
            pc.publish(topic, payload, qos="guaranteed")
        pc.flush()
        got = 0
        while got < messages:
            if sub.get(timeout=30) is None:
                raise RuntimeError(f"bench guaranteed: {got} of {messages} arrived")
            got += 1
        elapsed = time.perf_counter() - start
        return {"msgs_per_s": messages / elapsed, "lost": float(sub.lost_messages)}


def _sign_check_ns(frame_bytes: int, rounds: int = 20_000) -> float:
    from appliance.control.auth import FabricAuth
    from datapath.protocol.codec import encode_data_frame

    key = bytes.fromhex(KEY_HEX)
    sender, receiver = FabricAuth(key, 1, 1, 1), FabricAuth(key, 1, 2, 2)
    payload = bytes(max(frame_bytes - 32 - 40 - 32, 8))
    frame = memoryview(encode_data_frame([{"topic_key": 1, "sequence": 1, "payload": payload}],
                                         source_session=7, dest_session=8, stream_id=1))
    start = time.perf_counter_ns()
    for _ in range(rounds):
        signed = sender.signed_copy(frame)
        if receiver.check_bytes(memoryview(signed), 7, 8, 8) is not None:
            raise RuntimeError("bench guaranteed: a signed frame did not check")
    return (time.perf_counter_ns() - start) / rounds


def run(args: argparse.Namespace) -> dict[str, Any]:
    from appliance.control.auth import FabricAuth

    payload = bytes(args.size)
    runs: dict[str, list[dict[str, float]]] = {"topicwire": [], "unsigned": []}
    a, d = _pair()
    try:
        _wait(lambda: all(n["state"] == "up" for app in (a, d)
                          for n in app.status()["neighbours"])
              and d.status()["node"]["pm"] is not None, 30, "the appliances did not meet")
        signers = {"topicwire": lambda app: FabricAuth(
                       app.config.fabric_key, app.config.fabric_key_id,
                       app.control.epoch, time.time_ns()),
                   "unsigned": lambda app: _Unsigned()}
        for name, make in signers.items():  # warm-up (compiles, first streams): not counted
            for app in (a, d):
                _use(app, make(app))
            progress(NAME, f"warm-up, {name}")
            _measure(a, d, args.messages, payload, f"w{name[0]}/x")
        order = list(signers)
        for r in range(args.repeats):
            for name in order if r % 2 == 0 else order[::-1]:  # neither always goes first
                for app in (a, d):
                    _use(app, signers[name](app))
                progress(NAME, f"repeat {r + 1}/{args.repeats}, {name}")
                runs[name].append(_measure(a, d, args.messages, payload, f"b{r}{name[0]}/x"))
    finally:
        d.stop()
        a.stop()
    results = {name: {k: statistics.median(x[k] for x in found) for k in found[0]}
               for name, found in runs.items()}
    results["topicwire"]["sign_check_ns_per_frame"] = _sign_check_ns(args.frame_bytes)
    params = {"messages": args.messages, "size": args.size, "repeats": args.repeats,
              "frame_bytes": args.frame_bytes, "transport": "udp loopback, in one process",
              "runs": {name: [round(x["msgs_per_s"]) for x in found]
                       for name, found in runs.items()}}
    return build_report(NAME, params, results)
