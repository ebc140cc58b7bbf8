"""Persistent MQTT sessions (3.1.1 clean session 0, 5.0 clean start 0 with a Session Expiry
Interval): session present, subscriptions kept, offline queueing bounded, redelivery of
unacknowledged QoS 1/2 with DUP, expiry; paho-mqtt clients and scripted raw peers."""

from __future__ import annotations

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType
from tests.edge.conftest import (
    counter,
    raw_connect,
    read_packet,
    start_edge,
    wait_counter,
    wait_for,
)
from tests.edge.peers import Peer


def expiry_props(seconds: int) -> Properties:
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = seconds
    return props


def persistent(edge, client_id: str, version: int, **kw) -> Peer:
    props = expiry_props(300) if version == 5 else None
    return Peer(edge, client_id, version=version, clean=False, props=props, **kw)


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_a_persistent_session_keeps_its_subscriptions_and_queues_while_away(edge, version):
    cid = f"keeper-{version}"
    first = persistent(edge, cid, version)
    assert first.rc == 0 and not first.session_present
    assert first.subscribe("away/#", 1) == 1
    first.close()
    wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 1)
    with Peer(edge, f"away-pub-{version}") as pub:
        for i in range(3):
            pub.publish(f"away/{i}", f"m{i}".encode(), 1)
        pub.publish("away/zero", b"qos0 is not queued", 0)
    wait_counter(edge, "deliveries_queued", 3)
    wait_counter(edge, "deliveries_dropped_offline_qos0")
    with persistent(edge, cid, version) as again:
        assert again.session_present
        got = [again.next() for _ in range(3)]
        assert [(m.topic, m.payload, m.qos) for m in got] == [
            (f"away/{i}", f"m{i}".encode(), 1) for i in range(3)]
        with Peer(edge, f"live-pub-{version}") as pub:  # the subscription is still there
            pub.publish("away/live", b"live", 1)
        assert again.next().payload == b"live"
    assert counter(edge, "sessions_resumed") == 1


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_a_clean_session_discards_the_persistent_one(edge, version):
    cid = f"discard-{version}"
    first = persistent(edge, cid, version)
    assert first.subscribe("gone/#", 1) == 1
    first.close()
    wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 1)
    with Peer(edge, cid, version=version) as clean:
        assert not clean.session_present
        with Peer(edge, f"gone-pub-{version}") as pub:
            pub.publish("gone/x", b"nobody", 1)
            assert clean.subscribe("marker/#", 1) == 1
            pub.publish("marker/x", b"marker", 1)
        assert clean.next().payload == b"marker"   # not gone/x: no subscription left
    assert counter(edge, "sessions_ended_clean_start") == 1


def test_the_offline_queue_is_bounded_and_drops_are_counted():
    edge = start_edge(max_queued=2)
    try:
        first = persistent(edge, "small-queue", 4)
        assert first.subscribe("q/#", 1) == 1
        first.close()
        wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 1)
        with Peer(edge, "q-pub") as pub:
            for i in range(5):
                pub.publish(f"q/{i}", b"x", 1)
        wait_counter(edge, "deliveries_dropped_queue_full", 3)
        with persistent(edge, "small-queue", 4) as again:
            assert [again.next().topic for _ in range(2)] == ["q/0", "q/1"]
    finally:
        edge.stop()


def test_a_5_0_session_expires_after_its_interval(edge):
    sock, body = raw_connect(edge, "short-lived", 5, clean=False,
                             props=[(codec.PROP["session_expiry_interval"], 1)])
    assert body[0] == 0   # no session present
    sock.sendall(codec.encode_subscribe(1, [("exp/#", 1)], codec.V5))
    read_packet(sock)
    sock.close()
    wait_counter(edge, "sessions_ended_expired")
    assert "short-lived" not in edge.mqtt.sessions
    sock, body = raw_connect(edge, "short-lived", 5, clean=False,
                             props=[(codec.PROP["session_expiry_interval"], 1)])
    assert body[0] == 0
    sock.close()


def test_the_session_expiry_is_capped_by_the_config_and_announced():
    edge = start_edge(max_session_expiry_s=5)
    try:
        with Peer(edge, "capped", version=5, clean=False, props=expiry_props(1000)) as peer:
            assert peer.connack_props.SessionExpiryInterval == 5
            assert edge.mqtt.sessions["capped"].expiry_s == 5
    finally:
        edge.stop()


