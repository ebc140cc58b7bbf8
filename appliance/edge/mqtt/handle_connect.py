"""CONNECT -> CONNACK: protocol name and level, client identifier, will, credentials (a
password, or a TLS client certificate's CN), the session (new, or a persistent one taken up
again), takeover.

Refusals (each counted as ``connect_refused_<why>``): a protocol name other than ``MQTT``
(closed without CONNACK), a level other than 4 (3.1.1) or 5 (5.0) (CONNACK "unacceptable
protocol version"), a client identifier the edge does not take (empty with a persistent
3.1.1 conn, longer than ``MAX_CLIENT_ID_BYTES``), an invalid will topic, a username that
is no P&M identity with a password, a wrong password (checked against the identity's verifier
in this appliance's copy of P&M's document: appliance/control/credentials.py),
no username while ``mqtt.allow_anonymous`` is false, a username other than the CN of the
client certificate (``mqtt.tls_identity_from_cert``). A 5.0 CONNECT with an Authentication
Method runs the SCRAM-SHA-256 exchange first (handle_auth.py: other methods 0x8C).
A client already connected with the same identifier is disconnected first (no will: a
takeover). Then the conn: a persistent one of that identifier and identity is taken up
again with clean start 0 (session present 1); otherwise a new session joins its identity's
shared native client session (identities.py; the first of the identity logs it in). 5.0
limits agreed here: Session Expiry Interval (at most
``mqtt.max_session_expiry_s``; 3.1.1 persistent sessions get that), Server Keep Alive
(``mqtt.server_keep_alive_s``), Topic Alias Maximum both ways, Receive Maximum, Maximum
Packet Size.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from appliance.edge.mqtt import codec, handle_auth
from appliance.edge.mqtt.codec import ConnackV3, Reason
from appliance.edge.mqtt.sessions import SessionState
from appliance.edge.mqtt.state import Closed
from appliance.edge.mqtt.topics import topic_problem

if TYPE_CHECKING:
    from appliance.edge.mqtt.connection import MqttConnection
    from appliance.edge.mqtt.server import MqttServer

MAX_CLIENT_ID_BYTES = 256
"""Longest client identifier the edge takes (MQTT allows 65,535 bytes)."""
ANONYMOUS_IDENTITY = "anonymous"

_V3_CODE = {Reason.UNSUPPORTED_PROTOCOL_VERSION: ConnackV3.UNACCEPTABLE_PROTOCOL_VERSION,
            Reason.CLIENT_ID_NOT_VALID: ConnackV3.IDENTIFIER_REJECTED,
            Reason.BAD_USERNAME_OR_PASSWORD: ConnackV3.BAD_USERNAME_OR_PASSWORD,
            Reason.NOT_AUTHORIZED: ConnackV3.NOT_AUTHORIZED,
            Reason.SERVER_UNAVAILABLE: ConnackV3.SERVER_UNAVAILABLE}


def _refuse(conn: MqttConnection, version: int, why: str, code: Reason) -> bool:
    conn.count("connect_refused_" + why)
    if version == codec.V5:
        conn.send_now(codec.encode_connack(codec.V5, code))
    else:
        conn.send_now(codec.encode_connack(codec.V311, _V3_CODE.get(
            code, ConnackV3.SERVER_UNAVAILABLE)))
    return False


async def on_connect(conn: MqttConnection, pkt: codec.Connect) -> bool:
    """Answer CONNECT; True when the connection is accepted (bound to its session)."""
    server = conn.server
    if pkt.protocol_name != codec.PROTOCOL_NAME:
        raise Closed("connect_refused_protocol_name", 0, will=False)
    if pkt.version not in (codec.V311, codec.V5):
        return _refuse(conn, codec.V5 if pkt.version == codec.V5 else codec.V311,
                       "protocol_level", Reason.UNSUPPORTED_PROTOCOL_VERSION)
    version = pkt.version
    conn.version = version
    client_id = pkt.client_id
    assigned = False
    if not client_id:
        if version == codec.V311 and not pkt.clean_start:
            return _refuse(conn, version, "client_id", Reason.CLIENT_ID_NOT_VALID)
        client_id = "tw-" + secrets.token_hex(8)
        assigned = True
    if len(client_id.encode()) > MAX_CLIENT_ID_BYTES:
        return _refuse(conn, version, "client_id", Reason.CLIENT_ID_NOT_VALID)
    if pkt.will is not None and topic_problem(pkt.will.topic) is not None:
        return _refuse(conn, version, "will_topic",
                       Reason.UNSPECIFIED if version == codec.V311 else Reason.TOPIC_NAME_INVALID)
    if version == codec.V5:
        receive_max = codec.prop(pkt.props, "receive_maximum", 65_535)
        max_packet = codec.prop(pkt.props, "maximum_packet_size", conn.client_max_packet_bytes)
        if receive_max == 0 or max_packet == 0:
            raise Closed("connect_protocol_error", Reason.PROTOCOL_ERROR, will=False)
        conn.client_receive_maximum = int(receive_max)  # type: ignore[arg-type]
        conn.client_max_packet_bytes = int(max_packet)  # type: ignore[arg-type]
        alias_max = codec.prop(pkt.props, "topic_alias_maximum", 0)
        # the edge sets at most as many aliases as it takes (the client's maximum is its own)
        conn.client_alias_max = min(int(alias_max),  # type: ignore[call-overload]
                                    conn.cfg.topic_alias_maximum)

    props, expiry_s = _agree(conn, pkt, assigned and client_id)
    identity = await _identity(conn, pkt, props)
    if identity is None:
        return False
    if version == codec.V5 and len(codec.encode_connack(version, 0, False, props)) > \
            conn.client_max_packet_bytes:
        # the CONNACK may not be sent (5.0 3.1.2.11.4) and the client may not be left waiting
        raise Closed("connect_refused_client_max_packet", 0, will=False)

    # a client already connected with this identifier goes first (a takeover: no will)
    state = server.sessions.get(client_id)
    if state is not None and state.conn is not None:
        server.count("sessions_taken_over")
        server.successors.taking_over(client_id)  # its records stay (successor.py)
        await state.conn.close("taken_over", Reason.SESSION_TAKEN_OVER)
    if conn.closing:
        return False
    state = server.sessions.get(client_id)
    if state is not None and (pkt.clean_start or state.identity != identity):
        await state.end("clean_start" if pkt.clean_start else "other_identity")
        state = None
    present = state is not None
    if state is None:
        from appliance.client.errors import ClientError, LoginError

        state = SessionState(server, client_id, identity)
        try:
            await state.join()
        except LoginError:
            return _refuse(conn, version, "not_authorized", Reason.NOT_AUTHORIZED)
        except ClientError:
            return _refuse(conn, version, "native_login", Reason.SERVER_UNAVAILABLE)
        if conn.closing or server.sessions.get(client_id) is not None:  # raced
            await state.end("raced")
            raise Closed("connect_raced", Reason.SESSION_TAKEN_OVER, will=False)
        server.sessions[client_id] = state
        server.count("sessions_created")
    else:
        server.count("sessions_resumed")
    conn.connect = pkt
    conn.state = state
    state.expiry_s = expiry_s
    conn.count("connects_accepted")
    state.attach(conn, codec.encode_connack(version, 0, present, props))
    if server.store is not None:  # recorded (persistent), or forgotten (expiry 0 now)
        server.store.save_session(state)
    return True


async def _identity(conn: MqttConnection, pkt: codec.Connect,
                    props: codec.Props) -> str | None:
    """The P&M identity of the CONNECT (None: refused, answered); an enhanced
    authentication's CONNACK properties are added to ``props``."""
    server, version = conn.server, pkt.version
    if version == codec.V5 and codec.prop(pkt.props, "authentication_method") is not None:
        try:
            identity, auth_props = await handle_auth.connect_exchange(conn, pkt,
                                                                      pm_identities(server))
        except handle_auth.AuthRefused as refused:
            _refuse(conn, version, refused.why, refused.code)
            return None
        if conn.cert_identity is not None and conn.cfg.tls_identity_from_cert and \
                identity != conn.cert_identity:
            _refuse(conn, version, "cert_username", Reason.BAD_USERNAME_OR_PASSWORD)
            return None
        props.extend(auth_props)
        return identity
    if conn.cert_identity is not None and conn.cfg.tls_identity_from_cert:
        if pkt.username is not None and pkt.username != conn.cert_identity:
            _refuse(conn, version, "cert_username", Reason.BAD_USERNAME_OR_PASSWORD)
            return None
        if conn.cert_identity not in pm_identities(server):
            _refuse(conn, version, "cert_identity", Reason.NOT_AUTHORIZED)
            return None
        conn.count("connects_by_certificate")
        return conn.cert_identity
    # credentials: the username is a P&M identity with a password (appliance/control/credentials)
    if pkt.username is None:
        if not conn.cfg.allow_anonymous:
            _refuse(conn, version, "anonymous", Reason.NOT_AUTHORIZED)
            return None
        return ANONYMOUS_IDENTITY
    from appliance.control.credentials import verifier_of, verify_with_verifier

    spec = pm_identities(server).get(pkt.username)
    stored = spec.get("verifier") if isinstance(spec, dict) else None
    # an unknown user costs the same scrypt as a known one (no user enumeration by time)
    ok = await server.blocking(verify_with_verifier,
                               stored or verifier_of(server.decoy_hash), pkt.password or b"")
    if not (ok and stored is not None and pkt.password is not None):
        _refuse(conn, version, "bad_credentials", Reason.BAD_USERNAME_OR_PASSWORD)
        return None
    return pkt.username


