"""The client API applications use to publish and subscribe through an appliance.

    from appliance.client import connect

    with connect("udp://127.0.0.1:47471", identity="md-feed") as c:
        sub = c.subscribe("prices/#", selector="price > 100")
        c.publish("prices/eu/xyz", b"...")
        for msg in sub:
            print(msg.topic, msg.payload, msg.latency_ns)

``connect`` accepts ``shm://RING`` (the appliance's shared-memory bus, same host),
``udp://HOST:PORT`` (the appliance's client UDP endpoint), ``rdma://HOST:PORT`` (its RDMA
client endpoint, appliance/client/rdma.py) and ``embedded:`` (an appliance in
this process, for tests and single-process applications). The wire protocol is
docs/appliance.md, "Clients".
"""

from appliance.client.api import (
    QOS,
    Client,
    ClientError,
    EntitlementError,
    LoginError,
    Loss,
    Message,
    Subscription,
    connect,
)

__all__ = [
    "QOS",
    "Client",
    "ClientError",
    "EntitlementError",
    "LoginError",
    "Loss",
    "Message",
    "Subscription",
    "connect",
]
