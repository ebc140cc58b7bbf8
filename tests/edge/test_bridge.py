"""Bridges from the edge to a real mosquitto (``[[mqtt.bridges]]``, docs/mqtt.md): messages in
and out at QoS 0 and 1, the remote's Receive Maximum and a pipelined window, mosquitto
killed and started again, the edge restarted with a backlog, a full backlog, mirrored topics
without loops, retained messages without echoes."""

from __future__ import annotations

from collections import Counter

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.config import parse_config
from appliance.edge.node import EdgeAppliance
from tests.appliance.helpers import free_port
from tests.edge.bridge_peers import (
    Client,
    Mosquitto,
    bridge_doc,
    bridge_spec,
    bridge_status,
    requires_mosquitto,
    stop_all,
    wait_bridge,
)
from tests.edge.conftest import edge_doc, wait_for
from tests.edge.peers import Peer
from tests.edge.test_transports import pki  # noqa: F401 (the fixture: a CA and certificates)

pytestmark = requires_mosquitto


@pytest.fixture(autouse=True)
def _no_mosquitto_left():
    yield
    stop_all()


def start(doc: dict) -> EdgeAppliance:
    return EdgeAppliance(parse_config(doc)).start()


def ids(payloads: Counter, prefix: bytes) -> Counter:
    return Counter({p: n for p, n in payloads.items() if p.startswith(prefix)})


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_messages_flow_in_and_out_at_qos_0_and_1(tmp_path, protocol):
    broker = Mosquitto(tmp_path / "m").start()
    remote = Client(broker.port, "watch")
    remote.subscribe("edge1/#", 1)
    edge = start(bridge_doc(tmp_path, broker.port, protocol=protocol,
                            out=[{"local": "plant/#", "remote_prefix": "edge1/", "qos": 1}],
                            **{"in": [{"remote": "cmd/#", "local_prefix": "cloud/",
                                       "qos": 1}]}))
    try:
        wait_bridge(edge, "connected and subscribed",
                    lambda s: s["connected"] and s["counters"].get("in_subscribed"))
        with Peer(edge, "local-sub") as sub, Peer(edge, "local-pub") as pub:
            assert sub.subscribe("cloud/#", 1) == 1
            pub.publish("plant/boiler", b"q1", 1)
            pub.publish("plant/boiler", b"q0", 0)
            m1 = remote.wait_payload(b"q1")
            assert (m1.topic, m1.qos) == ("edge1/plant/boiler", 1)
            m0 = remote.wait_payload(b"q0")
            assert (m0.topic, m0.qos) == ("edge1/plant/boiler", 0)
            remote.publish("cmd/valve", b"in1", 1)
            remote.publish("cmd/valve", b"in0", 0)
            got = {sub.next().payload: None for _ in range(2)}
            assert set(got) == {b"in1", b"in0"}
        status = wait_bridge(edge, "acked", lambda s: s["acked"] == 1
                             and s["counters"].get("in_messages") == 2)
        assert status["backlog_messages"] == 0 and status["protocol"] == protocol
        assert edge.status()["mqtt"]["bridges"]["cloud"]["connected"] is True
    finally:
        edge.stop()
        remote.close()
        broker.stop()


def test_the_window_is_the_remote_receive_maximum_and_pipelined(tmp_path):
    broker = Mosquitto(tmp_path / "m", bridge_allowed=False, extra="max_inflight_messages 5\n")
    broker.start()
    edge = start(bridge_doc(tmp_path, broker.port,
                            out=[{"local": "plant/#", "remote_prefix": "", "qos": 1}]))
    remote = Client(broker.port, "watch")
    try:
        remote.subscribe("plant/#", 1)
        wait_bridge(edge, "refused", lambda s: s["counters"].get("connect_refused"))
        with Peer(edge, "pub") as pub:
            for i in range(40):
                pub.publish("plant/x", b"w%03d" % i, 1)
        wait_bridge(edge, "backlogged", lambda s: s["backlog_messages"] == 40)
        broker.allow_bridge()
        status = wait_bridge(edge, "drained", lambda s: s["acked"] == 40)
        assert status["remote_receive_maximum"] == 5 and status["window"] == 5
        assert status["inflight_peak"] == 5  # pipelined, never more than the remote allows
        wait_for(lambda: len(remote.received) == 40)
        assert [m.payload for m in remote.received] == [b"w%03d" % i for i in range(40)]
    finally:
        edge.stop()
        remote.close()
        broker.stop()


