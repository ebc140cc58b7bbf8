"""SUBSCRIBE -> SUBACK and UNSUBSCRIBE -> UNSUBACK.

Each filter is checked (MQTT's rules and the fabric's bounds, appliance/edge/mqtt/topics.py),
then subscribed by the connection's native session, whose identity's P&M entitlements decide:
a denied filter gets 0x80 (3.1.1) or 0x87 "not authorized" (5.0), an invalid one 0x80 or
0x8F, a shared subscription (``$share/...``) 0x80 or 0x9E (not built), one beyond
``mqtt.max_subscriptions`` 0x80 or 0x97. The retained messages a new subscription matches
follow its SUBACK (5.0 retain handling 0, 1 and 2).

MQTT subscriptions are a set of filters; the fabric's subscription lists are ordered with
partial unsubscribes (seed 000). So an UNSUBSCRIBE of a filter the client holds withdraws it
natively and subscribes again every remaining filter that overlaps it (the native
withdrawal also removes what it includes); an UNSUBSCRIBE of a filter the client does not
hold changes nothing (0x11 in 5.0), never a partial unsubscribe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import SUBACK_FAILURE_V3, Reason
from appliance.edge.mqtt.state import Closed, SubOptions
from appliance.edge.mqtt.topics import SHARED_PREFIX, filter_problem

if TYPE_CHECKING:
    from appliance.edge.mqtt.session import MqttSession

NATIVE_RESUBSCRIBE_FACTOR = 4
"""After this many native subscribes per allowed filter, an unsubscribe rebuilds the native
session's list from scratch (each native subscribe keeps a subscription object)."""


def _code(session: MqttSession, v5_code: int) -> int:
    return v5_code if session.version == codec.V5 else SUBACK_FAILURE_V3


async def on_subscribe(session: MqttSession, pkt: codec.Subscribe) -> None:
    from appliance.client.errors import ClientError, EntitlementError

    if session.version == codec.V5 and codec.prop(pkt.props, "subscription_identifier"):
        raise Closed("subscription_identifier", Reason.SUBSCRIPTION_IDS_NOT_SUPPORTED)
    server = session.server
    codes: list[int] = []
    retained = []
    for topic_filter, options in pkt.filters:
        qos = options & 0x03
        if topic_filter.startswith(SHARED_PREFIX):
            session.count("subscriptions_refused_shared")
            codes.append(_code(session, Reason.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED))
            continue
        if filter_problem(topic_filter) is not None:
            session.count("subscriptions_refused_bad_filter")
            codes.append(_code(session, Reason.TOPIC_FILTER_INVALID))
            continue
        new = topic_filter not in session.filters
        if new and len(session.filters) >= session.cfg.max_subscriptions:
            session.count("subscriptions_refused_limit")
            codes.append(_code(session, Reason.QUOTA_EXCEEDED))
            continue
        if new:
            try:
                await server.blocking(native_subscribe, session, topic_filter)
            except EntitlementError:
                session.count("subscriptions_denied")
                codes.append(_code(session, Reason.NOT_AUTHORIZED))
                continue
            except ClientError as exc:
                raise Closed("native_subscribe_failed", Reason.UNSPECIFIED,
                             detail=str(exc)) from None
        opts = SubOptions(qos, bool(options & 0x04), bool(options & 0x08), (options >> 4) & 3)
        if session.version != codec.V5:
            opts = SubOptions(qos)
        session.filters[topic_filter] = opts
        session.count("subscriptions")
        codes.append(qos)
        if opts.retain_handling == 0 or (opts.retain_handling == 1 and new):
            retained.extend((m, qos) for m in server.retained.matching(topic_filter))
    session.send(codec.encode_suback(pkt.packet_id, codes, session.version))
    for message, qos in retained:
        session.deliver(message.topic, message.payload, min(qos, message.qos), True)
        session.count("retained_delivered")


def native_subscribe(session: MqttSession, topic_filter: str) -> None:
    """Subscribe natively in both classes (best-effort, then guaranteed: MQTT QoS 1/2 and
    native guaranteed publications travel as guaranteed); a refused guaranteed class (no
    guaranteed place left at the appliance) is counted and the best-effort one kept. Raises
    ``EntitlementError`` when P&M refuses the filter. Runs off the event loop."""
    from appliance.client.errors import ClientError

    native = session.native
    native.subscribe(topic_filter, callback=session.on_native)  # P&M's decision
    session.native_subscribes += 1
    try:  # allowed by now: a refusal here is the appliance's guaranteed places, not P&M
        native.subscribe(topic_filter, qos="guaranteed", callback=session.on_native)
        session.native_subscribes += 1
        session.guaranteed_filters.add(topic_filter)
    except ClientError:
        session.guaranteed_filters.discard(topic_filter)
        session.count("subscriptions_guaranteed_refused")


def _native_unsubscribe(session: MqttSession, topic_filter: str,
                        remaining: dict[str, SubOptions]) -> None:
    """Withdraw ``topic_filter`` from the native session and subscribe again what the
    withdrawal may have taken from the remaining filters (runs off the event loop)."""
    from appliance.client.errors import EntitlementError
    from datapath.topics.algebra import overlaps

    native = session.native
    rebuild = session.native_subscribes > NATIVE_RESUBSCRIBE_FACTOR * max(1, len(remaining))
    native.unsubscribe("#" if rebuild else topic_filter)
    again = list(remaining) if rebuild else [f for f in remaining if overlaps(f, topic_filter)]
    if rebuild:
        session.native_subscribes = 0
    for other in again:
        try:
            native_subscribe(session, other)
        except EntitlementError:  # P&M took it back meanwhile
            remaining.pop(other, None)


async def on_unsubscribe(session: MqttSession, pkt: codec.Unsubscribe) -> None:
    codes = []
    for topic_filter in pkt.filters:
        if topic_filter not in session.filters:
            codes.append(Reason.NO_SUBSCRIPTION_EXISTED)
            continue
        del session.filters[topic_filter]
        session.guaranteed_filters.discard(topic_filter)
        remaining = dict(session.filters)
        await session.server.blocking(_native_unsubscribe, session, topic_filter, remaining)
        for gone in set(session.filters) - set(remaining):
            del session.filters[gone]
        session.count("unsubscriptions")
        codes.append(Reason.SUCCESS)
    session.send(codec.encode_unsuback(pkt.packet_id, codes, session.version))
