"""The edge's MQTT server: its listeners (TCP; TLS and WebSocket when configured), one asyncio
event loop on a thread of its own, the connections (``MqttConnection``), the sessions
(``SessionState``, connected or offline), the shared subscriptions, the retained store, the
5.0 message metadata and the counters.

Started by ``EdgeAppliance.start`` when the config has ``[mqtt]`` (appliance/edge/node.py),
after the appliance itself: the MQTT sessions of one P&M identity share one native client
session at this appliance (``clients.udp``, else ``clients.shm``; identities.py), so MQTT
clients are clients of the fabric like any other, and a connection costs no thread or socket
beyond its own TCP socket. Calls that wait for the appliance (login, subscribe, the first
publish of a topic, scrypt) run on a small thread pool (``blocking``), never on the loop.

Bounds: ``mqtt.max_connections`` open connections (one more is closed at once, counted
``refused_max_connections``; at start the open-file limit's soft value is raised to its hard
one, and an edge whose ``max_connections`` cannot fit it does not start), per connection
``max_subscriptions``, ``max_inflight``, ``send_buffer_bytes`` and the packet size, and the
retained store's count and bytes.
``status()`` is the ``mqtt`` section of ``/status``.

With ``mqtt.state_dir`` the server opens the state store (store.py) at start, before it
serves: the retained messages are set again, the persistent sessions restored as offline
sessions (sessions.restore_session), then the QoS 1/2 publishes recorded but not known to
have reached the fabric are published again (``republish``).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from appliance.config import ApplianceConfig, ConfigError, MqttConfig, local_client_url
from appliance.edge.mqtt.codec import Reason
from appliance.edge.mqtt.connection import MqttConnection
from appliance.edge.mqtt.exactly_once import RecentIds
from appliance.edge.mqtt.fastcodec import Framer
from appliance.edge.mqtt.identities import IdentitySession
from appliance.edge.mqtt.meta import MessageMeta, MetadataTooLarge, to_headers
from appliance.edge.mqtt.retain import RetainedStore
from appliance.edge.mqtt.sessions import SessionState, restore_session
from appliance.edge.mqtt.shared import SharedRouter
from appliance.edge.mqtt.successor import SuccessorTable

log = logging.getLogger("topicwire.edge.mqtt")

BLOCKING_THREADS = 8
"""Threads that run the calls waiting for the appliance (logins, subscribes, scrypt)."""
NATIVE_IDLE = "sleep"
"""The native sessions' client threads sleep 1 ms when idle (one thread per identity)."""
RESERVED_FILES = 1_024
"""Open files kept beside the MQTT connections (the appliance's sockets, the native
sessions', the state store, listeners): ``mqtt.max_connections`` + this must fit the
process's open-file limit (RLIMIT_NOFILE, its soft value raised to the hard one)."""
STOP_TIMEOUT_S = 10.0
"""How long ``close`` waits for the shutdown on the loop (connections, sessions, native
logouts), then for the loop's thread: a stop of the MQTT server takes at most twice this."""
CLOSE_GRACE_S = 2.0
"""At shutdown, how long the connections get to end on their own once their sockets are
closed; those still waiting then (e.g. a publish waiting for the appliance to register its
topic) are cancelled, and get as long again to finish."""
LISTEN_BACKLOG = 128
INBOUND_CLOSE_S = 5.0
"""How long the native sessions that publish recorded messages again stay logged in."""