def test_mosquitto_killed_and_restarted_backlog_drained_nothing_lost_or_repeated(tmp_path):
    broker = Mosquitto(tmp_path / "m").start()
    remote = Client(broker.port, "watch")
    remote.subscribe("plant/#", 1)
    edge = start(bridge_doc(tmp_path, broker.port,
                            out=[{"local": "plant/#", "remote_prefix": "", "qos": 1}]))
    try:
        with Peer(edge, "pub") as pub:
            wait_bridge(edge, "connected", lambda s: s["connected"])
            for i in range(50):
                pub.publish("plant/x", b"a%03d" % i, 1)
            wait_bridge(edge, "acked", lambda s: s["acked"] == 50)
            wait_for(lambda: len(remote.received) == 50)
            remote.close()
            broker.stop(kill=True)
            wait_bridge(edge, "disconnected", lambda s: not s["connected"])
            for i in range(100):
                pub.publish("plant/x", b"b%03d" % i, 1)
            wait_bridge(edge, "backlogged", lambda s: s["backlog_messages"] == 100)
            # the same port again; the bridge is refused until the watcher subscribed
            broker2 = Mosquitto(tmp_path / "m2", port=broker.port, bridge_allowed=False).start()
            try:
                remote2 = Client(broker.port, "watch2")
                remote2.subscribe("plant/#", 1)
                broker2.allow_bridge()
                status = wait_bridge(edge, "drained",
                                     lambda s: s["acked"] == 150 and s["backlog_messages"] == 0)
                assert status["reconnects"] >= 1
                wait_for(lambda: len(remote2.received) >= 100)
                pub.publish("plant/x", b"end", 1)
                remote2.wait_payload(b"end")
                got = remote2.payloads()
                # every message once: nothing acknowledged before the kill came again
                assert got == Counter({b"b%03d" % i: 1 for i in range(100)} | {b"end": 1})
                remote2.close()
            finally:
                broker2.stop()
    finally:
        edge.stop()


def test_an_edge_restarted_with_an_unacknowledged_backlog_sends_it(tmp_path):
    broker = Mosquitto(tmp_path / "m")  # not started: nobody listens on its port yet
    doc = bridge_doc(tmp_path, broker.port,
                     out=[{"local": "plant/#", "remote_prefix": "", "qos": 1}])
    edge = start(doc)
    try:
        with Peer(edge, "pub") as pub:
            for i in range(30):
                pub.publish("plant/x", b"r%03d" % i, 1)
        wait_bridge(edge, "backlogged", lambda s: s["backlog_messages"] == 30)
        wait_bridge(edge, "failing", lambda s: s["counters"].get("connect_failed", 0) >= 1)
    finally:
        edge.stop()
    broker.start()
    remote = Client(broker.port, "watch")
    remote.subscribe("plant/#", 1)
    edge = start(bridge_doc(tmp_path, broker.port,
                            out=[{"local": "plant/#", "remote_prefix": "", "qos": 1}]))
    try:
        status = wait_bridge(edge, "drained", lambda s: s["acked"] == 30)
        assert status["backlog_messages"] == 0
        wait_for(lambda: len(remote.received) == 30)
        assert remote.payloads() == Counter({b"r%03d" % i: 1 for i in range(30)})
    finally:
        edge.stop()
        remote.close()
        broker.stop()
    # and once acknowledged, a third start sends nothing again
    broker.start()
    remote = Client(broker.port, "watch-again")
    remote.subscribe("plant/#", 1)
    edge = start(bridge_doc(tmp_path, broker.port,
                            out=[{"local": "plant/#", "remote_prefix": "", "qos": 1}]))
    try:
        status = wait_bridge(edge, "connected", lambda s: s["connected"])
        assert status["backlog_messages"] == 0
        with Peer(edge, "pub") as pub:
            pub.publish("plant/x", b"fresh", 1)
        remote.wait_payload(b"fresh")
        assert remote.payloads() == Counter({b"fresh": 1})
    finally:
        edge.stop()
        remote.close()
        broker.stop()


