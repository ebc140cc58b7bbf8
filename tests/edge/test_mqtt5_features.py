"""MQTT 5.0 features end to end: will delay, message expiry, topic aliases both ways,
subscription identifiers, retain-as-published, request/response and user properties, server
keep-alive; paho-mqtt 5.0 clients and scripted raw peers."""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType
from tests.edge.conftest import (
    closed_by_peer,
    counter,
    raw_connect,
    read_packet,
    start_edge,
    wait_counter,
    wait_for,
)
from tests.edge.peers import Peer


def props(kind: int, **values) -> Properties:
    out = Properties(kind)
    for name, value in values.items():
        setattr(out, name, value)
    return out


def test_a_will_waits_for_its_delay_and_is_cancelled_by_a_reconnect(edge):
    will = codec.Will("wd/gone", b"late", 1, False,
                      [(codec.PROP["will_delay_interval"], 1)])
    expiry = [(codec.PROP["session_expiry_interval"], 300)]
    with Peer(edge, "wd-watch", version=5) as watch:
        assert watch.subscribe("wd/#", 1) == 1
        sock, _ = raw_connect(edge, "wd", 5, clean=False, props=expiry, will=will)
        sock.close()  # no DISCONNECT: the will is due, after its delay
        wait_for(lambda: edge.mqtt.sessions["wd"].will is not None)
        assert counter(edge, "wills_published") == 0
        sock, body = raw_connect(edge, "wd", 5, clean=False, props=expiry, will=will)
        assert body[0] == 1   # session present: back in time, the will is cancelled
        wait_for(lambda: edge.mqtt.sessions["wd"].will is None)
        sock.close()  # dropped again; this time it stays away
        msg = watch.next()
        assert (msg.topic, msg.payload) == ("wd/gone", b"late")
        assert counter(edge, "wills_published") == 1


def test_a_delayed_will_of_a_session_that_ends_with_its_connection_goes_at_once(edge):
    will = codec.Will("wd0/gone", b"now", 1, False, [(codec.PROP["will_delay_interval"], 600)])
    with Peer(edge, "wd0-watch", version=5) as watch:
        assert watch.subscribe("wd0/#", 1) == 1
        sock, _ = raw_connect(edge, "wd0", 5, will=will)
        sock.close()
        assert watch.next().payload == b"now"


def test_message_expiry_is_forwarded_and_expired_messages_are_not_delivered(edge):
    expiry = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    sub = Peer(edge, "exp-sub", version=5, clean=False, props=expiry)
    assert sub.subscribe("exp/#", 1) == 1
    with Peer(edge, "exp-pub", version=5) as pub:
        pub.publish("exp/live", b"x", 1, props=props(PacketTypes.PUBLISH,
                                                     MessageExpiryInterval=600))
        msg = sub.next()
        assert 0 < msg.properties.MessageExpiryInterval <= 600
        sub.close()
        wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 1)
        pub.publish("exp/short", b"stale", 1, props=props(PacketTypes.PUBLISH,
                                                          MessageExpiryInterval=1))
        pub.publish("exp/long", b"fresh", 1)
    state = edge.mqtt.sessions["exp-sub"]
    wait_for(lambda: len(state.queued) == 2)
    wait_for(lambda: state.queued[0].meta.expired(time.monotonic()), what="the expiry")
    with Peer(edge, "exp-sub", version=5, clean=False, props=expiry) as again:
        assert again.next().payload == b"fresh"
    assert counter(edge, "deliveries_dropped_expired") == 1


