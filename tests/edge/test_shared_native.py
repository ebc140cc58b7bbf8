"""The MQTT sessions of one P&M identity share one native client session
(appliance/edge/mqtt/identities.py): native subscriptions counted per pattern across
sessions, No Local between two connections of one identity, a slow subscriber of an identity
that does not hold up a fast one of the same identity, and thousands of idle connections
held by a ``topicwire run`` edge while paho clients exchange QoS 1 messages."""

from __future__ import annotations

import asyncio
import queue
import resource
import shutil
import socket
import subprocess
import threading

import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from appliance.edge.mqtt import codec
from tests.appliance.helpers import CLI, free_port, run_appliance, stop, write_config
from tests.appliance.mgmt_fabric import http
from tests.edge.conftest import (
    counter,
    port_of,
    raw_connect,
    read_packet,
    start_edge,
    wait_counter,
    wait_for,
)
from tests.edge.peers import Peer

IDLE_CONNECTIONS = 5_000
"""Idle connections the ``topicwire run`` edge holds in the test below."""
EXCHANGED = 1_000


def native_sessions(edge) -> int:
    return edge.mqtt.status()["native_sessions"]


def test_an_identity_keeps_a_filter_another_session_still_holds():
    edge = start_edge()
    try:
        with Peer(edge, "a", version=5) as a, Peer(edge, "b", version=5) as b, \
                Peer(edge, "pub", user="bob") as pub:
            assert a.subscribe("public/x", 1) == 1
            assert b.subscribe("public/x", 1) == 1
            assert native_sessions(edge) == 2  # alice's and bob's, not one per connection
            assert counter(edge, "native_subscribes_shared") >= 1
            pub.publish("public/x", b"both", 1)
            assert a.next().payload == b"both" and b.next().payload == b"both"
            a.unsubscribe("public/x")
            pub.publish("public/x", b"b only", 1)
            assert b.next().payload == b"b only"
            # a's UNSUBSCRIBE took nothing from b; a got nothing more (b's copy came first)
            pub.publish("public/x", b"again", 1)
            assert b.next().payload == b"again"
            assert a.messages.empty()
        wait_for(lambda: native_sessions(edge) == 0, what="the native sessions logged out")
    finally:
        edge.stop()


def test_sessions_of_an_identity_coming_and_going_do_not_rebuild_its_native_list():
    """A session that holds ``keep/#`` while others of its identity subscribe and leave,
    one after another: each leaving one's pattern is withdrawn alone, never by withdrawing
    every pattern and subscribing the held ones again (``native_rebuilds``: a gap in which
    the keeper's messages would be lost). Before, every subscribe ever made counted towards
    that rebuild, so from the second visitor on each withdrawal was one."""
    edge = start_edge()
    try:
        with Peer(edge, "keeper") as keeper, Peer(edge, "pub") as pub:
            assert keeper.subscribe("keep/#", 1) == 1
            for i in range(5):
                with Peer(edge, f"visitor{i}") as visitor:
                    assert visitor.subscribe(f"visit{i}/#", 1) == 1
                wait_counter(edge, "native_unsubscribe_batches", i + 1)
                pub.publish(f"keep/{i}", b"%d" % i, 1)
                assert keeper.next().payload == b"%d" % i
            assert counter(edge, "native_rebuilds") == 0
    finally:
        edge.stop()


def test_no_local_tells_two_connections_of_one_identity_apart():
    edge = start_edge()
    try:
        with Peer(edge, "nl-a", version=5) as a, Peer(edge, "nl-b", version=5) as b:
            assert a.subscribe("nl/t", options=SubscribeOptions(qos=1, noLocal=True)) == 1
            assert b.subscribe("nl/t", options=SubscribeOptions(qos=1, noLocal=True)) == 1
            a.publish("nl/t", b"from a", 1)
            assert b.next().payload == b"from a"  # the other session of alice gets it
            b.publish("nl/t", b"from b", 1)
            # a's first message is b's: its own one was not sent back to it
            assert a.next().payload == b"from b"
            a.publish("nl/t", b"from a again", 1)
            assert b.next().payload == b"from a again"
            b.publish("nl/t", b"from b again", 1)
            assert a.next().payload == b"from b again"
            assert a.messages.empty() and b.messages.empty()
            assert native_sessions(edge) == 1
    finally:
        edge.stop()