def test_a_full_backlog_drops_the_newest_counted_and_the_bridge_comes_back(tmp_path):
    broker = Mosquitto(tmp_path / "m", bridge_allowed=False).start()
    remote = Client(broker.port, "watch")
    remote.subscribe("plant/#", 1)
    edge = start(bridge_doc(tmp_path, broker.port, backlog_max_messages=20,
                            out=[{"local": "plant/#", "remote_prefix": "", "qos": 1}]))
    try:
        wait_bridge(edge, "refused", lambda s: s["counters"].get("connect_refused"))
        with Peer(edge, "pub") as pub:
            for i in range(30):
                pub.publish("plant/x", b"f%03d" % i, 1)
            status = wait_bridge(edge, "full", lambda s: s["dropped"] == 10)
            assert status["backlog_messages"] == 20
            broker.allow_bridge()
            wait_bridge(edge, "drained", lambda s: s["acked"] == 20 and not s["backlog_messages"])
            for i in range(5):  # it keeps bridging after the full backlog
                pub.publish("plant/x", b"g%03d" % i, 1)
            wait_for(lambda: len(remote.received) == 25)
        assert remote.payloads() == Counter({b"f%03d" % i: 1 for i in range(20)}
                                            | {b"g%03d" % i: 1 for i in range(5)})
        assert bridge_status(edge)["dropped"] == 10
    finally:
        edge.stop()
        remote.close()
        broker.stop()


MIRROR = {"out": [{"local": "m/#", "remote_prefix": "", "qos": 1}],
          "in": [{"remote": "m/#", "local_prefix": "", "qos": 1}]}


def test_mirrored_topics_both_ways_make_no_loop(tmp_path):
    broker = Mosquitto(tmp_path / "m").start()
    remote = Client(broker.port, "watch")
    remote.subscribe("m/#", 1)
    edge = start(bridge_doc(tmp_path, broker.port, **MIRROR))
    try:
        wait_bridge(edge, "subscribed", lambda s: s["counters"].get("in_subscribed"))
        with Peer(edge, "local-sub") as sub, Peer(edge, "local-pub") as pub:
            assert sub.subscribe("m/#", 1) == 1
            for i in range(5):
                pub.publish("m/e", b"edge%d" % i, 1)
                remote.publish("m/r", b"remote%d" % i, 1)
            pub.publish("m/e", b"end-edge", 1)
            remote.publish("m/r", b"end-remote", 1)
            local = Counter()
            while local[b"end-edge"] == 0 or local[b"end-remote"] == 0:
                local[sub.next().payload] += 1
            remote.wait_payload(b"end-edge")
            remote.wait_payload(b"end-remote")
        want = Counter({b"edge%d" % i: 1 for i in range(5)} | {b"remote%d" % i: 1
                                                               for i in range(5)}
                       | {b"end-edge": 1, b"end-remote": 1})
        assert remote.payloads() == want
        assert local == want
        wait_bridge(edge, "acked and in", lambda s: s["acked"] == 6
                    and s["counters"].get("in_messages") == 6)
    finally:
        edge.stop()
        remote.close()
        broker.stop()


