"""Partial unsubscribe for MQTT clients (seed 000), opt-in: an UNSUBSCRIBE of a filter
narrower than one the connection holds carves it out, with the 5.0 user property
``tw-partial-unsubscribe`` or the edge setting ``mqtt.partial_unsubscribe``; a later SUBSCRIBE
takes its topics back (the newer entry decides). Without the opt-in MQTT's own semantics hold.
paho-mqtt clients against an in-process edge."""

from __future__ import annotations

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.edge.mqtt.handle_subscribe import PARTIAL_PROPERTY
from tests.edge.conftest import counter, start_edge, wait_counter
from tests.edge.peers import Peer


def _partial() -> Properties:
    props = Properties(PacketTypes.UNSUBSCRIBE)
    props.UserProperty = (PARTIAL_PROPERTY, "true")
    return props


def _next_is(peer: Peer, topic: str, payload: bytes) -> None:
    msg = peer.next()
    assert (msg.topic, msg.payload) == (topic, payload)


def test_a_5_0_partial_unsubscribe_carves_out_and_a_later_subscribe_takes_it_back(edge):
    with Peer(edge, "pu-sub", version=5) as sub, Peer(edge, "pu-pub", version=5) as pub:
        assert sub.subscribe("pu/#", 1) == 1
        assert sub.unsubscribe("pu/x/#", _partial()) == [0x00]
        assert sub.unsubscribe("pu/y/#") == [0x11]  # no opt-in: MQTT's answer, nothing cut
        assert sub.unsubscribe("other/#", _partial()) == [0x11]  # overlaps nothing held
        assert sub.unsubscribe("$share/g/pu/#", _partial()) == [0x8F]
        pub.publish("pu/x/1", b"carved", 1)
        pub.publish("pu/y/1", b"kept y", 1)
        pub.publish("pu/a", b"kept a", 1)
        _next_is(sub, "pu/y/1", b"kept y")  # (one publisher: in order, so pu/x/1 was not
        _next_is(sub, "pu/a", b"kept a")    # delivered before them)
        assert wait_counter(edge, "deliveries_carved_out") == 1
        assert counter(edge, "unsubscriptions_partial") == 1
        assert sub.subscribe("pu/x/1", 1) == 1  # newer than the carve-out: taken back
        pub.publish("pu/x/2", b"still carved", 1)
        pub.publish("pu/x/1", b"back", 1)
        _next_is(sub, "pu/x/1", b"back")
        assert wait_counter(edge, "deliveries_carved_out", 2) == 2
        assert sub.unsubscribe("pu/#") == [0x00]  # the broad filter goes: its carve-out too
        assert edge.mqtt.sessions["pu-sub"].carve_outs == {}


def test_the_edge_setting_gives_3_1_1_clients_partial_unsubscribes():
    edge = start_edge(partial_unsubscribe=True)
    try:
        with Peer(edge, "pu3-sub") as sub, Peer(edge, "pu3-pub") as pub:
            assert sub.subscribe("pu3/#", 1) == 1
            sub.unsubscribe("pu3/x/+")
            pub.publish("pu3/x/1", b"carved", 1)
            pub.publish("pu3/x/1/deeper", b"kept deeper", 1)
            _next_is(sub, "pu3/x/1/deeper", b"kept deeper")
            assert wait_counter(edge, "deliveries_carved_out") == 1
    finally:
        edge.stop()