def test_a_slow_subscriber_does_not_stop_a_fast_one_of_the_same_identity():
    edge = start_edge(max_inflight=4, max_queued=50)
    try:
        slow, _ = raw_connect(edge, "slow")  # alice, never acknowledges nor reads
        slow.sendall(codec.encode_subscribe(1, [("fast/t", 1)], 4))
        assert read_packet(slow)[0] >> 4 == codec.PacketType.SUBACK
        with Peer(edge, "fast") as fast, Peer(edge, "pub", user="alice") as pub:
            assert fast.subscribe("fast/t", 1) == 1
            n = 120
            for i in range(n):  # each reaches the fast one while the slow one is stuck
                pub.publish("fast/t", b"%d" % i, 1)
                assert int(fast.next().payload) == i
            # the slow one holds 4 in flight and 50 queued; the rest were dropped, counted
            wait_counter(edge, "deliveries_dropped_queue_full", n - 4 - 50)
            assert counter(edge, "deliveries_dropped_queue_full") == n - 4 - 50
        slow.close()
    finally:
        edge.stop()


def _raise_open_files(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < need:
        pytest.skip(f"this test holds {need} sockets; the open-file limit is {hard}")


class IdleConnections:
    """``n`` raw MQTT 3.1.1 connections (anonymous, keep-alive 600 s) on an asyncio loop of
    a thread of their own, each CONNACKed, then left idle."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n = port, n
        self.loop = asyncio.new_event_loop()
        self.writers: list[asyncio.StreamWriter] = []
        self.accepted = 0
        self.ready: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._open())
            self.ready.put(None)
        except BaseException as exc:  # the test fails with it
            self.loop.run_until_complete(self._close())
            self.loop.close()
            self.ready.put(exc)
            return
        self.loop.run_forever()
        self.loop.run_until_complete(self._close())  # (else the sockets outlive the test)
        self.loop.close()

    async def _close(self) -> None:
        for w in self.writers:
            w.close()
        await asyncio.gather(*(w.wait_closed() for w in self.writers), return_exceptions=True)

    async def _one(self, i: int, gate: asyncio.Semaphore) -> None:
        async with gate:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            writer.write(codec.encode_connect(f"idle-{i}", version=4, keep_alive_s=600))
            head = await reader.readexactly(4)
            assert head[0] >> 4 == codec.PacketType.CONNACK and head[3] == 0, head
            self.writers.append(writer)
            self.accepted += 1

    async def _open(self) -> None:
        gate = asyncio.Semaphore(64)  # at most this many CONNECTs waiting at once
        await asyncio.gather(*(self._one(i, gate) for i in range(self.n)))

    def wait(self, timeout_s: float) -> None:
        error = self.ready.get(timeout=timeout_s)
        if error is not None:
            raise error

    def close(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(60)


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="as test_run_edge.py")
def test_a_running_edge_holds_thousands_of_idle_connections_while_two_clients_talk(tmp_path):
    _raise_open_files(IDLE_CONNECTIONS + 1_000)
    mqtt_port, mgmt_port = free_port(), free_port()
    config = write_config(tmp_path / "edge.toml", f"""
[appliance]
name = "edge-idle"
role = "edge"
[clients]
udp = "127.0.0.1:{free_port()}"
[pm]
require_passwords = false
[pm.identities.anonymous]
publish = ["idle/#"]
subscribe = ["idle/#"]
[mqtt]
listen = "127.0.0.1:{mqtt_port}"
allow_anonymous = true
max_connections = {IDLE_CONNECTIONS + 16}
[mgmt]
listen = "127.0.0.1:{mgmt_port}"
""")
    proc = run_appliance(config)
    idle = None
    try:
        edge = type("Edge", (), {"port": mqtt_port})()
        # (paho's loop uses select(): its sockets are opened before the thousands of others)
        with Peer(edge, "sub", user=None) as sub, Peer(edge, "pub", user=None) as pub:
            assert sub.subscribe("idle/talk", 1) == 1
            idle = IdleConnections(mqtt_port, IDLE_CONNECTIONS)
            idle.wait(120)
            assert idle.accepted == IDLE_CONNECTIONS
            infos = [pub.client.publish("idle/talk", b"%d" % i, 1) for i in range(EXCHANGED)]
            for info in infos:
                info.wait_for_publish(60)
                assert info.is_published()
            got = [int(sub.next(60).payload) for _ in range(EXCHANGED)]
            assert got == list(range(EXCHANGED))  # each once, in order
            code, _, doc = http("GET", f"http://127.0.0.1:{mgmt_port}/status")
            assert code == 200
            mqtt = doc["mqtt"]
            assert mqtt["connections"] >= IDLE_CONNECTIONS + 2, mqtt
            assert mqtt["native_sessions"] == 1, mqtt  # every connection is "anonymous"
            assert mqtt["counters"].get("closed_keep_alive_timeout", 0) == 0
            assert sub.messages.empty()
    finally:
        if idle is not None:
            idle.close()
        stop(proc)


def test_max_connections_beyond_the_open_file_limit_stops_the_edge_with_one_line(tmp_path):
    config = write_config(tmp_path / "edge.toml", f"""
[appliance]
name = "edge-nofile"
role = "edge"
[clients]
udp = "127.0.0.1:{free_port()}"
[mqtt]
listen = "127.0.0.1:{free_port()}"
max_connections = 5000
""")

    def low_limit() -> None:  # (in the child: its hard limit cannot be raised again)
        resource.setrlimit(resource.RLIMIT_NOFILE, (2_048, 2_048))

    done = subprocess.run([*CLI, "run", "--config", str(config)], capture_output=True,
                          text=True, timeout=120, preexec_fn=low_limit)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        "topicwire: config: mqtt.max_connections: 5000 connections and 1024 other files need "
        "more than this process's open-file limit (2048"), done.stderr


COALESCED = 200
"""Connections of one identity subscribing each its own topic at once in the test below."""


def test_native_subscribes_arriving_together_go_in_one_native_request():
    """Each of COALESCED connections of bob subscribes its own topic, all sent before any
    SUBACK is read: the identity's native subscribes are coalesced (fewer native requests
    than patterns), each SUBACK still comes once its subscription is live (a message
    published right after it is delivered), and a filter P&M refuses gets 0x80 alone.
    Then the connections unsubscribe together."""
    edge = start_edge(max_connections=COALESCED + 8)
    socks = []
    try:
        for i in range(COALESCED):
            sock = socket.create_connection(("127.0.0.1", port_of(edge)), timeout=30)
            sock.sendall(codec.encode_connect(f"co{i}", username="bob",
                                              password=b"bob-secret"))
            first, body = read_packet(sock)
            assert first >> 4 == codec.PacketType.CONNACK and body[1] == 0, body
            socks.append(sock)
        refused = {7, 150}
        topics = [f"private/co/{i}" if i in refused else f"public/co/{i}"
                  for i in range(COALESCED)]
        batches = counter(edge, "native_subscribe_batches")
        for i, sock in enumerate(socks):
            sock.sendall(codec.encode_subscribe(1, [(topics[i], 1)]))
        for i, sock in enumerate(socks):
            first, body = read_packet(sock)
            assert first >> 4 == codec.PacketType.SUBACK, (i, first)
            assert body[2:] == (b"\x80" if i in refused else b"\x01"), (i, body)
        made = counter(edge, "native_subscribe_batches") - batches
        assert 1 <= made < COALESCED - len(refused), made
        with Peer(edge, "copub", user="bob") as pub:
            for i in (0, COALESCED - 1):
                pub.publish(topics[i], f"to {i}".encode(), 1)
                sock = socks[i]
                first, body = read_packet(sock)
                assert first >> 4 == codec.PacketType.PUBLISH and body.endswith(
                    f"to {i}".encode()), (first, body)
        unsubscribes = counter(edge, "native_unsubscribe_batches")
        for i, sock in enumerate(socks):
            sock.sendall(codec.packet(codec.PacketType.UNSUBSCRIBE, 0b0010,
                                      b"\x00\x02" + codec._str(topics[i])))
        for sock in socks:
            first, _ = read_packet(sock)
            assert first >> 4 == codec.PacketType.UNSUBACK
        assert counter(edge, "native_unsubscribe_batches") - unsubscribes < COALESCED
    finally:
        for sock in socks:
            sock.close()
        edge.stop()
