"""The MQTT codec against golden bytes (from the MQTT 3.1.1 and 5.0 standards' layouts, and
bytes paho-mqtt sends), and hostile input: every malformed packet is a ``Refusal``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType, Reason, Refusal
from appliance.edge.mqtt.topics import filter_problem, mqtt_matches, topic_problem


@pytest.mark.parametrize(("value", "golden"), [
    (0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16_383, b"\xff\x7f"),
    (16_384, b"\x80\x80\x01"), (2_097_151, b"\xff\xff\x7f"), (268_435_455, b"\xff\xff\xff\x7f")])
def test_remaining_length_encodes_and_decodes_as_the_standard_table_says(value, golden):
    assert codec.varint(value) == golden
    assert codec.read_remaining_length(golden) == (value, len(golden))


def test_a_remaining_length_of_five_bytes_is_refused_and_a_short_one_waits():
    assert isinstance(codec.read_remaining_length(b"\xff\xff\xff\xff\x7f"), Refusal)
    assert codec.read_remaining_length(b"\xff\xff") is None


def test_server_packets_encode_to_golden_bytes():
    assert codec.encode_connack(codec.V311, 0) == b"\x20\x02\x00\x00"
    assert codec.encode_connack(codec.V311, 5) == b"\x20\x02\x00\x05"
    assert codec.encode_connack(codec.V5, 0x86) == b"\x20\x03\x00\x86\x00"
    assert codec.PINGRESP == b"\xd0\x00"
    assert codec.encode_publish("a/b", b"hi") == b"\x30\x07\x00\x03a/bhi"
    assert codec.encode_publish("a/b", b"hi", qos=1, retain=True, packet_id=10) == \
        b"\x33\x09\x00\x03a/b\x00\x0ahi"
    assert codec.encode_publish("a/b", b"hi", qos=2, packet_id=1, version=codec.V5) == \
        b"\x34\x0a\x00\x03a/b\x00\x01\x00hi"
    assert codec.encode_ack(PacketType.PUBACK, 10) == b"\x40\x02\x00\x0a"
    assert codec.encode_ack(PacketType.PUBREL, 10) == b"\x62\x02\x00\x0a"
    assert codec.encode_ack(PacketType.PUBACK, 10, codec.V5, 0x87) == b"\x40\x03\x00\x0a\x87"
    assert codec.encode_suback(1, [0, 1, 0x80]) == b"\x90\x05\x00\x01\x00\x01\x80"
    assert codec.encode_suback(1, [0x87], codec.V5) == b"\x90\x04\x00\x01\x00\x87"
    assert codec.encode_unsuback(7, [0]) == b"\xb0\x02\x00\x07"
    assert codec.encode_unsuback(7, [0, 0x11], codec.V5) == b"\xb0\x05\x00\x07\x00\x00\x11"
    assert codec.encode_disconnect(Reason.KEEP_ALIVE_TIMEOUT) == b"\xe0\x01\x8d"


PAHO_CONNECT_311 = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04abcd"
"""paho-mqtt's CONNECT, client id "abcd", clean session, keep-alive 60."""


def _decode(data: bytes, version: int = 0):
    length, used = codec.read_remaining_length(data[1:])
    assert len(data) == 1 + used + length
    return codec.decode(data[0], data[1 + used:], version)


def test_connect_decodes_from_golden_bytes_both_versions():
    pkt = _decode(PAHO_CONNECT_311)
    assert pkt == codec.Connect(4, True, 60, "abcd", None, None, None, [])
    v5 = codec.encode_connect("c", version=codec.V5, username="u", password=b"p",
                              will=codec.Will("w/t", b"bye", 1, True,
                                              [(codec.PROP["will_delay_interval"], 5)]),
                              props=[(codec.PROP["session_expiry_interval"], 30),
                                     (codec.PROP["user_property"], ("k", "v"))])
    pkt = _decode(v5)
    assert pkt.version == 5 and pkt.username == "u" and pkt.password == b"p"
    assert pkt.will == codec.Will("w/t", b"bye", 1, True, [(0x18, 5)])
    assert codec.prop(pkt.props, "session_expiry_interval") == 30
    assert codec.prop(pkt.props, "user_property") == ("k", "v")


