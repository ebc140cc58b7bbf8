"""Retained messages shared across edges (``mqtt.retained_namespace``, retain_share.py): a
fabric of edge A (the fabric's P&M), a core and edge B (remote P&M), real MQTT clients
(paho) at both edges and a native client at the core. A retained message set at one edge
reaches a later subscriber at the other, with its 5.0 properties; a clear reaches it too; a
native publisher sets one for every edge; concurrent sets settle on one message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes

from appliance.config import ConfigError, parse_config
from appliance.edge.mqtt.retain import RetainedStore
from appliance.edge.mqtt.retain_share import parse_stamp
from appliance.edge.node import EdgeAppliance
from tests.edge.conftest import counter, edge_doc, wait_counter, wait_for
from tests.edge.peers import Peer
from tests.edge.test_fabric_metadata import edge_core_edge, props

NS = 9
SHARE = {"retained_namespace": NS, "retained_identity": "edges"}


def _entitle_the_share(doc_a: dict) -> None:
    """At the P&M (edge A): the shared namespace exists, identity ``edges`` may use it, and
    so may the native client at the core."""
    doc_a["appliance"]["namespaces"] = [0, NS]
    identities = doc_a["pm"]["identities"]
    identities["edges"] = {"publish": ["#"], "subscribe": ["#"], "namespaces": [NS]}
    identities["native"]["namespaces"] = [0, NS]


@pytest.fixture(scope="module")
def fabric() -> Iterator[tuple[EdgeAppliance, EdgeAppliance, Any]]:
    """(edge A with the fabric's P&M, edge B with a remote P&M, a native client at the core
    entitled to the shared namespace), both edges sharing retained messages."""
    with edge_core_edge(SHARE, _entitle_the_share) as (edge_a, edge_b, native):
        for edge in (edge_a, edge_b):
            wait_for(lambda e=edge: e.mqtt.status()["retained_share"]["logged_in"],
                     what="the retained share's session logged in")
        yield edge_a, edge_b, native


def _peer(edge: EdgeAppliance, client_id: str) -> Peer:
    """An MQTT 5 client of ``edge`` (anonymous at edge B, whose P&M is remote)."""
    if edge.config.pm_mode == "remote":
        return Peer(edge, client_id, user=None, version=5)
    return Peer(edge, client_id, version=5)


def _retained_on_subscribe(edge: EdgeAppliance, topic_filter: str, probe: str,
                           client_id: str) -> list:
    """The retained messages a new subscriber to ``topic_filter`` at ``edge`` gets: those
    before its own probe (``probe``, a topic the filter matches, published after the
    SUBACK, so it comes through the fabric after anything the subscribe sent)."""
    with _peer(edge, client_id) as sub:
        assert sub.subscribe(topic_filter, 1) == 1
        out = []
        while True:
            sub.publish(probe, b"probe", 1)
            msg = sub.next()
            if msg.topic == probe and msg.payload == b"probe":
                return out
            out.append(msg)


def test_a_retained_message_set_at_one_edge_reaches_a_later_subscriber_at_the_other(fabric):
    edge_a, edge_b, _ = fabric
    taken = counter(edge_b, "retained_share_taken")
    with _peer(edge_a, "r-pub") as pub:
        pub.publish("plant/1/state", b"running", 1, retain=True, props=props(
            PacketTypes.PUBLISH, ContentType="text/plain", UserProperty=[("line", "3")]))
    wait_counter(edge_b, "retained_share_taken", taken + 1)
    got = _retained_on_subscribe(edge_b, "plant/+/state", "plant/probe/state", "r-sub")
    assert [(m.topic, m.payload, m.retain) for m in got] == [("plant/1/state", b"running", True)]
    assert got[0].properties.ContentType == "text/plain"
    assert got[0].properties.UserProperty == [("line", "3")]
    # cleared at edge B: gone at edge A too
    cleared = counter(edge_a, "retained_share_taken")
    with _peer(edge_b, "r-clear") as clearer:
        clearer.publish("plant/1/state", b"", 1, retain=True)
    wait_counter(edge_a, "retained_share_taken", cleared + 1)
    assert "plant/1/state" not in edge_a.mqtt.retained.messages
    assert _retained_on_subscribe(edge_a, "plant/1/#", "plant/1/probe", "r-sub-a") == []


def test_a_native_publisher_sets_one_for_every_edge(fabric):
    edge_a, edge_b, native = fabric
    before = [counter(e, "retained_share_taken") for e in (edge_a, edge_b)]
    native.publish("plant/9/mode", b"auto", qos="guaranteed", namespace=NS, flush=True)
    for edge, n in zip((edge_a, edge_b), before, strict=True):
        wait_counter(edge, "retained_share_taken", n + 1)
    for edge, cid in ((edge_a, "n-sub-a"), (edge_b, "n-sub-b")):
        got = _retained_on_subscribe(edge, "plant/9/#", "plant/9/probe", cid)
        assert [(m.topic, m.payload, m.retain) for m in got] == [("plant/9/mode", b"auto",
                                                                 True)]


def test_an_edge_that_was_down_catches_up_on_what_was_set_and_cleared_meanwhile():
    """Edge B stops; edge A sets one retained message and clears another that B held; B
    starts again (same config, no state directory): its share session asks, A answers with
    all it holds, and B's subscribers get exactly what A has."""
    with edge_core_edge(SHARE, _entitle_the_share) as (edge_a, edge_b, _):
        for edge in (edge_a, edge_b):
            wait_for(lambda e=edge: e.mqtt.status()["retained_share"]["logged_in"],
                     what="the retained share's session logged in")
        with _peer(edge_a, "c-pub") as pub:
            pub.publish("line/old", b"to be cleared", 1, retain=True)
        wait_counter(edge_b, "retained_share_taken", 1)
        config_b = edge_b.config
        edge_b.stop()
        with _peer(edge_a, "c-pub2") as pub:
            pub.publish("line/new", b"set while B was down", 1, retain=True, props=props(
                PacketTypes.PUBLISH, ContentType="text/plain"))
            pub.publish("line/old", b"", 1, retain=True)
        edge_b = EdgeAppliance(config_b).start()
        try:
            wait_counter(edge_a, "retained_share_sync_sent", 2)  # its message and its clear
            wait_for(lambda: "line/new" in edge_b.mqtt.retained.messages,
                     what="edge B to take edge A's answer")
            got = _retained_on_subscribe(edge_b, "line/#", "line/probe", "c-sub")
            assert [(m.topic, m.payload) for m in got] == [("line/new",
                                                            b"set while B was down")]
            assert got[0].properties.ContentType == "text/plain"
            assert edge_b.mqtt.retained.cleared.get("line/old") == \
                edge_a.mqtt.retained.cleared["line/old"]
        finally:
            edge_b.stop()


