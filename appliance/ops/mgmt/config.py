"""Tunables of the management API, ``topicwire status`` and the structured logs (units in names)."""

from __future__ import annotations

MGMT_DEFAULT_HOST = "127.0.0.1"
"""Where the management API listens unless ``mgmt.listen`` names another address."""
MGMT_DEFAULT_PORT = 8470
"""The management API's port in the documented config and ``topicwire status``'s default URL."""
MGMT_MAX_BODY_BYTES = 65_536
"""A request body larger than this is refused (413) without being read."""
MGMT_REQUEST_TIMEOUT_S = 10.0
"""A connection that sends nothing for this long is closed (slow or stuck clients)."""
MGMT_SHUTDOWN_POLL_S = 0.2
"""How often the server thread checks for ``close()`` (the longest ``close()`` waits for it)."""
STATUS_HTTP_TIMEOUT_S = 5.0
"""How long ``topicwire status`` waits for the appliance's answer."""
