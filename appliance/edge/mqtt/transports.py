"""The MQTT server's transports besides plain TCP: TLS (Python's ``ssl``) and WebSocket (the
``websockets`` library, subprotocol ``mqtt``, MQTT 5.0 6.0).

TLS: ``mqtt.tls_cert_file`` and ``mqtt.tls_key_file`` (PEM) make the server context; with
``mqtt.tls_ca_file`` clients may present a certificate signed by those CAs (required with
``mqtt.tls_require_client_cert``), and a verified certificate's subject CN is offered to
CONNECT as the identity (``mqtt.tls_identity_from_cert``). A file that does not load stops
the start with a ``ConfigError`` naming its key.

WebSocket: each binary message carries bytes of the MQTT stream (a packet may span
messages); ``WsStream`` turns the socket into the reader and writer an ``MqttConnection``
uses. A client that does not offer the ``mqtt`` subprotocol is refused by the handshake
(HTTP 400, by ``websockets``); one that sends a text message is closed (counted). Inbound
bytes are bounded: the reader stops taking messages from the socket while it holds more than
``WS_READ_BUFFER_PACKETS`` packets' worth of bytes.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from websockets.exceptions import ConnectionClosed

from appliance.config import ConfigError, MqttConfig

WS_SUBPROTOCOL = "mqtt"
WS_READ_BUFFER_PACKETS = 2
"""Inbound bytes held per WebSocket connection, in ``mqtt.max_packet_bytes``."""
log = logging.getLogger("topicwire.edge.mqtt")
WS_CLOSE_PROTOCOL_ERROR = 1002


def tls_context(cfg: MqttConfig) -> ssl.SSLContext:
    """The server's TLS context (a bad file is a ``ConfigError`` naming its key)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cfg.tls_cert_file), str(cfg.tls_key_file))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"mqtt.tls_cert_file: {cfg.tls_cert_file} with mqtt.tls_key_file "
                          f"{cfg.tls_key_file} does not load: {_why(exc)}") from None
    if cfg.tls_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=str(cfg.tls_ca_file))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"mqtt.tls_ca_file: {cfg.tls_ca_file} does not load: "
                              f"{_why(exc)}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED if cfg.tls_require_client_cert else \
            ssl.CERT_OPTIONAL
    return ctx


def _why(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)


def cert_common_name(peercert: dict | None) -> str | None:
    """The subject CN of a verified peer certificate (``SSLObject.getpeercert()``)."""
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None


class WsReader:
    """The MQTT bytes a WebSocket received, read with ``read`` or ``readexactly`` (what
    ``MqttConnection`` asks of a reader); ``feed`` waits while more than ``limit`` bytes are
    unread, so the socket is not read meanwhile."""

    def __init__(self, limit: int) -> None:
        self._buf = bytearray()
        self._eof = False
        self._limit = limit
        self._changed = asyncio.Condition()

    async def feed(self, data: bytes) -> None:
        async with self._changed:
            if self._eof:  # the connection is over: nobody reads any more
                return
            self._buf += data
            self._changed.notify_all()
            await self._changed.wait_for(lambda: len(self._buf) <= self._limit or self._eof)

    async def feed_eof(self) -> None:
        async with self._changed:
            self._eof = True
            self._changed.notify_all()

    async def read(self, n: int) -> bytes:
        """At most ``n`` of the bytes received, at least one (waits); b"" at the end."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._buf or self._eof)
            out = bytes(self._buf[:n])
            del self._buf[:n]
            self._changed.notify_all()
            return out

    async def readexactly(self, n: int) -> bytes:
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._buf) >= n or self._eof)
            if len(self._buf) < n:
                raise asyncio.IncompleteReadError(bytes(self._buf), n)
            out = bytes(self._buf[:n])
            del self._buf[:n]
            self._changed.notify_all()
            return out


class _WsTransport:
    """What ``MqttConnection`` asks of ``writer.transport``."""

    def __init__(self, stream: WsStream) -> None:
        self._stream = stream

    def get_write_buffer_size(self) -> int:
        return self._stream.out_bytes


class WsStream:
    """A WebSocket as an MQTT byte stream: ``reader`` (a ``WsReader`` fed from binary
    messages) and the writer side (``write``, ``close``, ``is_closing``...)."""

    def __init__(self, ws: Any, max_packet_bytes: int, count: Any) -> None:
        self.ws = ws
        self.reader = WsReader(WS_READ_BUFFER_PACKETS * max_packet_bytes)
        self.transport = _WsTransport(self)
        self.out_bytes = 0
        self._out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._closing = False
        self._count = count

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self.ws.remote_address
        return default

    def write(self, data: bytes) -> None:
        if not self._closing:
            self.out_bytes += len(data)
            self._out.put_nowait(data)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._out.put_nowait(None)  # sent what was written, then closes

    async def pump_in(self) -> None:
        """WebSocket messages -> the reader (paused while it holds its limit)."""
        try:
            async for message in self.ws:
                if isinstance(message, str):
                    self._count("closed_ws_text_message")
                    await self.ws.close(WS_CLOSE_PROTOCOL_ERROR, "MQTT uses binary messages")
                    break
                await self.reader.feed(message)
        except (ConnectionClosed, OSError):  # the peer went away: the reader sees the end
            pass
        except Exception:  # a bug here: this connection ends, counted and logged
            self._count("closed_internal_error")
            log.exception("mqtt websocket: reading failed; connection closed")
        finally:
            await self.reader.feed_eof()

    async def pump_out(self) -> None:
        """The writer's packets -> WebSocket binary messages, then the close."""
        try:
            while True:
                data = await self._out.get()
                if data is None:
                    break
                self.out_bytes -= len(data)
                await self.ws.send(data)
        except (ConnectionClosed, OSError):  # the peer went away
            pass
        except Exception:  # a bug here: this connection ends, counted and logged
            self._count("closed_internal_error")
            log.exception("mqtt websocket: sending failed; connection closed")
        finally:
            self._closing = True
            await self.ws.close()
