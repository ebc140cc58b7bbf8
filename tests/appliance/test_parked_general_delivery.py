"""A parked message run again inside the clients' UDP receive (``Express.receive``: its
readiness check reruns what was parked when the tables moved on since), for a subscriber the
general loop delivers to (a session with a selector subscription: its egress is guarded).

With the data path on a thread, the control agent installs snapshots while a duty cycle
runs, so the rerun can happen there rather than at the cycle's start. The general loop then
leaves a frame open in the UDP out queue; the express kernel, which sends that queue itself,
must not run over it: the message was counted delivered and never sent (a cold
``topicwire warm`` lost whole topics to this). The test makes that moment on the data-path
thread: a parked message of a known key, tables newer than it, a datagram in the clients'
socket, and the receive."""

import socket
import threading
import time

from appliance.client import connect
from appliance.config import parse_config
from appliance.dataplane import express as _express
from appliance.dataplane.agent import _PROBE, RELIABLE_STREAM_BIT
from appliance.node import Appliance
from datapath.protocol import frame_layout as fl
from datapath.protocol.codec import FrameWriter
from tests.appliance.helpers import free_port, wait_for

QUOTE = {"id": 7, "fields": [["price", 0, "u32"]]}


def _message(key: int, payload: bytes) -> bytes:
    """One message of ``key`` as the data path parks it (a frame's body)."""
    buf = bytearray(512)
    writer = FrameWriter(memoryview(buf), 0, len(buf))
    writer.begin(source_session=1, stream_id=1)
    writer.append(key, 1, time.time_ns(), payload)
    return bytes(buf[fl.FRAME_HEADER_BYTES:writer.finish()])


def test_a_parked_message_rerun_inside_the_udp_receive_reaches_a_guarded_subscriber():
    port = free_port()
    app = Appliance(parse_config({
        "appliance": {"name": f"pg{port}", "dataplane": "thread"},
        "clients": {"udp": f"127.0.0.1:{port}"},
        "pm": {"schemas": {"quote": QUOTE}, "require_passwords": False,
               "identities": {"feed": {"publish": ["#"], "subscribe": ["#"]}}}})).start()
    url = f"udp://127.0.0.1:{port}"
    poke = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with connect(url, "feed") as pub, connect(url, "feed") as sub:
            sub.subscribe("s/#", selector="price > 10")  # the session's egress is guarded
            plain = sub.subscribe("n/#")
            # a topic of the selector's pattern: its key is guarded, and so the session's
            # egress is the general loop's for every key
            pub.publish("s/x", (50).to_bytes(4, "big"), schema_id=7, flush=True)
            pub.publish("n/1", b"first", flush=True)  # the key is known from here on
            assert plain.get(timeout=10).payload == b"first"
            key = next(k for k, (_, topic) in pub._topics.items() if topic == "n/1")
            dp = app.dataplane
            wait_for(lambda: dp.sessions[sub.session].selectors is not None,
                     what="the subscriber's egress guarded")
            done = threading.Event()
            seen: dict = {}

            def moment() -> None:  # on the data-path thread, between two duty cycles
                now = time.monotonic_ns()
                dp._parked.append(((False, dp.node_id, 1, None, now + 10**10, 0),
                                   _message(key, b"parked")))
                dp._parked_version = -1  # the tables moved on since it was parked
                poke.sendto(b"not a frame", ("127.0.0.1", port))
                name, batch, channel, _ = next(r for r in dp._receivers if r[3])
                n, taken, punts = dp.express.receive(channel, batch, now, RELIABLE_STREAM_BIT,
                                                     _PROBE, now + dp.parked_ttl_ns)
                seen.update(n=n, parked_left=len(dp._parked))
                if n and taken != _express.TAKEN:
                    dp._on_batch(name, batch, now, taken == _express.UNTRIED)
                elif punts:
                    dp._general(name, batch, punts, now)
                done.set()

            dp.commands.offer(moment)
            assert done.wait(10), "the data path ran no cycle within 10 s"
            assert seen == {"n": 1, "parked_left": 0}, seen
            got = plain.get(timeout=10)
            assert got is not None, (
                "the parked message was counted delivered "
                f"({dp.sessions[sub.session].delivered}) but never reached the subscriber")
            assert (got.topic, got.payload) == ("n/1", b"parked")
    finally:
        poke.close()
        app.stop()
