"""The client API applications use to publish and subscribe through an appliance.

    from appliance.client import connect

    with connect("udp://127.0.0.1:47471", identity="md-feed") as c:
        sub = c.subscribe("prices/#", selector="price > 100")
        c.publish("prices/eu/xyz", b"...")
        for msg in sub:
            print(msg.topic, msg.payload, msg.latency_ns)

For throughput: ``subscribe(pattern, poll=True)`` and ``client.poll(handler, limit)`` hand
messages over as one reused ``PollView`` (no object, no payload copy per message; valid only
during the handler call), and ``client.publish_batch(topic, payloads)`` packs many messages
into few frames (appliance/client/polling.py, batching.py).

``connect`` accepts ``shm://RING`` (the appliance's shared-memory bus, same host),
``udp://HOST:PORT`` (the appliance's client UDP endpoint), ``rdma://HOST:PORT`` (its RDMA
client endpoint, appliance/client/rdma.py) and ``embedded:`` (an appliance in
this process, for tests and single-process applications); a bare ``HOST:PORT`` is UDP, as
on the command line. HOST is an IPv4 address or a host name (resolved when ``connect`` is
called; IPv6 is not supported on the UDP path yet and is refused saying so). Topics are
native (``a/b``; patterns with ``+`` and ``#``): a NATS subject such as ``prices.>`` is
refused with its native spelling. The wire protocol is docs/appliance.md, "Clients".

Guaranteed publishing returns an ``Outcome`` per message (acknowledged by the appliance, or
failed with a reason); ``flush(timeout=...)`` raises ``UnacknowledgedError`` with the count
of messages not acknowledged. ``connect(..., on_state=fn)`` reports the connection's
``StateChange``s (lost, reconnecting, reconnected, closed): a client notices a lost
appliance within its session timeout, reconnects with backoff, logs in again and makes its
subscriptions again (docs/appliance.md, "Connection states").

Every error the API raises is a ``TopicwireError`` (exported here): ``ClientError`` for a
refused operation (``LoginError``, ``EntitlementError``, ``ConnectionLostError``,
``NoAnswerError`` (the appliance did not answer: not running or unreachable), ``BusyError``
(it could not take a (un)subscribe yet: ask again later),
``UnacknowledgedError``, ``PublishFailedError``, ``SelectorRefusedError``), the channels'
and the protocol's errors for what the transport reports.
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
from appliance.client.connection import STATES, StateChange
from appliance.client.errors import (
    BackPressureError,
    BusyError,
    ConnectionLostError,
    NoAnswerError,
    PublishFailedError,
    SelectorRefusedError,
    UnacknowledgedError,
)
from appliance.client.outcomes import Outcome
from appliance.client.pathwatch import MoveBounds
from appliance.client.polling import PollView
from datapath.errors import TopicwireError

__all__ = [
    "QOS",
    "BackPressureError",
    "BusyError",
    "TopicwireError",
    "Client",
    "ClientError",
    "ConnectionLostError",
    "NoAnswerError",
    "Outcome",
    "PollView",
    "PublishFailedError",
    "SelectorRefusedError",
    "STATES",
    "StateChange",
    "UnacknowledgedError",
    "EntitlementError",
    "LoginError",
    "Loss",
    "Message",
    "MoveBounds",
    "Subscription",
    "connect",
]
