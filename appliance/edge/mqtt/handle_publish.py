"""PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP: MQTT publishes (and wills) into the fabric.

An MQTT PUBLISH becomes a native publish of its identity's shared client session
(identities.py; the identity's entitlements decide; a refused topic is counted as
``publishes_denied`` and answered with reason 0x87 in 5.0, dropped silently in 3.1.1 as
mosquitto does), then the retained store is updated and the publish acknowledged: QoS 1 with
PUBACK once the native publish left for the appliance (the publishes of one wake-up of the
event loop, from every connection of the identity, leave together at its end, before the
acknowledgements are written: server.end_wakeup), QoS 2 with PUBREC (published once; a
repeat of the packet id before PUBREL is not published again) and PUBCOMP on PUBREL. QoS 0
travels as a native best-effort message, QoS 1 and 2 as guaranteed ones (the connection's
reliable stream, recovered hop by hop); the acknowledgement says the edge took the message,
not that subscribers got it (docs/mqtt.md, "QoS"). 5.0: a Topic Alias sets or names the
topic (at most ``mqtt.topic_alias_maximum``: 0x94 beyond, 0x82 for an unknown one). The
message's MQTT metadata (publish QoS, retain flag, 5.0 properties and expiry) travels as
headers of the native message (meta.py), read back by whichever edge delivers it; a message
whose metadata does not fit the header block is refused (``publishes_refused_metadata``; 5.0
QoS 1/2: PUBACK/PUBREC 0x83 Implementation specific error), never published without it.

With ``mqtt.state_dir`` (store.py) an incoming QoS 1/2 PUBLISH is first recorded in the state
store (``INBOUND``), published, and acknowledged (PUBACK, PUBREC) only once its record is
synced: the writer thread's callback sends it, in the order the PUBLISHes came
(``conn.acks``); the read loop goes on meanwhile and the event loop never waits for the disk.
At most ``mqtt.max_inflight`` acknowledgements wait per connection: beyond, the
connection's next packet is read once the oldest is sent. The record is deleted
``store.INBOUND_RETIRE_S`` after the publish; after a crash before
that the edge publishes it again at start (with its number: MQTT subscribers that had
it do not get it twice, exactly_once.py). A record that cannot be written
closes the connection without the acknowledgement (the client sends it again). The incoming
QoS 2 ids awaiting PUBREL are recorded for persistent sessions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType, Reason
from appliance.edge.mqtt.meta import MessageMeta, MetadataTooLarge, meta_of, to_headers
from appliance.edge.mqtt.state import Closed
from appliance.edge.mqtt.successor import (
    SUCCESSOR_PREFIX,
    ack_successor_publish,
    on_successor_publish,
)
from appliance.edge.mqtt.topics import topic_problem

if TYPE_CHECKING:
    from appliance.edge.mqtt.connection import MqttConnection
    from appliance.edge.mqtt.sessions import SessionState


log = logging.getLogger(__name__)

NATIVE_QOS = ("best-effort", "guaranteed")
"""The native class of an MQTT publish at QoS 0, and at QoS 1 or 2."""


async def into_fabric(state: SessionState, topic: str, payload: bytes, qos: int,
                      retain: bool, props: codec.Props, seq: int = 0) -> int:
    """Publish natively with the message's MQTT metadata as headers (meta.py) and keep a
    retained message. 0 when published, else the reason code of the refusal: 0x87 when
    entitlements refuse, 0x83 when the metadata does not fit a header block (counted
    ``publishes_refused_metadata``). ``seq``: its record in the state store."""
    from appliance.client.errors import ClientError, EntitlementError, NoAnswerError
    from appliance.edge.mqtt.identities import NATIVE_WAIT_S

    server = state.server
    native_qos = NATIVE_QOS[min(qos, 1)]
    meta = meta_of(props, retain)
    if seq:
        meta = MessageMeta([], None, retain, seq) if meta is None else replace(meta, origin=seq)
    try:
        headers = to_headers(meta, qos, state.number if state.no_local_for(topic) else 0)
    except MetadataTooLarge as exc:
        state.count("publishes_refused_metadata")
        log.info("mqtt: a publish to %r refused: its metadata does not fit the native "
                 "headers (%s)", topic, exc)
        return Reason.IMPLEMENTATION_SPECIFIC
    ident = state.ident
    if ident is None or ident.native is None:
        raise Closed("native_session_gone", Reason.UNSPECIFIED)
    try:
        if topic not in ident.registered:  # the first publish of a topic registers it:
            # together with the others of this wake-up, retried while unanswered (this
            # connection's reading waits meanwhile: identities.py)
            await ident.register(topic)
        native = ident.native
        if native is None:
            raise Closed("native_session_gone", Reason.UNSPECIFIED)
        # its key is known: publishing does not wait, and what a wake-up of the loop
        # publishes is sent at its end in one go (server.py)
        native.publish(topic, payload, qos=native_qos, headers=headers)
        server.defer_publish(native, state.conn)
    except EntitlementError:
        state.count("publishes_denied")
        return Reason.NOT_AUTHORIZED
    except NoAnswerError as exc:  # asked again for identities.NATIVE_WAIT_S, in vain
        log.warning("mqtt %s: the appliance did not register topic %r for identity %r "
                    "within %g s (%s); connection closed", _peer(state), topic,
                    ident.identity, NATIVE_WAIT_S, exc)
        raise Closed("native_register_timeout", Reason.UNSPECIFIED, detail=str(exc)) from None
    except ClientError as exc:
        log.warning("mqtt %s: a publish to %r failed natively (%s: %s); connection closed",
                    _peer(state), topic, type(exc).__name__, exc)
        raise Closed("native_publish_failed", Reason.UNSPECIFIED, detail=str(exc)) from None
    state.count("publishes_in")
    if retain:
        if server.keep_retained(topic, payload, qos, meta, seq, headers):
            state.count("retained_set" if payload else "retained_cleared")
        else:
            state.count("retained_refused_full")
    return 0


def _peer(state: SessionState) -> object:
    return state.conn.peer if state.conn is not None else "-"


def _topic(conn: MqttConnection, pkt: codec.Publish) -> str:
    """The PUBLISH's topic, through its 5.0 Topic Alias (set or used)."""
    alias = codec.prop(pkt.props, "topic_alias") if conn.version == codec.V5 else None
    if alias is None:
        return pkt.topic
    if not 0 < alias <= conn.cfg.topic_alias_maximum:  # type: ignore[operator]
        raise Closed("topic_alias_invalid", Reason.TOPIC_ALIAS_INVALID, detail=f"alias {alias}")
    if pkt.topic:
        if topic_problem(pkt.topic) is None:
            conn.aliases_in[alias] = pkt.topic  # type: ignore[index]
        return pkt.topic
    topic = conn.aliases_in.get(alias)  # type: ignore[call-overload]
    if topic is None:
        raise Closed("topic_alias_unknown", Reason.PROTOCOL_ERROR, detail=f"alias {alias}")
    return topic


