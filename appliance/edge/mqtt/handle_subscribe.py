"""SUBSCRIBE -> SUBACK and UNSUBSCRIBE -> UNSUBACK.

Each filter is checked (MQTT's rules and the fabric's bounds, appliance/edge/mqtt/topics.py),
then held by the identity's shared native session (identities.py: subscribed natively unless
another session of the identity holds it already), whose P&M entitlements decide:
a denied filter gets 0x80 (3.1.1) or 0x87 "not authorized" (5.0), an invalid one 0x80 or
0x8F, one beyond ``mqtt.max_subscriptions`` 0x80 or 0x97. ``$share/GROUP/FILTER`` joins a
shared subscription (shared.py). The retained messages a new subscription matches follow its
SUBACK (5.0 retain handling 0, 1 and 2; none for a shared one). A 5.0 Subscription
Identifier is kept with each filter of the SUBSCRIBE and sent with the messages they match.

MQTT subscriptions are a set of filters; the fabric's subscription lists are ordered with
partial unsubscribes (seed 000). So an UNSUBSCRIBE of a filter the client holds releases it;
once no session of the identity holds its pattern, the identity withdraws it natively and
subscribes again every remaining pattern that overlaps it (the native withdrawal also
removes what it includes; identities.py); an UNSUBSCRIBE of a filter the client does not
hold changes nothing (0x11 in 5.0), unless the client opted in to partial unsubscribes
(``mqtt.partial_unsubscribe``, or the 5.0 user property ``tw-partial-unsubscribe``): then it
carves that filter out of the ones it overlaps (``SessionState.carve_outs``; of a filter and
a carve-out matching a topic the newer decides, so a later SUBSCRIBE takes topics back).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import SUBACK_FAILURE_V3, Reason
from appliance.edge.mqtt.shared import split_shared
from appliance.edge.mqtt.state import Closed, Delivery, SubOptions
from appliance.edge.mqtt.successor import SUCCESSOR_PREFIX
from appliance.edge.mqtt.topics import SHARED_PREFIX, filter_problem

if TYPE_CHECKING:
    from appliance.edge.mqtt.connection import MqttConnection
    from appliance.edge.mqtt.sessions import SessionState

log = logging.getLogger("topicwire.edge.mqtt")

PARTIAL_PROPERTY = "tw-partial-unsubscribe"
"""The 5.0 user property that makes one UNSUBSCRIBE a partial one (value true, 1 or yes)."""
_USER_PROPERTY = codec.PROP["user_property"]


def _code(conn: MqttConnection, v5_code: int) -> int:
    return v5_code if conn.version == codec.V5 else SUBACK_FAILURE_V3


def _options(conn: MqttConnection, topic_filter: str, options: int,
             sub_id: int) -> SubOptions | int:
    """The subscription's options, or the SUBACK failure code of an invalid filter."""
    qos = options & 0x03
    match, group = topic_filter, None
    if topic_filter.startswith(SHARED_PREFIX):
        parts = split_shared(topic_filter)
        if parts is None:
            conn.count("subscriptions_refused_bad_filter")
            return _code(conn, Reason.TOPIC_FILTER_INVALID)
        group, match = parts
        if conn.version == codec.V5 and options & 0x04:  # no local on a shared subscription
            raise Closed("shared_no_local", Reason.PROTOCOL_ERROR)
    if filter_problem(match) is not None:
        conn.count("subscriptions_refused_bad_filter")
        return _code(conn, Reason.TOPIC_FILTER_INVALID)
    if match.startswith(SUCCESSOR_PREFIX):  # the edge's own exchange (successor.py)
        conn.count("subscriptions_refused_reserved")
        return _code(conn, Reason.NOT_AUTHORIZED)
    if conn.version != codec.V5:
        return SubOptions(qos, match=match, group=None if group is None else f"{group}/{match}")
    return SubOptions(qos, bool(options & 0x04), bool(options & 0x08), (options >> 4) & 3,
                      sub_id, match, None if group is None else f"{group}/{match}")


