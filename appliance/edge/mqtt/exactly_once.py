"""Exactly once for MQTT QoS 2 across a publishing edge's crash: the QoS 2 messages an edge
delivered recently, by their publish's number, so that one published again is not
delivered twice.

An edge with ``mqtt.state_dir`` records every incoming QoS 1/2 PUBLISH before it
acknowledges it and deletes the record ``store.INBOUND_RETIRE_S`` after the native publish;
after a crash in between it publishes the message again at start (server.py
``_republish``), with the same number (``mqtt.origin``; store.py numbers never repeat
across restarts). An edge that delivered the first copy drops the second here: each
identity's native session (identities.py) looks up every message published at QoS 2 by
(identity, origin appliance, number) before handing it to its MQTT sessions. On the
publishing edge itself the persistent sessions need no look-up: a QoS 2 delivery is sent
to the client only once its record is on disk (sessions.py), and the record carries the
number (``store_duplicates_skipped``).

Bounded: the last ``mqtt.exactly_once_window`` numbers of the whole edge (0: off). A copy
that comes back after more QoS 2 messages than that went through the edge is delivered
again (at least once, as before): the window must cover the QoS 2 messages of the time a
publishing edge takes to restart. The window is ``RecentIds``
(appliance/client/exactly_once.py: native clients make the same drop).
"""

from __future__ import annotations

from appliance.client.exactly_once import RecentIds

__all__ = ["RecentIds"]