def test_two_bridges_mirroring_one_broker_stop_at_the_origin_tag(tmp_path):
    # No Local keeps each bridge's own messages from coming back to it, but each gets the
    # other's copy: only the origin tag stops that one from going round again
    broker = Mosquitto(tmp_path / "m").start()
    remote = Client(broker.port, "watch")
    remote.subscribe("m/#", 1)
    specs = [bridge_spec(tmp_path, broker.port, **MIRROR),
             bridge_spec(tmp_path, broker.port, **MIRROR, name="cloud2",
                         backlog_dir=str(tmp_path / "backlog2"))]
    edge = start(edge_doc(bridges=specs))
    try:
        for name in ("cloud", "cloud2"):
            wait_bridge(edge, "subscribed", lambda s: s["counters"].get("in_subscribed"),
                        name=name)
        with Peer(edge, "local-sub") as sub, Peer(edge, "local-pub") as pub:
            assert sub.subscribe("m/#", 1) == 1
            for i in range(5):
                pub.publish("m/e", b"edge%d" % i, 1)
            for name in ("cloud", "cloud2"):
                wait_bridge(edge, "dropped its echoes",
                            lambda s: s["counters"].get("in_dropped_origin") == 5, name=name)
            pub.publish("m/e", b"end", 1)
            local = Counter()
            while not local[b"end"]:
                local[sub.next().payload] += 1
            wait_for(lambda: remote.payloads()[b"end"] == 2)
        assert local == Counter({b"edge%d" % i: 1 for i in range(5)} | {b"end": 1})
        # one copy per bridge, no more
        assert remote.payloads() == Counter({b"edge%d" % i: 2 for i in range(5)} | {b"end": 2})
        for name in ("cloud", "cloud2"):
            counters = wait_bridge(edge, "dropped the end's echo", lambda s: s["counters"].get(
                "in_dropped_origin") == 6, name=name)["counters"]
            assert counters.get("in_messages", 0) == 0
    finally:
        edge.stop()
        remote.close()
        broker.stop()


def test_retained_messages_are_not_echoed_back_nor_replayed_on_reconnect(tmp_path):
    broker = Mosquitto(tmp_path / "m").start()
    remote = Client(broker.port, "watch")
    remote.subscribe("m/#", 1)
    remote.publish("m/state", b"on", 1, retain=True)
    remote.wait_payload(b"on")
    doc = bridge_doc(tmp_path, broker.port, **MIRROR)
    edge = start(doc)
    try:
        status = wait_bridge(edge, "got the retained message",
                             lambda s: s["counters"].get("in_retained") == 1)
        assert status["counters"]["in_messages"] == 1
        with Peer(edge, "local-pub") as pub:  # a marker after it, through the same bridge
            pub.publish("m/marker", b"mark1", 1)
        remote.wait_payload(b"mark1")
        wait_bridge(edge, "acked", lambda s: s["acked"] == 1)
        assert remote.payloads() == Counter({b"on": 1, b"mark1": 1})  # not echoed back
    finally:
        edge.stop()
    # the bridge comes back on its remote session: the retained message is not sent again
    edge = start(doc)
    try:
        with Peer(edge, "local-sub") as sub:
            wait_bridge(edge, "subscribed", lambda s: s["counters"].get("in_subscribed"))
            assert sub.subscribe("m/#", 1) == 1
            remote.publish("m/marker", b"mark2", 1)
            assert sub.next().payload == b"mark2"
        counters = wait_bridge(edge, "mark2 in", lambda s: s["counters"].get(
            "in_messages") == 1)["counters"]
        assert "in_retained" not in counters
        assert remote.payloads() == Counter({b"on": 1, b"mark1": 1, b"mark2": 1})
    finally:
        edge.stop()
        remote.close()
        broker.stop()