class MqttServer:
    """See the module docstring."""

    def __init__(self, appliance: Any, config: ApplianceConfig) -> None:
        assert config.mqtt is not None
        self.appliance = appliance
        self.cfg: MqttConfig = config.mqtt
        self.node_id = config.node_id
        self.edge_name = config.name
        self.bridges: dict[str, Any] = {}
        """Bridge name -> its ``MqttBridge`` (bridge.py)."""
        self.native_url = self._native_url(config)
        self.retained = RetainedStore(self.cfg.max_retained, self.cfg.max_retained_bytes)
        self.retained.node_id = self.node_id
        self.retained_share: Any = None
        """With ``mqtt.retained_namespace``: the ``RetainedShare`` (retain_share.py)."""
        self.shared_view: Any = None
        """With ``mqtt.shared_namespace``: the ``SharedView`` (shared_view.py)."""
        self.sessions: dict[str, SessionState] = {}
        """Client identifier -> its session (connected, or persistent and offline)."""
        self.identities: dict[str, IdentitySession] = {}
        """P&M identity -> its shared native session (identities.py)."""
        self.stopping = False
        self.store: Any = None
        """The state store (store.StateStore) with ``mqtt.state_dir``; None: in memory."""
        self.open: set[MqttConnection] = set()
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.shared_router = SharedRouter(self.count)
        self.successors = SuccessorTable(self.count)
        self.delivered_once = RecentIds(self.cfg.exactly_once_window)
        """The QoS 2 messages delivered lately, by publish number (exactly_once.py)."""
        self.addresses: dict[str, tuple[str, int]] = {}
        """Listener (``tcp``, ``tls``, ``ws``) -> its bound address."""
        self._socks: dict[str, socket.socket] = {}
        self.loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(BLOCKING_THREADS, thread_name_prefix="mqtt-blocking")
        self._thread: threading.Thread | None = None
        self._servers: list[Any] = []
        self._tasks: set[asyncio.Task] = set()
        self._sock: socket.socket | None = None
        self.address: tuple[str, int] | None = None
        self._unsent: dict[Any, set[MqttConnection | None]] = {}
        """Native clients with publishes of this wake-up not sent yet -> the connections
        (None: a will, a republish) those publishes came from (``end_wakeup``)."""
        self._writes: list[MqttConnection] = []
        """Connections with packets waiting for the end of this wake-up."""
        self.framer = Framer(self.cfg.max_packet_bytes)
        """The compiled framing kernel's tables, shared by every connection (each call runs
        to its end on the loop: fastcodec.py)."""
        self._wakeup_end_due = False
        from appliance.control.credentials import hash_password

        self.decoy_hash = hash_password(os.urandom(16))
        """Checked against when a username has no credential (the same cost as a real one)."""

    @staticmethod
    def _native_url(config: ApplianceConfig) -> str:
        return local_client_url(config)

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> MqttServer:
        """Listen (a port in use is a ``ConfigError`` naming its key), then serve."""
        open_file_limit(self.cfg.max_connections)
        from appliance.edge.mqtt.fastcodec import warm_up

        warm_up()  # the framing kernel: loaded (compiled on a cold cache) now, not on a packet
        self._tls = None
        listens = {"tcp": ("listen", self.cfg.listen), "tls": ("tls_listen", self.cfg.tls_listen),
                   "ws": ("ws_listen", self.cfg.ws_listen)}
        try:
            if self.cfg.tls_listen is not None:
                from appliance.edge.mqtt.transports import tls_context

                self._tls = tls_context(self.cfg)
            for name, (key, address) in listens.items():
                if address is not None:
                    self._socks[name] = _listen(key, address)
                    self.addresses[name] = self._socks[name].getsockname()
        except BaseException:
            for sock in self._socks.values():
                sock.close()
            raise
        self._sock = self._socks["tcp"]
        self.address = self.addresses["tcp"]
        try:
            self._open_store()
        except BaseException:
            for sock in self._socks.values():
                sock.close()
            raise
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True,
                                        name="mqtt-edge")
        self._start_error: BaseException | None = None
        self._thread.start()
        started.wait()
        if self._start_error is not None:
            self._thread.join()
            self._thread = None
            for sock in self._socks.values():
                sock.close()
            if self.store is not None:
                self.store.close()
            raise self._start_error
        log.info("mqtt: listening on %s (native sessions via %s)", ", ".join(
            f"{n} {a[0]}:{a[1]}" for n, a in self.addresses.items()), self.native_url)
        try:
            self._start_bridges()
        except BaseException:
            self.close()
            raise
        if self.cfg.retained_namespace is not None:
            from appliance.edge.mqtt.retain_share import RetainedShare

            self.retained_share = RetainedShare(self, self.cfg.retained_namespace,
                                                self.cfg.retained_identity).start()
        if self.cfg.shared_namespace is not None:
            from appliance.edge.mqtt.shared_view import SharedView

            self.shared_view = SharedView(self, self.cfg.shared_namespace,
                                          self.cfg.shared_identity)
            self.loop.call_soon_threadsafe(setattr, self.shared_router, "view",
                                           self.shared_view)
            self.shared_view.start()
        return self

    def _start_bridges(self) -> None:
        """``[[mqtt.bridges]]`` (bridge.py): each connects out in the background."""
        from appliance.edge.mqtt.bridge import MqttBridge

        for cfg in self.cfg.bridges:
            self.bridges[cfg.name] = MqttBridge(self, cfg, self.edge_name).start()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._open())
        except BaseException as exc:  # start() raises it
            self._start_error = exc
            started.set()
            return
        started.set()
        self.loop.run_forever()

    def _open_store(self) -> None:
        """``mqtt.state_dir``: read the state back (a ``ConfigError`` when it cannot be) and
        set the retained messages again."""
        if self.cfg.state_dir is None:
            return
        from appliance.edge.mqtt.store import StateStore

        self.store = store = StateStore(self.cfg.state_dir, self.loop, self.count)
        for topic, payload, qos, seq, meta in store.stored_retained():
            if meta is not None and meta.expired(time.monotonic()):
                store.retained(topic, b"", 0)  # expired while the edge was down
                self.count("store_retained_expired")
            elif self.retained.set(topic, payload, qos, meta, seq, stamp=(0, 0)):
                self.count("store_retained_restored")
            else:  # (the bounds may have shrunk)
                store.retained(topic, b"", 0)
                self.count("retained_refused_full")
        self.retained.on_change = store.retained

    async def _restore(self) -> None:
        """The persistent sessions, then the publishes to send again (store.py)."""
        if self.store is None:
            return
        now = time.time()
        stored = self.store.stored_sessions()
        for s in sorted(stored, key=lambda s: s.offline_since or now, reverse=True):
            await restore_session(self, s, now)  # (the most recent first, within the bound)
        if stored:
            log.info("mqtt: %d persistent sessions restored from %s", len(self.sessions),
                     self.cfg.state_dir)
        await self._republish()

    async def _republish(self) -> None:
        """Publish again, under their publishers' identities, the QoS 1/2 messages recorded
        and acknowledged but not known to have reached the fabric (a crash within
        ``store.INBOUND_RETIRE_S`` of their publish): at least once."""
        from appliance.client.errors import ClientError, EntitlementError

        store = self.store
        by_identity: dict[str, list] = {}
        for m in store.stored_inbound():
            by_identity.setdefault(m.identity, []).append(m)
        for identity, messages in by_identity.items():
            try:
                native = await self.blocking(self.native_login, identity)
            except ClientError as exc:
                log.warning("mqtt: %d recorded publishes of %r not published again: %s",
                            len(messages), identity, exc)
                self.count("store_republish_failed", len(messages))
                for m in messages:
                    store.retire(m.seq, 0)
                continue
            for m in messages:
                meta = MessageMeta([], None, m.retain, m.seq) if m.meta is None else replace(
                    m.meta, origin=m.seq)
                if meta.expired(time.monotonic()):  # (expired while the edge was down)
                    self.count("deliveries_dropped_expired")
                    store.retire(m.seq, 0)
                    continue
                try:
                    await self.blocking(native.publish, m.topic, m.payload, flush=True,
                                        qos="guaranteed", headers=to_headers(meta, m.qos))
                except (EntitlementError, ClientError, MetadataTooLarge):
                    self.count("store_republish_failed")
                    store.retire(m.seq, 0)
                    continue
                self.count("store_inbound_republished")
                if m.retain and m.seq > store.retained_seq(m.topic):
                    self.keep_retained(m.topic, m.payload, m.qos, meta, m.seq,
                                       to_headers(meta, m.qos))
                store.retire(m.seq)
            self.loop.call_later(INBOUND_CLOSE_S, lambda n=native: self.spawn(
                self.blocking(n.close)))

    async def _open(self) -> None:
        await self._restore()
        self._servers = [await asyncio.start_server(self._accept, sock=self._socks["tcp"])]
        if "tls" in self._socks:
            self._servers.append(await asyncio.start_server(
                self._accept_tls, sock=self._socks["tls"], ssl=self._tls,
                ssl_handshake_timeout=self.cfg.connect_timeout_ms / 1e3))
        if "ws" in self._socks:
            from websockets.asyncio.server import serve

            from appliance.edge.mqtt.transports import WS_SUBPROTOCOL

            self._servers.append(await serve(
                self._accept_ws, sock=self._socks["ws"], subprotocols=[WS_SUBPROTOCOL],
                max_size=self.cfg.max_packet_bytes, ssl=self._tls if self.cfg.ws_tls else None,
                open_timeout=self.cfg.connect_timeout_ms / 1e3))

    def _room(self) -> bool:
        if len(self.open) >= self.cfg.max_connections:
            self.count("refused_max_connections")
            return False
        return True

    async def _serve(self, conn: MqttConnection) -> None:
        self.open.add(conn)
        self.count("connections_opened")
        self.count("connections_opened_" + conn.transport)
        conn.task = asyncio.current_task()
        await conn.run()

    async def _accept_tls(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        if not self._room():
            writer.close()
            return
        from appliance.edge.mqtt.transports import cert_common_name

        identity = cert_common_name(writer.get_extra_info("peercert"))
        await self._serve(MqttConnection(self, reader, writer, "tls", identity))

    async def _accept_ws(self, ws: Any) -> None:
        from appliance.edge.mqtt.transports import WsStream

        # (a client that does not offer subprotocol "mqtt" was refused by the handshake:
        # websockets answers HTTP 400 "missing subprotocol")
        if not self._room():
            await ws.close()
            return
        identity = None
        if self.cfg.ws_tls:  # wss://: a client certificate as on tls_listen
            from appliance.edge.mqtt.transports import cert_common_name

            identity = cert_common_name(ws.transport.get_extra_info("peercert"))
        stream = WsStream(ws, self.cfg.max_packet_bytes, self.count)
        pumps = [asyncio.ensure_future(stream.pump_in()), asyncio.ensure_future(stream.pump_out())]
        try:
            await self._serve(MqttConnection(self, stream.reader, stream,
                                             "wss" if self.cfg.ws_tls else "ws", identity))
        finally:
            stream.close()
            await stream.reader.feed_eof()  # (a pump waiting for room goes on, to the end)
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._room():
            writer.close()
            return
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await self._serve(MqttConnection(self, reader, writer))

    def forget(self, conn: MqttConnection) -> None:
        self.open.discard(conn)
        self.count("connections_closed")

    def offline_sessions(self) -> int:
        return sum(1 for s in self.sessions.values() if s.conn is None)

    async def _shutdown(self) -> None:
        self.stopping = True
        for server in self._servers:
            server.close()
        await self._close_connections()
        if self.store is not None:  # the last publishes reach the sessions and are retired
            from appliance.edge.mqtt.store import INBOUND_RETIRE_S

            deadline = self.loop.time() + INBOUND_RETIRE_S + 1
            while self.store.inbound_pending() and self.loop.time() < deadline:
                await asyncio.sleep(0.05)
        await asyncio.gather(*(s.end("shutdown") for s in list(self.sessions.values())),
                             return_exceptions=True)
        await asyncio.gather(*(i.close() for i in list(self.identities.values())),
                             return_exceptions=True)
        try:  # (websockets closes its server in a task of its own)
            async with asyncio.timeout(STOP_TIMEOUT_S / 2):
                await asyncio.gather(*(server.wait_closed() for server in self._servers),
                                     return_exceptions=True)
        except TimeoutError:
            log.warning("mqtt: a listener did not close in time")
        left = [task for task in self._tasks if not task.done()]
        for task in left:  # (native batches still waiting for an appliance that stops)
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    async def _close_connections(self) -> None:
        """Close every connection: each gets ``CLOSE_GRACE_S`` to end once its socket is
        closed; those still waiting then are cancelled (bounded: a connection waiting for
        the appliance does not hold the stop up)."""
        conns = list(self.open)
        if not conns:
            return
        closing = [asyncio.ensure_future(c.close("shutdown", Reason.SERVER_SHUTTING_DOWN))
                   for c in conns]
        _, waiting = await asyncio.wait(closing, timeout=CLOSE_GRACE_S)
        if waiting:
            late = [c for c in conns if not c.done.is_set() and c.task is not None]
            self.count("shutdown_connections_cancelled", len(late))
            log.warning("mqtt: %d of %d connections had not ended %g s after the shutdown "
                        "closed them; cancelled", len(late), len(conns), CLOSE_GRACE_S)
            for conn in late:
                conn.task.cancel()
            _, waiting = await asyncio.wait(closing, timeout=CLOSE_GRACE_S)
        for fut in waiting:
            fut.cancel()
        await asyncio.gather(*closing, return_exceptions=True)

    def close(self) -> None:
        """Close every connection (no wills: the edge stops), their native sessions, the
        listener and the loop (safe twice)."""
        if self._thread is None:
            return
        bridges, self.bridges = self.bridges, {}
        for bridge in bridges.values():
            bridge.close()
        share, self.retained_share = self.retained_share, None
        if share is not None:
            share.close()
        view, self.shared_view = self.shared_view, None
        if view is not None:  # (withdraws first: the other edges take this one's share)
            view.close()
        thread, self._thread = self._thread, None
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(STOP_TIMEOUT_S)
        except Exception as exc:  # stop anyway
            log.warning("mqtt: shutdown incomplete: %r", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        thread.join(STOP_TIMEOUT_S)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.store is not None:
            self.store.close()  # (what is queued is written and synced)
        if not thread.is_alive():
            self.loop.close()

    # --- helpers of the sessions -------------------------------------------------------------
    async def blocking(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """Run a call that waits (for the appliance, or scrypt) off the event loop."""
        return await self.loop.run_in_executor(self._pool, functools.partial(fn, *args, **kw))

    def spawn(self, coro: Any) -> asyncio.Task:
        """Run ``coro`` as a task of the loop, held until it is done (a timer's work, a
        native batch); the shutdown cancels those still running."""
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def native_login(self, identity: str, republish_window: int = 0) -> Any:
        """The native session of a CONNECT the edge authenticated (password or certificate):
        the appliance's own process vouches for it (``trusted_login_token``), so an identity
        with a password needs no second proof. ``republish_window``: the client's own drop
        of QoS 2 publications sent again (appliance/client/exactly_once.py): off but for a
        bridge, since the identities' sessions drop them per identity
        (``delivered_once``) and the other sessions' messages are the edges' own copies."""
        from appliance.client.api import connect

        control = self.appliance.control
        return connect(self.native_url, identity, idle=NATIVE_IDLE,
                       republish_window=republish_window,
                       _trusted=None if control is None else control.trusted_login_token)

    def keep_retained(self, topic: str, payload: bytes, qos: int, meta: Any, seq: int,
                      headers: dict) -> bool:
        """(the event loop) A retained PUBLISH of this edge's: kept (False: the store's
        bounds refused it) and, with ``mqtt.retained_namespace``, a copy sent to the other
        edges with its native ``headers``."""
        stamp_ns = time.time_ns()
        if not self.retained.set(topic, payload, qos, meta, seq, (stamp_ns, self.node_id)):
            return False
        if self.retained_share is not None:
            self.retained_share.copy(topic, payload, headers, stamp_ns)
        return True

    # --- the end of a wake-up (on the loop) --------------------------------------------------
    def defer_publish(self, native: Any, conn: MqttConnection | None) -> None:
        """``native`` took a publish of ``conn`` with nothing sent: it is sent at the end of
        this wake-up, with every other publish the wake-up gave it."""
        conns = self._unsent.get(native)
        if conns is None:
            self._unsent[native] = conns = set()
            self._end_due()
        conns.add(conn)

    def defer_write(self, conn: MqttConnection) -> None:
        """``conn`` has packets to write at the end of this wake-up."""
        self._writes.append(conn)
        self._end_due()

    def _end_due(self) -> None:
        if not self._wakeup_end_due:
            self._wakeup_end_due = True
            self.loop.call_soon(self.end_wakeup)

    def end_wakeup(self) -> None:
        """Once per wake-up of the loop that published or sent: each native client sends the
        publishes it took (one frame per class and stream for many connections' packets),
        then each connection writes its packets in one write. A native send that fails
        closes the connections whose publishes it held, with their packets unsent (no
        PUBACK for a message that did not leave)."""
        self._wakeup_end_due = False
        unsent, self._unsent = self._unsent, {}
        for native, conns in unsent.items():
            try:
                native.send_pending()
            except Exception as exc:  # (the connection to the appliance is lost)
                self.count("native_publish_failed", len(conns))
                log.info("mqtt: a native send failed (%s); its publishers' connections close",
                         exc)
                for conn in conns:
                    if conn is not None and not conn.closing:
                        conn.drop_out()
                        self.spawn(conn.close("native_publish_failed", Reason.UNSPECIFIED))
        writes, self._writes = self._writes, []
        for conn in writes:
            conn.flush_out()

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def status(self) -> dict[str, Any]:
        with self._lock:
            counters = dict(sorted(self.counters.items()))
        return {"listen": f"{self.address[0]}:{self.address[1]}" if self.address else None,
                "listeners": {n: f"{a[0]}:{a[1]}" for n, a in self.addresses.items()},
                "connections": len(self.open), "sessions": len(self.sessions),
                "native_sessions": sum(1 for i in list(self.identities.values())
                                       if i.native is not None),
                "sessions_offline": self.offline_sessions(),
                "shared_groups": len(self.shared_router.groups),
                "successors": self.successors.status(),
                "exactly_once_ids": len(self.delivered_once),
                "retained_messages": len(self.retained.messages),
                "retained_bytes": self.retained.bytes, "counters": counters,
                "state_dir": None if self.store is None else str(self.cfg.state_dir),
                "state_bytes": None if self.store is None else self.store.bytes,
                "bridges": {n: b.status() for n, b in list(self.bridges.items())},
                "retained_share": None if (share := self.retained_share) is None
                else share.status(),
                "shared": None if (view := self.shared_view) is None else view.status()}


def open_file_limit(max_connections: int) -> int:
    """Raise the process's open-file soft limit to its hard one; a ``ConfigError`` naming
    ``mqtt.max_connections`` when that many connections and ``RESERVED_FILES`` do not fit.
    Returns the limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and max_connections + RESERVED_FILES > soft:
        raise ConfigError(f"mqtt.max_connections: {max_connections} connections and "
                          f"{RESERVED_FILES} other files need more than this process's "
                          f"open-file limit ({soft}, RLIMIT_NOFILE hard limit {hard}); lower "
                          "it or raise the limit (ulimit -Hn, LimitNOFILE=)")
    return soft


def _listen(key: str, address: tuple[str, int]) -> socket.socket:
    """A listening TCP socket (a port in use is a ``ConfigError`` naming ``mqtt.KEY``)."""
    host, port = address
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"mqtt.{key}: {host}:{port} is in use by another socket; "
                              "pick another port or stop its owner") from None
        raise ConfigError(f"mqtt.{key}: cannot listen on {host}:{port}: "
                          f"{exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock
