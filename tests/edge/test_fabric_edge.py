"""Across two appliances: an MQTT client of an edge (the fabric's P&M) and a native client of a
core (remote P&M) exchange messages both ways over the fabric."""

from __future__ import annotations

import queue
import time

from appliance.client import connect
from appliance.client.errors import ClientError
from appliance.config import parse_config
from appliance.edge.node import EdgeAppliance
from appliance.node import Appliance
from tests.appliance.helpers import FABRIC_KEY, free_port
from tests.edge.conftest import DEADLINE_S, edge_doc
from tests.edge.peers import Peer

FAST = {"heartbeat_interval_ms": 50, "lsa_refresh_ms": 500}


def _until(action, check, what: str):
    """Repeat ``action`` until ``check`` gives something (interest takes a few refreshes to
    reach the publisher's appliance; best-effort messages before it are not delivered)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        action()
        got = check()
        if got is not None:
            return got
    raise AssertionError(f"timed out: {what}")


def test_an_mqtt_client_at_an_edge_and_a_native_client_at_a_core_talk_both_ways():
    fe, fc = free_port(), free_port()
    doc = edge_doc()
    doc["appliance"].update(FAST)
    doc["fabric"] = {"listen": f"127.0.0.1:{fe}", "key": FABRIC_KEY}
    doc["neighbours"] = [{"name": "core1", "address": f"127.0.0.1:{fc}"}]
    edge = EdgeAppliance(parse_config(doc)).start()
    core = Appliance(parse_config({
        "appliance": {"name": "core1", **FAST},
        "fabric": {"listen": f"127.0.0.1:{fc}", "key": FABRIC_KEY},
        "neighbours": [{"name": "edge1", "address": f"127.0.0.1:{fe}"}],
        "clients": {"udp": f"127.0.0.1:{free_port()}"},
        "pm": {"mode": "remote"}})).start()
    try:
        url = f"udp://127.0.0.1:{core.config.clients_udp[1]}"
        native = _until(lambda: None, lambda: _login(url), "a login at the core (P&M's "
                                                     "document reaches it from the edge)")
        with native, Peer(edge, "far", version=5) as peer:
            got: queue.Queue = queue.Queue()
            native.subscribe("to-core/#", callback=got.put)
            msg = _until(lambda: peer.publish("to-core/m", b"from mqtt", 1),
                         lambda: _get(got), "an MQTT publish at the edge reaching the core")
            assert (msg.topic, msg.payload, msg.origin) == ("to-core/m", b"from mqtt",
                                                            edge.config.node_id)
            assert peer.subscribe("to-edge/#", 1) == 1
            msg = _until(lambda: native.publish("to-edge/n", b"from native", flush=True),
                         lambda: _get(peer.messages), "a native publish reaching MQTT")
            assert (msg.topic, msg.payload) == ("to-edge/n", b"from native")
    finally:
        core.stop()
        edge.stop()


def _login(url: str):
    try:
        return connect(url, "native", timeout_s=2.0)
    except ClientError:
        return None


def _get(q: queue.Queue):
    try:
        return q.get(timeout=0.2)
    except queue.Empty:
        return None