def test_subscribe_and_publish_decode():
    pkt = _decode(b"\x82\x0a\x00\x05\x00\x05a/b/#\x01")
    assert pkt == codec.Subscribe(5, [("a/b/#", 1)], [])
    pkt = _decode(b"\x33\x09\x00\x03a/b\x00\x0ahi", codec.V311)
    assert pkt == codec.Publish("a/b", b"hi", 1, True, False, 10, [])
    pkt = _decode(b"\x34\x0a\x00\x03a/b\x00\x01\x00hi", codec.V5)
    assert pkt == codec.Publish("a/b", b"hi", 2, False, False, 1, [])


def test_a_bad_protocol_name_or_level_decodes_for_the_connect_handler_to_refuse():
    pkt = _decode(PAHO_CONNECT_311.replace(b"MQTT\x04", b"MQTT\x06"))
    assert pkt.version == 6
    pkt = _decode(PAHO_CONNECT_311.replace(b"MQTT", b"MQIs"))
    assert pkt.protocol_name == b"MQIs"


@pytest.mark.parametrize(("data", "version", "reason"), [
    (b"\x00\x00", 4, "bad_packet_type"),                                 # type 0
    (b"\x82\x00", 4, "truncated"),                                       # SUBSCRIBE, no id
    (b"\x80\x05\x00\x01\x00\x01a", 4, "bad_flags"),                      # SUBSCRIBE flags 0000
    (b"\x82\x03\x00\x01\x00", 4, "truncated"),                           # filter cut short
    (b"\x82\x02\x00\x01", 4, "protocol_error"),                          # no filter
    (b"\x82\x06\x00\x00\x00\x01a\x00", 4, "bad_packet_id"),              # packet id 0
    (b"\x82\x06\x00\x01\x00\x01a\x04", 4, "bad_subscription_options"),   # 3.1.1 reserved bit
    (b"\x82\x06\x00\x01\x00\x01a\x03", 4, "bad_subscription_options"),   # QoS 3
    (b"\x82\x07\x00\x01\x00\x00\x01a\x30", 5, "bad_subscription_options"),  # retain handling 3
    (b"\x36\x07\x00\x03a/b\x00\x01", 4, "bad_qos"),                      # PUBLISH QoS 3
    (b"\x38\x05\x00\x03a/b", 4, "bad_flags"),                            # DUP at QoS 0
    (b"\x30\x04\x00\x02\xc3\x28", 4, "bad_utf8"),                        # invalid UTF-8
    (b"\x30\x04\x00\x02a\x00", 4, "bad_utf8"),                           # U+0000
    (b"\x30\x05\x00\x02\xed\xa0\x80", 4, "bad_utf8"),                    # a surrogate
    (b"\x30\x05\x00\x01a\x01\x04", 5, "bad_property"),                   # unknown property
    (b"\x30\x0a\x00\x01a\x04\x02\x00\x00\x00\x00\x00", 5, "bad_property"),  # past its length
    (b"\x30\x09\x00\x01a\x06\x02\x00\x00\x00\x01", 5, "truncated"),      # longer than packet
    (b"\x40\x03\x00\x01\x00", 4, "trailing_bytes"),                      # PUBACK + 1 byte
    (b"\x40\x02\x00\x00", 4, "bad_packet_id"),                           # PUBACK id 0
    (b"\x62\x03\x00\x00\x00", 5, "bad_packet_id"),                       # PUBREL id 0
    (b"\x40\x04\x00\x01\xff\x00", 5, "bad_reason_code"),                  # PUBACK 0xFF
    (b"\x70\x03\x00\x01\x80", 5, "bad_reason_code"),                      # PUBCOMP 0x80
    (b"\xc0\x01\x00", 4, "trailing_bytes"),                              # PINGREQ + 1 byte
    (b"\xc1\x00", 4, "bad_flags"),                                       # PINGREQ flags
    (b"\x20\x02\x00\x00", 4, "protocol_error"),                          # CONNACK from a client
    (b"\xf0\x00", 4, "auth_unsupported"),                                # AUTH in 3.1.1
    (b"\xf0\x01\x01", 5, "bad_reason_code"),                             # AUTH 0x01
    (b"\xf0\x03\x18\x01\x02", 5, "bad_property"),                       # AUTH + expiry
    (b"\x10\x0d\x00\x04MQTT\x04\x03\x00\x3c\x00\x01a", 0, "bad_flags"),  # reserved flag
    (b"\x10\x0d\x00\x04MQTT\x04\x0a\x00\x3c\x00\x01a", 0, "bad_flags"),  # will QoS w/o will
    (b"\x10\x0f\x00\x04MQTT\x04\x42\x00\x3c\x00\x01a\x00\x00", 0, "bad_flags"),  # password only
])
def test_malformed_packets_are_refusals_naming_the_reason(data, version, reason):
    pkt = _decode(data, version)
    assert isinstance(pkt, Refusal), pkt
    assert pkt.reason == reason, pkt


