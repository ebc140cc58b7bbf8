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
this process, for tests and single-process applications); a bare ``HOST:PORT`` is UDP, as
on the command line. The wire protocol is docs/appliance.md, "Clients".

Every error the API raises is a ``TopicwireError`` (exported here): ``ClientError`` for a
refused operation (``LoginError``, ``EntitlementError``), the channels' and the protocol's
errors for what the transport reports.
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
from datapath.errors import TopicwireError

__all__ = [
    "QOS",
    "TopicwireError",
    "Client",
    "ClientError",
    "EntitlementError",
    "LoginError",
    "Loss",
    "Message",
    "Subscription",
    "connect",
]
