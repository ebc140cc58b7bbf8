"""MQTT metadata through the fabric (appliance/edge/mqtt/meta.py): an MQTT publisher on edge
A, MQTT subscribers on edge B, reached through a core, and a native client at the core. The
retain flag, the publish QoS, the 5.0 properties and the message expiry travel as native
headers under ``mqtt.`` and edge B restores them; native headers reach MQTT as user
properties."""

from __future__ import annotations

import itertools
import queue
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from appliance.client import connect
from appliance.client.errors import ClientError
from appliance.config import parse_config
from appliance.edge.node import EdgeAppliance
from appliance.node import Appliance
from tests.appliance.helpers import FABRIC_KEY, free_port
from tests.edge.conftest import DEADLINE_S, counter, edge_doc, wait_counter, wait_for
from tests.edge.peers import Peer

FAST = {"heartbeat_interval_ms": 50, "lsa_refresh_ms": 500}
_probes = itertools.count()


def props(kind: int, **values: Any) -> Properties:
    out = Properties(kind)
    for name, value in values.items():
        setattr(out, name, value)
    return out


@contextmanager
def edge_core_edge(mqtt: dict | None = None, edit_a: Any = None
                   ) -> Iterator[tuple[EdgeAppliance, EdgeAppliance, Any]]:
    """(edge A with the fabric's P&M, edge B with a remote P&M and anonymous MQTT clients,
    a native client logged in at the core between them); ``mqtt``: more ``[mqtt]`` keys of
    both edges, ``edit_a(doc)``: changes to edge A's config document (its P&M's)."""
    fa, fb, fc = free_port(), free_port(), free_port()
    doc_a = edge_doc(**(mqtt or {}))
    doc_a["appliance"].update(FAST)
    doc_a["pm"]["identities"]["anonymous"] = {"publish": ["#"], "subscribe": ["#"]}
    doc_a["fabric"] = {"listen": f"127.0.0.1:{fa}", "key": FABRIC_KEY}
    doc_a["neighbours"] = [{"name": "core1", "address": f"127.0.0.1:{fc}"}]
    if edit_a is not None:
        edit_a(doc_a)
    doc_b = edge_doc(allow_anonymous=True, **(mqtt or {}))
    doc_b["appliance"].update(name="edge2", **FAST)
    doc_b["pm"] = {"mode": "remote"}
    doc_b["fabric"] = {"listen": f"127.0.0.1:{fb}", "key": FABRIC_KEY}
    doc_b["neighbours"] = [{"name": "core1", "address": f"127.0.0.1:{fc}"}]
    started: list[Any] = []
    native = None
    try:
        started.append(EdgeAppliance(parse_config(doc_a)).start())
        started.append(Appliance(parse_config({
            "appliance": {"name": "core1", **FAST},
            "fabric": {"listen": f"127.0.0.1:{fc}", "key": FABRIC_KEY},
            "neighbours": [{"name": "edge1", "address": f"127.0.0.1:{fa}"},
                           {"name": "edge2", "address": f"127.0.0.1:{fb}"}],
            "clients": {"udp": f"127.0.0.1:{free_port()}"},
            "pm": {"mode": "remote"}})).start())
        started.append(EdgeAppliance(parse_config(doc_b)).start())
        url = f"udp://127.0.0.1:{started[1].config.clients_udp[1]}"
        native = wait_for(lambda: _login(url), what="a login at the core (P&M's document "
                                                    "reaches it from edge A)")
        wait_for(lambda: _accepted(started[2]), what="edge B accepting an MQTT client (P&M's "
                                                   "document reaches it)")
        yield started[0], started[2], native
    finally:
        if native is not None:
            native.close()
        for appliance in reversed(started):
            appliance.stop()


@pytest.fixture(scope="module")
def fabric() -> Iterator[tuple[EdgeAppliance, EdgeAppliance, Any]]:
    with edge_core_edge() as appliances:
        yield appliances


def _login(url: str) -> Any:
    try:
        return connect(url, "native", timeout_s=2.0)
    except ClientError:
        return None