def test_auth_round_trips_in_5_0():
    data = codec.encode_auth(Reason.CONTINUE_AUTHENTICATION,
                             [(codec.PROP["authentication_method"], "SCRAM-SHA-256"),
                              (codec.PROP["authentication_data"], b"r=abc,s=c2FsdA==,i=4096")])
    assert data[:4] == b"\xf0\x2c\x18\x2a"  # length 44: reason, 42 bytes of properties
    pkt = _decode(data, codec.V5)
    assert pkt == codec.Auth(Reason.CONTINUE_AUTHENTICATION,
                             [(0x15, "SCRAM-SHA-256"), (0x16, b"r=abc,s=c2FsdA==,i=4096")])
    assert _decode(b"\xf0\x00", codec.V5) == codec.Auth(Reason.SUCCESS, [])


def test_a_property_given_twice_is_a_protocol_error():
    props = codec.encode_props([(0x02, 5), (0x02, 6)])
    pkt = codec.decode(0x30, b"\x00\x01a" + props, codec.V5)
    assert isinstance(pkt, Refusal) and pkt.code == Reason.PROTOCOL_ERROR


@pytest.mark.parametrize(("first", "body", "props"), [
    (0x30, b"\x00\x01a", [(0x01, 2)]),  # Payload Format Indicator 2
    (0x30, b"\x00\x01a", [(0x08, "reply/+")]),  # a Response Topic with a wildcard
    (0x82, b"\x00\x01", [(0x0B, 1), (0x0B, 1)]),  # a SUBSCRIBE with two Subscription Ids
], ids=["payload_format_2", "response_topic_wildcard", "two_subscription_ids"])
def test_property_values_mqtt_forbids_are_protocol_errors(first, body, props):
    tail = b"\x00\x01a\x00" if first == 0x82 else b""
    pkt = codec.decode(first, body + codec.encode_props(props) + tail, codec.V5)
    assert isinstance(pkt, Refusal) and pkt.code == Reason.PROTOCOL_ERROR, pkt


def test_a_publish_may_repeat_its_subscription_identifier_property_to_a_client_but_a_will_not():
    ok = codec.decode(0x30, b"\x00\x01a" + codec.encode_props([(0x01, 1), (0x08, "r/x")]),
                      codec.V5)
    assert isinstance(ok, codec.Publish) and ok.props == [(0x01, 1), (0x08, "r/x")]


@settings(max_examples=3_000, deadline=None)
@given(st.integers(0, 255), st.binary(max_size=64), st.sampled_from([0, 4, 5]))
def test_decode_never_raises_on_any_bytes(first, body, version):
    pkt = codec.decode(first, body, version)
    assert isinstance(pkt, Refusal | codec.Connect | codec.Publish | codec.Ack | codec.Subscribe
                      | codec.Unsubscribe | codec.Simple | codec.Disconnect | codec.Auth)


