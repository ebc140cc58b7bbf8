"""The MQTT edge works in namespace 0: an identity whose P&M namespaces leave 0 out is
refused its subscriptions and publishes over MQTT, as a native client would be."""

from __future__ import annotations

from appliance.client import connect
from appliance.config import parse_config
from appliance.control.credentials import hash_password
from appliance.edge.node import EdgeAppliance
from tests.appliance.helpers import counter as control_counter
from tests.edge.conftest import PASSWORDS, counter, edge_doc, wait_counter, wait_for
from tests.edge.peers import Peer


def test_an_identity_without_namespace_0_is_refused_over_mqtt(monkeypatch):
    doc = edge_doc()
    doc["appliance"]["namespaces"] = [0, 7]
    doc["pm"]["identities"]["carol"] = {"publish": ["#"], "subscribe": ["#"],
                                        "namespaces": [7],
                                        "password": hash_password("carol-secret", n=1 << 10)}
    monkeypatch.setitem(PASSWORDS, "carol", "carol-secret")
    edge = EdgeAppliance(parse_config(doc)).start()
    try:
        url = "udp://{}:{}".format(*edge.config.clients_udp)
        with Peer(edge, "carol", user="carol") as carol, \
                Peer(edge, "alice", user="alice") as alice, connect(url, "native") as native:
            assert carol.subscribe("#", 0) == 0x80
            assert alice.subscribe("#", 0) == 0
            before = counter(edge, "publishes_denied")
            carol.publish("x/y", b"refused", 1)
            wait_counter(edge, "publishes_denied", before + 1)
            native.publish("x/end", b"end", flush=True)
            assert alice.next().payload == b"end"  # carol's never came first
            wait_for(lambda: control_counter(edge, "control_namespace_denials") >= 2)
    finally:
        edge.stop()