async def on_subscribe(conn: MqttConnection, pkt: codec.Subscribe) -> None:
    from appliance.client.errors import BusyError, ClientError, EntitlementError, NoAnswerError
    from appliance.edge.mqtt.identities import NATIVE_WAIT_S

    sub_id = int(codec.prop(pkt.props, "subscription_identifier", 0))  # type: ignore[arg-type]
    if conn.version == codec.V5 and codec.PROP["subscription_identifier"] in (
            i for i, _ in pkt.props) and sub_id == 0:
        raise Closed("subscription_identifier_zero", Reason.PROTOCOL_ERROR)
    server = conn.server
    state = conn.state
    assert state is not None
    codes: list[int] = []
    retained = []
    for topic_filter, options in pkt.filters:
        opts = _options(conn, topic_filter, options, sub_id)
        if isinstance(opts, int):
            codes.append(opts)
            continue
        new = topic_filter not in state.filters
        if new and len(state.filters) >= conn.cfg.max_subscriptions:
            conn.count("subscriptions_refused_limit")
            codes.append(_code(conn, Reason.QUOTA_EXCEEDED))
            continue
        if new:
            try:
                assert state.ident is not None
                await state.ident.hold(state, topic_filter, opts.match)
            except EntitlementError:
                conn.count("subscriptions_denied")
                codes.append(_code(conn, Reason.NOT_AUTHORIZED))
                continue
            except (NoAnswerError, BusyError) as exc:  # asked again, in vain (identities.py)
                log.warning("mqtt %s: the appliance did not take the native subscribe of %r "
                            "for identity %r within %g s (%s: %s); connection closed",
                            conn.peer, topic_filter, state.identity, NATIVE_WAIT_S,
                            type(exc).__name__, exc)
                raise Closed("native_subscribe_timeout", Reason.UNSPECIFIED,
                             detail=str(exc)) from None
            except ClientError as exc:
                log.warning("mqtt %s: the native subscribe of %r failed (%s: %s); connection "
                            "closed", conn.peer, topic_filter, type(exc).__name__, exc)
                raise Closed("native_subscribe_failed", Reason.UNSPECIFIED,
                             detail=str(exc)) from None
        opts.seq = state.stamp()  # (newer than every carve-out so far: it takes back their
        state.filters[topic_filter] = opts  # topics, as seed 000's ordered lists do)
        conn.count("subscriptions")
        codes.append(opts.qos)
        if opts.group is not None:  # no retained messages for a shared subscription
            server.shared_router.join(opts.group, state)
            conn.count("subscriptions_shared")
        elif opts.retain_handling == 0 or (opts.retain_handling == 1 and new):
            retained.extend((m, opts) for m in server.retained.matching(opts.match))
    if state.stored:
        server.store.save_session(state)
    conn.send(codec.encode_suback(pkt.packet_id, codes, conn.version))
    for message, opts in retained:
        state.deliver(Delivery(message.topic, message.payload, min(opts.qos, message.qos), True,
                               message.meta, (opts.sub_id,) if opts.sub_id else ()))
        conn.count("retained_delivered")


def _wants_partial(conn: MqttConnection, pkt: codec.Unsubscribe) -> bool:
    """Whether this UNSUBSCRIBE may carve out (``mqtt.partial_unsubscribe``, or the 5.0 user
    property ``tw-partial-unsubscribe`` with a true value)."""
    if conn.cfg.partial_unsubscribe:
        return True
    return any(i == _USER_PROPERTY and v[0] == PARTIAL_PROPERTY
               and v[1].lower() in ("1", "true", "yes") for i, v in pkt.props)


def _carve_out(conn: MqttConnection, topic_filter: str) -> int:
    """A partial unsubscribe of ``topic_filter``, a filter the session does not hold: carved
    out of the filters it overlaps (SUCCESS), or NO_SUBSCRIPTION_EXISTED when it overlaps none
    (the standard answer), or a refusal."""

    state = conn.state
    assert state is not None
    if (filter_problem(topic_filter) is not None or topic_filter.startswith(SHARED_PREFIX)
            or topic_filter.startswith(SUCCESSOR_PREFIX)):
        conn.count("unsubscriptions_partial_refused")
        return Reason.TOPIC_FILTER_INVALID
    if not _carves(state, topic_filter, state.next_seq):
        return Reason.NO_SUBSCRIPTION_EXISTED
    if (topic_filter not in state.carve_outs
            and len(state.filters) + len(state.carve_outs) >= conn.cfg.max_subscriptions):
        conn.count("unsubscriptions_partial_refused_limit")
        return Reason.QUOTA_EXCEEDED
    state.carve_outs.pop(topic_filter, None)  # (re-inserted: the newest)
    state.carve_outs[topic_filter] = state.stamp()
    conn.count("unsubscriptions_partial")
    return Reason.SUCCESS


def _carves(state: SessionState, carved: str, seq: int) -> bool:
    """Whether a carve-out of ``carved`` at place ``seq`` takes topics from a filter the
    session holds: one older than it that overlaps it (shared subscriptions are not carved)."""
    from datapath.topics.algebra import overlaps

    return any(o.group is None and o.seq < seq and overlaps(o.match, carved)
               for o in state.filters.values())


def _forget_idle_carve_outs(state: SessionState) -> None:
    """Carve-outs that carve nothing any more: dropped, so that they do not count against
    the bound."""
    for carved, seq in list(state.carve_outs.items()):
        if not _carves(state, carved, seq):
            del state.carve_outs[carved]


async def on_unsubscribe(conn: MqttConnection, pkt: codec.Unsubscribe) -> None:
    from appliance.client.errors import ClientError

    state = conn.state
    assert state is not None
    codes = []
    partial = _wants_partial(conn, pkt)
    for topic_filter in pkt.filters:
        opts = state.filters.pop(topic_filter, None)
        if opts is None:
            codes.append(_carve_out(conn, topic_filter) if partial
                         else Reason.NO_SUBSCRIPTION_EXISTED)
            continue
        if opts.group is not None:
            conn.server.shared_router.leave(opts.group, state)
        if state.ident is not None:
            try:
                await state.ident.release(state, topic_filter, opts.match)
            except ClientError as exc:  # asked again while unanswered, in vain
                log.warning("mqtt %s: the native unsubscribe of %r failed (%s: %s); "
                            "connection closed", conn.peer, topic_filter, type(exc).__name__,
                            exc)
                raise Closed("native_unsubscribe_failed", Reason.UNSPECIFIED,
                             detail=str(exc)) from None
        conn.count("unsubscriptions")
        codes.append(Reason.SUCCESS)
    if state.carve_outs:
        _forget_idle_carve_outs(state)
    if state.stored:
        conn.server.store.save_session(state)
    conn.send(codec.encode_unsuback(pkt.packet_id, codes, conn.version))
