"""An edge's own native session in a P&M namespace, run by a thread of its own
(``NamespaceSession``): the session under the retained messages shared across edges
(retain_share.py) and under the shared-group view (shared_view.py). It logs in from its
thread, in the background and again after a loss (``RETRY_S`` apart), since an edge with a
remote P&M starts before P&M's document reaches it."""

from __future__ import annotations

import logging
import threading
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


class NamespaceSession:
    """The session's state and thread; a subclass gives ``_run`` (the thread, which calls
    ``logged_in`` each round), ``_on_native`` (the namespace's messages) and, optionally,
    ``_after_login``. ``WHAT`` names it in log lines, ``PREFIX`` in counters."""

    WHAT = "namespace session"
    PREFIX = "namespace_session"

    def __init__(self, server: MqttServer, namespace: int, identity: str) -> None:
        self.server = server
        self.namespace = namespace
        self.identity = identity
        self.native: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _start_thread(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def _on_native(self, msg: Any) -> None:
        raise NotImplementedError

    def _after_login(self, native: Any) -> None:
        """Called once logged in and subscribed, before the session is used."""

    def logged_in(self) -> Any:
        """(the thread) The logged-in native client; None after a refused login (then
        ``RETRY_S`` later, or at the stop)."""
        native = self.native
        if native is not None and not native.closed:
            return native
        native = namespace_login(self.server, self.identity, self.namespace, self._on_native,
                                 self.WHAT, self.PREFIX, self._after_login)
        if native is None:
            self._stop.wait(RETRY_S)
            return None
        self.native = native
        return native

    def _join_and_log_out(self) -> None:
        """The end of ``close``, once the thread was told to stop: wait for it, log out."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(10)
        native, self.native = self.native, None
        if native is not None:
            try:
                native.close()
            except Exception as exc:  # stop anyway
                log.warning("mqtt: %s: native logout: %r", self.WHAT, exc)

    def session_status(self) -> dict[str, Any]:
        """The part of ``/status`` every such session shows."""
        native = self.native
        return {"namespace": self.namespace, "identity": self.identity,
                "logged_in": native is not None and not native.closed}