async def on_publish(conn: MqttConnection, pkt: codec.Publish) -> None:
    from datapath.protocol.message_layout import MAX_PAYLOAD_BYTES

    version = conn.version
    state = conn.state
    assert state is not None
    topic = _topic(conn, pkt)
    ident = state.ident
    if ident is None or topic not in ident.registered:  # (a registered topic was checked)
        problem = topic_problem(topic)
        if problem is not None:
            raise Closed("bad_topic", Reason.TOPIC_NAME_INVALID, detail=problem)
    if len(pkt.payload) > MAX_PAYLOAD_BYTES:
        raise Closed("payload_too_large", Reason.PACKET_TOO_LARGE,
                     detail=f"{len(pkt.payload)} bytes; the fabric carries {MAX_PAYLOAD_BYTES}")
    if codec.prop(pkt.props, "subscription_identifier") is not None:
        raise Closed("publish_subscription_identifier", Reason.PROTOCOL_ERROR)
    if pkt.qos == 2:
        if pkt.packet_id in state.awaiting_rel:  # a repeat: already published
            _send_ack(conn, codec.encode_ack(PacketType.PUBREC, pkt.packet_id, version))
            return
        if len(state.awaiting_rel) >= conn.cfg.max_inflight:
            raise Closed("receive_maximum_exceeded", Reason.RECEIVE_MAXIMUM_EXCEEDED)
    if topic.startswith(SUCCESSOR_PREFIX):  # the edge's own exchange (successor.py)
        ack_successor_publish(conn, pkt, on_successor_publish(conn, topic, pkt))
        return
    props = [(i, v) for i, v in pkt.props if i != codec.PROP["topic_alias"]]
    store = conn.server.store
    if store is None or pkt.qos == 0:
        reason = await into_fabric(state, topic, pkt.payload, pkt.qos, pkt.retain, props)
        allowed = reason == 0
        if pkt.qos == 1:
            conn.send(codec.encode_ack(PacketType.PUBACK, pkt.packet_id, version, reason))
        elif pkt.qos == 2:
            if allowed:
                state.awaiting_rel.add(pkt.packet_id)
            conn.send(codec.encode_ack(PacketType.PUBREC, pkt.packet_id, version, reason))
        return
    # with a state store: recorded first, acknowledged once the record is synced; at most
    # mqtt.max_inflight acknowledgements wait per connection (then its reading waits)
    while len(conn.acks) >= conn.cfg.max_inflight:
        await asyncio.wait(conn.acks[0][0])
        send_acks(conn)
        if conn.closing:
            raise Closed("store_write_failed", Reason.UNSPECIFIED, will=False)
    loop = conn.server.loop
    first = loop.create_future()
    entry: list = [[first], None]  # [the records' sync futures, the acknowledgement]
    conn.acks.append(entry)
    seq = store.inbound(pkt.qos, pkt.retain, state.identity, topic, pkt.payload,
                        _resolve(conn, first), meta_of(props, pkt.retain))
    try:
        reason = await into_fabric(state, topic, pkt.payload, pkt.qos, pkt.retain, props,
                                   seq)
    finally:
        store.retire(seq)
    allowed = reason == 0
    kind = PacketType.PUBACK if pkt.qos == 1 else PacketType.PUBREC
    if pkt.qos == 2 and allowed:
        state.awaiting_rel.add(pkt.packet_id)
        if state.stored:  # the PUBREC waits for this record too
            rel = loop.create_future()
            entry[0].append(rel)
            store.rel(state, pkt.packet_id, True, _resolve(conn, rel))
    entry[1] = codec.encode_ack(kind, pkt.packet_id, version, reason)
    send_acks(conn)