@settings(max_examples=3_000, deadline=None)
@given(st.integers(0x30, 0x3F), st.binary(max_size=48), st.booleans())
def test_the_inline_3_1_1_publish_decoder_agrees_with_the_general_one(first, body, framed):
    if framed:  # a well-formed topic length mostly, so both decoders get past it
        body = len(body[:20]).to_bytes(2, "big") + body
    fast = codec._publish_311(first, body)
    try:
        general: object = codec._decode(first, body, codec.V311)
    except Exception as exc:  # (_Bad and the reader's errors: a refusal)
        general = exc
    if fast is None:
        assert not isinstance(general, codec.Publish) or "\x00" in general.topic
    else:
        assert fast == general


@settings(max_examples=500, deadline=None)
@given(st.text(min_size=1, max_size=20), st.binary(max_size=40), st.integers(0, 2),
       st.booleans(), st.integers(1, 65_535), st.sampled_from([4, 5]))
def test_publish_round_trips(topic, payload, qos, retain, packet_id, version):
    if "\x00" in topic:
        return
    data = codec.encode_publish(topic, payload, qos, retain, packet_id=packet_id,
                                version=version)
    pkt = _decode(data, version)
    assert pkt == codec.Publish(topic, payload, qos, retain, False, packet_id if qos else 0, [])


def test_topic_rules_are_mqtts_and_the_dollar_rule_holds():
    assert topic_problem("a/b") is None and topic_problem("a//b") is None
    assert topic_problem("a/+") and topic_problem("") and topic_problem("a/#")
    assert filter_problem("a/+/c/#") is None and filter_problem("#") is None
    assert filter_problem("a/#/c")  # fabric patterns allow it, MQTT does not
    assert filter_problem("a/b#") and filter_problem("a+/b") and filter_problem("")
    assert mqtt_matches("a/#", "a") and mqtt_matches("a/#", "a/b/c")
    assert mqtt_matches("a/+", "a/b") and not mqtt_matches("a/+", "a/b/c")
    assert mqtt_matches("+/+", "/x") and not mqtt_matches("a/b", "a")
    assert not mqtt_matches("#", "$SYS/x") and not mqtt_matches("+/x", "$SYS/x")
    assert mqtt_matches("$SYS/#", "$SYS/x") and mqtt_matches("$SYS/+", "$SYS/x")


@settings(max_examples=1_000, deadline=None)
@given(st.one_of(st.text(max_size=40), st.binary(max_size=300)), st.binary(max_size=300),
       st.integers(0, 2), st.booleans(), st.booleans(), st.integers(1, 65535),
       st.sampled_from([codec.V311, codec.V5]),
       st.lists(st.sampled_from([(0x23, 2), (0x26, ("k", "v")), (0x0B, 300)]), max_size=2))
def test_the_hot_path_encoders_build_what_the_general_packet_builder_builds(
        topic, payload, qos, retain, dup, packet_id, version, props):
    """``encode_publish`` and ``encode_ack`` build their bytes in one go; the general
    ``packet`` builder from the standard's layout is the reference."""
    raw = topic.encode() if isinstance(topic, str) else topic
    body = len(raw).to_bytes(2, "big") + raw + (packet_id.to_bytes(2, "big") if qos else b"")
    if version == codec.V5:
        body += codec.encode_props(props)
    flags = (0x08 if dup else 0) | (qos << 1) | (0x01 if retain else 0)
    assert codec.encode_publish(topic, payload, qos, retain, dup, packet_id, version, props) \
        == codec.packet(PacketType.PUBLISH, flags, body + payload)
    for ptype in (PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL, PacketType.PUBCOMP):
        for reason in (0, 0x10, 0x92):
            want = packet_id.to_bytes(2, "big") + (bytes([reason]) if version == codec.V5
                                                   and reason else b"")
            assert codec.encode_ack(ptype, packet_id, version, reason) == codec.packet(
                ptype, 0b0010 if ptype == PacketType.PUBREL else 0, want)