def test_request_response_and_user_properties_pass_through(edge):
    with Peer(edge, "rr-sub5", version=5) as sub5, Peer(edge, "rr-sub3") as sub3, \
            Peer(edge, "rr-pub", version=5) as pub:
        assert sub5.subscribe("rr/#", 1) == 1 and sub3.subscribe("rr/#", 1) == 1
        sent = props(PacketTypes.PUBLISH, ResponseTopic="rr/reply", CorrelationData=b"\x01id",
                     ContentType="text/plain", PayloadFormatIndicator=1,
                     UserProperty=[("site", "plant-7"), ("site", "again")])
        pub.publish("rr/ask", b"question", 1, props=sent)
        got = sub5.next().properties
        assert (got.ResponseTopic, got.CorrelationData, got.ContentType,
                got.PayloadFormatIndicator) == ("rr/reply", b"\x01id", "text/plain", 1)
        assert got.UserProperty == [("site", "plant-7"), ("site", "again")]
        assert sub3.next().payload == b"question"   # 3.1.1: the payload alone


def test_response_information_is_sent_to_a_client_that_asks_and_a_request_is_answered():
    """``mqtt.response_information``: a 5.0 client asking for Response Information gets the
    prefix with its client identifier; one that does not ask gets none; the requester
    subscribes under it, and a responder answers on the request's Response Topic."""
    edge = start_edge(response_information="resp/{client_id}/")
    try:
        asks = props(PacketTypes.CONNECT, RequestResponseInformation=1)
        with Peer(edge, "rq", version=5, props=asks) as requester, \
                Peer(edge, "rs", version=5) as responder:
            prefix = requester.connack_props.ResponseInformation
            assert prefix == "resp/rq/"
            assert not hasattr(responder.connack_props, "ResponseInformation")
            assert requester.subscribe(prefix + "#", 1) == 1
            assert responder.subscribe("svc/time", 1) == 1
            requester.publish("svc/time", b"now?", 1, props=props(
                PacketTypes.PUBLISH, ResponseTopic=prefix + "time", CorrelationData=b"c1"))
            asked = responder.next()
            responder.publish(asked.properties.ResponseTopic, b"12:00", 1, props=props(
                PacketTypes.PUBLISH, CorrelationData=asked.properties.CorrelationData))
            answer = requester.next()
            assert (answer.topic, answer.payload, answer.properties.CorrelationData) == (
                "resp/rq/time", b"12:00", b"c1")
        sock, body = raw_connect(edge, "rq-raw", 5,
                                 props=[(codec.PROP["request_response_information"], 1)])
        assert codec.prop(codec.connack_props(body), "response_information") == "resp/rq-raw/"
        sock.close()
    finally:
        edge.stop()
    edge = start_edge()  # not configured: none, even when asked
    try:
        sock, body = raw_connect(edge, "rq-none", 5,
                                 props=[(codec.PROP["request_response_information"], 1)])
        assert codec.prop(codec.connack_props(body), "response_information", None) is None
        sock.close()
    finally:
        edge.stop()


def test_subscription_identifiers_come_with_the_messages_they_match(edge):
    with Peer(edge, "sid-sub", version=5) as sub, Peer(edge, "sid-pub", version=5) as pub:
        assert sub.subscribe("sid/#", 1, props=props(PacketTypes.SUBSCRIBE,
                                                     SubscriptionIdentifier=7)) == 1
        assert sub.subscribe("sid/+/x", 1, props=props(PacketTypes.SUBSCRIBE,
                                                       SubscriptionIdentifier=9)) == 1
        assert sub.subscribe("sid/plain", 1) == 1
        pub.publish("sid/a/x", b"both", 1)
        assert sorted(sub.next().properties.SubscriptionIdentifier) == [7, 9]
        pub.publish("sid/plain", b"one", 1)
        assert sub.next().properties.SubscriptionIdentifier == [7]


def test_retain_as_published_keeps_the_retain_flag_of_live_messages(edge):
    with Peer(edge, "rap-on", version=5) as on, Peer(edge, "rap-off", version=5) as off, \
            Peer(edge, "rap-pub", version=5) as pub:
        assert on.subscribe("rap/#", options=SubscribeOptions(
            qos=1, retainAsPublished=True)) == 1
        assert off.subscribe("rap/#", options=SubscribeOptions(qos=1)) == 1
        pub.publish("rap/a", b"kept", 1, retain=True)
        assert on.next().retain and not off.next().retain


