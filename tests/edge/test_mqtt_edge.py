"""The edge's MQTT server end to end with real clients (paho-mqtt 3.1.1 and 5.0) and native
clients of the same appliance, started for real in this process."""

from __future__ import annotations

import queue

import pytest

from appliance.client import connect
from appliance.config import parse_config
from appliance.edge.node import EdgeAppliance
from tests.edge.conftest import counter, edge_doc, wait_counter, wait_for
from tests.edge.peers import Peer

BOTH = pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])


@BOTH
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_an_mqtt_publish_reaches_an_mqtt_subscriber_at_each_qos(edge, version, qos):
    with Peer(edge, f"sub-{version}-{qos}", version=version) as sub, \
            Peer(edge, f"pub-{version}-{qos}", version=version) as pub:
        assert sub.rc == 0 and pub.rc == 0
        assert sub.subscribe("sensors/+/temp", qos) == qos
        pub.publish("sensors/k1/temp", b"21.5", qos)
        msg = sub.next()
        assert (msg.topic, msg.payload, msg.qos, msg.retain) == ("sensors/k1/temp", b"21.5",
                                                                 qos, False)
    wait_counter(edge, "publishes_in")


@BOTH
def test_mqtt_and_native_clients_exchange_messages_both_ways(edge, version):
    with connect(f"udp://127.0.0.1:{edge.config.clients_udp[1]}", "native") as native, \
            Peer(edge, f"mix-{version}", version=version) as peer:
        got = queue.Queue()
        native.subscribe("from-mqtt/#", callback=got.put)
        assert peer.subscribe("from-native/#", 1) == 1
        peer.publish("from-mqtt/a", b"to native", 1)
        msg = got.get(timeout=30)
        assert (msg.topic, msg.payload) == ("from-mqtt/a", b"to native")
        native.publish("from-native/b", b"to mqtt", flush=True)
        msg = peer.next()
        assert (msg.topic, msg.payload) == ("from-native/b", b"to mqtt")


@BOTH
def test_wrong_passwords_unknown_users_and_anonymous_clients_are_refused(edge, version):
    peer = Peer(edge, "bad1", user="alice", password="nope", version=version)
    peer.client.loop_stop()
    assert peer.rc.value == 0x86  # paho maps 3.1.1's code 4 to 0x86
    peer = Peer(edge, "bad2", user="mallory", password="x", version=version)
    peer.client.loop_stop()
    assert peer.rc.value == 0x86
    peer = Peer(edge, "bad3", user=None, version=version)
    peer.client.loop_stop()
    assert peer.rc.value == 0x87  # 3.1.1's code 5, not authorized
    assert counter(edge, "connect_refused_bad_credentials") >= 2
    assert counter(edge, "connect_refused_anonymous") >= 1


@BOTH
def test_entitlements_deny_subscriptions_and_publishes(edge, version):
    with Peer(edge, f"bob-{version}", user="bob", version=version) as bob, \
            Peer(edge, f"alice-{version}", version=version) as alice:
        denied = 0x80 if version == 4 else 0x87
        assert bob.subscribe("alice/#", 1) == denied
        assert bob.subscribe("#", 0) == denied
        assert bob.subscribe("bob/in", 1) == 1
        assert alice.subscribe("alice/#", 0) == 0
        before = counter(edge, "publishes_denied")
        bob.publish("alice/x", b"not allowed", 1)   # PUBACK (0x87 in 5.0); not delivered
        wait_counter(edge, "publishes_denied", before + 1)
        bob.publish("public/x", b"allowed", 1)
        alice.publish("alice/y", b"marker", 1)
        assert alice.next().payload == b"marker"   # the denied one never came first
        alice.publish("bob/in", b"to bob", 1)
        assert bob.next().payload == b"to bob"
    assert counter(edge, "subscriptions_denied") >= 2


@BOTH
def test_retained_messages_are_set_delivered_on_subscribe_and_cleared(edge, version):
    with Peer(edge, f"rpub-{version}", version=version) as pub:
        pub.publish(f"status/{version}/door", b"open", 1, retain=True)
        wait_counter(edge, "retained_set")
        with Peer(edge, f"rsub-{version}", version=version) as sub:
            assert sub.subscribe(f"status/{version}/#", 1) == 1
            msg = sub.next()
            assert (msg.topic, msg.payload, msg.retain) == (f"status/{version}/door", b"open",
                                                            True)
        pub.publish(f"status/{version}/door", b"", 1, retain=True)  # clears it
        wait_for(lambda: f"status/{version}/door" not in edge.mqtt.retained.messages)
        with Peer(edge, f"rsub2-{version}", version=version) as sub:
            assert sub.subscribe(f"status/{version}/#", 1) == 1
            pub.publish(f"status/{version}/marker", b"m", 1)
            assert sub.next().payload == b"m"  # no retained message came before it