def test_a_bridge_over_tls_with_a_client_certificate(tmp_path, pki):  # noqa: F811
    tls_port = free_port()
    ca, _ = pki["ca"]
    server_cert, server_key = pki["127.0.0.1"]
    broker = Mosquitto(tmp_path / "m", extra=(
        f"listener {tls_port} 127.0.0.1\ncafile {ca}\ncertfile {server_cert}\n"
        f"keyfile {server_key}\nrequire_certificate true\nuse_identity_as_username true\n"))
    broker.start()
    remote = Client(broker.port, "watch")
    remote.subscribe("edge1/#", 1)
    cert, key = pki["alice"]
    spec = bridge_spec(tmp_path, tls_port, tls=True, tls_ca_file=ca, tls_cert_file=cert,
                       tls_key_file=key,
                       out=[{"local": "plant/#", "remote_prefix": "edge1/", "qos": 1}])
    del spec["username"], spec["password_file"]
    edge = start(edge_doc(bridges=[spec]))
    try:
        wait_bridge(edge, "connected", lambda s: s["connected"])
        with Peer(edge, "pub") as pub:
            pub.publish("plant/secret", b"over-tls", 1)
        assert remote.wait_payload(b"over-tls").topic == "edge1/plant/secret"
        wait_bridge(edge, "acked", lambda s: s["acked"] == 1)
    finally:
        edge.stop()
        remote.close()
        broker.stop()


def test_a_bridge_without_a_certificate_the_remote_wants_keeps_trying(tmp_path, pki):  # noqa: F811
    tls_port = free_port()
    ca, _ = pki["ca"]
    server_cert, server_key = pki["127.0.0.1"]
    broker = Mosquitto(tmp_path / "m", extra=(
        f"listener {tls_port} 127.0.0.1\ncafile {ca}\ncertfile {server_cert}\n"
        f"keyfile {server_key}\nrequire_certificate true\n"))
    broker.start()
    spec = bridge_spec(tmp_path, tls_port, tls=True, tls_ca_file=ca,
                       out=[{"local": "plant/#", "remote_prefix": "", "qos": 1}])
    edge = start(edge_doc(bridges=[spec]))
    try:  # no client certificate: every handshake fails, the bridge backs off and retries
        status = wait_bridge(edge, "failing", lambda s: s["counters"].get(
            "connect_failed", 0) + s["counters"].get("connect_refused", 0) >= 3)
        assert not status["connected"] and status["counters"].get("connects", 0) == 0
    finally:
        edge.stop()
        broker.stop()


def test_the_bridge_acts_as_its_identity_and_its_entitlements_apply(tmp_path):
    broker = Mosquitto(tmp_path / "m").start()
    remote = Client(broker.port, "watch")
    remote.subscribe("out/#", 1)
    # bob may publish and subscribe bob/# and public/# only
    edge = start(bridge_doc(tmp_path, broker.port, identity="bob",
                            out=[{"local": "bob/#", "remote_prefix": "out/", "qos": 1}],
                            **{"in": [{"remote": "x/#", "local_prefix": "public/", "qos": 1},
                                      {"remote": "y/#", "local_prefix": "secret/", "qos": 1}]}))
    try:
        wait_bridge(edge, "subscribed", lambda s: s["counters"].get("in_subscribed") == 2)
        with Peer(edge, "local-sub") as sub, Peer(edge, "local-pub") as pub:
            assert sub.subscribe("#", 1) == 1
            remote.publish("y/1", b"denied", 1)
            remote.publish("x/1", b"allowed", 1)
            msg = sub.next()
            assert (msg.topic, msg.payload) == ("public/x/1", b"allowed")
            pub.publish("bob/a", b"to-remote", 1)
            assert remote.wait_payload(b"to-remote").topic == "out/bob/a"
        wait_bridge(edge, "counted", lambda s: s["counters"].get("in_denied") == 1
                    and s["counters"].get("in_messages") == 1)
    finally:
        edge.stop()
        remote.close()
        broker.stop()


