"""AUTH: MQTT 5.0 enhanced authentication (MQTT 5.0 section 4.12) with SCRAM-SHA-256
(RFC 5802/7677), at CONNECT and as re-authentication.

The exchange at CONNECT (``connect_exchange``, called by handle_connect)::

    client                                              edge
    CONNECT  method "SCRAM-SHA-256", data client-first  ->
                                                        <-  AUTH 0x18, data server-first
    AUTH 0x18, same method, data client-final           ->
                                                        <-  CONNACK 0x00, data server-final
                                                            (or 0x86 bad proof / 0x87 / 0x82)

The SCRAM username (``n=`` of client-first) is the P&M identity; a CONNECT User Name, when
given, must be the same. The edge checks the proof against the identity's stored keys
(``scram_sha256`` in this appliance's copy of P&M's document: iteration count, salt,
StoredKey, ServerKey; appliance/control/credentials.py), so an edge whose P&M is remote
authenticates as the P&M appliance does. The SCRAM computations are scramp's
(``ScramMechanism.make_server``); the edge never runs PBKDF2 (the client does), so an
exchange costs a few HMACs. An identity that is unknown or has no ``scram_sha256`` gets a
decoy salt (the same for the same name: RFC 5802 section 5.1's advice) and is refused at
the proof as a wrong password is: the answers do not tell which identities exist.

After CONNACK the client may re-authenticate (AUTH 0x19 with the same method, then the same
two steps; the edge ends with AUTH 0x00 and the server-final message), as the identity it
connected as; other packets flow meanwhile. A refused re-authentication closes the
connection with DISCONNECT (the refusal's reason code). An AUTH from a client that did not
connect with a method, or out of sequence, is a protocol error (DISCONNECT 0x82).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from typing import TYPE_CHECKING

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import Reason
from appliance.edge.mqtt.state import Closed

if TYPE_CHECKING:
    from appliance.edge.mqtt.connection import MqttConnection

METHOD = "SCRAM-SHA-256"
"""The one Authentication Method the edge takes (any other: CONNACK 0x8C)."""
MAX_AUTH_DATA_BYTES = 2048
"""Longest SCRAM message taken (a client-first or client-final is ~100 bytes)."""
_DECOY_KEY = secrets.token_bytes(32)
"""Keys the decoy salts of unknown identities (per process)."""


log = logging.getLogger("topicwire.edge.mqtt")


class AuthRefused(Exception):
    """An exchange refused: ``why`` names the counter, ``code`` the reason code."""

    def __init__(self, why: str, code: int) -> None:
        super().__init__(why)
        self.why, self.code = why, code


class ScramExchange:
    """The server side of one SCRAM-SHA-256 exchange (scramp's ``ScramServer``) over the
    identities of a P&M document."""

    def __init__(self, identities: dict) -> None:
        from scramp import ScramMechanism

        self._identities = identities
        self.identity: str | None = None
        self._missing: str | None = None
        """Why the identity has no stored keys ("unknown", "no_credential"), else None."""
        self._server = ScramMechanism(METHOD).make_server(self._auth_info)

    def _auth_info(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        from appliance.control.credentials import SCRAM_ITERATIONS, scram_from_document

        self.identity = username
        spec = self._identities.get(username)
        keys = scram_from_document(spec.get("scram_sha256")) if isinstance(spec, dict) \
            else None
        if keys is not None:
            return keys.auth_info()
        self._missing = "unknown_identity" if spec is None else "no_scram_credential"
        decoy = hmac.new(_DECOY_KEY, username.encode(), hashlib.sha256).digest()
        return decoy[:16], secrets.token_bytes(32), secrets.token_bytes(32), SCRAM_ITERATIONS

    def first(self, data: object) -> bytes:
        """The server-first message for a client-first (raises ``AuthRefused``)."""
        try:
            self._server.set_client_first(_text(data))
            return self._server.get_server_first().encode()
        except AuthRefused:
            raise
        except Exception as exc:  # scramp's ScramException, or anything its parsing raises
            raise _malformed(self.identity, exc) from None

    def final(self, data: object) -> bytes:
        """The server-final message for a client-final whose proof is right (raises
        ``AuthRefused``: 0x86 for a wrong proof or an identity without stored keys)."""
        from scramp.utils import ServerError

        try:
            self._server.set_client_final(_text(data))
            return self._server.get_server_final().encode()
        except AuthRefused:
            raise
        except Exception as exc:
            if getattr(exc, "server_error", None) == ServerError.INVALID_PROOF:
                raise AuthRefused("scram_" + (self._missing or "bad_proof"),
                                  Reason.BAD_USERNAME_OR_PASSWORD) from None
            raise _malformed(self.identity, exc) from None


def _malformed(identity: object, exc: Exception) -> AuthRefused:
    """A SCRAM message scramp could not take: logged (the refusal itself is counted as
    ``connect_refused_scram_malformed`` or ``closed_reauth_refused_scram_malformed``)."""
    log.info("mqtt: SCRAM message of %r refused as malformed: %s: %.200s", identity,
             type(exc).__name__, exc)
    return AuthRefused("scram_malformed", Reason.NOT_AUTHORIZED)


def _text(data: object) -> str:
    if not isinstance(data, bytes) or not 0 < len(data) <= MAX_AUTH_DATA_BYTES:
        raise AuthRefused("scram_malformed", Reason.NOT_AUTHORIZED)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthRefused("scram_malformed", Reason.NOT_AUTHORIZED) from None


def _auth_packet(reason: int, data: bytes) -> bytes:
    return codec.encode_auth(reason, [(codec.PROP["authentication_method"], METHOD),
                                      (codec.PROP["authentication_data"], data)])


async def connect_exchange(conn: MqttConnection, pkt: codec.Connect,
                           identities: dict) -> tuple[str, codec.Props]:
    """Run the exchange of a CONNECT that names an Authentication Method: the P&M identity
    and the CONNACK's properties (method, server-final). Raises ``AuthRefused`` (the caller
    answers CONNACK with its code), or ``Closed`` when ``mqtt.connect_timeout_ms`` (counted
    from the TCP connect) runs out first."""
    if codec.prop(pkt.props, "authentication_method") != METHOD:
        raise AuthRefused("auth_method", Reason.BAD_AUTHENTICATION_METHOD)
    if pkt.password is not None:  # it would travel in clear beside a method made to avoid that
        raise AuthRefused("auth_with_password", Reason.BAD_USERNAME_OR_PASSWORD)
    exchange = ScramExchange(identities)
    server_first = exchange.first(codec.prop(pkt.props, "authentication_data"))
    if pkt.username is not None and pkt.username != exchange.identity:
        raise AuthRefused("scram_username", Reason.BAD_USERNAME_OR_PASSWORD)
    challenge = _auth_packet(Reason.CONTINUE_AUTHENTICATION, server_first)
    if len(challenge) > conn.client_max_packet_bytes:  # it may not be sent (5.0 3.1.2.11.4)
        raise Closed("connect_refused_client_max_packet", 0, will=False)
    conn.send_now(challenge)
    left_s = max(0.0, conn.connect_deadline - conn.server.loop.time())
    reply = await conn.read_packet(left_s, "auth_timeout")
    if not isinstance(reply, codec.Auth) or reply.reason != Reason.CONTINUE_AUTHENTICATION or \
            codec.prop(reply.props, "authentication_method") != METHOD:
        raise AuthRefused("auth_protocol", Reason.PROTOCOL_ERROR)
    server_final = exchange.final(codec.prop(reply.props, "authentication_data"))
    assert exchange.identity is not None
    conn.auth_method = METHOD
    conn.count("connects_by_scram")
    return exchange.identity, [(codec.PROP["authentication_method"], METHOD),
                               (codec.PROP["authentication_data"], server_final)]


def on_auth(conn: MqttConnection, pkt: codec.Auth, identities: dict) -> None:
    """An AUTH after CONNACK: a step of re-authentication (against ``identities``, those of
    P&M's document now), else a protocol error (raises ``Closed``: the connection ends with
    DISCONNECT)."""
    if conn.auth_method is None:
        raise Closed("auth_without_method", Reason.PROTOCOL_ERROR)
    if codec.prop(pkt.props, "authentication_method") != conn.auth_method:
        raise Closed("auth_protocol", Reason.PROTOCOL_ERROR)
    data = codec.prop(pkt.props, "authentication_data")
    try:
        if pkt.reason == Reason.RE_AUTHENTICATE and conn.reauth is None:
            exchange = ScramExchange(identities)
            server_first = exchange.first(data)
            if conn.state is None or exchange.identity != conn.state.identity:
                raise AuthRefused("reauth_identity", Reason.NOT_AUTHORIZED)
            conn.reauth = exchange
            conn.send(_auth_packet(Reason.CONTINUE_AUTHENTICATION, server_first))
        elif pkt.reason == Reason.CONTINUE_AUTHENTICATION and conn.reauth is not None:
            exchange, conn.reauth = conn.reauth, None
            server_final = exchange.final(data)
            conn.count("reauths_by_scram")
            conn.send(_auth_packet(Reason.SUCCESS, server_final))
        else:
            raise Closed("auth_protocol", Reason.PROTOCOL_ERROR)
    except AuthRefused as refused:
        raise Closed("reauth_refused_" + refused.why.removeprefix("reauth_"),
                     refused.code) from None
