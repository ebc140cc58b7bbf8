"""Replay and durable subscriptions from a neighbour's cache (``cache.serve_from``;
docs/fault-tolerance.md, "Replay and durable subscriptions from a neighbour's cache").

The fabric: ``c`` keeps ``orders/#`` (a ``topicwire run`` process with ``[cache]``, so that
it can be stopped with SIGSTOP), ``a`` and ``s`` have no cache and name ``c`` in
``cache.serve_from`` (in-process appliances, neighbours of ``c`` on loopback), and ``a2``
(a ``topicwire run`` process, killed with SIGKILL) is another like them. Real files, real
fsync, real sockets; every wait has a deadline and waits for a message, a state or a counter.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import urllib.request

import pytest

from appliance.client import ClientError, connect
from appliance.config import parse_config
from appliance.node import Appliance
from datapath.protocol import admin_layout as al
from datapath.protocol.codec import encode_admin
from datapath.protocol.frame_layout import FrameType
from tests.appliance.helpers import FABRIC_KEY, free_port, run_appliance, stop, wait_for
from tests.appliance.test_client_state import States

DEADLINE_S = 60.0
IDENTITIES = {"feed": {"publish": ["#"], "subscribe": ["#"]},
              "reader": {"subscribe": ["orders/#"]}}
COMMON = {"heartbeat_interval_ms": 50, "lsa_refresh_ms": 500, "neighbour_dead_ms": 10_000}
C_CONFIG = """
[appliance]
name = "{name}"
heartbeat_interval_ms = 50
lsa_refresh_ms = 500
neighbour_dead_ms = 10000
[fabric]
listen = "127.0.0.1:{fabric}"
key = "{key}"
{neighbours}
[clients]
udp = "127.0.0.1:{clients}"
[mgmt]
listen = "127.0.0.1:{mgmt}"
[cache]
dir = "{dir}"
patterns = ["orders/#"]
fsync = "interval"
fsync_interval_ms = 5
[pm]
require_passwords = false
[pm.identities.feed]
publish = ["#"]
subscribe = ["#"]
[pm.identities.reader]
subscribe = ["orders/#"]
"""
A2_CONFIG = """
[appliance]
name = "{name}"
heartbeat_interval_ms = 50
lsa_refresh_ms = 500
neighbour_dead_ms = 10000
[fabric]
listen = "127.0.0.1:{fabric}"
key = "{key}"
[[neighbours]]
name = "{c}"
address = "127.0.0.1:{c_fabric}"
[[neighbours]]
name = "{s}"
address = "127.0.0.1:{s_fabric}"
[clients]
udp = "127.0.0.1:{clients}"
[cache]
serve_from = "{c}"
[pm]
mode = "remote"
"""


class Fabric:
    """``c`` (process, cache), ``a`` and ``s`` (in process, ``serve_from = c``); ``a2``'s
    name and ports (started by the test that kills it)."""

    def __init__(self, tmp) -> None:
        p = {k: free_port() for k in ("c", "a", "s", "a2", "c_cl", "c_mgmt", "a_cl", "s_cl",
                                      "a2_cl")}
        self.ports = p
        self.names = {k: f"{k}{p[k]}" for k in ("c", "a", "s", "a2")}
        self.c_url = f"udp://127.0.0.1:{p['c_cl']}"
        self.a_url = f"udp://127.0.0.1:{p['a_cl']}"
        self.s_url = f"udp://127.0.0.1:{p['s_cl']}"
        self.a2_url = f"udp://127.0.0.1:{p['a2_cl']}"
        self.mgmt = f"http://127.0.0.1:{p['c_mgmt']}"
        self.tmp = tmp
        neighbours = "".join(f'[[neighbours]]\nname = "{self.names[k]}"\n'
                             f'address = "127.0.0.1:{p[k]}"\n' for k in ("a", "s", "a2"))
        config = tmp / "c.toml"
        config.write_text(C_CONFIG.format(name=self.names["c"], fabric=p["c"], key=FABRIC_KEY,
                                          neighbours=neighbours, clients=p["c_cl"],
                                          mgmt=p["c_mgmt"], dir=tmp / "cache"))
        self.c = run_appliance(config)
        self.a2 = None
        self.a = self.s = None
        try:
            self.a = self._serving("a", ("s",))
            self.s = self._serving("s", ("a", "a2"))
            wait_for(lambda: all(self._up(app, self.names["c"]) for app in (self.a, self.s))
                     and all(app.status()["node"]["pm"] is not None for app in (self.a, self.s)),
                     DEADLINE_S, what="a and s to meet c and take its P&M")
        except BaseException:
            self.close()
            raise

    def _serving(self, key: str, others: tuple[str, ...]) -> Appliance:
        p = self.ports
        return Appliance(parse_config({
            "appliance": {"name": self.names[key], **COMMON},
            "fabric": {"listen": f"127.0.0.1:{p[key]}", "key": FABRIC_KEY},
            "neighbours": [{"name": self.names[k], "address": f"127.0.0.1:{p[k]}"}
                           for k in ("c", *others)],
            "clients": {"udp": f"127.0.0.1:{p[key + '_cl']}"},
            "cache": {"serve_from": self.names["c"]},
            "pm": {"mode": "remote"}})).start()

    @staticmethod
    def _up(app, name: str) -> bool:
        return any(n["name"] == name and n["state"] == "up" for n in app.status()["neighbours"])

    def c_status(self) -> dict:
        with urllib.request.urlopen(f"{self.mgmt}/status", timeout=5) as answer:
            return json.load(answer)

    def start_a2(self) -> None:
        p = self.ports
        config = self.tmp / "a2.toml"
        config.write_text(A2_CONFIG.format(
            name=self.names["a2"], fabric=p["a2"], key=FABRIC_KEY, c=self.names["c"],
            c_fabric=p["c"], s=self.names["s"], s_fabric=p["s"], clients=p["a2_cl"]))
        self.a2 = run_appliance(config)
        wait_for(lambda: any(n["name"] == self.names["a2"] and n["state"] == "up"
                             for n in self.c_status()["neighbours"]), DEADLINE_S,
                 what="a2 up at c")

    def close(self) -> None:
        for app in (self.a, self.s):
            if app is not None:
                app.stop()
        for proc in (self.a2, self.c):
            if proc is not None:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                stop(proc)


@pytest.fixture(scope="module")
def fabric(tmp_path_factory):
    fab = Fabric(tmp_path_factory.mktemp("remote-replay"))
    yield fab
    fab.close()


def _counter(app, name: str) -> int:
    return int(app.status()["counters"].get(name, 0))


def _publish(url: str, topic: str, start: int, count: int, qos: str = "guaranteed") -> None:
    with connect(url, "feed") as client:
        for i in range(start, start + count):
            client.publish(topic, b"%d" % i, qos=qos)
            if i % 50 == 49:
                client.flush(timeout=DEADLINE_S)
        client.flush(timeout=DEADLINE_S)


def _take(sub, n: int, topic: str) -> list[int]:
    """The next ``n`` messages of ``sub`` on ``topic`` (others tests' topics skipped)."""
    got: list[int] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < n:
        msg = sub.get(timeout=max(0.0, deadline - time.monotonic()))
        assert msg is not None, f"{len(got)} of {n} messages: {got[-5:]}"
        if msg.topic == topic:
            got.append(int(msg.payload))
    return got


def test_a_replay_at_an_appliance_without_a_cache_comes_from_the_neighbours(fabric):
    """Every kept message in order from c's cache through a, then the live stream without a
    gap or a duplicate, while a publisher at c goes on."""
    total = 2_000
    topics = ("orders/eu/x", "orders/us/y")
    published: list[tuple[str, bytes]] = []
    halfway = threading.Event()

    def publish() -> None:
        with connect(fabric.c_url, "feed") as client:
            for i in range(total):
                topic = topics[i % 2]
                payload = f"{topic}:{i}".encode()
                client.publish(topic, payload)
                published.append((topic, payload))
                if i % 8 == 7:
                    client.flush()
                    time.sleep(0.005)  # a steady stream, not one burst
                if i == total // 2:
                    halfway.set()
            client.flush()

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        assert halfway.wait(DEADLINE_S)
        with connect(fabric.a_url, "reader") as client:
            stream = client.replay("orders/#", then_live=True)
            got = []
            deadline = time.monotonic() + DEADLINE_S
            for msg in stream:
                if msg.topic in topics:
                    got.append((msg.topic, msg.payload))
                if msg.payload.endswith(f":{total - 1}".encode()) or \
                        time.monotonic() > deadline:
                    break
    finally:
        publisher.join(DEADLINE_S)
    for topic in topics:  # per topic: each message once, in publish order
        assert [p for t, p in got if t == topic] == [p for t, p in published if t == topic]
    assert len(got) == total and stream.join_gaps == 0
    wait_for(lambda: _counter(fabric.a, "control_replay_forward_answers") >= 2
             and _counter(fabric.a, "control_replay_forward_frames") >= 1, DEADLINE_S,
             what="a's forwarding counters")
    assert _counter(fabric.a, "control_replay_forward_refused_down") == 0


def test_a_durable_subscriber_that_moves_to_another_appliance_goes_on_where_it_left(fabric):
    """A durable subscriber at a takes 30 messages and leaves; 1,500 are published; it comes
    back at s (both name c): it gets exactly those 1,500 in order, then the live ones."""
    with connect(fabric.a_url, "reader") as client:
        sub = client.subscribe("orders/#", durable="mover")
        _publish(fabric.c_url, "orders/d/x", 0, 30)
        assert _take(sub, 30, "orders/d/x") == list(range(30))
    _publish(fabric.c_url, "orders/d/x", 30, 1_500)  # while it is away
    with connect(fabric.s_url, "reader") as client:
        sub = client.subscribe("orders/#", durable="mover")
        got = _take(sub, 1_500, "orders/d/x")
        assert got == list(range(30, 1_530))  # every one, once, in order
        _publish(fabric.c_url, "orders/d/x", 1_530, 20)  # then live
        assert _take(sub, 20, "orders/d/x") == list(range(1_530, 1_550))
        assert sub.get(timeout=0.2) is None  # nothing twice
    durables = {d["name"]: d for d in fabric.c_status()["cache"]["durables"]}
    assert durables["mover"]["identity"] == "reader"  # kept in c's book
    wait_for(lambda: _counter(fabric.s, "control_replay_forwarded") >= 1, DEADLINE_S,
             what="s's forwarding counter")


def test_loss_events_reach_a_durable_subscriber_through_the_forwarding_appliance(fabric):
    """Messages too large for c's cache (40,000 bytes) on topics of ~1,000 characters between
    two small ones: the subscriber at a gets the first, a loss event naming each, then the
    second; the result documents naming them are larger than a frame on the link and cross
    it in parts."""
    long = "orders/" + "l" * 990
    with connect(fabric.a_url, "reader") as client:
        sub = client.subscribe("orders/#", durable="lossy")
        with connect(fabric.c_url, "feed") as pub:
            pub.publish("orders/l/x", b"1", qos="guaranteed")
            for i in range(3):
                pub.publish(f"{long}{i}", bytes(40_000), qos="guaranteed")
            pub.publish("orders/l/x", b"2", qos="guaranteed")
            pub.flush(timeout=DEADLINE_S)
        assert _take(sub, 2, "orders/l/x") == [1, 2]
        losses = list(sub.losses)
        assert [(x.reason, x.topic) for x in losses] == [
            ("CACHE_TOO_LARGE", f"{long}{i}") for i in range(3)], losses
    wait_for(lambda: fabric.c_status()["counters"].get(
        "control_replay_served_results_in_parts", 0) >= 1, DEADLINE_S,
        what="a result sent in parts")


def test_a_forward_to_a_cache_that_is_not_up_is_refused_with_a_clear_error(fabric):
    """An appliance whose serve_from names a neighbour that is not up (never started) gives
    its client a clear error at once, for a replay and for a durable subscription."""
    ghost = f"ghost{free_port()}"
    port = free_port()
    app = Appliance(parse_config({
        "appliance": {"name": f"lone{port}", **COMMON},
        "fabric": {"listen": f"127.0.0.1:{port}", "key": FABRIC_KEY},
        "neighbours": [{"name": ghost, "address": f"127.0.0.1:{free_port()}"}],
        "clients": {"udp": f"127.0.0.1:{(cl := free_port())}"},
        "cache": {"serve_from": ghost},
        "pm": {"require_passwords": False, "identities": IDENTITIES}})).start()
    try:
        with connect(f"udp://127.0.0.1:{cl}", "reader") as client:
            t0 = time.monotonic()
            with pytest.raises(ClientError) as err:
                list(client.replay("orders/#"))
            assert ghost in str(err.value) and "not up" in str(err.value), str(err.value)
            with pytest.raises(ClientError) as err:
                client.subscribe("orders/#", durable="nowhere")
            assert "not up" in str(err.value), str(err.value)
            assert time.monotonic() - t0 < client.timeout_s * 2  # answered, not timed out
        wait_for(lambda: _counter(app, "control_replay_forward_refused_down") >= 2,
                 DEADLINE_S, what="the refusals counted")
    finally:
        app.stop()


def test_forwarded_requests_are_bounded_per_session(fabric):
    """Four durable requests of one session held at c (nothing new, 10 s wait): a fifth is
    refused busy by a, counted, before it reaches c."""
    with connect(fabric.a_url, "reader") as client:
        client.subscribe("orders/#", durable="bounded").unsubscribe()  # made, at the end
        for rid in range(9_000, 9_004):
            client._control(al.ControlKind.REPLAY, {
                "id": rid, "pattern": "orders/#", "durable": "bounded", "wait_ms": 10_000})
        wait_for(lambda: fabric.a.status()["counters"].get(
            "control_replay_forward_pending", 0) >= 4, DEADLINE_S, what="4 forwards waiting")
        result = client._request(("replay", 9_004), lambda: client._control(
            al.ControlKind.REPLAY, {"id": 9_004, "pattern": "orders/#", "durable": "bounded",
                                    "wait_ms": 10_000}))
        assert not result["accepted"] and result["why"] == "busy", result
        assert "waiting for their answer" in result["reason"], result
    wait_for(lambda: _counter(fabric.a, "control_replay_forward_refused_session_limit") >= 1,
             DEADLINE_S, what="the refusal counted")


def test_forged_forwarded_requests_on_the_fabric_are_dropped_and_counted(fabric):
    """A REMOTE_REPLAY deleting a durable subscription, from a2's address (a configured
    neighbour, not running yet) without a trailer, or signed with another key, is refused by
    c's fabric authentication before it is read: counted, never served (the durable
    subscription is still there)."""
    def rejected() -> dict:
        return fabric.c_status()["auth"]["rejected"]

    with connect(fabric.a_url, "reader") as client:
        client.subscribe("orders/#", durable="victim").unsubscribe()
    before = rejected()
    doc = json.dumps({"fid": 1, "session": 7, "identity": "reader",
                      "request": {"id": 1, "pattern": "#", "durable": "victim",
                                  "delete": True}})
    c_id = next(n["id"] for n in fabric.a.status()["neighbours"]
                if n["name"] == fabric.names["c"])
    a2_id = 60_000
    entry = [al.Control(al.ControlKind.REMOTE_REPLAY, doc)]
    unsigned = encode_admin(FrameType.CONTROL, entry, source_session=a2_id,
                            dest_session=c_id, send_ts_ns=time.time_ns())
    from appliance.control.auth import FabricAuth

    other = FabricAuth(bytes(32), 1, 1)
    forged = bytes(other.sign(encode_admin(FrameType.CONTROL, entry, source_session=a2_id,
                                           dest_session=c_id, send_ts_ns=time.time_ns(),
                                           auth=other.next_auth())))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", fabric.ports["a2"]))  # a neighbour's address
        for frame in (unsigned, forged):
            sock.sendto(frame, ("127.0.0.1", fabric.ports["c"]))
    wait_for(lambda: (r := rejected()).get("no_trailer", 0) > before.get("no_trailer", 0)
             and r.get("bad_mac", 0) + r.get("unknown_key", 0) > before.get("bad_mac", 0)
             + before.get("unknown_key", 0), DEADLINE_S, what="both frames rejected at c")
    with connect(fabric.a_url, "reader") as client:  # through a: the deletion is served
        assert client.delete_durable("victim") is True  # it was still there


def test_a_cache_that_does_not_answer_in_time_gives_a_clear_error(fabric):
    """c stopped with SIGSTOP (still up for its neighbours): a's forward times out and the
    client gets a refusal naming c within its own timeout, not a hang."""
    fabric.c.send_signal(signal.SIGSTOP)
    try:
        with connect(fabric.a_url, "reader") as client:
            with pytest.raises(ClientError) as err:
                list(client.replay("orders/#"))
            assert "did not answer within" in str(err.value), str(err.value)
            assert fabric.names["c"] in str(err.value)
    finally:
        fabric.c.send_signal(signal.SIGCONT)
    wait_for(lambda: _counter(fabric.a, "control_replay_forward_failed_timeout") >= 1,
             DEADLINE_S, what="the timeout counted")


class _Publisher(threading.Thread):
    def __init__(self, url: str, start: int, count: int, per_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.first, self.count, self.per_s = url, start, count, per_s
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with connect(self.url, "feed") as client:
                t0 = time.monotonic()
                for i in range(self.count):
                    client.publish("orders/f/x", b"%d" % (self.first + i), qos="guaranteed")
                    if i % 10 == 9:
                        client.flush(timeout=DEADLINE_S)
                        ahead = t0 + (i + 1) / self.per_s - time.monotonic()
                        if ahead > 0:
                            time.sleep(ahead)
                client.flush(timeout=DEADLINE_S)
        except BaseException as exc:  # the test reports it
            self.error = exc


def test_a_durable_subscriber_goes_on_at_the_standby_when_its_appliance_is_killed(fabric):
    """A durable subscriber connected to a2 (a process) with the standby s; a publisher at c
    sends 2,000 guaranteed messages at 1,000 a second; a2 gets SIGKILL after the 400th the
    subscriber took: the session moves to s and the subscription goes on from c's book,
    every message once, in order."""
    fabric.start_a2()
    states = States()
    client = connect(fabric.a2_url, "reader", standby=fabric.s_url, session_timeout_s=1.0,
                     on_state=states)
    try:
        sub = client.subscribe("orders/#", durable="failover")
        publisher = _Publisher(fabric.c_url, 0, 2_000, 1_000)
        publisher.start()
        got = _take(sub, 400, "orders/f/x")
        fabric.a2.send_signal(signal.SIGKILL)  # no logout, no goodbye
        states.wait("reconnected")
        got += _take(sub, 1_600, "orders/f/x")
        publisher.join(DEADLINE_S)
        assert publisher.error is None
        assert got == list(range(2_000))  # every message, once, in order
        assert client.url == fabric.s_url and client.moves == 1
        assert sub.get(timeout=0.2) is None
    finally:
        client.close()
