"""Hundreds of connections of one identity, each publishing the first message of its own topic
at the same moment, on a ``topicwire run`` edge whose appliance stops answering for a while
(its data-path process stopped with SIGSTOP, as a data path busy with thousands of first
publishes is): the registrations go unanswered past the native client's request timeout,
and are asked again (``native_register_retries``) instead of closing the connections
(``closed_native_publish_failed``, issue 16); once the appliance answers, every publish is
acknowledged and delivered to its subscriber. The native subscribes and unsubscribes of
those connections likewise. Then a SIGTERM while every connection waits
for the appliance ends the edge within its bound (docs/mqtt.md, "How it is built", "Start
and stop"): the waiting connections are cancelled after ``CLOSE_GRACE_S`` (the data path
is let run again then, for the appliance's own drain)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from appliance.dataplane.process import STOP_MARGIN_S
from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType
from appliance.edge.mqtt.server import CLOSE_GRACE_S, STOP_TIMEOUT_S
from tests.appliance.helpers import free_port, run_appliance, stop, write_config

CONNECTIONS = 300
"""Connections of the one identity (each subscribes its own topic and publishes to it)."""
DEADLINE_S = 120.0
"""How long the test waits for the set-up, the retries and the deliveries (a loaded host)."""
DRAIN_S = 0.5
STOP_BOUND_S = 2 * STOP_TIMEOUT_S + DRAIN_S + STOP_MARGIN_S + 5.0
"""The documented bound of a clean stop of an edge (docs/mqtt.md, "Start and stop"): the MQTT
server's shutdown and its loop's thread (``STOP_TIMEOUT_S`` each), then the appliance's
drain and its data path's stop (``appliance.drain_timeout_ms`` + ``STOP_MARGIN_S``), and 5 s
for the rest (the management API, the process's exit)."""


def _config(tmp_path: Path, mqtt_port: int, mgmt_port: int) -> Path:
    # the management API in the appliance's process: the data path is its only child;
    # session_dead_ms: the native session outlives the data path's stop
    return write_config(tmp_path / "edge.toml", f"""
[appliance]
name = "edge-many"
role = "edge"
drain_timeout_ms = {int(DRAIN_S * 1000)}
[clients]
udp = "127.0.0.1:{free_port()}"
max_subscriptions = 4096
session_dead_ms = 60000
[pm]
require_passwords = false
[pm.identities.anonymous]
publish = ["many/#"]
subscribe = ["many/#"]
[mqtt]
listen = "127.0.0.1:{mqtt_port}"
allow_anonymous = true
max_connections = {CONNECTIONS + 16}
[mgmt]
listen = "127.0.0.1:{mgmt_port}"
process = false
""")


def _data_path_pid(pid: int) -> int:
    """The appliance's one child process: its data path (forked by one of its threads)."""
    children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    assert len(children) == 1, children
    return children[0]


def _counters(mgmt_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{mgmt_port}/status", timeout=30) as answer:
        return json.load(answer).get("mqtt", {}).get("counters", {})


class Peer:
    """One raw MQTT 3.1.1 connection: subscribed to ``many/<i>``; what it receives."""

    def __init__(self, i: int) -> None:
        self.i = i
        self.topic = f"many/{i}"
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter
        self.got: dict[str, asyncio.Event] = {k: asyncio.Event() for k in
                                              ("connack", "suback", "puback", "publish",
                                               "unsuback")}
        self.payloads: list[bytes] = []
        self.ended = asyncio.Event()

    async def open(self, port: int, subscribe: bool = True) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        self.task = asyncio.ensure_future(self._read())
        self.writer.write(codec.encode_connect(f"many-{self.i}", keep_alive_s=0))
        await self.got["connack"].wait()
        if subscribe:
            self.subscribe()
            await self.got["suback"].wait()

    def subscribe(self) -> None:
        self.writer.write(codec.encode_subscribe(1, [(self.topic, 1)]))

    def unsubscribe(self) -> None:
        self.writer.write(codec.packet(PacketType.UNSUBSCRIBE, 0b0010,
                                       b"\x00\x03" + codec._str(self.topic)))

    def publish(self) -> None:
        self.writer.write(codec.encode_publish(self.topic, b"%d" % self.i, 1, packet_id=2))

    async def _read(self) -> None:
        try:
            while True:
                first = (await self.reader.readexactly(1))[0]
                header = b""
                while (got := codec.read_remaining_length(header)) is None:
                    header += await self.reader.readexactly(1)
                body = await self.reader.readexactly(got[0])
                kind = first >> 4
                if kind == PacketType.CONNACK:
                    assert body[1] == 0, body
                    self.got["connack"].set()
                elif kind == PacketType.SUBACK:
                    assert body[2] == 1, body  # granted QoS 1
                    self.got["suback"].set()
                elif kind == PacketType.PUBACK:
                    self.got["puback"].set()
                elif kind == PacketType.UNSUBACK:
                    self.got["unsuback"].set()
                elif kind == PacketType.PUBLISH:
                    pkt = codec.decode(first, body, codec.V311)
                    self.payloads.append(pkt.payload)
                    if pkt.qos:
                        self.writer.write(codec.encode_ack(PacketType.PUBACK, pkt.packet_id))
                    self.got["publish"].set()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.ended.set()

    def close(self) -> None:
        self.task.cancel()
        self.writer.close()


async def _open_all(port: int, subscribe: bool = True) -> list[Peer]:
    peers = [Peer(i) for i in range(CONNECTIONS)]
    gate = asyncio.Semaphore(64)

    async def one(peer: Peer) -> None:
        async with gate:
            await peer.open(port, subscribe)

    await asyncio.wait_for(asyncio.gather(*(one(p) for p in peers)), DEADLINE_S)
    return peers


async def _until(predicate, what: str, log: list[str] | None = None) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not await asyncio.to_thread(predicate):
        assert time.monotonic() < deadline, f"{what} not within {DEADLINE_S} s: {log}"
        await asyncio.sleep(0.2)


async def _while_stopped(dp: int, peers: list[Peer], send, until, what: str) -> None:
    """``send`` on every peer with the data path stopped, which goes on once ``until()``."""
    os.kill(dp, signal.SIGSTOP)
    try:
        for peer in peers:
            send(peer)
        await _until(until, what)
    finally:
        os.kill(dp, signal.SIGCONT)


async def _every(peers: list[Peer], name: str) -> None:
    await asyncio.wait_for(asyncio.gather(*(p.got[name].wait() for p in peers)), DEADLINE_S)


async def _published_to_every(peers: list[Peer]) -> None:
    """Each peer's message acknowledged and delivered to it, once."""
    for name in ("puback", "publish"):
        await _every(peers, name)
    assert [p.payloads for p in peers] == [[b"%d" % p.i] for p in peers]


def _closed(counters: dict) -> dict:
    """The connections the edge closed (not their peers)."""
    return {k: v for k, v in counters.items() if k.startswith("closed_") and k != "closed_by_peer"}


def _unanswered(mgmt_port: int) -> bool:
    """The native side left a first publish unanswered past its request timeout: asked
    again (the fix), or the connection closed for it (issue 16's failure)."""
    c = _counters(mgmt_port)
    return bool(c.get("native_register_retries") or c.get("closed_native_publish_failed"))


def _run_edge(tmp_path: Path, scenario, subscribe: bool = True) -> dict:
    """``await scenario(peers, dp, mgmt_port)`` with CONNECTIONS raw connections to a
    ``topicwire run`` edge (each subscribed to its own topic with ``subscribe``; ``dp``: its
    data path's pid), after which none of them was closed by the edge; its counters then."""
    mqtt_port, mgmt_port = free_port(), free_port()
    proc = run_appliance(_config(tmp_path, mqtt_port, mgmt_port))
    dp = _data_path_pid(proc.pid)

    async def run() -> None:
        peers = await _open_all(mqtt_port, subscribe)
        try:
            await scenario(peers, dp, mgmt_port)
            assert not any(p.ended.is_set() for p in peers)
        finally:
            for peer in peers:
                peer.close()

    try:
        asyncio.run(run())
        counters = _counters(mgmt_port)
        assert _closed(counters) == {}, counters
        return counters
    finally:
        os.kill(dp, signal.SIGCONT)
        stop(proc)


def test_first_publishes_the_appliance_does_not_answer_in_time_are_asked_again(tmp_path):
    async def scenario(peers: list[Peer], dp: int, mgmt_port: int) -> None:
        await _while_stopped(dp, peers, Peer.publish, lambda: _unanswered(mgmt_port),
                             "a registration unanswered past its timeout")
        await _published_to_every(peers)

    counters = _run_edge(tmp_path, scenario)
    assert counters.get("native_register_retries", 0) >= 1, counters


def test_subscribes_and_unsubscribes_the_appliance_does_not_answer_in_time_are_asked_again(
        tmp_path):
    """Every connection subscribes its own topic while the data path is stopped: the native
    subscribe batch goes unanswered past the request timeout and is asked again
    (``native_subscribe_retries``; once the appliance runs, it may refuse a repeat while the
    first request's entries still wait for their tables: ``BusyError``, asked again too)
    instead of closing the connections (``closed_native_subscribe_failed``, issue 16):
    each SUBACK grants QoS 1 and a message then reaches every connection. The unsubscribes
    likewise (``native_unsubscribe_retries``: more patterns than the identity withdraws at
    once, so its native list is rebuilt, then the last ones withdrawn)."""
    steps = (("suback", "native_subscribe_retries", Peer.subscribe),
             ("unsuback", "native_unsubscribe_retries", Peer.unsubscribe))

    async def scenario(peers: list[Peer], dp: int, mgmt_port: int) -> None:
        for answer, retries, send in steps:
            await _while_stopped(
                dp, peers, send, lambda name=retries: _counters(mgmt_port).get(name, 0) >= 1,
                f"a native request for {answer} asked again")
            await _every(peers, answer)
            if answer == "suback":
                for peer in peers:
                    peer.publish()
                await _published_to_every(peers)

    counters = _run_edge(tmp_path, scenario, subscribe=False)
    assert counters.get("subscriptions") == CONNECTIONS, counters
    assert counters.get("unsubscriptions") == CONNECTIONS, counters


def test_sigterm_while_every_connection_waits_for_the_appliance_exits_within_the_bound(
        tmp_path):
    mqtt_port, mgmt_port = free_port(), free_port()
    proc = run_appliance(_config(tmp_path, mqtt_port, mgmt_port))
    dp = _data_path_pid(proc.pid)

    async def scenario() -> None:
        peers = await _open_all(mqtt_port)
        try:
            os.kill(dp, signal.SIGSTOP)  # every first publish now waits for the appliance
            for peer in peers:
                peer.publish()
            await _until(lambda: _counters(mgmt_port).get("native_register_batches", 0) >= 1,
                         "the first publishes waiting for their registration")
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
            reader.start()  # (the edge's log: its warning once it cancelled them)
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            # the connections still waiting for the appliance are cancelled, then the
            # appliance goes on stopping with its data path running again
            await _until(lambda: any("cancelled" in line for line in lines),
                         "the waiting connections cancelled", lines)
            os.kill(dp, signal.SIGCONT)
            left = STOP_BOUND_S - (time.monotonic() - sent)
            await asyncio.to_thread(proc.wait, left)  # (TimeoutExpired: too late)
            await asyncio.wait_for(asyncio.gather(*(p.ended.wait() for p in peers)),
                                   CLOSE_GRACE_S * 2 + 5)
        finally:
            for peer in peers:
                peer.close()

    try:
        asyncio.run(scenario())
        assert proc.returncode == 0
    finally:
        try:
            os.kill(dp, signal.SIGCONT)
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.kill()
        stop(proc)
        try:
            proc.wait(0)
        except subprocess.TimeoutExpired:
            pass