def test_stamps_read_from_a_copy_and_from_a_catch_up_answer():
    assert parse_stamp(None, 5, 7) == (5, 7)
    assert parse_stamp("123", 5, 7) == (123, 7)
    assert parse_stamp(b"123:9", 5, 7) == (123, 9)
    assert parse_stamp("12x", 5, 7) is None
    assert parse_stamp("1:y", 5, 7) is None


def test_the_later_set_wins_everywhere_and_a_clear_is_not_undone_by_an_older_set():
    a, b = RetainedStore(10, 1_000), RetainedStore(10, 1_000)
    a.node_id, b.node_id = 1, 2
    a.set("t", b"from-a", 1, stamp=(100, 1))
    b.set("t", b"from-b", 1, stamp=(100, 2))  # the same instant: the higher node id wins
    assert b.set_shared("t", b"from-a", 1, None, (100, 1)) is None
    assert a.set_shared("t", b"from-b", 1, None, (100, 2)) is True
    assert a.messages["t"].payload == b.messages["t"].payload == b"from-b"
    assert a.set_shared("t", b"", 0, None, (200, 2)) is True and "t" not in a.messages
    assert a.set_shared("t", b"late-old", 1, None, (150, 1)) is None and "t" not in a.messages
    assert a.set_shared("t", b"newer", 1, None, (300, 1)) is True
    assert a.messages["t"].payload == b"newer"
    for i in range(12):  # clears' stamps are bounded by max_messages
        a.set(f"c{i}", b"", 0)
    assert len(a.cleared) == 10


@pytest.mark.parametrize("mqtt, error", [
    ({"retained_namespace": 9}, "mqtt.retained_identity: required"),
    ({"retained_identity": "edges"}, "mqtt.retained_namespace: required"),
    ({"retained_namespace": 0, "retained_identity": "edges"}, "mqtt.retained_namespace"),
    ({"retained_namespace": 9, "retained_identity": "nobody"}, "not in pm.identities"),
    ({"retained_namespace": 9, "retained_identity": 7}, "mqtt.retained_identity"),
])
def test_bad_share_settings_are_refused_naming_the_key(mqtt, error):
    doc = edge_doc(**mqtt)
    doc["pm"]["identities"]["edges"] = {"publish": ["#"], "subscribe": ["#"]}
    with pytest.raises(ConfigError, match=error):
        parse_config(doc)
