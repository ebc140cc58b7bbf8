"""Hostile MQTT peers over raw TCP: every malformed, oversized or out-of-order packet, silence
and greed end that one connection (counted), never the edge; what a client can grow is
bounded."""

from __future__ import annotations

import pytest

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType
from tests.edge.conftest import (
    closed_by_peer,
    counter,
    logged_in,
    raw,
    read_packet,
    start_edge,
    wait_counter,
    wait_for,
)
from tests.edge.peers import Peer


def still_serves(edge) -> None:
    with Peer(edge, "after-hostile") as sub, Peer(edge, "after-hostile-pub") as pub:
        assert sub.subscribe("ok/#", 1) == 1
        pub.publish("ok/1", b"fine", 1)
        assert sub.next().payload == b"fine"


MALFORMED_AFTER_CONNECT = [
    ("bad_remaining_length", b"\x30\xff\xff\xff\xff\x01"),
    ("bad_qos", b"\x36\x07\x00\x03a/b\x00\x01"),
    ("bad_utf8", b"\x30\x04\x00\x02\xc3\x28"),
    ("bad_flags", b"\x80\x06\x00\x01\x00\x01a\x00"),
    ("truncated", b"\x82\x05\x00\x01\x00\x05a"),
    ("bad_packet_type", b"\x00\x00"),
    ("bad_packet_type", b"\x0a\xc0"),  # type 0, a remaining length never finished: at once
    ("trailing_bytes", b"\xc0\x01\x00"),
    ("protocol_error", b"\x20\x02\x00\x00"),
    ("second_connect", codec.encode_connect("again", username="alice",
                                            password=b"alice-secret")),
    ("bad_topic", None),  # a PUBLISH to "a/+/c" in the connection's version
]


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_malformed_packets_close_that_connection_only_and_are_counted(edge, version):
    bystander = Peer(edge, "bystander", version=version)
    assert bystander.subscribe("ok/#", 1) == 1
    for reason, data in MALFORMED_AFTER_CONNECT:
        sock = logged_in(edge, version, f"hostile-{reason}")
        sock.sendall(data or codec.encode_publish("a/+/c", b"x", version=version))
        sent = closed_by_peer(sock)
        sock.close()
        wait_counter(edge, f"closed_{reason}")
        if version == 5:  # a 5.0 client is told why: DISCONNECT with a reason >= 0x80
            assert sent[:1] == b"\xe0" and sent[2] >= 0x80, (reason, sent)
        else:
            assert sent == b"", (reason, sent)
    with Peer(edge, "pub-after", version=version) as pub:
        pub.publish("ok/x", b"still here", 1)
    assert bystander.next().payload == b"still here"
    bystander.close()


def test_an_oversized_packet_is_refused_before_its_body_is_read(edge):
    sock = logged_in(edge, 5, "big")
    sock.sendall(b"\x30" + codec.varint(100_000) + b"\x00\x01a")  # max_packet_bytes = 4096
    sent = closed_by_peer(sock)
    assert sent == codec.encode_disconnect(codec.Reason.PACKET_TOO_LARGE)
    wait_counter(edge, "refused_oversize")
    still_serves(edge)


def test_bad_protocol_levels_and_names_are_refused(edge):
    sock = raw(edge)
    sock.sendall(codec.encode_connect("lvl", version=3, username="alice",
                                      password=b"alice-secret"))
    assert closed_by_peer(sock) == b"\x20\x02\x00\x01"  # unacceptable protocol version
    sock = raw(edge)
    sock.sendall(codec.encode_connect("name", protocol_name=b"MQIsdp", username="alice",
                                      password=b"alice-secret"))
    assert closed_by_peer(sock) == b""
    sock = raw(edge)
    sock.sendall(codec.PINGRESP.replace(b"\xd0", b"\xc0"))  # PINGREQ before CONNECT
    assert closed_by_peer(sock) == b""
    assert counter(edge, "connect_refused_protocol_level") == 1
    wait_counter(edge, "closed_connect_refused_protocol_name")
    wait_counter(edge, "closed_first_packet_not_connect")
    still_serves(edge)