@BOTH
def test_the_will_is_sent_on_an_abnormal_close_and_not_on_a_clean_disconnect(edge, version):
    with Peer(edge, f"watch-{version}", version=version) as watcher:
        assert watcher.subscribe("wills/#", 1) == 1
        clean = Peer(edge, f"clean-{version}", version=version,
                     will=("wills/clean", b"clean died", 1, False))
        clean.close()  # DISCONNECT: no will
        wait_counter(edge, "disconnects_clean")
        dying = Peer(edge, f"dying-{version}", version=version,
                     will=("wills/dying", b"dying died", 1, False))
        wait_for(lambda: f"dying-{version}" in edge.mqtt.sessions)
        dying.client.loop_stop()
        dying.client.socket().close()  # the connection drops without DISCONNECT
        msg = watcher.next()
        assert (msg.topic, msg.payload) == ("wills/dying", b"dying died")


def test_dollar_topics_are_not_matched_by_first_level_wildcards(edge):
    with Peer(edge, "all") as everything, Peer(edge, "sys") as sys_sub, \
            Peer(edge, "pub") as pub:
        assert everything.subscribe("#", 1) == 1
        assert sys_sub.subscribe("$SYS/#", 1) == 1
        pub.publish("$SYS/load", b"1.0", 1)
        assert sys_sub.next().topic == "$SYS/load"
        pub.publish("plain/marker", b"m", 1)
        assert everything.next().topic == "plain/marker"  # $SYS/load never reached it


def test_unsubscribe_stops_delivery_and_keeps_overlapping_filters(edge):
    with Peer(edge, "unsub") as sub, Peer(edge, "unsub-pub") as pub:
        assert sub.subscribe("u/#", 1) == 1
        assert sub.subscribe("u/a", 1) == 1
        sub.unsubscribe("u/a")  # u/# still holds u/a: MQTT's set, not a partial unsubscribe
        pub.publish("u/a", b"1", 1)
        assert sub.next().payload == b"1"
        sub.unsubscribe("u/#")
        assert sub.subscribe("v/x", 1) == 1
        pub.publish("u/a", b"2", 1)
        pub.publish("v/x", b"marker", 1)
        assert sub.next().payload == b"marker"


def test_a_second_connection_with_the_same_client_id_takes_the_session_over(edge):
    with Peer(edge, "twin", will=("wills/twin", b"x", 1, False)):
        wait_for(lambda: "twin" in edge.mqtt.sessions)
        first = edge.mqtt.sessions["twin"]
        first_connection = first.conn
        with Peer(edge, "twin") as second:  # its CONNACK comes after the first session ended
            assert second.rc == 0
            assert counter(edge, "sessions_taken_over") == 1
            assert first_connection.done.is_set() and edge.mqtt.sessions["twin"] is not first
            assert counter(edge, "wills_published") == 0  # a takeover sends no will


def test_subscriptions_beyond_the_limit_are_refused(edge):
    with Peer(edge, "greedy") as peer:
        codes = [peer.subscribe(f"g/{i}", 0) for i in range(9)]  # max_subscriptions = 8
        assert codes[:8] == [0] * 8 and codes[8] == 0x80
        assert counter(edge, "subscriptions_refused_limit") == 1


def test_status_reports_the_mqtt_section(edge):
    with Peer(edge, "st"):
        status = wait_for(lambda: edge.status().get("mqtt"))
        assert status["listen"] == f"127.0.0.1:{edge.mqtt.address[1]}"
        assert status["connections"] >= 1 and status["counters"]["connects_accepted"] >= 1


def test_mqtt5_no_local_retain_handling_and_an_assigned_client_identifier(edge):
    from paho.mqtt.subscribeoptions import SubscribeOptions

    with Peer(edge, "", version=5) as me, Peer(edge, "other5", version=5) as other:
        assert me.rc == 0
        wait_for(lambda: any(cid.startswith("tw-") for cid in edge.mqtt.sessions))
        other.publish("opts/kept", b"old", 1, retain=True)
        wait_counter(edge, "retained_set")
        # no-local: my own publishes do not come back; retain handling 2: no retained message
        assert me.subscribe("opts/#", options=SubscribeOptions(qos=1, noLocal=True,
                                                                retainHandling=2)) == 1
        me.publish("opts/mine", b"echo?", 1)
        other.publish("opts/theirs", b"marker", 1)
        msg = me.next()
        assert (msg.topic, msg.payload, msg.retain) == ("opts/theirs", b"marker", False)
        wait_counter(edge, "deliveries_unmatched")  # the fabric did echo it: the edge held it


