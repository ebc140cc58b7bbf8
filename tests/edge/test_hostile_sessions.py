"""Hostile 5.0 peers against the stateful parts (persistent sessions, topic aliases,
subscription identifiers, shared subscriptions, session expiry on DISCONNECT): valid packets
mutated at random (a fixed seed) close at most their own connection, never raise inside the
edge (``closed_internal_error`` stays 0), and the edge keeps serving."""

from __future__ import annotations

import random
import socket

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PROP, PacketType
from tests.edge.conftest import raw_connect, start_edge, wait_for
from tests.edge.peers import Peer

SEED = 16
CASES = 60
VALID_V5 = [
    codec.encode_publish("h/a", b"x", 1, packet_id=1, version=codec.V5, props=[
        (PROP["topic_alias"], 1), (PROP["user_property"], ("k", "v")),
        (PROP["message_expiry_interval"], 5), (PROP["response_topic"], "h/r")]),
    codec.encode_publish("", b"y", 0, version=codec.V5, props=[(PROP["topic_alias"], 1)]),
    codec.encode_publish("h/b", b"z", 2, packet_id=3, version=codec.V5),
    codec.encode_subscribe(2, [("$share/g/h/#", 0x01), ("h/+", 0x2A)], codec.V5,
                           props=[(PROP["subscription_identifier"], 3)]),
    codec.encode_ack(PacketType.PUBREC, 9, codec.V5),
    codec.encode_ack(PacketType.PUBREL, 3, codec.V5),
    codec.packet(PacketType.UNSUBSCRIBE, 0b0010, b"\x00\x04\x00\x00\x0c$share/g/h/#"),
    codec.packet(PacketType.DISCONNECT, 0,
                 b"\x00" + codec.encode_props([(PROP["session_expiry_interval"], 10)])),
]


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(out))
        op = rng.randrange(3)
        if op == 0:
            out[i] = rng.randrange(256)
        elif op == 1 and len(out) > 2:
            del out[i]
        else:
            out.insert(i, rng.randrange(256))
    return bytes(out)


def until_pong_or_close(sock: socket.socket) -> None:
    got = b""
    while b"\xd0\x00" not in got:
        try:
            chunk = sock.recv(65_536)
        except (ConnectionResetError, TimeoutError):
            return
        if not chunk:
            return
        got += chunk


def test_mutated_5_0_packets_end_at_most_their_own_connection():
    edge = start_edge(max_offline_sessions=4, topic_alias_maximum=4)
    rng = random.Random(SEED)
    try:
        with Peer(edge, "bystander", version=5) as bystander, \
                Peer(edge, "bystander-pub") as pub:
            assert bystander.subscribe("calm/#", 1) == 1
            for case in range(CASES):
                sock, _ = raw_connect(edge, f"fz{case % 8}", 5, clean=rng.random() < 0.5,
                                      keep_alive_s=1, props=[
                                          (PROP["session_expiry_interval"], rng.choice([0, 5])),
                                          (PROP["topic_alias_maximum"], 2)])
                sent = [rng.choice(VALID_V5) for _ in range(rng.randint(1, 3))]
                sent = [mutate(rng, p) if rng.random() < 0.8 else p for p in sent]
                try:  # the edge may close the connection before it took everything
                    sock.sendall(b"".join(sent) + codec.packet(PacketType.PINGREQ, 0, b""))
                except (BrokenPipeError, ConnectionResetError):
                    pass
                until_pong_or_close(sock)
                sock.close()
                pub.publish("calm/x", str(case).encode(), 1)
                assert bystander.next().payload == str(case).encode()
        counters = edge.mqtt.status()["counters"]
        assert counters.get("closed_internal_error", 0) == 0, counters
        refused = sum(n for name, n in counters.items() if name.startswith("refused_"))
        assert refused and counters["publishes_in"] > CASES   # both kinds were exercised
        wait_for(lambda: edge.mqtt.status()["connections"] == 0)
        assert edge.mqtt.status()["sessions_offline"] <= 4
    finally:
        edge.stop()
