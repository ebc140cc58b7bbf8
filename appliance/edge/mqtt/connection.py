"""One MQTT connection (TCP, TLS or WebSocket): its read loop, deadlines, what it sends.

A ``MqttConnection`` runs as one task on the MQTT server's event loop: it reads a packet
(fixed header first: the remaining length is bounded by ``mqtt.max_packet_bytes`` before the
body is read), decodes it (``codec.decode``: a packet or a counted ``Refusal``) and hands it
to the handler of its packet family, one packet at a time, so a connection's packets take
effect in order. Deadlines: CONNECT within ``mqtt.connect_timeout_ms``, then any packet
within 1.5x the keep-alive. Whatever goes wrong (a refusal, a timeout, a bug in a handler)
closes this connection only, counted.

An accepted CONNECT binds the connection to a ``SessionState`` (sessions.py: the native
client session, subscriptions, deliveries), new or taken up again; when the connection ends
the session goes offline or ends, with the will. What is per connection stays here: the
protocol version, the client's Receive Maximum, Maximum Packet Size and topic aliases both
ways.
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
        self.aliases_in: dict[int, str] = {}
        """Topic aliases the client set (at most ``mqtt.topic_alias_maximum``)."""
        self.aliases_out: dict[str, int] = {}
        """Topic aliases the edge set towards the client (at most its maximum)."""
        self.closing = False
        self.no_will = False
        self.improper = False
        """It ended improperly: the socket dropped or the keep-alive expired (successor.py)."""
        self.done = asyncio.Event()
        self.acks: deque[list] = deque()
        """With a state store: the acknowledgements waiting for their records to be synced,
        in the order of their PUBLISHes (handle_publish.send_acks)."""

    def count(self, name: str, n: int = 1) -> None:
        self.server.count(name, n)

    # --- the read loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        from appliance.edge.mqtt import handle_connect, handle_publish, handle_subscribe

        clean = False
        will = False
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
        """The next packet (raises ``Closed`` for a refusal or the deadline)."""
        try:
            async with asyncio.timeout(timeout_s):
                first = (await self.reader.readexactly(1))[0]
                if first >> 4 == 0:  # reserved: refused before a remaining length that may
                    refused = codec.decode(first, b"", self.version)  # never end
                    if isinstance(refused, Refusal):
                        self.count("refused_" + refused.reason)
                        raise Closed(refused.reason, refused.code, detail=refused.detail)
                header = b""
                while True:
                    header += await self.reader.readexactly(1)
                    got = codec.read_remaining_length(header)
                    if isinstance(got, Refusal):
                        self.count("refused_" + got.reason)
                        raise Closed(got.reason, got.code, detail=got.detail)
                    if got is not None:
                        break
                length = got[0]
                if 1 + len(header) + length > self.cfg.max_packet_bytes:
                    self.count("refused_oversize")
                    raise Closed("oversize", Reason.PACKET_TOO_LARGE,
                                 detail=f"{length} bytes announced")
                body = await self.reader.readexactly(length)
        except TimeoutError:
            raise Closed(why, Reason.KEEP_ALIVE_TIMEOUT) from None
        self.count("packets_in")
        pkt = codec.decode(first, body, self.version)
        if isinstance(pkt, Refusal):
            self.count("refused_" + pkt.reason)
            raise Closed(pkt.reason, pkt.code, detail=pkt.detail)
        return pkt

    # --- sending ---------------------------------------------------------------------------------
    def send(self, data: bytes) -> bool:
        """Queue one packet to the client; False when it is not sent (closing, or larger
        than the 5.0 client's Maximum Packet Size: dropped and counted)."""
        if self.closing or self.writer.is_closing():
            return False
        if self.version == codec.V5 and len(data) > self.client_max_packet_bytes:
            self.count("deliveries_dropped_client_max_packet")
            return False
        self.writer.write(data)
        self.count("packets_out")
        return True

    def send_now(self, data: bytes) -> None:
        """Send even while closing (a DISCONNECT before the close)."""
        if not self.writer.is_closing():
            self.writer.write(data)
            self.count("packets_out")

    def send_publish(self, d: Delivery, packet_id: int, dup: bool) -> bool:
        """One PUBLISH of ``d`` (5.0: its properties, the remaining expiry, subscription
        identifiers and a topic alias); QoS 0 is dropped when the send buffer is full."""
        if self.closing:
            return False
        if d.qos == 0 and self.writer.transport.get_write_buffer_size() > \
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
        self.writer.close()
        await self.done.wait()

    async def _end(self, send_will: bool) -> None:
        self.closing = True
        try:
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