def test_keep_alive_is_enforced_at_one_and_a_half_periods(edge):
    sock = logged_in(edge, 4, "sleepy", keep_alive_s=1)
    sock.sendall(b"\xc0\x00")
    assert read_packet(sock) == (0xD0, b"")  # PINGRESP while alive
    assert closed_by_peer(sock) == b""  # then silence: closed (after 1.5 s)
    assert counter(edge, "closed_keep_alive_timeout") == 1


def test_keep_alive_expiry_sends_the_will(edge):
    with Peer(edge, "will-watch") as watch:
        assert watch.subscribe("gone/#", 1) == 1
        sock = raw(edge)
        sock.sendall(codec.encode_connect("silent", username="alice", password=b"alice-secret",
                                          keep_alive_s=1,
                                          will=codec.Will("gone/silent", b"timed out", 1,
                                                          False)))
        assert read_packet(sock) == (0x20, b"\x00\x00")
        msg = watch.next()  # nothing more is sent: after 1.5 s the edge gives up on it
        assert (msg.topic, msg.payload) == ("gone/silent", b"timed out")
        assert counter(edge, "closed_keep_alive_timeout") == 1
        sock.close()


def test_a_connection_that_never_sends_connect_is_closed():
    edge = start_edge(connect_timeout_ms=300)
    try:
        sock = raw(edge)
        assert closed_by_peer(sock) == b""
        assert counter(edge, "closed_connect_timeout") == 1
    finally:
        edge.stop()


def test_connections_beyond_the_limit_are_closed_at_once():
    edge = start_edge(max_connections=2)
    try:
        held = [logged_in(edge, 4, f"c{i}") for i in range(2)]
        extra = raw(edge)
        assert closed_by_peer(extra) == b""
        assert counter(edge, "refused_max_connections") == 1
        for sock in held:
            sock.close()
        wait_for(lambda: edge.mqtt.status()["connections"] == 0)
        still_serves(edge)
    finally:
        edge.stop()


def test_unacknowledged_deliveries_are_bounded_by_max_inflight_and_max_queued():
    edge = start_edge(max_inflight=2, max_queued=1)
    try:
        sock = logged_in(edge, 4, "slow-acker")
        sock.sendall(codec.encode_subscribe(1, [("slow/#", 1)]))
        assert read_packet(sock) == (0x90, b"\x00\x01\x01")
        with Peer(edge, "fast-pub") as pub:
            for i in range(5):
                pub.publish(f"slow/{i}", b"x", 1)
        wait_counter(edge, "deliveries_dropped_queue_full", 2)  # 2 in flight, 1 queued
        got = [read_packet(sock) for _ in range(2)]
        assert [body[2:8] for first, body in got] == [b"slow/0", b"slow/1"]
        assert all(first == 0x32 for first, _ in got), got
        session = edge.mqtt.sessions["slow-acker"]
        assert len(session.inflight) == 2 and len(session.queued) == 1
        sock.sendall(codec.encode_ack(PacketType.PUBACK, int.from_bytes(got[0][1][8:10], "big")))
        first, body = read_packet(sock)  # the queued one takes the freed slot
        assert (first, body[2:8]) == (0x32, b"slow/2")
        sock.close()
    finally:
        edge.stop()


def test_the_retained_store_is_bounded():
    edge = start_edge(max_retained=2)
    try:
        with Peer(edge, "retainer") as pub:
            for i in range(3):
                pub.publish(f"keep/{i}", b"v", 1, retain=True)
        wait_counter(edge, "retained_refused_full")
        assert sorted(edge.mqtt.retained.messages) == ["keep/0", "keep/1"]
    finally:
        edge.stop()