def test_qos_travels_as_the_native_class_and_native_guaranteed_messages_reach_mqtt(edge):
    with connect(f"udp://127.0.0.1:{edge.config.clients_udp[1]}", "native") as native, \
            Peer(edge, "q-sub", version=5) as sub, Peer(edge, "q-pub", version=5) as pub:
        assert sub.subscribe("q/#", 1) == 1
        pub.publish("q/zero", b"0", 0)          # best-effort: delivered at QoS 0
        msg = sub.next()
        assert (msg.topic, msg.qos) == ("q/zero", 0)
        pub.publish("q/one", b"1", 1)           # guaranteed: at the granted QoS 1
        msg = sub.next()
        assert (msg.topic, msg.qos) == ("q/one", 1)
        native.publish("q/native", b"n", qos="guaranteed", flush=True)
        msg = sub.next()
        assert (msg.topic, msg.payload, msg.qos) == ("q/native", b"n", 1)
        each_once(pub, sub, "q", 20)  # more of each class, each delivered once
    # the edge's native session subscribed "q/#" in both classes with own_class: each message
    # came once, in its class; the appliance left the other copy out, so none reached the
    # edge to be dropped there
    assert counter(edge, "deliveries_guaranteed_copies") == 0
    assert wait_for(lambda: edge.status()["counters"].get("own_class_spared", 0) >= 43)


def each_once(pub: Peer, sub: Peer, prefix: str, n: int) -> None:
    """``n`` messages at QoS 1 and ``n`` at QoS 0 reach ``sub`` once each at their QoS: each
    class's come before a last message of that class (the classes travel apart), and
    nothing else does."""
    for i in range(n):
        pub.publish(f"{prefix}/one", b"%d" % i, 1)
        pub.publish(f"{prefix}/zero", b"%d" % i, 0)
    pub.publish(f"{prefix}/end", b"", 1)
    pub.publish(f"{prefix}/end", b"", 0)
    got, ends = [], set()
    while len(ends) < 2:
        m = sub.next()
        if m.topic == f"{prefix}/end":
            assert m.qos not in ends, "an end message came twice"
            ends.add(m.qos)
        else:
            got.append((m.topic, m.payload, m.qos))
    assert sorted(got) == sorted([(f"{prefix}/one", b"%d" % i, 1) for i in range(n)]
                                 + [(f"{prefix}/zero", b"%d" % i, 0) for i in range(n)])


def test_without_a_guaranteed_place_every_message_comes_best_effort_at_its_qos():
    doc = edge_doc(max_packet_bytes=4_096)
    doc["clients"]["max_guaranteed_sessions"] = 0  # the native guaranteed class is refused
    edge = EdgeAppliance(parse_config(doc)).start()
    try:
        with Peer(edge, "fb-sub", version=5) as sub, Peer(edge, "fb-pub", version=5) as pub:
            assert sub.subscribe("fb/#", 1) == 1  # granted: the best-effort class takes all
            each_once(pub, sub, "fb", 10)
        assert counter(edge, "subscriptions_guaranteed_refused") >= 1
        assert counter(edge, "deliveries_guaranteed_copies") == 0
        assert edge.status()["counters"].get("own_class_spared", 0) == 0
    finally:
        edge.stop()


def test_a_reloaded_password_applies_to_the_next_connect(edge):
    from appliance.config import parse_config
    from appliance.control.credentials import hash_password
    from tests.edge.conftest import edge_doc

    doc = edge_doc(max_packet_bytes=4_096, max_subscriptions=8)  # the fixture's [mqtt]
    doc["clients"]["udp"] = "{}:{}".format(*edge.config.clients_udp)
    doc["pm"]["identities"]["alice"]["password"] = hash_password("rotated", n=1 << 10)
    plan = edge.reload(parse_config(doc))
    assert "mqtt" not in plan.restart
    old = Peer(edge, "rot-old", password="alice-secret")
    old.client.loop_stop()
    assert old.rc.value == 0x86
    with Peer(edge, "rot-new", password="rotated") as new:
        assert new.rc == 0
