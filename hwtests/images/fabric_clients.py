"""The host side of test_image_fabric, run inside the test's network namespace (``ip netns
exec``), where the guests' client NICs are on a bridge: wait until both appliances have their
neighbour up, then, at once and until each has ``count`` messages or the deadline passes:

- native: a publisher at the core (``img/ticks``), a subscriber at the edge;
- MQTT at the edge: a paho-mqtt subscriber on the edge's MQTT listener receives the core's
  native ``img/ticks``, and a paho-mqtt publisher there (``img/fromedge/...``) reaches a native
  subscriber at the core.

Prints one JSON line ``{"sent", "received", "mqtt_received", "mqtt_sent",
"core_received_from_mqtt", "seconds", "fabric"}`` (``fabric``: per appliance, its fabric
channel rows and ``rdma_*`` counters from ``/status`` after the exchange, which show whether
the neighbour link was RDMA); exit 0 when every stream got its ``count``."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request

import paho.mqtt.client as mqtt

from appliance.client.api import connect

MQTT_PORT = 1883
NATIVE_TOPIC = "img/ticks"
MQTT_TOPIC = "img/fromedge/ticks"


def _status(mgmt: str) -> dict:
    try:
        with urllib.request.urlopen(f"http://{mgmt}/status", timeout=5) as answer:
            return json.loads(answer.read())
    except (OSError, ValueError):
        return {}


def _neighbours_up(mgmt: str) -> bool:
    return any(n.get("state") == "up" for n in _status(mgmt).get("neighbours", []))


def _fabric(mgmt: str) -> dict:
    """The fabric's channel rows (``fabric``, ``fabric-rdma:NAME``) and ``rdma_*`` counters."""
    status = _status(mgmt)
    return {"channels": {row["name"]: {k: row.get(k) for k in ("kind", "frames_in",
                                                                "frames_out")}
                         for row in status.get("channels", [])
                         if row.get("name", "").startswith("fabric")},
            "counters": {k: v for k, v in status.get("counters", {}).items()
                         if k.startswith("rdma_")}}


class MqttPeer:
    """One paho-mqtt client (MQTT 3.1.1, anonymous) on the edge's listener; ``got`` holds the
    payloads of what its subscription received."""

    def __init__(self, host: str, client_id: str, deadline: float) -> None:
        self.got: list[bytes] = []
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=mqtt.MQTTv311)
        self.client.on_connect = lambda *_a: self.connected.set()
        self.client.on_subscribe = lambda *_a: self.subscribed.set()
        self.client.on_message = lambda _c, _u, msg: self.got.append(bytes(msg.payload))
        self.client.connect(host, MQTT_PORT, keepalive=60)
        self.client.loop_start()
        if not self.connected.wait(max(0.1, deadline - time.monotonic())):
            raise TimeoutError(f"mqtt: {client_id} got no CONNACK from {host}:{MQTT_PORT}")

    def subscribe(self, topic: str, deadline: float) -> None:
        self.client.subscribe(topic, qos=1)
        if not self.subscribed.wait(max(0.1, deadline - time.monotonic())):
            raise TimeoutError(f"mqtt: no SUBACK for {topic}")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def main(core: str, edge: str, count: int, deadline_s: float) -> int:
    deadline = time.monotonic() + deadline_s
    while not (_neighbours_up(f"{edge}:8470") and _neighbours_up(f"{core}:8470")):
        if time.monotonic() > deadline:
            print(json.dumps({"error": "the neighbours did not come up"}))
            return 1
        time.sleep(1.0)
    sub_client = connect(f"udp://{edge}:47471", "desk", timeout_s=20.0)
    pub_client = connect(f"udp://{core}:47471", "feed", timeout_s=20.0)
    core_sub_client = connect(f"udp://{core}:47471", "desk", timeout_s=20.0)
    mqtt_sub = MqttPeer(edge, "img-mqtt-sub", deadline)
    mqtt_pub = MqttPeer(edge, "img-mqtt-pub", deadline)
    started = time.monotonic()
    sent, mqtt_sent, got, from_mqtt = 0, 0, [], []
    try:
        sub = sub_client.subscribe(NATIVE_TOPIC)
        core_sub = core_sub_client.subscribe("img/fromedge/#")
        mqtt_sub.subscribe(NATIVE_TOPIC, deadline)

        def done() -> bool:
            return min(len(got), len(mqtt_sub.got), len(from_mqtt)) >= count

        while not done() and time.monotonic() < deadline:
            # each stream publishes until its receiver has all it needs: the first messages
            # may go before the subscription reached the other appliance
            if len(got) < count or len(mqtt_sub.got) < count:
                pub_client.publish(NATIVE_TOPIC, f"m{sent}".encode())
                pub_client.flush()
                sent += 1
            if len(from_mqtt) < count:
                mqtt_pub.client.publish(MQTT_TOPIC, f"q{mqtt_sent}".encode(), qos=1)
                mqtt_sent += 1
            for queue, into in ((sub, got), (core_sub, from_mqtt)):
                message = queue.get(timeout=0.5)
                while message is not None:
                    into.append(bytes(message.payload))
                    message = queue.get(timeout=0.05)
    finally:
        for closing in (mqtt_pub, mqtt_sub, pub_client, sub_client, core_sub_client):
            closing.close()
    print(json.dumps({"sent": sent, "received": len(got), "mqtt_received": len(mqtt_sub.got),
                      "mqtt_sent": mqtt_sent, "core_received_from_mqtt": len(from_mqtt),
                      "seconds": round(time.monotonic() - started, 1),
                      "fabric": {"core": _fabric(f"{core}:8470"),
                                 "edge": _fabric(f"{edge}:8470")}}), flush=True)
    return 0 if done() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