def pm_identities(server: MqttServer) -> dict:
    """The identities of this appliance's copy of P&M's document (its own when it is the
    P&M, the newest flooded one when P&M is remote; none before one arrived, so every
    CONNECT with a username is refused until then): each with its login ``verifier`` when it
    has a password (appliance/control/pm.py)."""
    control = server.appliance.control
    doc = None if control is None else control.pm_doc
    return (doc or {}).get("identities", {})


def _agree(conn: MqttConnection, pkt: codec.Connect,
           assigned: str | bool) -> tuple[codec.Props, int]:
    """The keep-alive, the CONNACK's 5.0 properties and the session's expiry. Retain,
    wildcard subscriptions, subscription identifiers and shared subscriptions are available:
    the CONNACK leaves those four properties out, as absent means available (5.0 3.2.2.3)."""
    cfg = conn.cfg
    conn.keep_alive_s = pkt.keep_alive_s
    if pkt.version != codec.V5:
        return [], 0 if pkt.clean_start else cfg.max_session_expiry_s
    asked = int(codec.prop(pkt.props, "session_expiry_interval", 0))  # type: ignore[arg-type]
    expiry_s = min(asked, cfg.max_session_expiry_s)
    props: codec.Props = [
        (codec.PROP["maximum_packet_size"], cfg.max_packet_bytes),
        (codec.PROP["receive_maximum"], min(cfg.max_inflight, 65_535)),
        (codec.PROP["topic_alias_maximum"], cfg.topic_alias_maximum)]
    if expiry_s != asked:
        props.append((codec.PROP["session_expiry_interval"], expiry_s))
    server_keep_alive = cfg.server_keep_alive_s
    if server_keep_alive and (pkt.keep_alive_s == 0 or pkt.keep_alive_s > server_keep_alive):
        conn.keep_alive_s = server_keep_alive
        props.append((codec.PROP["server_keep_alive"], server_keep_alive))
    if assigned:
        props.append((codec.PROP["assigned_client_identifier"], assigned))
    if cfg.response_information and codec.prop(pkt.props, "request_response_information", 0):
        info = cfg.response_information.replace("{client_id}", pkt.client_id or str(assigned))
        if "+" not in info and "#" not in info:  # (a client id with wildcards: none)
            props.append((codec.PROP["response_information"], info))
    return props, expiry_s