def _accepted(edge_b: EdgeAppliance) -> bool:
    peer = _peer_b(edge_b, "ready")
    peer.close()
    return peer.rc == 0


def _peer_b(edge_b: EdgeAppliance, client_id: str, **kw: Any) -> Peer:
    return Peer(edge_b, client_id, user=None, version=kw.pop("version", 5), **kw)


def _next_on(peer: Peer, topic: str) -> Any:
    """The next message ``peer`` gets: on ``topic``, after probes of ``_ready`` at most."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        msg = peer.messages.get(timeout=max(0.0, deadline - time.monotonic()))
        if msg.topic == topic:
            return msg
        assert "/probe" in msg.topic, f"{msg.topic} came before {topic}"


def _ready(pub: Peer, subs: list[Peer], prefix: str) -> None:
    """Publish probes under ``prefix`` until every subscriber got one: the subscriptions'
    interest has reached edge A (best-effort messages before that go nowhere)."""
    waiting = set(range(len(subs)))
    deadline = time.monotonic() + DEADLINE_S
    while waiting:
        assert time.monotonic() < deadline, f"no probe reached {waiting}"
        pub.publish(f"{prefix}/probe{next(_probes)}", b"probe", 0)
        for i in list(waiting):
            try:
                if subs[i].messages.get(timeout=0.2).topic.startswith(f"{prefix}/probe"):
                    waiting.discard(i)
            except queue.Empty:
                pass


def test_5_0_properties_cross_two_edges_unchanged(fabric):
    edge_a, edge_b, _ = fabric
    with Peer(edge_a, "m-pub", version=5) as pub, _peer_b(edge_b, "m-sub5") as sub5, \
            _peer_b(edge_b, "m-sub3", version=4) as sub3:
        assert sub5.subscribe("m/#", 1) == 1 and sub3.subscribe("m/#", 1) == 1
        _ready(pub, [sub5, sub3], "m")
        users = [("site", "plant-7"), ("line", "3"), ("site", "again")]
        pub.publish("m/ask", b"question", 1, props=props(
            PacketTypes.PUBLISH, ResponseTopic="m/reply", CorrelationData=b"\x00\xffid",
            ContentType="text/plain", PayloadFormatIndicator=1, UserProperty=users,
            MessageExpiryInterval=600))
        got = _next_on(sub5, "m/ask")
        p = got.properties
        assert got.payload == b"question" and got.qos == 1 and not got.retain
        assert (p.ResponseTopic, p.CorrelationData, p.ContentType,
                p.PayloadFormatIndicator) == ("m/reply", b"\x00\xffid", "text/plain", 1)
        assert p.UserProperty == users  # order and the repeated name kept
        assert 0 < p.MessageExpiryInterval <= 600
        old = _next_on(sub3, "m/ask")  # 3.1.1: topic, payload, QoS
        assert (old.payload, old.qos, old.retain) == (b"question", 1, False)
        pub.publish("m/plain", b"bare", 1)  # no properties: none restored
        plain = _next_on(sub5, "m/plain")
        assert not hasattr(plain.properties, "UserProperty")
        assert not hasattr(plain.properties, "MessageExpiryInterval")


def test_the_publish_qos_caps_the_delivery_qos_across_edges(fabric):
    edge_a, edge_b, _ = fabric
    with Peer(edge_a, "q-pub", version=5) as pub, _peer_b(edge_b, "q-sub") as sub:
        assert sub.subscribe("q/#", 2) == 2
        _ready(pub, [sub], "q")
        pub.publish("q/one", b"1", 1)
        pub.publish("q/two", b"2", 2)
        assert _next_on(sub, "q/one").qos == 1  # min(publish QoS 1, granted 2)
        assert _next_on(sub, "q/two").qos == 2


def test_retain_as_published_across_edges(fabric):
    edge_a, edge_b, _ = fabric
    with Peer(edge_a, "r-pub", version=5) as pub, _peer_b(edge_b, "r-on") as on, \
            _peer_b(edge_b, "r-off") as off:
        assert on.subscribe("r/#", options=SubscribeOptions(qos=1, retainAsPublished=True)) == 1
        assert off.subscribe("r/#", options=SubscribeOptions(qos=1)) == 1
        _ready(pub, [on, off], "r")
        pub.publish("r/live", b"kept", 1, retain=True)
        assert _next_on(on, "r/live").retain
        assert not _next_on(off, "r/live").retain
        pub.publish("r/live", b"", 1, retain=True)  # (clears edge A's retained message)


def test_the_remaining_expiry_decreases_and_an_expired_message_is_not_delivered(fabric):
    edge_a, edge_b, _ = fabric
    expiry = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    sub = _peer_b(edge_b, "x-sub", clean=False, props=expiry)
    with Peer(edge_a, "x-pub", version=5) as pub:
        assert sub.subscribe("x/#", 1) == 1
        _ready(pub, [sub], "x")
        sub.close()
        wait_for(lambda: "x-sub" in edge_b.mqtt.sessions and
                 edge_b.mqtt.sessions["x-sub"].conn is None, what="x-sub offline")
        pub.publish("x/short", b"stale", 1, props=props(PacketTypes.PUBLISH,
                                                        MessageExpiryInterval=1))
        pub.publish("x/long", b"fresh", 1, props=props(PacketTypes.PUBLISH,
                                                       MessageExpiryInterval=4))
    state = edge_b.mqtt.sessions["x-sub"]
    wait_for(lambda: len(state.queued) == 2, what="two messages queued at edge B")
    wait_for(lambda: state.queued[0].meta.expired(time.monotonic()), what="the short expiry")
    wait_for(lambda: state.queued[1].meta.remaining_s(time.monotonic()) <= 2,
             what="the long one's remaining interval falling")
    dropped = counter(edge_b, "deliveries_dropped_expired")
    with _peer_b(edge_b, "x-sub", clean=False, props=expiry) as again:
        fresh = _next_on(again, "x/long")  # (x/short, queued first, not delivered)
        assert fresh.payload == b"fresh" and 0 < fresh.properties.MessageExpiryInterval <= 2
    assert counter(edge_b, "deliveries_dropped_expired") == dropped + 1


def test_a_native_subscriber_sees_the_mqtt_metadata_as_headers(fabric):
    edge_a, _, native = fabric
    got: queue.Queue = queue.Queue()
    native.subscribe("h/#", callback=got.put, qos="guaranteed")
    with Peer(edge_a, "h-pub", version=5) as pub:
        def probe() -> Any:
            pub.publish(f"h/probe{next(_probes)}", b"probe", 0)
            try:
                return got.get(timeout=0.2)
            except queue.Empty:
                return None
        wait_for(probe, what="interest of the native subscription at edge A")
        pub.publish("h/m", b"x", 1, retain=True, props=props(
            PacketTypes.PUBLISH, ContentType="application/json", CorrelationData=b"\x01",
            UserProperty=[("a", "1"), ("a", "2")], MessageExpiryInterval=60))
        msg = wait_for(lambda: _drain_to(got, "h/m"), what="h/m at the native client")
        h = dict(msg.headers)
        assert h.pop("mqtt.qos") == "1" and h.pop("mqtt.retain") == "1"
        deadline_ms = int(h.pop("mqtt.expires_at_ms"))
        assert 0 < deadline_ms - time.time() * 1000 <= 60_000
        assert h == {"mqtt.content_type": "application/json", "mqtt.correlation_data": b"\x01",
                     "mqtt.user.0.a": "1", "mqtt.user.1.a": "2"}
        pub.publish("h/m", b"", 1, retain=True)


def _drain_to(q: queue.Queue, topic: str) -> Any:
    while True:
        try:
            msg = q.get(timeout=0.2)
        except queue.Empty:
            return None
        if msg.topic == topic:
            return msg


def test_native_headers_reach_mqtt_5_as_user_properties(fabric):
    _, edge_b, native = fabric
    with _peer_b(edge_b, "n-sub") as sub, _peer_b(edge_b, "n-sub3", version=4) as sub3:
        assert sub.subscribe("n/#", 2) == 2 and sub3.subscribe("n/#", 1) == 1

        def probe() -> Any:
            native.publish(f"n/probe{next(_probes)}", b"probe", flush=True)
            try:
                return sub.messages.get(timeout=0.2)
            except queue.Empty:
                return None
        wait_for(probe, what="interest of edge B's subscription at the core")
        not_mapped = counter(edge_b, "headers_not_mapped")
        native.publish("n/m", b"from native", flush=True, qos="guaranteed",
                       headers={"trace": "abc", "blob": b"\xff\xfe", "span": b"s1"})
        got = _next_on(sub, "n/m")
        assert got.qos == 2  # a native guaranteed publish: the granted QoS
        assert got.properties.UserProperty == [("trace", "abc"), ("span", "s1")]
        assert _next_on(sub3, "n/m").payload == b"from native"
        wait_counter(edge_b, "headers_not_mapped", not_mapped + 1)  # the non-UTF-8 value
        # a native message that carries an expiry deadline already past is not delivered
        dropped = counter(edge_b, "deliveries_dropped_expired")
        past = str(int(time.time() * 1000) - 1_000)
        native.publish("n/old", b"stale", flush=True, qos="guaranteed",
                       headers={"mqtt.expires_at_ms": past})
        native.publish("n/new", b"fresh", flush=True, qos="guaranteed")
        assert _next_on(sub, "n/new").payload == b"fresh"
        wait_counter(edge_b, "deliveries_dropped_expired", dropped + 2)  # both subscribers


def test_metadata_beyond_the_header_limits_refuses_the_publish(fabric):
    edge_a, edge_b, _ = fabric
    acks: queue.Queue = queue.Queue()
    with Peer(edge_a, "big-pub", version=5) as pub, _peer_b(edge_b, "big-sub") as sub:
        pub.client.on_publish = lambda _c, _u, mid, rc, _p: acks.put((mid, rc))
        assert sub.subscribe("big/#", 1) == 1
        _ready(pub, [sub], "big")
        while not acks.empty():
            acks.get()
        refused = counter(edge_a, "publishes_refused_metadata")
        many = [("k", str(i)) for i in range(40)]  # 41 headers with mqtt.qos: over 32
        info = pub.client.publish("big/many", b"x", 1, properties=props(
            PacketTypes.PUBLISH, UserProperty=many))
        mid, rc = acks.get(timeout=DEADLINE_S)
        assert mid == info.mid and rc.value == 0x83  # Implementation specific error
        info = pub.client.publish("big/long", b"x", 1, properties=props(
            PacketTypes.PUBLISH, ContentType="c" * 1_100))  # over the block's 1,024 bytes
        mid, rc = acks.get(timeout=DEADLINE_S)
        assert mid == info.mid and rc.value == 0x83
        assert counter(edge_a, "publishes_refused_metadata") == refused + 2
        pub.publish("big/fits", b"ok", 1, props=props(PacketTypes.PUBLISH,
                                                      UserProperty=many[:20]))
        # (the refused ones, published first, went nowhere)
        assert _next_on(sub, "big/fits").properties.UserProperty == many[:20]


def test_without_a_shared_namespace_each_edge_has_its_own_members_of_a_group(fabric):
    """No ``mqtt.shared_namespace``: a group is per edge, its member at each edge gets every
    message (test_shared_fabric.py: one member of the fabric with it)."""
    edge_a, edge_b, _ = fabric
    assert edge_a.mqtt.status()["shared"] is None
    with Peer(edge_a, "pe-a", version=5) as member_a, Peer(edge_a, "pe-pub") as pub, \
            _peer_b(edge_b, "pe-b") as member_b:
        for member in (member_a, member_b):
            assert member.subscribe("$share/pe/pe/#", 1) == 1
        _ready(pub, [member_a, member_b], "pe")  # (a probe reaches one member per edge)
        for i in range(10):
            pub.publish(f"pe/{i}", str(i).encode(), 1)
        for member in (member_a, member_b):
            assert [_next_on(member, f"pe/{i}").payload for i in range(10)] == [
                str(i).encode() for i in range(10)]