def test_a_stopping_edge_waits_for_the_pubacks_of_what_is_in_flight(tmp_path):
    # a scripted remote (the project's own codec, server side) that holds its PUBACK back
    # until the edge is stopping: the acknowledged message must not stay in the backlog
    import socket
    import threading

    from appliance.edge.mqtt import codec
    from appliance.edge.mqtt.bridge_backlog import Backlog
    from tests.edge.conftest import read_packet

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    edge = start(bridge_doc(tmp_path, port, out=[{"local": "plant/#", "remote_prefix": "",
                                                  "qos": 1}]))
    stopper = None
    try:
        listener.settimeout(30)
        conn, _ = listener.accept()
        conn.settimeout(30)
        first, body = read_packet(conn)
        assert first >> 4 == codec.PacketType.CONNECT
        conn.sendall(codec.encode_connack(codec.V5, 0))
        with Peer(edge, "pub") as pub:
            pub.publish("plant/x", b"held", 1)
        first, body = read_packet(conn)
        pkt = codec.decode(first, body, codec.V5)
        assert isinstance(pkt, codec.Publish) and pkt.payload == b"held"
        bridge = edge.mqtt.bridges["cloud"]
        stopper = threading.Thread(target=edge.stop)
        stopper.start()
        wait_for(lambda: bridge._draining, what="the bridge draining")
        conn.sendall(codec.encode_ack(codec.PacketType.PUBACK, pkt.packet_id, codec.V5))
        stopper.join(60)
        assert not stopper.is_alive()
        assert bridge.counters["out_acked"] == 1
        conn.close()
    finally:
        if stopper is None:
            edge.stop()
        listener.close()
    backlog = Backlog(tmp_path / "backlog" / "cloud", 10, 1 << 20, lambda *_: None)
    assert backlog.snapshot() == []
    backlog.close()


def test_mosquitto_killed_in_the_middle_of_traffic_loses_nothing_the_bridge_holds(tmp_path):
    # killed while the bridge sends: each message is acknowledged once, by the old mosquitto
    # or the new one; what was in flight (at most the window) goes again, everything else
    # once. (Not asserted: that the old mosquitto's subscriber got what it acknowledged; a
    # mosquitto without persistence killed between its PUBACK and its forward loses that.)
    broker = Mosquitto(tmp_path / "m").start()
    edge = start(bridge_doc(tmp_path, broker.port, max_inflight=16,
                            out=[{"local": "plant/#", "remote_prefix": "", "qos": 1}]))
    try:
        wait_bridge(edge, "connected", lambda s: s["connected"])
        with Peer(edge, "pub") as pub:
            for i in range(100):
                pub.publish("plant/x", b"k%03d" % i, 1)
            broker.stop(kill=True)
            for i in range(100, 200):
                pub.publish("plant/x", b"k%03d" % i, 1)
        broker2 = Mosquitto(tmp_path / "m2", port=broker.port, bridge_allowed=False).start()
        try:
            second = Client(broker.port, "watch2")
            second.subscribe("plant/#", 1)
            broker2.allow_bridge()
            status = wait_bridge(edge, "drained", lambda s: s["backlog_messages"] == 0
                                 and s["connected"])
            assert status["acked"] == 200  # each message acknowledged once, by one or other
            wait_for(lambda: {b"k%03d" % i for i in range(100, 200)} <= set(second.payloads()))
            pub2 = Peer(edge, "pub2")
            pub2.publish("plant/x", b"end", 1)
            pub2.close()
            second.wait_payload(b"end")
            got = second.payloads()
            assert max(got.values()) == 1  # the new mosquitto: each once
            # of the messages before the kill, the new one got those the old one had not
            # acknowledged (in flight, or not sent yet): PUBACKs come in order, so a tail
            tail = sorted(p for p in got if p.startswith(b"k0"))
            assert tail == [b"k%03d" % i for i in range(100 - len(tail), 100)]
            second.close()
        finally:
            broker2.stop()
    finally:
        edge.stop()


def _props(**values: object) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(props, name, value)
    return props


