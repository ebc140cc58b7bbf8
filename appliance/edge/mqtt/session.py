"""One MQTT connection: its read loop, its state and what it sends.

A ``MqttSession`` runs as one task on the MQTT server's event loop: it reads a packet (fixed
header first: the remaining length is bounded by ``mqtt.max_packet_bytes`` before the body is
read), decodes it (``codec.decode``: a packet or a counted ``Refusal``) and hands it to the
handler of its packet family, one packet at a time, so a connection's packets take effect in
order. Deadlines: CONNECT within ``mqtt.connect_timeout_ms``, then any packet within 1.5x the
keep-alive. Whatever goes wrong (a refusal, a timeout, a bug in a handler) closes this
connection only, counted.

Fabric side: an accepted CONNECT logs in a native client session of its own (the username's
P&M identity) at this edge (appliance/edge/mqtt/handle_connect.py); its subscriptions and
publishes are that session's, so the appliance applies the identity's entitlements. Messages
the native session receives arrive on its client thread (``on_native``) and are handed to
the event loop, bounded (``NATIVE_PENDING_MESSAGES``), then sent to the MQTT client with the
QoS its matching filters granted (0 for a best-effort message).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from appliance.client.messages import QOS
from appliance.dataplane.guaranteed import RELIABLE_STREAM_BIT
from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType, Reason, Refusal
from appliance.edge.mqtt.state import Closed, SubOptions
from appliance.edge.mqtt.topics import mqtt_matches

if TYPE_CHECKING:
    from appliance.edge.mqtt.server import MqttServer

log = logging.getLogger("topicwire.edge.mqtt")

NATIVE_PENDING_MESSAGES = 10_000
"""Messages from the fabric handed to the event loop for one connection and not yet sent;
more are dropped and counted (``deliveries_dropped_backlog``)."""
GUARANTEED_QOS = QOS["guaranteed"]
KEEP_ALIVE_GRACE = 1.5
"""A client that sends nothing for this many keep-alive periods is disconnected."""


class MqttSession:
    """See the module docstring."""

    def __init__(self, server: MqttServer, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.cfg = server.cfg
        self.reader = reader
        self.writer = writer
        self.peer = writer.get_extra_info("peername")
        self.version = 0
        self.connect: codec.Connect | None = None
        self.client_id = ""
        self.identity = ""
        self.native: Any = None
        """The native ``appliance.client.Client`` logged in for this connection."""
        self.filters: dict[str, SubOptions] = {}
        self.guaranteed_filters: set[str] = set()
        """Filters with a native guaranteed subscription too (``native_subscribe``)."""
        self.native_subscribes = 0
        self.inflight: dict[int, tuple[int, str]] = {}
        """Outgoing QoS 1/2 packet id -> (qos, what is awaited: puback, pubrec, pubcomp)."""
        self.queued: deque[tuple[str, bytes, int, bool]] = deque()
        """QoS 1/2 deliveries waiting for a free inflight slot (``mqtt.max_queued``)."""
        self.awaiting_rel: set[int] = set()
        self.registered: set[str] = set()
        """Topics this connection published before (handle_publish.REGISTERED_TOPICS)."""
        """Incoming QoS 2 packet ids published, awaiting PUBREL."""
        self.client_receive_maximum = 65_535
        self.client_max_packet_bytes = codec.MAX_REMAINING_LENGTH + 5
        self._ids = itertools.cycle(range(1, 65_536))
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._last_native: Any = None
        self.closing = False
        self.no_will = False
        self.done = asyncio.Event()

    # --- counting --------------------------------------------------------------------------------
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
            keep_alive = self.connect.keep_alive_s if self.connect else 0
            timeout = keep_alive * KEEP_ALIVE_GRACE if keep_alive else None
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
                    clean = pkt.reason != Reason.DISCONNECT_WITH_WILL
                    self.count("disconnects_clean" if clean else "disconnects_with_will")
                    return
                elif isinstance(pkt, codec.Connect):
                    raise Closed("second_connect", Reason.PROTOCOL_ERROR)
                else:
                    raise Closed("protocol_error", Reason.PROTOCOL_ERROR)
        except Closed as closed:
            will = will and closed.will
            self.count(f"closed_{closed.reason}")
            if closed.detail:
                log.debug("mqtt %s: closed: %s: %s", self.peer, closed.reason, closed.detail)
            if self.version == codec.V5 and self.connect is not None and closed.code:
                self.send_now(codec.encode_disconnect(closed.code))
        except (ConnectionError, asyncio.IncompleteReadError):
            self.count("closed_by_peer")
        except asyncio.CancelledError:
            will = False  # the server is stopping
            raise
        except Exception:  # a handler's bug ends this connection only
            self.count("closed_internal_error")
            log.exception("mqtt %s: internal error; connection closed", self.peer)
        finally:
            await self._end(send_will=will and not clean and not self.no_will)

    async def _read(self, timeout_s: float | None, why: str) -> codec.Packet:
        """The next packet (raises ``Closed`` for a refusal or the deadline)."""
        try:
            async with asyncio.timeout(timeout_s):
                first = (await self.reader.readexactly(1))[0]
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

    def deliver(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        """One PUBLISH to the client at ``qos`` (an outgoing QoS 1/2 takes an inflight slot;
        with none free, or a full send buffer at QoS 0, the message is dropped and counted)."""
        if self.closing:
            return
        if qos == 0:
            transport = self.writer.transport
            if transport.get_write_buffer_size() > self.cfg.send_buffer_bytes:
                self.count("deliveries_dropped_send_buffer")
                return
            if self.send(codec.encode_publish(topic, payload, 0, retain, version=self.version)):
                self.count("messages_out")
            return
        if len(self.inflight) >= min(self.cfg.max_inflight, self.client_receive_maximum):
            if len(self.queued) >= self.cfg.max_queued:
                self.count("deliveries_dropped_queue_full")
                return
            self.queued.append((topic, payload, qos, retain))
            self.count("deliveries_queued")
            return
        packet_id = next(self._ids)
        while packet_id in self.inflight:
            packet_id = next(self._ids)
        if self.send(codec.encode_publish(topic, payload, qos, retain, packet_id=packet_id,
                                          version=self.version)):
            self.inflight[packet_id] = (qos, "puback" if qos == 1 else "pubrec")
            self.count("messages_out")

    def release(self, packet_id: int) -> None:
        """An outgoing QoS 1/2 flow ended: its slot takes the next queued delivery."""
        del self.inflight[packet_id]
        if self.queued:
            self.deliver(*self.queued.popleft())

    # --- from the fabric -------------------------------------------------------------------------
    def on_native(self, msg: Any) -> None:
        """A native message for one of this session's subscriptions (client thread). The
        native client calls this once per matching subscription: only the first counts."""
        if msg is self._last_native:
            return
        self._last_native = msg
        with self._pending_lock:
            if self._pending >= NATIVE_PENDING_MESSAGES:
                self.server.count("deliveries_dropped_backlog")
                return
            self._pending += 1
        try:
            self.server.loop.call_soon_threadsafe(self._from_fabric, msg)
        except RuntimeError:  # the server's loop has stopped: the edge is going down
            self.server.count("deliveries_dropped_stopping")

    def _from_fabric(self, msg: Any) -> None:
        with self._pending_lock:
            self._pending -= 1
        own = self.native is not None and msg.origin == self.server.node_id and (
            msg.stream & ~RELIABLE_STREAM_BIT) == self.native.session
        # with a filter subscribed in both native classes, every message arrives twice:
        # over the reliable stream (msg.guaranteed) and as a best-effort copy, dropped here
        copy = not msg.guaranteed
        qos = -1
        for topic_filter, options in self.filters.items():
            if not (own and options.no_local) and mqtt_matches(topic_filter, msg.topic):
                if copy and topic_filter in self.guaranteed_filters:
                    self.count("deliveries_guaranteed_copies")
                    return
                qos = max(qos, options.qos)
        if qos < 0:
            self.count("deliveries_unmatched")  # the $ rule, no-local, or withdrawn meanwhile
            return
        # published best-effort (MQTT QoS 0): at QoS 0; published guaranteed (QoS 1 or 2, or
        # a native guaranteed publish): at the QoS the subscription granted
        self.deliver(msg.topic, msg.payload, qos if msg.qos == GUARANTEED_QOS else 0, False)

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
            native = self.native
            if native is not None:
                will = self.connect.will if self.connect is not None else None
                if send_will and will is not None:
                    from appliance.edge.mqtt.handle_publish import publish_will

                    await publish_will(self, will)
                self.native = None
                await self.server.blocking(native.close)
        finally:
            self.server.forget(self)
            self.done.set()