def test_topic_aliases_from_the_client_set_and_name_topics(edge):
    with Peer(edge, "ta-sub", version=5) as sub:
        assert sub.subscribe("ta/#", 1) == 1
        sock, body = raw_connect(edge, "ta-raw", 5)
        assert codec.prop(codec.connack_props(body), "topic_alias_maximum") == 16
        alias = [(codec.PROP["topic_alias"], 3)]
        sock.sendall(codec.encode_publish("ta/long/topic", b"1", 1, packet_id=1,
                                          version=codec.V5, props=alias))
        assert read_packet(sock)[0] == 0x40
        sock.sendall(codec.encode_publish("", b"2", 1, packet_id=2, version=codec.V5,
                                          props=alias))
        assert read_packet(sock)[0] == 0x40
        assert [(m.topic, m.payload) for m in (sub.next(), sub.next())] == [
            ("ta/long/topic", b"1"), ("ta/long/topic", b"2")]
        sock.sendall(codec.encode_publish("", b"3", 0, version=codec.V5,
                                          props=[(codec.PROP["topic_alias"], 4)]))
        assert closed_by_peer(sock) == codec.encode_disconnect(codec.Reason.PROTOCOL_ERROR)
    sock, _ = raw_connect(edge, "ta-big", 5)
    sock.sendall(codec.encode_publish("ta/x", b"", 0, version=codec.V5,
                                      props=[(codec.PROP["topic_alias"], 17)]))  # max 16
    assert closed_by_peer(sock) == codec.encode_disconnect(codec.Reason.TOPIC_ALIAS_INVALID)
    assert counter(edge, "closed_topic_alias_unknown") == 1
    assert counter(edge, "closed_topic_alias_invalid") == 1


@pytest.mark.parametrize(("client_max", "edge_max"), [(1, 16), (500, 1)])
def test_topic_aliases_towards_the_client_stay_within_its_maximum(client_max, edge_max):
    """At most min(the client's maximum, the edge's): a client's large maximum does not
    make the edge remember more topics."""
    edge = start_edge(topic_alias_maximum=edge_max)
    try:
        _aliases_out(edge, client_max)
    finally:
        edge.stop()


def _aliases_out(edge, client_max: int) -> None:
    sock, _ = raw_connect(edge, "ta-out", 5,
                          props=[(codec.PROP["topic_alias_maximum"], client_max)])
    sock.sendall(codec.encode_subscribe(1, [("tao/#", 0)], codec.V5))
    read_packet(sock)
    seen = []
    with Peer(edge, "tao-pub") as pub:
        for topic in ("tao/a", "tao/a", "tao/b"):
            pub.publish(topic, b"p", 1)
            decoded = codec.decode(*read_packet(sock), codec.V5)
            seen.append((decoded.topic, codec.prop(decoded.props, "topic_alias")))
    # alias 1 set, then used; one alias at most, so tao/b goes by name
    assert seen == [("tao/a", 1), ("", 1), ("tao/b", None)]
    sock.close()


def test_the_server_keep_alive_caps_the_clients():
    edge = start_edge(server_keep_alive_s=5)
    try:
        with Peer(edge, "ska", version=5, keepalive=60) as peer:
            assert peer.connack_props.ServerKeepAlive == 5
        sock, body = raw_connect(edge, "ska-raw", 5, keep_alive_s=0)  # 0: none asked
        assert codec.prop(codec.connack_props(body), "server_keep_alive") == 5
        assert edge.mqtt.sessions["ska-raw"].conn.keep_alive_s == 5
        sock.close()
        wait_counter(edge, "connections_closed", 2)
    finally:
        edge.stop()


