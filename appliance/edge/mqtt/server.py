"""The edge's MQTT server: a TCP listener, one asyncio event loop on a thread of its own, the
connections (``MqttSession``), the retained store and the counters.

Started by ``EdgeAppliance.start`` when the config has ``[mqtt]`` (appliance/edge/node.py),
after the appliance itself: every accepted connection logs in a native client session at
this appliance (``clients.udp``, else ``clients.shm``), so MQTT clients are clients of the
fabric like any other. Calls that wait for the appliance (login, subscribe, the first
publish of a topic, scrypt) run on a small thread pool (``blocking``), never on the loop.

Bounds: ``mqtt.max_connections`` open connections (one more is closed at once, counted
``refused_max_connections``), per connection ``max_subscriptions``, ``max_inflight``,
``send_buffer_bytes`` and the packet size, and the retained store's count and bytes.
``status()`` is the ``mqtt`` section of ``/status``.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import socket
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from appliance.config import ApplianceConfig, ConfigError, MqttConfig, local_client_url
from appliance.edge.mqtt.codec import Reason
from appliance.edge.mqtt.retain import RetainedStore
from appliance.edge.mqtt.session import MqttSession

log = logging.getLogger("topicwire.edge.mqtt")

BLOCKING_THREADS = 8
"""Threads that run the calls waiting for the appliance (logins, subscribes, scrypt)."""
NATIVE_IDLE = "sleep"
"""The native sessions' client threads sleep 1 ms when idle (one thread per connection)."""
STOP_TIMEOUT_S = 10.0
"""How long ``close`` waits for the connections' native sessions to log out."""
LISTEN_BACKLOG = 128


class MqttServer:
    """See the module docstring."""

    def __init__(self, appliance: Any, config: ApplianceConfig) -> None:
        assert config.mqtt is not None
        self.appliance = appliance
        self.cfg: MqttConfig = config.mqtt
        self.node_id = config.node_id
        self.native_url = self._native_url(config)
        self.retained = RetainedStore(self.cfg.max_retained, self.cfg.max_retained_bytes)
        self.sessions: dict[str, MqttSession] = {}
        """Client identifier -> its connected session."""
        self.open: set[MqttSession] = set()
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(BLOCKING_THREADS, thread_name_prefix="mqtt-blocking")
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._sock: socket.socket | None = None
        self.address: tuple[str, int] | None = None
        from appliance.control.credentials import hash_password

        self.decoy_hash = hash_password(os.urandom(16))
        """Checked against when a username has no credential (the same cost as a real one)."""

    @staticmethod
    def _native_url(config: ApplianceConfig) -> str:
        return local_client_url(config)

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> MqttServer:
        """Listen (a port in use is a ``ConfigError`` naming ``mqtt.listen``), then serve."""
        host, port = self.cfg.listen
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(LISTEN_BACKLOG)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"mqtt.listen: {host}:{port} is in use by another socket; "
                                  "pick another port or stop its owner") from None
            raise ConfigError(f"mqtt.listen: cannot listen on {host}:{port}: "
                              f"{exc.strerror or exc}") from None
        sock.setblocking(False)
        self._sock = sock
        self.address = sock.getsockname()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True,
                                        name="mqtt-edge")
        self._thread.start()
        started.wait()
        log.info("mqtt: listening on %s:%d (native sessions via %s)", *self.address,
                 self.native_url)
        return self

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(
            asyncio.start_server(self._accept, sock=self._sock))
        started.set()
        self.loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.open) >= self.cfg.max_connections:
            self.count("refused_max_connections")
            writer.close()
            return
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        session = MqttSession(self, reader, writer)
        self.open.add(session)
        self.count("connections_opened")
        await session.run()

    def forget(self, session: MqttSession) -> None:
        self.open.discard(session)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        self.count("connections_closed")

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await asyncio.gather(*(s.close("shutdown", Reason.SERVER_SHUTTING_DOWN)
                               for s in list(self.open)), return_exceptions=True)

    def close(self) -> None:
        """Close every connection (no wills: the edge stops), their native sessions, the
        listener and the loop (safe twice)."""
        if self._thread is None:
            return
        thread, self._thread = self._thread, None
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(STOP_TIMEOUT_S)
        except Exception as exc:  # stop anyway
            log.warning("mqtt: shutdown incomplete: %r", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        thread.join(STOP_TIMEOUT_S)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if not thread.is_alive():
            self.loop.close()

    # --- helpers of the sessions -------------------------------------------------------------
    async def blocking(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """Run a call that waits (for the appliance, or scrypt) off the event loop."""
        return await self.loop.run_in_executor(self._pool, functools.partial(fn, *args, **kw))

    def native_login(self, identity: str, password: bytes | None = None) -> Any:
        """The native session of a CONNECT (``password``: the one CONNECT carried, checked
        already; an identity P&M gives a password proves it again to the appliance)."""
        from appliance.client.api import connect

        return connect(self.native_url, identity, idle=NATIVE_IDLE, password=password)

    def password_of(self, identity: str) -> str | None:
        """The stored credential of a P&M identity in this appliance's config (the running
        one: a reload's new passwords apply to the next CONNECT)."""
        ident = self.appliance.config.identities.get(identity)
        return None if ident is None else ident.password

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def status(self) -> dict[str, Any]:
        with self._lock:
            counters = dict(sorted(self.counters.items()))
        return {"listen": f"{self.address[0]}:{self.address[1]}" if self.address else None,
                "connections": len(self.open), "sessions": len(self.sessions),
                "retained_messages": len(self.retained.messages),
                "retained_bytes": self.retained.bytes, "counters": counters}
