"""One MQTT connection (TCP, TLS or WebSocket): its read loop, deadlines, what it sends.

A ``MqttConnection`` runs as one task on the MQTT server's event loop: it reads what the
socket holds (up to ``READ_BYTES`` a read), frames and decodes every complete packet of it
in one call of the compiled kernel (fastcodec.py: PUBLISH and the acknowledgements decoded
there, other packets by ``codec.decode``; a malformed one is a counted ``Refusal``; the
remaining length is bounded by ``mqtt.max_packet_bytes`` as soon as it is known, before the
body is awaited) and hands each to the handler of its packet family, one packet at a time,
so a connection's packets take effect in order; the loop is not entered again while
complete packets wait. Deadlines: CONNECT within ``mqtt.connect_timeout_ms``,
then any packet within 1.5x the keep-alive (from the end of the previous packet). Whatever
goes wrong (a refusal, a timeout, a bug in a handler) closes this connection only, counted.

An accepted CONNECT binds the connection to a ``SessionState`` (sessions.py: the native
client session, subscriptions, deliveries), new or taken up again; when the connection ends
the session goes offline or ends, with the will. What is per connection stays here: the
protocol version, the client's Receive Maximum, Maximum Packet Size and topic aliases both
ways.

**Sending is per wake-up**: ``send`` appends the packet to the connection's output and the
server writes each connection's output in one ``write`` at the end of the event loop's
wake-up (``MqttServer.end_wakeup``), after the native publishes of that wake-up were sent
(so a PUBACK never leaves before its message left for the appliance). ``send_now`` and the
close write what waits first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType, Reason, Refusal
from appliance.edge.mqtt.state import Closed, Delivery

if TYPE_CHECKING:
    from appliance.edge.mqtt.server import MqttServer
    from appliance.edge.mqtt.sessions import SessionState

log = logging.getLogger("topicwire.edge.mqtt")

KEEP_ALIVE_GRACE = 1.5
"""A client that sends nothing for this many keep-alive periods is disconnected."""
READ_BYTES = 65_536
"""The most bytes one read of a connection's socket takes (its buffer holds at most this
plus one packet of ``mqtt.max_packet_bytes``)."""


class MqttConnection:
    """See the module docstring."""

    def __init__(self, server: MqttServer, reader: asyncio.StreamReader, writer: Any,
                 transport: str = "tcp", cert_identity: str | None = None) -> None:
        self.server = server
        self.cfg = server.cfg
        self.reader = reader
        self.writer = writer
        self.transport = transport
        self.cert_identity = cert_identity
        """The CN of a verified client certificate (TLS), else None."""
        self.peer = writer.get_extra_info("peername")
        self.version = 0
        self.connect: codec.Connect | None = None
        self.state: SessionState | None = None
        self.keep_alive_s = 0
        self.client_receive_maximum = 65_535
        self.client_max_packet_bytes = codec.MAX_REMAINING_LENGTH + 5
        self.client_alias_max = 0
        self.connect_deadline = 0.0
        """When CONNECT and its enhanced authentication must be done (loop time)."""
        self.auth_method: str | None = None
        """The 5.0 Authentication Method it connected with (handle_auth.py), else None."""
        self.reauth: Any = None
        """A re-authentication waiting for its client-final (``handle_auth.ScramExchange``)."""
        self.aliases_in: dict[int, str] = {}
        """Topic aliases the client set (at most ``mqtt.topic_alias_maximum``)."""
        self.aliases_out: dict[str, int] = {}
        """Topic aliases the edge set towards the client (at most its maximum)."""
        self.closing = False
        self.no_will = False
        self.improper = False
        """It ended improperly: the socket dropped or the keep-alive expired (successor.py)."""
        self.done = asyncio.Event()
        self._buf = bytearray()
        """Bytes read and not yet taken as packets (from ``_pos``)."""
        self._pos = 0
        self._framer = server.framer
        self._ready: list[codec.Packet | Refusal] = []
        """Packets framed and decoded (a malformed one last), handled from ``_next`` on."""
        self._next = 0
        self._stop: Refusal | None = None
        """The fixed-header refusal behind ``_ready`` (the connection closes there)."""
        self._deadline: float | None = None
        """When the packet being waited for is due (loop time; None: not waiting yet)."""
        self._watch: asyncio.TimerHandle | None = None
        """The timer that ends a read past ``_deadline`` (``_on_watch``): armed once and
        moved on when it fires early, not made and cancelled for every read."""
        self._reading: asyncio.Task | None = None
        """The task waiting in ``_fill`` (the watch cancels that wait)."""
        self._expired = False
        self._packets_in = 0
        self._out: list[bytes] = []
        """Packets waiting for the end of the wake-up (``flush_out``)."""
        self._out_bytes = 0
        self.task: asyncio.Task | None = None
        """The task running ``run`` (the server cancels it when a shutdown finds it late)."""
        self.acks: deque[list] = deque()
        """With a state store: the acknowledgements waiting for their records to be synced,
        in the order of their PUBLISHes (handle_publish.send_acks)."""

    def count(self, name: str, n: int = 1) -> None:
        self.server.count(name, n)

    # --- the read loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        from appliance.edge.mqtt import (
            handle_auth,
            handle_connect,
            handle_publish,
            handle_subscribe,
        )

        clean = False
        will = False
        self.connect_deadline = self.server.loop.time() + self.cfg.connect_timeout_ms / 1e3
        try:
            pkt = await self._read(self.cfg.connect_timeout_ms / 1e3, "connect_timeout")
            if not isinstance(pkt, codec.Connect):
                raise Closed("first_packet_not_connect", Reason.PROTOCOL_ERROR, will=False)
            if not await handle_connect.on_connect(self, pkt):
                return
            will = True
            timeout = self.keep_alive_s * KEEP_ALIVE_GRACE if self.keep_alive_s else None
            while not self.closing:
                pkt = await self._read(timeout, "keep_alive_timeout")
                if isinstance(pkt, codec.Publish):
                    await handle_publish.on_publish(self, pkt)
                elif isinstance(pkt, codec.Ack):
                    handle_publish.on_ack(self, pkt)
                elif isinstance(pkt, codec.Subscribe):
                    await handle_subscribe.on_subscribe(self, pkt)
                elif isinstance(pkt, codec.Unsubscribe):
                    await handle_subscribe.on_unsubscribe(self, pkt)
                elif isinstance(pkt, codec.Simple) and pkt.type == PacketType.PINGREQ:
                    self.send(codec.PINGRESP)
                elif isinstance(pkt, codec.Disconnect):
                    self._on_disconnect(pkt)  # (5.0 3.14.2.2.2: a protocol error)
                    clean = pkt.reason != Reason.DISCONNECT_WITH_WILL
                    self.count("disconnects_clean" if clean else "disconnects_with_will")
                    return
                elif isinstance(pkt, codec.Auth):
                    handle_auth.on_auth(self, pkt, handle_connect.pm_identities(self.server))
                elif isinstance(pkt, codec.Connect):
                    raise Closed("second_connect", Reason.PROTOCOL_ERROR)
                else:
                    raise Closed("protocol_error", Reason.PROTOCOL_ERROR)
        except Closed as closed:
            will = will and closed.will
            self.improper = closed.reason == "keep_alive_timeout"
            self.count(f"closed_{closed.reason}")
            if closed.detail:
                log.debug("mqtt %s: closed: %s: %s", self.peer, closed.reason, closed.detail)
            if self.version == codec.V5 and self.connect is not None and closed.code:
                self.send_now(codec.encode_disconnect(closed.code))
        except (ConnectionError, asyncio.IncompleteReadError):
            self.count("closed_by_peer")
            self.improper = True
        except asyncio.CancelledError:
            will = False  # the server is stopping
            raise
        except Exception:  # a handler's bug ends this connection only
            self.count("closed_internal_error")
            log.exception("mqtt %s: internal error; connection closed", self.peer)
        finally:
            await self._end(send_will=will and not clean and not self.no_will)

    def _on_disconnect(self, pkt: codec.Disconnect) -> None:
        """A 5.0 DISCONNECT may change the Session Expiry Interval (not from 0)."""
        expiry = codec.prop(pkt.props, "session_expiry_interval")
        if expiry is None or self.state is None:
            return
        if self.state.expiry_s == 0 and expiry:
            raise Closed("session_expiry_from_zero", Reason.PROTOCOL_ERROR)
        self.state.expiry_s = min(int(expiry), self.cfg.max_session_expiry_s)  # type: ignore

    async def _read(self, timeout_s: float | None, why: str) -> codec.Packet:
        """The next packet (raises ``Closed`` for a refusal or the deadline): from those
        framed already, else from the buffer's complete packets (``_frame``), else after
        reading more."""
        ready = self._ready
        while self._next >= len(ready):
            if ready:
                ready.clear()
                self._next = 0
            if self._stop is not None:  # a bad fixed header behind the packets taken
                stop = self._stop
                self.count("refused_" + stop.reason)
                raise Closed(stop.reason, stop.code, detail=stop.detail)
            if self._pos < len(self._buf) and self._frame():
                continue
            if self._deadline is None:
                self._deadline = None if timeout_s is None else \
                    self.server.loop.time() + timeout_s
            await self._fill(why)
        self._deadline = None
        self._packets_in += 1
        pkt = ready[self._next]
        self._next += 1
        if isinstance(pkt, Refusal):
            self.count("refused_" + pkt.reason)
            raise Closed(pkt.reason, pkt.code, detail=pkt.detail)
        return pkt

    async def read_packet(self, timeout_s: float | None, why: str) -> codec.Packet:
        """The next packet, within ``timeout_s`` (handle_auth reads its AUTH with it)."""
        return await self._read(timeout_s, why)

    def _frame(self) -> bool:
        """Every complete packet of the buffer, decoded in one call of the compiled kernel
        (fastcodec.py) into ``_ready`` (a malformed one as its ``Refusal``, the last); a bad
        fixed header (reserved packet type, remaining length over 4 bytes or over
        ``mqtt.max_packet_bytes``, refused as soon as it is read) into ``_stop``. True when
        it took a packet or found such a header."""
        before = len(self._ready)
        pos, stop = self._framer.take(self._buf, self._pos, self.version, self._ready)
        if pos >= len(self._buf):
            self._buf.clear()
            self._pos = 0
        else:
            self._pos = pos
        self._stop = stop
        return stop is not None or len(self._ready) > before

    async def _fill(self, why: str) -> None:
        """Read what the socket holds (waits for at least a byte, until the deadline)."""
        if self._packets_in:
            self.count("packets_in", self._packets_in)
            self._packets_in = 0
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        deadline = self._deadline
        if deadline is not None:
            loop = self.server.loop
            if loop.time() >= deadline:
                raise Closed(why, Reason.KEEP_ALIVE_TIMEOUT)
            watch = self._watch
            if watch is None or watch.when() > deadline:
                if watch is not None:
                    watch.cancel()
                self._watch = loop.call_at(deadline, self._on_watch)
        task = self._reading = asyncio.current_task()
        try:
            data = await self.reader.read(READ_BYTES)
        except asyncio.CancelledError:
            if self._expired:  # (the watch's cancel, unless the task was cancelled too)
                self._expired = False
                if task is not None and task.uncancel() == 0:
                    raise Closed(why, Reason.KEEP_ALIVE_TIMEOUT) from None
            raise
        finally:
            self._reading = None
        if not data:
            raise asyncio.IncompleteReadError(bytes(self._buf), None)
        self._buf += data

    def _on_watch(self) -> None:
        """The read deadline's timer: it cancels the wait of a read that is past its
        deadline; one that fired early (the deadline moved on with the packets read since)
        is set again for the deadline, and none is set while no read waits (``_fill`` sets
        it)."""
        self._watch = None
        task, deadline = self._reading, self._deadline
        if task is None or deadline is None or self.closing:
            return
        loop = self.server.loop
        if loop.time() < deadline:
            self._watch = loop.call_at(deadline, self._on_watch)
            return
        self._expired = True
        task.cancel()

    # --- sending ---------------------------------------------------------------------------------
    def send(self, data: bytes) -> bool:
        """Queue one packet to the client; False when it is not sent (closing, or larger
        than the 5.0 client's Maximum Packet Size: dropped and counted)."""
        if self.closing or self.writer.is_closing():
            return False
        if self.version == codec.V5 and len(data) > self.client_max_packet_bytes:
            self.count("deliveries_dropped_client_max_packet")
            return False
        if not self._out:
            self.server.defer_write(self)
        self._out.append(data)
        self._out_bytes += len(data)
        return True

    def flush_out(self) -> None:
        """Write the packets ``send`` queued, in one write (end of the wake-up)."""
        out = self._out
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        n = len(out)
        out.clear()
        self._out_bytes = 0
        if not self.writer.is_closing():
            self.writer.write(data)
            self.count("packets_out", n)

    def drop_out(self) -> None:
        """Forget the packets waiting (their connection closes without them)."""
        self._out.clear()
        self._out_bytes = 0

    def send_now(self, data: bytes) -> None:
        """Send now, even while closing (a DISCONNECT before the close), after what
        waits."""
        self.flush_out()
        if not self.writer.is_closing():
            self.writer.write(data)
            self.count("packets_out")

    def send_publish(self, d: Delivery, packet_id: int, dup: bool) -> bool:
        """One PUBLISH of ``d`` (5.0: its properties, the remaining expiry, subscription
        identifiers and a topic alias); QoS 0 is dropped when the send buffer is full."""
        if self.closing:
            return False
        if d.qos == 0 and self.writer.transport.get_write_buffer_size() + self._out_bytes > \
                self.cfg.send_buffer_bytes:
            self.count("deliveries_dropped_send_buffer")
            return False
        topic: str = d.topic
        props: codec.Props = []
        alias = 0
        if self.version == codec.V5:
            meta = d.meta
            if meta is not None:
                props.extend(meta.props)
                remaining = meta.remaining_s(time.monotonic())
                if remaining is not None:
                    props.append((codec.PROP["message_expiry_interval"], remaining))
            props.extend((codec.PROP["subscription_identifier"], s) for s in d.sub_ids)
            if self.client_alias_max:
                alias = self.aliases_out.get(topic, 0)
                if alias:
                    topic = ""
                elif len(self.aliases_out) < self.client_alias_max:
                    alias = len(self.aliases_out) + 1
                if alias:
                    props.append((codec.PROP["topic_alias"], alias))
        data = codec.encode_publish(topic, d.payload, d.qos, d.retain, dup, packet_id,
                                    self.version, props)
        if not self.send(data):
            return False
        if alias and topic:  # the alias is the client's once the packet that sets it went
            self.aliases_out[topic] = alias
        return True

    # --- the end ---------------------------------------------------------------------------------
    async def close(self, reason: str, code: int) -> None:
        """End this connection from outside (takeover, shutdown): no will."""
        if self.version == codec.V5 and self.connect is not None:
            self.send_now(codec.encode_disconnect(code))
        self.no_will = True
        self.closing = True
        self.flush_out()
        self.writer.close()
        await self.done.wait()

    async def _end(self, send_will: bool) -> None:
        self.closing = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._packets_in:
            self.count("packets_in", self._packets_in)
            self._packets_in = 0
        try:
            self.flush_out()
            self.writer.close()
        except Exception:  # the socket may be gone already
            pass
        try:
            state = self.state
            if state is not None and state.conn is self:
                will = self.connect.will if self.connect is not None else None
                await state.detach(will if send_will else None,
                                   improper=self.improper and not self.no_will)
        finally:
            self.server.forget(self)
            self.done.set()
