"""The login of an edge's own native session in a P&M namespace: the session under the
retained messages shared across edges (retain_share.py) and under the shared-group view
(shared_view.py). Each logs in from a thread of its own, in the background and again after
a loss (``RETRY_S`` apart), since an edge with a remote P&M starts before P&M's document
reaches it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from appliance.edge.mqtt.server import MqttServer

log = logging.getLogger("topicwire.edge.mqtt")

RETRY_S = 1.0
"""Delay between login attempts of such a session."""


def namespace_login(server: MqttServer, identity: str, namespace: int,
                    on_message: Callable[[Any], None], what: str, prefix: str,
                    then: Callable[[Any], None] | None = None) -> Any:
    """Log in as ``identity``, subscribe ``#`` in ``namespace`` (guaranteed, to
    ``on_message``) and call ``then(native)``; the native client, or None when refused
    (counted ``{prefix}_login_failed``, the first refusal logged naming ``what``). Counts
    ``{prefix}_logins``."""
    from appliance.client.errors import ClientError

    try:
        native = server.native_login(identity)
        native.subscribe("#", qos="guaranteed", namespace=namespace, callback=on_message)
        if then is not None:
            then(native)
    except ClientError as exc:
        server.count(f"{prefix}_login_failed")
        if server.counters.get(f"{prefix}_login_failed", 0) == 1:
            log.warning("mqtt: %s: login as %r with namespace %d failed (tried again every "
                        "%.0f s): %s", what, identity, namespace, RETRY_S, exc)
        return None
    server.count(f"{prefix}_logins")
    return native


def session_status(native: Any, namespace: int, identity: str) -> dict[str, Any]:
    """The part of ``/status`` every such session shows."""
    return {"namespace": namespace, "identity": identity,
            "logged_in": native is not None and not native.closed}
