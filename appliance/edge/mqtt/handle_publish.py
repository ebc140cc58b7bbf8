"""PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP and the will: MQTT publishes into the fabric.

An MQTT PUBLISH becomes a native publish of the connection's own client session (the
identity's entitlements decide; a refused topic is counted as ``publishes_denied`` and
answered with reason 0x87 in 5.0, dropped silently in 3.1.1 as mosquitto does), then the
retained store is updated and the publish acknowledged: QoS 1 with PUBACK once the native
publish left for the appliance, QoS 2 with PUBREC (published once; a repeat of the packet id
before PUBREL is not published again) and PUBCOMP on PUBREL. QoS 0 travels as a native
best-effort message, QoS 1 and 2 as guaranteed ones (the connection's reliable stream,
recovered hop by hop); the acknowledgement says the edge took the message, not that
subscribers got it (docs/edge.md, "QoS").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType, Reason
from appliance.edge.mqtt.state import Closed
from appliance.edge.mqtt.topics import topic_problem

if TYPE_CHECKING:
    from appliance.edge.mqtt.session import MqttSession


NATIVE_QOS = ("best-effort", "guaranteed")
"""The native class of an MQTT publish at QoS 0, and at QoS 1 or 2."""
REGISTERED_TOPICS = 16_384
"""Topics per connection remembered as registered with the appliance: their publishes run on
the event loop (no round trip: the native client has their key); others on a worker thread."""


async def _into_fabric(session: MqttSession, topic: str, payload: bytes, qos: int,
                       retain: bool) -> bool:
    """Publish natively and keep a retained message; False when entitlements refuse."""
    from appliance.client.errors import ClientError, EntitlementError

    server = session.server
    native_qos = NATIVE_QOS[min(qos, 1)]
    try:
        if topic in session.registered:  # its key is known: publishing does not wait
            session.native.publish(topic, payload, flush=True, qos=native_qos)
        else:  # the first publish of a topic registers it: a round trip to the appliance
            await server.blocking(session.native.publish, topic, payload, flush=True,
                                  qos=native_qos)
            if len(session.registered) < REGISTERED_TOPICS:
                session.registered.add(topic)
    except EntitlementError:
        session.count("publishes_denied")
        return False
    except ClientError as exc:
        raise Closed("native_publish_failed", Reason.UNSPECIFIED, detail=str(exc)) from None
    session.count("publishes_in")
    if retain:
        if server.retained.set(topic, payload, qos):
            session.count("retained_set" if payload else "retained_cleared")
        else:
            session.count("retained_refused_full")
    return True


async def on_publish(session: MqttSession, pkt: codec.Publish) -> None:
    from datapath.protocol.message_layout import MAX_PAYLOAD_BYTES

    version = session.version
    if version == codec.V5 and codec.prop(pkt.props, "topic_alias") is not None:
        raise Closed("topic_alias", Reason.TOPIC_ALIAS_INVALID)  # we announce a maximum of 0
    problem = topic_problem(pkt.topic)
    if problem is not None:
        raise Closed("bad_topic", Reason.TOPIC_NAME_INVALID, detail=problem)
    if len(pkt.payload) > MAX_PAYLOAD_BYTES:
        raise Closed("payload_too_large", Reason.PACKET_TOO_LARGE,
                     detail=f"{len(pkt.payload)} bytes; the fabric carries {MAX_PAYLOAD_BYTES}")
    if pkt.qos == 2:
        if pkt.packet_id in session.awaiting_rel:  # a repeat: already published
            session.send(codec.encode_ack(PacketType.PUBREC, pkt.packet_id, version))
            return
        if len(session.awaiting_rel) >= session.cfg.max_inflight:
            raise Closed("receive_maximum_exceeded", Reason.RECEIVE_MAXIMUM_EXCEEDED)
    allowed = await _into_fabric(session, pkt.topic, pkt.payload, pkt.qos, pkt.retain)
    reason = 0 if allowed else Reason.NOT_AUTHORIZED
    if pkt.qos == 1:
        session.send(codec.encode_ack(PacketType.PUBACK, pkt.packet_id, version, reason))
    elif pkt.qos == 2:
        if allowed:
            session.awaiting_rel.add(pkt.packet_id)
        session.send(codec.encode_ack(PacketType.PUBREC, pkt.packet_id, version, reason))


def on_ack(session: MqttSession, pkt: codec.Ack) -> None:
    """The acknowledgements of both directions' QoS 1/2 flows."""
    version = session.version
    if pkt.type == PacketType.PUBREL:
        known = pkt.packet_id in session.awaiting_rel
        session.awaiting_rel.discard(pkt.packet_id)
        session.send(codec.encode_ack(PacketType.PUBCOMP, pkt.packet_id, version,
                                      0 if known else Reason.PACKET_ID_NOT_FOUND))
        return
    state = session.inflight.get(pkt.packet_id)
    want = {PacketType.PUBACK: "puback", PacketType.PUBREC: "pubrec",
            PacketType.PUBCOMP: "pubcomp"}[pkt.type]
    if state is None or state[1] != want:
        session.count("acks_unexpected")
        if pkt.type == PacketType.PUBREC:
            session.send(codec.encode_ack(PacketType.PUBREL, pkt.packet_id, version,
                                          Reason.PACKET_ID_NOT_FOUND))
        return
    if pkt.type == PacketType.PUBREC and pkt.reason < 0x80:
        session.inflight[pkt.packet_id] = (2, "pubcomp")
        session.send(codec.encode_ack(PacketType.PUBREL, pkt.packet_id, version))
    else:
        session.release(pkt.packet_id)


async def publish_will(session: MqttSession, will: codec.Will) -> None:
    """The will of a connection that ended without a clean DISCONNECT."""
    try:
        if await _into_fabric(session, will.topic, will.payload, will.qos, will.retain):
            session.count("wills_published")
    except Closed:
        session.count("wills_failed")
