"""CONNECT -> CONNACK: protocol name and level, client identifier, will, credentials, the
native login, session takeover.

Refusals (each counted as ``connect_refused_<why>``): a protocol name other than ``MQTT``
(closed without CONNACK), a level other than 4 (3.1.1) or 5 (5.0) (CONNACK "unacceptable
protocol version"), a client identifier the edge does not take (empty with a persistent
3.1.1 session, longer than ``MAX_CLIENT_ID_BYTES``), an invalid will topic, a username that
is no P&M identity with a password, a wrong password (scrypt, appliance/control/credentials.py),
no username while ``mqtt.allow_anonymous`` is false, enhanced authentication (5.0 AUTH).
An accepted CONNECT logs in a native session as the username's identity; a client already
connected with the same identifier is disconnected first (no will: a takeover).
Sessions are clean: a persistent session is accepted as a clean one (session present 0).
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import ConnackV3, Reason
from appliance.edge.mqtt.state import Closed
from appliance.edge.mqtt.topics import topic_problem

if TYPE_CHECKING:
    from appliance.edge.mqtt.session import MqttSession

MAX_CLIENT_ID_BYTES = 256
"""Longest client identifier the edge takes (MQTT allows 65,535 bytes)."""
ANONYMOUS_IDENTITY = "anonymous"

_V3_CODE = {Reason.UNSUPPORTED_PROTOCOL_VERSION: ConnackV3.UNACCEPTABLE_PROTOCOL_VERSION,
            Reason.CLIENT_ID_NOT_VALID: ConnackV3.IDENTIFIER_REJECTED,
            Reason.BAD_USERNAME_OR_PASSWORD: ConnackV3.BAD_USERNAME_OR_PASSWORD,
            Reason.NOT_AUTHORIZED: ConnackV3.NOT_AUTHORIZED,
            Reason.SERVER_UNAVAILABLE: ConnackV3.SERVER_UNAVAILABLE}


def _refuse(session: MqttSession, version: int, why: str, code: Reason) -> bool:
    session.count("connect_refused_" + why)
    if version == codec.V5:
        session.send_now(codec.encode_connack(codec.V5, code))
    else:
        session.send_now(codec.encode_connack(codec.V311, _V3_CODE.get(
            code, ConnackV3.SERVER_UNAVAILABLE)))
    return False


async def on_connect(session: MqttSession, pkt: codec.Connect) -> bool:
    """Answer CONNECT; True when the connection is accepted (``session.native`` logged in)."""
    server = session.server
    if pkt.protocol_name != codec.PROTOCOL_NAME:
        raise Closed("connect_refused_protocol_name", 0, will=False)
    if pkt.version not in (codec.V311, codec.V5):
        return _refuse(session, codec.V5 if pkt.version == codec.V5 else codec.V311,
                       "protocol_level", Reason.UNSUPPORTED_PROTOCOL_VERSION)
    version = pkt.version
    session.version = version
    client_id = pkt.client_id
    assigned = False
    if not client_id:
        if version == codec.V311 and not pkt.clean_start:
            return _refuse(session, version, "client_id", Reason.CLIENT_ID_NOT_VALID)
        client_id = "tw-" + secrets.token_hex(8)
        assigned = True
    if len(client_id.encode()) > MAX_CLIENT_ID_BYTES:
        return _refuse(session, version, "client_id", Reason.CLIENT_ID_NOT_VALID)
    if pkt.will is not None and topic_problem(pkt.will.topic) is not None:
        return _refuse(session, version, "will_topic",
                       Reason.UNSPECIFIED if version == codec.V311 else Reason.TOPIC_NAME_INVALID)
    if version == codec.V5:
        if codec.prop(pkt.props, "authentication_method") is not None:
            return _refuse(session, version, "auth_method", Reason.BAD_AUTHENTICATION_METHOD)
        receive_max = codec.prop(pkt.props, "receive_maximum", 65_535)
        max_packet = codec.prop(pkt.props, "maximum_packet_size", session.client_max_packet_bytes)
        if receive_max == 0 or max_packet == 0:
            raise Closed("connect_protocol_error", Reason.PROTOCOL_ERROR, will=False)
        session.client_receive_maximum = int(receive_max)  # type: ignore[arg-type]
        session.client_max_packet_bytes = int(max_packet)  # type: ignore[arg-type]

    # credentials: the username is a P&M identity with a password (appliance/control/credentials)
    if pkt.username is None:
        if not session.cfg.allow_anonymous:
            return _refuse(session, version, "anonymous", Reason.NOT_AUTHORIZED)
        identity = ANONYMOUS_IDENTITY
    else:
        identity = pkt.username
        from appliance.control.credentials import verify_password

        stored = server.password_of(identity)
        # an unknown user costs the same scrypt as a known one (no user enumeration by time)
        ok = await server.blocking(verify_password, stored or server.decoy_hash,
                                   pkt.password or b"")
        ok = ok and stored is not None and pkt.password is not None
        if not ok:
            return _refuse(session, version, "bad_credentials", Reason.BAD_USERNAME_OR_PASSWORD)

    # a client already connected with this identifier goes first (a takeover: no will)
    old = server.sessions.get(client_id)
    if old is not None:
        server.count("sessions_taken_over")
        await old.close("taken_over", Reason.SESSION_TAKEN_OVER)
    if session.closing:
        return False

    from appliance.client.errors import ClientError, LoginError

    try:
        # the native login proves the password again (an identity with one: challenge-response)
        session.native = await server.blocking(
            server.native_login, identity,
            None if identity == ANONYMOUS_IDENTITY else pkt.password)
    except LoginError:
        return _refuse(session, version, "not_authorized", Reason.NOT_AUTHORIZED)
    except ClientError:
        return _refuse(session, version, "native_login", Reason.SERVER_UNAVAILABLE)
    session.connect = pkt
    session.client_id = client_id
    session.identity = identity
    server.sessions[client_id] = session
    props: codec.Props = []
    if version == codec.V5:
        props = [(codec.PROP["maximum_packet_size"], session.cfg.max_packet_bytes),
                 (codec.PROP["receive_maximum"], min(session.cfg.max_inflight, 65_535)),
                 (codec.PROP["retain_available"], 1),
                 (codec.PROP["wildcard_subscription_available"], 1),
                 (codec.PROP["subscription_identifier_available"], 0),
                 (codec.PROP["shared_subscription_available"], 0)]
        if assigned:
            props.append((codec.PROP["assigned_client_identifier"], client_id))
    session.count("connects_accepted")
    session.send(codec.encode_connack(version, 0, False, props))
    return True