def test_a_repeated_qos2_packet_id_is_published_once(edge):
    with Peer(edge, "q2-watch") as watch:
        assert watch.subscribe("q2/#", 0) == 0
        sock = logged_in(edge, 4, "q2-raw")
        data = codec.encode_publish("q2/a", b"once", 2, packet_id=7)
        sock.sendall(data)
        assert read_packet(sock) == (0x50, b"\x00\x07")  # PUBREC
        sock.sendall(codec.encode_publish("q2/a", b"once", 2, dup=True, packet_id=7))
        assert read_packet(sock) == (0x50, b"\x00\x07")
        sock.sendall(codec.encode_ack(PacketType.PUBREL, 7))
        assert read_packet(sock) == (0x70, b"\x00\x07")  # PUBCOMP
        # the marker on the same topic and class (QoS 1 and 2 are the fabric's guaranteed
        # class): it comes after the message, in order; across classes order is not kept
        sock.sendall(codec.encode_publish("q2/a", b"marker", 1, packet_id=8))
        assert read_packet(sock) == (0x40, b"\x00\x08")  # PUBACK
        assert watch.next().payload == b"once"
        assert watch.next().payload == b"marker"  # no second copy between them
        sock.close()


def test_a_persistent_3_1_1_session_needs_a_client_id(edge):
    sock = raw(edge)
    sock.sendall(codec.encode_connect("", clean=False, username="alice",
                                      password=b"alice-secret"))
    assert closed_by_peer(sock) == b"\x20\x02\x00\x02"  # identifier rejected
    assert counter(edge, "connect_refused_client_id") == 1


def test_mqtt5_disconnect_with_will_sends_the_will(edge):
    with Peer(edge, "w4-watch") as watch:
        assert watch.subscribe("w4/#", 1) == 1
        sock = raw(edge)
        sock.sendall(codec.encode_connect("w4", version=5, username="alice",
                                          password=b"alice-secret",
                                          will=codec.Will("w4/gone", b"asked for", 1, False)))
        first, body = read_packet(sock)
        assert first == 0x20 and body[1] == 0
        sock.sendall(codec.packet(PacketType.DISCONNECT, 0, b"\x04\x00"))
        msg = watch.next()
        assert (msg.topic, msg.payload) == ("w4/gone", b"asked for")
        assert counter(edge, "disconnects_with_will") == 1
        sock.close()


def test_mqtt5_clients_receive_maximum_and_maximum_packet_size_are_honoured(edge):
    sock = raw(edge)
    sock.sendall(codec.encode_connect(
        "small", version=5, username="alice", password=b"alice-secret",
        props=[(codec.PROP["receive_maximum"], 1), (codec.PROP["maximum_packet_size"], 40)]))
    first, body = read_packet(sock)
    assert first == 0x20 and body[1] == 0
    sock.sendall(codec.encode_subscribe(1, [("small/#", 1)], codec.V5))
    assert read_packet(sock) == (0x90, b"\x00\x01\x00\x01")
    with Peer(edge, "small-pub") as pub:
        pub.publish("small/big", b"x" * 100, 1)     # larger than the client takes: dropped
        wait_counter(edge, "deliveries_dropped_client_max_packet")
        pub.publish("small/a", b"1", 1)
        pub.publish("small/b", b"2", 1)             # waits: receive maximum 1
        first, body = read_packet(sock)
        assert (first, body[2:9]) == (0x32, b"small/a")
        wait_counter(edge, "deliveries_queued")
        sock.sendall(codec.encode_ack(PacketType.PUBACK, int.from_bytes(body[9:11], "big")))
        first, body = read_packet(sock)
        assert (first, body[2:9]) == (0x32, b"small/b")
    sock.close()