def _carried(message: object) -> dict:
    """The 5.0 properties of a received message that a bridge carries (origin tags apart)."""
    p = message.properties  # type: ignore[attr-defined]
    return {"ContentType": getattr(p, "ContentType", None),
            "ResponseTopic": getattr(p, "ResponseTopic", None),
            "CorrelationData": getattr(p, "CorrelationData", None),
            "PayloadFormatIndicator": getattr(p, "PayloadFormatIndicator", None),
            "expiry": getattr(p, "MessageExpiryInterval", None),
            "users": [u for u in getattr(p, "UserProperty", None) or []
                      if u[0] != "topicwire-origin"]}


def test_mqtt_5_properties_cross_a_bridge_both_ways_and_survive_its_backlog(tmp_path):
    """Content type, response topic, correlation data, payload format, user properties (in
    order, a name repeated) and the remaining message expiry go out to mosquitto at QoS 1
    (through the durable backlog, across a restart of the edge) and QoS 0, and come in from
    mosquitto to an MQTT 5 subscriber of the edge; the origin tag is not carried in."""
    broker = Mosquitto(tmp_path / "m").start()
    remote = Client(broker.port, "watch")
    remote.subscribe("edge1/#", 1)
    doc = bridge_doc(tmp_path, broker.port, protocol="5",
                     out=[{"local": "plant/#", "remote_prefix": "edge1/", "qos": 1}],
                     **{"in": [{"remote": "cmd/#", "local_prefix": "cloud/", "qos": 1}]})
    sent = {"ContentType": "text/plain", "ResponseTopic": "reply/1",
            "CorrelationData": b"\x00c1", "PayloadFormatIndicator": 1}
    users = [("k", "v1"), ("k", "v2"), ("site", "north")]
    edge = start(doc)
    try:
        wait_bridge(edge, "connected and subscribed",
                    lambda s: s["connected"] and s["counters"].get("in_subscribed"))
        with Peer(edge, "local-sub", version=5) as sub, \
                Peer(edge, "local-pub", version=5) as pub:
            assert sub.subscribe("cloud/#", 1) == 1
            for qos in (1, 0):
                pub.publish("plant/boiler", f"out{qos}".encode(), qos,
                            props=_props(**sent, UserProperty=users, MessageExpiryInterval=300))
                got = _carried(remote.wait_payload(f"out{qos}".encode()))
                assert {k: got[k] for k in sent} == sent and got["users"] == users
                assert 250 <= got["expiry"] <= 300
            remote.client.publish("cmd/valve", b"in1", 1, properties=_props(
                **sent, UserProperty=[*users, ("topicwire-origin", "elsewhere")],
                MessageExpiryInterval=120)).wait_for_publish(10)
            m = sub.next()
            got = _carried(m)
            assert m.payload == b"in1" and {k: got[k] for k in sent} == sent
            assert got["users"] == users and 60 <= got["expiry"] <= 120
        wait_bridge(edge, "acked", lambda s: s["acked"] == 1)
    finally:
        edge.stop()
    # kept in the backlog while mosquitto is down, sent with its properties after a restart
    broker.stop()
    edge = start(doc)
    try:
        with Peer(edge, "local-pub", version=5) as pub:
            pub.publish("plant/boiler", b"kept", 1, props=_props(**sent, UserProperty=users))
        wait_bridge(edge, "backlogged", lambda s: s["backlog_messages"] == 1)
    finally:
        edge.stop()
    remote.close()
    broker.start()
    remote = Client(broker.port, "watch2")
    remote.subscribe("edge1/#", 1)
    edge = start(doc)
    try:
        got = _carried(remote.wait_payload(b"kept"))
        assert {k: got[k] for k in sent} == sent and got["users"] == users
        assert got["expiry"] is None
        wait_bridge(edge, "drained", lambda s: s["backlog_messages"] == 0)
    finally:
        edge.stop()
        remote.close()
        broker.stop()