def _resolve(conn: MqttConnection, fut: asyncio.Future) -> Callable[[bool], None]:
    """The sync callback (on the loop) that resolves ``fut`` and sends what is ready."""
    def synced(ok: bool) -> None:
        if not fut.done():
            fut.set_result(ok)
        send_acks(conn)
    return synced


def send_acks(conn: MqttConnection) -> None:
    """Send the acknowledgements whose records are synced, in the order of their PUBLISHes;
    a record that could not be written closes the connection (not acknowledged)."""
    while conn.acks:
        futs, ack = conn.acks[0]
        if ack is None or not all(f.done() for f in futs):
            return
        conn.acks.popleft()
        if not all(f.result() for f in futs):
            conn.count("store_acks_refused")
            conn.acks.clear()
            conn.server.spawn(conn.close("store_write_failed", Reason.UNSPECIFIED))
            return
        conn.send(ack)


def _send_ack(conn: MqttConnection, data: bytes) -> None:
    """An acknowledgement behind those waiting for their records (with a state store)."""
    if conn.server.store is None:
        conn.send(data)
        return
    done = conn.server.loop.create_future()
    done.set_result(True)
    conn.acks.append([[done], data])
    send_acks(conn)


def on_ack(conn: MqttConnection, pkt: codec.Ack) -> None:
    """The acknowledgements of both directions' QoS 1/2 flows."""
    version = conn.version
    state = conn.state
    assert state is not None
    if pkt.type == PacketType.PUBREL:
        known = pkt.packet_id in state.awaiting_rel
        state.awaiting_rel.discard(pkt.packet_id)
        if known and state.stored:
            conn.server.store.rel(state, pkt.packet_id, False)
        conn.send(codec.encode_ack(PacketType.PUBCOMP, pkt.packet_id, version,
                                   0 if known else Reason.PACKET_ID_NOT_FOUND))
        return
    d = state.inflight.get(pkt.packet_id)
    want = {PacketType.PUBACK: "puback", PacketType.PUBREC: "pubrec",
            PacketType.PUBCOMP: "pubcomp"}[pkt.type]
    if d is not None and d.awaiting != want:
        if pkt.type == PacketType.PUBREC and d.awaiting == "pubcomp":  # PUBREC again
            conn.send(codec.encode_ack(PacketType.PUBREL, pkt.packet_id, version))
            return
        # e.g. PUBREC for a QoS 1 delivery, PUBACK for a QoS 2 one (mosquitto closes too)
        raise Closed("ack_wrong_kind", Reason.PROTOCOL_ERROR,
                     detail=f"{pkt.type.name} for a delivery awaiting {d.awaiting}")
    if d is None:
        conn.count("acks_unexpected")
        if pkt.type == PacketType.PUBREC and pkt.reason < 0x80:  # a failure ends the flow
            conn.send(codec.encode_ack(PacketType.PUBREL, pkt.packet_id, version,
                                       Reason.PACKET_ID_NOT_FOUND))
        return
    if pkt.type == PacketType.PUBREC and pkt.reason < 0x80:
        d.awaiting = "pubcomp"
        if state.stored:
            conn.server.store.sent(state, pkt.packet_id, d)
        conn.send(codec.encode_ack(PacketType.PUBREL, pkt.packet_id, version))
    else:
        state.release(pkt.packet_id)
