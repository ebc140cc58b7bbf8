"""The MQTT edge's batched hot path (docs/mqtt.md, "The hot path"): every complete packet of
one read taken in turn, the native publishes of a wake-up sent together before their
acknowledgements, each connection's packets written once per wake-up, deliveries handed to
the loop in batches. Real edge, real sockets, a real paho-mqtt subscriber."""

from __future__ import annotations

import socket

import pytest

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType
from tests.edge.conftest import closed_by_peer, logged_in, read_packet, wait_counter
from tests.edge.peers import Peer

MESSAGES = 300


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_many_packets_in_one_write_are_each_acknowledged_and_delivered_in_order(edge, version):
    with Peer(edge, f"hot-sub-{version}", version=version) as sub:
        assert sub.subscribe("hot/#", 1) == 1
        sock = logged_in(edge, version, f"hot-pub-{version}")
        # one write: PUBLISHes at QoS 1 to two topics interleaved (the first of each
        # registers its topic), QoS 0 ones, then a PINGREQ behind them
        topics = ("hot/a", "hot/b")
        burst = b"".join(codec.encode_publish(topics[i % 2], b"m%d" % i, 1, False, False,
                                              i + 1, version) for i in range(MESSAGES))
        burst += b"".join(codec.encode_publish("hot/zero", b"z%d" % i, 0, False, False, 0,
                                               version) for i in range(5))
        sock.sendall(burst + codec.packet(PacketType.PINGREQ, 0, b""))
        acked = []
        while True:
            first, body = read_packet(sock)
            if first >> 4 == PacketType.PINGRESP:
                break
            assert first >> 4 == PacketType.PUBACK, (first, body)
            acked.append(int.from_bytes(body[:2], "big"))
            if version == 5 and len(body) > 2:
                assert body[2] == 0, body
        assert acked == list(range(1, MESSAGES + 1))  # each once, in the PUBLISHes' order
        got: dict[str, list[bytes]] = {t: [] for t in (*topics, "hot/zero")}
        while sum(map(len, got.values())) < MESSAGES + 5:
            msg = sub.next()
            got[msg.topic].append(msg.payload)
        for k, topic in enumerate(topics):  # per topic in the order published, none lost
            assert got[topic] == [b"m%d" % i for i in range(k, MESSAGES, 2)]
        assert got["hot/zero"] == [b"z%d" % i for i in range(5)]
        sock.close()
    assert wait_counter(edge, "packets_in", MESSAGES + 5 + 1) >= MESSAGES + 6


def test_a_bad_packet_behind_good_ones_in_one_write_closes_after_them(edge):
    sock = logged_in(edge, 4, "hot-bad")
    good = b"".join(codec.encode_publish("hot/bad", b"x", 1, False, False, i + 1)
                    for i in range(3))
    sock.sendall(good + bytes([0x00, 0x00]))  # a reserved packet type after three PUBLISHes
    out = closed_by_peer(sock)
    acks = [out[i:i + 4] for i in range(0, len(out), 4)]
    assert acks == [bytes([0x40, 2, 0, i + 1]) for i in range(3)], out
    wait_counter(edge, "refused_bad_packet_type")


def test_a_packet_split_across_many_reads_is_taken_whole(edge):
    sock = logged_in(edge, 4, "hot-split")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = codec.encode_publish("hot/split", b"y" * 300, 1, False, False, 7)
    for i in range(len(data)):  # a byte at a time (each its own segment: TCP_NODELAY)
        sock.sendall(data[i:i + 1])
    first, body = read_packet(sock)
    assert (first, body) == (0x40, bytes([0, 7]))
    sock.close()