def test_unacknowledged_qos1_and_qos2_are_sent_again_with_dup_on_reconnect(edge):
    sock, _ = raw_connect(edge, "forgetful", clean=False)
    sock.sendall(codec.encode_subscribe(1, [("redo/q1", 1), ("redo/q2", 2)]))
    assert read_packet(sock) == (0x90, b"\x00\x01\x01\x02")
    with Peer(edge, "redo-pub") as pub:
        pub.publish("redo/q1", b"one", 1)
        first, body = read_packet(sock)
        assert first == 0x32 and body[2:9] == b"redo/q1"
        id1 = body[9:11]
        pub.publish("redo/q2", b"two", 2)
        first, body = read_packet(sock)
        assert first == 0x34 and body[2:9] == b"redo/q2"
        id2 = body[9:11]
    sock.sendall(codec.encode_ack(PacketType.PUBREC, int.from_bytes(id2, "big")))
    assert read_packet(sock) == (0x62, id2)       # PUBREL
    sock.close()                                   # neither PUBACK nor PUBCOMP sent
    wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 1)
    sock, body = raw_connect(edge, "forgetful", clean=False)
    assert body[0] == 1                            # session present
    first, body = read_packet(sock)
    assert first == 0x3A and body == b"\x00\x07redo/q1" + id1 + b"one"   # DUP, QoS 1
    assert read_packet(sock) == (0x62, id2)        # past PUBREC: PUBREL again
    sock.sendall(codec.encode_ack(PacketType.PUBACK, int.from_bytes(id1, "big")))
    sock.sendall(codec.encode_ack(PacketType.PUBCOMP, int.from_bytes(id2, "big")))
    wait_for(lambda: not edge.mqtt.sessions["forgetful"].inflight)
    assert counter(edge, "redeliveries") == 1
    sock.sendall(codec.packet(PacketType.DISCONNECT, 0, b""))
    sock.close()


def test_offline_sessions_are_bounded():
    edge = start_edge(max_offline_sessions=1)
    try:
        for cid in ("off-1", "off-2"):
            persistent(edge, cid, 4).close()
            wait_counter(edge, "connections_closed", 1 if cid == "off-1" else 2)
        wait_counter(edge, "sessions_dropped_offline_limit")
        assert edge.mqtt.status()["sessions_offline"] == 1
        assert sorted(edge.mqtt.sessions) == ["off-1"]
    finally:
        edge.stop()


def test_a_session_taken_up_by_another_identity_starts_afresh(edge):
    first = persistent(edge, "shared-id", 4)
    assert first.subscribe("bob/#", 1) == 1
    first.close()
    wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 1)
    with persistent(edge, "shared-id", 4, user="bob") as bob:
        assert not bob.session_present
    assert counter(edge, "sessions_ended_other_identity") == 1


def test_an_incoming_qos2_flow_survives_a_reconnect(edge):
    expiry = [(codec.PROP["session_expiry_interval"], 300)]
    with Peer(edge, "q2-in-watch") as watch:
        assert watch.subscribe("q2in/#", 1) == 1
        sock, _ = raw_connect(edge, "q2-in", 5, clean=False, props=expiry)
        sock.sendall(codec.encode_publish("q2in/a", b"once", 2, packet_id=5, version=codec.V5))
        assert read_packet(sock) == (0x50, b"\x00\x05")          # PUBREC
        sock.close()                                              # before PUBREL
        wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 1)
        sock, body = raw_connect(edge, "q2-in", 5, clean=False, props=expiry)
        assert body[0] == 1
        sock.sendall(codec.encode_publish("q2in/a", b"once", 2, dup=True, packet_id=5,
                                          version=codec.V5))     # sent again: not published
        assert read_packet(sock) == (0x50, b"\x00\x05")
        sock.sendall(codec.encode_ack(PacketType.PUBREL, 5, codec.V5))
        assert read_packet(sock) == (0x70, b"\x00\x05")          # PUBCOMP, success
        with Peer(edge, "q2-in-marker") as marker:
            marker.publish("q2in/marker", b"m", 1)
        assert watch.next().payload == b"once"
        assert watch.next().payload == b"m"                     # no second "once"
        sock.close()


def test_a_redelivery_larger_than_the_new_maximum_packet_size_is_dropped(edge):
    expiry = (codec.PROP["session_expiry_interval"], 300)
    sock, _ = raw_connect(edge, "shrinking", 5, clean=False, props=[expiry])
    sock.sendall(codec.encode_subscribe(1, [("big/#", 1)], codec.V5))
    read_packet(sock)
    with Peer(edge, "big-pub") as pub:
        pub.publish("big/x", b"b" * 500, 1)
        assert read_packet(sock)[0] == 0x32          # in flight, never acknowledged
    sock.close()
    wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 1)
    sock, body = raw_connect(edge, "shrinking", 5, clean=False,
                             props=[expiry, (codec.PROP["maximum_packet_size"], 100)])
    assert body[0] == 1
    wait_for(lambda: not edge.mqtt.sessions["shrinking"].inflight)   # not kept forever
    assert counter(edge, "deliveries_dropped_client_max_packet") == 1
    sock.close()