def test_a_subscription_identifier_of_zero_is_a_protocol_error(edge):
    sock, _ = raw_connect(edge, "sid0", 5)
    sock.sendall(codec.encode_subscribe(1, [("z/#", 0)], codec.V5,
                                        props=[(codec.PROP["subscription_identifier"], 0)]))
    assert closed_by_peer(sock) == codec.encode_disconnect(codec.Reason.PROTOCOL_ERROR)
    sock, _ = raw_connect(edge, "pubrel-x", 5)
    sock.sendall(codec.encode_ack(PacketType.PUBREL, 9, codec.V5))
    assert read_packet(sock) == (0x70, b"\x00\x09\x92")   # PUBCOMP: packet id not found
    sock.close()


def test_retained_messages_keep_their_properties_and_expire(edge):
    with Peer(edge, "ret-pub", version=5) as pub:
        pub.publish("ret/kept", b"v", 1, retain=True, props=props(
            PacketTypes.PUBLISH, UserProperty=[("unit", "C")], MessageExpiryInterval=600))
        pub.publish("ret/short", b"stale", 1, retain=True, props=props(
            PacketTypes.PUBLISH, MessageExpiryInterval=1))
    retained = edge.mqtt.retained.messages
    wait_for(lambda: "ret/short" in retained and "ret/kept" in retained)
    wait_for(lambda: retained["ret/short"].meta.expired(time.monotonic()), what="the expiry")
    with Peer(edge, "ret-sub", version=5) as sub:
        assert sub.subscribe("ret/#", 1) == 1
        msg = sub.next()
        assert (msg.topic, msg.retain, msg.properties.UserProperty) == ("ret/kept", True,
                                                                        [("unit", "C")])
        assert 0 < msg.properties.MessageExpiryInterval <= 600
        with Peer(edge, "ret-marker") as marker:
            marker.publish("ret/marker", b"m", 1)
        assert sub.next().topic == "ret/marker"     # the expired one was not sent
    assert "ret/short" not in retained


def test_a_will_delay_longer_than_the_session_goes_when_the_session_expires(edge):
    will = codec.Will("wx/gone", b"at expiry", 1, False,
                      [(codec.PROP["will_delay_interval"], 600)])
    with Peer(edge, "wx-watch", version=5) as watch:
        assert watch.subscribe("wx/#", 1) == 1
        sock, _ = raw_connect(edge, "wx", 5, clean=False, will=will,
                              props=[(codec.PROP["session_expiry_interval"], 1)])
        sock.close()
        assert watch.next().payload == b"at expiry"
    assert counter(edge, "sessions_ended_expired") == 1


def test_disconnect_may_shorten_the_session_expiry_but_not_raise_it_from_zero(edge):
    sock, _ = raw_connect(edge, "dx", 5, clean=False,
                          props=[(codec.PROP["session_expiry_interval"], 300)])
    sock.sendall(codec.packet(PacketType.DISCONNECT, 0, b"\x00" + codec.encode_props(
        [(codec.PROP["session_expiry_interval"], 0)])))
    wait_counter(edge, "sessions_ended_closed")        # 0 now: it ends with the connection
    assert "dx" not in edge.mqtt.sessions
    sock.close()
    sock, _ = raw_connect(edge, "dz", 5)               # expiry 0 ...
    sock.sendall(codec.packet(PacketType.DISCONNECT, 0, b"\x00" + codec.encode_props(
        [(codec.PROP["session_expiry_interval"], 60)])))   # ... may not become 60
    assert closed_by_peer(sock) == codec.encode_disconnect(codec.Reason.PROTOCOL_ERROR)
    assert counter(edge, "closed_session_expiry_from_zero") == 1


def test_the_server_keep_alive_is_enforced():
    edge = start_edge(server_keep_alive_s=1)
    try:
        sock, _ = raw_connect(edge, "silent", 5, keep_alive_s=0)
        assert closed_by_peer(sock) == codec.encode_disconnect(codec.Reason.KEEP_ALIVE_TIMEOUT)
        assert counter(edge, "closed_keep_alive_timeout") == 1
    finally:
        edge.stop()