def test_a_connack_larger_than_the_clients_maximum_packet_size_closes_without_it(edge):
    """mosquitto's vectors "tiny max packet" and "maximum packet size": the CONNACK is never
    larger than the client takes; too small a maximum closes the connection at once (it left
    the client waiting before), a 20-byte one gets its CONNACK."""
    sock = raw(edge)
    sock.sendall(codec.encode_connect("tiny", version=5, username="alice",
                                      password=b"alice-secret",
                                      props=[(codec.PROP["maximum_packet_size"], 2)]))
    assert closed_by_peer(sock) == b""
    assert counter(edge, "closed_connect_refused_client_max_packet") == 1
    sock = raw(edge)
    sock.sendall(codec.encode_connect("twenty", version=5, username="alice",
                                      password=b"alice-secret",
                                      props=[(codec.PROP["maximum_packet_size"], 20)]))
    first, body = read_packet(sock)
    assert first == 0x20 and body[1] == 0 and 2 + len(body) <= 20
    sock.close()


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_an_acknowledgement_of_the_wrong_kind_closes_the_connection(edge, version):
    """mosquitto's FLOW vectors: PUBREC or PUBCOMP for a QoS 1 delivery, PUBACK for a QoS 2
    one is a protocol error (it left the delivery in flight for good); PUBREC again after
    the edge's PUBREL is answered with the PUBREL again."""
    for qos, wrong in ((1, PacketType.PUBREC), (1, PacketType.PUBCOMP), (2, PacketType.PUBACK)):
        sock = logged_in(edge, version, client_id=f"wrong-ack-{version}-{qos}-{wrong.name}")
        sock.sendall(codec.encode_subscribe(1, [("wrong/ack", qos)], version))
        assert read_packet(sock)[0] == 0x90
        with Peer(edge, "wrong-ack-pub") as pub:
            pub.publish("wrong/ack", b"m", qos)
        first, body = read_packet(sock)
        assert first >> 4 == PacketType.PUBLISH, first
        packet_id = body[body[1] + 2:body[1] + 4]
        sock.sendall(codec.encode_ack(wrong, int.from_bytes(packet_id, "big")))
        assert closed_by_peer(sock) == (b"\xe0\x01\x82" if version == 5 else b"")
    assert counter(edge, "closed_ack_wrong_kind") == 3
    sock = logged_in(edge, version, client_id=f"pubrec-again-{version}")
    sock.sendall(codec.encode_subscribe(1, [("again/ack", 2)], version))
    assert read_packet(sock)[0] == 0x90
    with Peer(edge, "pubrec-again-pub") as pub:
        pub.publish("again/ack", b"m", 2)
    first, body = read_packet(sock)
    packet_id = int.from_bytes(body[body[1] + 2:body[1] + 4], "big")
    for _ in range(2):
        sock.sendall(codec.encode_ack(PacketType.PUBREC, packet_id))
        assert read_packet(sock) == (0x62, packet_id.to_bytes(2, "big"))
    sock.sendall(codec.encode_ack(PacketType.PUBCOMP, packet_id))
    sock.sendall(b"\xc0\x00")  # PINGREQ: still connected
    assert read_packet(sock) == (0xD0, b"")
    sock.close()


def test_mqtt5_acknowledgements_with_undefined_reason_codes_close_and_a_failed_pubrec_ends(edge):
    """mosquitto's vectors: a reason code MQTT 5.0 does not define for that acknowledgement is
    a protocol error; an unsolicited PUBREC that reports a failure gets no PUBREL (one that
    reports success gets PUBREL 0x92 Packet Identifier not found)."""
    for bad in (b"\x40\x04\x00\x01\xff\x00", b"\x70\x03\x00\x01\x80"):
        sock = logged_in(edge, 5, client_id="bad-reason")
        sock.sendall(bad)
        assert closed_by_peer(sock) == b"\xe0\x01\x82"
    assert counter(edge, "closed_bad_reason_code") == 2
    sock = logged_in(edge, 5, client_id="pubrec-failed")
    sock.sendall(b"\x50\x03\x00\x01\x80" + b"\x50\x02\x00\x02" + b"\xc0\x00")
    assert read_packet(sock) == (0x62, b"\x00\x02\x92")
    assert read_packet(sock) == (0xD0, b"")
    sock.close()
