"""Successor delivery (seed 004, appliance/edge/mqtt/successor.py): the ``$successor/``
exchange with paho-mqtt clients and scripted peers against an edge started for real; an
improper disconnect (socket killed, keep-alive expired) routes the ancestor's messages to its
successor with nothing lost at QoS 1, a clean one does not, the ancestor's return takes its
traffic back, refusals are answers."""

from __future__ import annotations

import json
import queue
import socket
import struct
import threading

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType, Reason
from tests.edge.conftest import (
    counter,
    raw_connect,
    read_packet,
    wait_counter,
    wait_for,
)
from tests.edge.peers import Peer

REPLY = "$successor/reply/"


class Mailbox:
    """A peer's messages split into the edge's answers and data (ids from the payload)."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.answers: list = []
        self.ids: list[int] = []
        self.marked: dict[int, list] = {}
        """id -> the 5.0 user properties ``successor-of`` it came with."""

    def take(self, timeout_s: float | None = None) -> None:
        """Move what arrived (waiting up to ``timeout_s`` for one message)."""
        try:
            m = self.peer.messages.get(timeout=timeout_s) if timeout_s else \
                self.peer.messages.get_nowait()
        except queue.Empty:
            return
        while True:
            if m.topic.startswith("$successor/"):
                self.answers.append(m)
            else:
                self.ids.append(int(m.payload))
                props = getattr(m, "properties", None)
                users = getattr(props, "UserProperty", None) or []
                self.marked[int(m.payload)] = [v for k, v in users if k == "successor-of"]
            try:
                m = self.peer.messages.get_nowait()
            except queue.Empty:
                return

    def ask(self, verb: str, payload: bytes | None = None, **doc: object) -> dict:
        """Publish a request (QoS 1) and return the edge's answer."""
        self.peer.publish("$successor/" + verb,
                          json.dumps(doc).encode() if payload is None else payload, 1)
        wait_for(lambda: self.take(0.05) or self.answers, what=f"an answer to {verb}")
        m = self.answers.pop(0)
        assert m.topic == REPLY + verb or verb not in ("announce", "withdraw", "candidates",
                                                       "set", "clear"), m.topic
        return json.loads(m.payload)


def kill(peer: Peer) -> None:
    """Drop the peer's TCP connection without DISCONNECT (a reset, as a crash leaves it)."""
    sock = peer.client.socket()
    peer.client.loop_stop()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def pair(edge, version: int, ancestor_id: str, successor_id: str, clean: bool = True,
         props=None) -> tuple[Mailbox, Mailbox]:
    """A successor that announced vendor ``acme`` and an ancestor subscribed to ``plant/#``
    at QoS 1 that found it among the candidates and set it."""
    succ = Mailbox(Peer(edge, successor_id, version=version))
    assert succ.ask("announce", vendor="acme") == {"ok": True, "request": "announce",
                                                   "vendor": "acme"}
    anc = Mailbox(Peer(edge, ancestor_id, version=version, clean=clean, props=props))
    assert anc.peer.subscribe("plant/#", 1) == 1
    assert anc.ask("candidates", vendor="acme") == {
        "ok": True, "request": "candidates", "vendor": "acme", "candidates": [successor_id]}
    assert anc.ask("set", successor=successor_id, vendor="acme") == {
        "ok": True, "request": "set", "successor": successor_id, "vendor": "acme"}
    return anc, succ


def publish_range(pub: Peer, first: int, end: int) -> None:
    for i in range(first, end):
        pub.publish(f"plant/line{i % 4}", str(i).encode(), 1)


def collect_until(boxes: list[Mailbox], want: set[int]) -> None:
    def done() -> bool:
        for box in boxes:
            box.take(0.02)
        return want <= set().union(*(set(b.ids) for b in boxes))
    def missing() -> str:
        got = set().union(*(set(b.ids) for b in boxes))
        counters = boxes[0].peer.edge.mqtt.status()["counters"]
        return f"all of {len(want)} ids (missing {sorted(want - got)}; {counters})"
    try:
        wait_for(done, what="all ids")
    except AssertionError:
        raise AssertionError(missing()) from None


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_an_improper_disconnect_routes_to_the_successor_and_the_return_takes_it_back(
        edge, version):
    anc_id, succ_id = f"anc-{version}", f"succ-{version}"
    anc, succ = pair(edge, version, anc_id, succ_id)
    assert edge.mqtt.status()["successors"] == {"nodes": 2, "successors": 1, "candidates": 1,
                                                "dropped": 0}
    pub = Peer(edge, f"pub-{version}")
    first = 200
    # the ancestor's socket is killed while messages flow to it
    sender = threading.Thread(target=publish_range, args=(pub, 0, first))
    sender.start()
    wait_for(lambda: anc.take(0.02) or len(anc.ids) >= first // 5, what="a fifth delivered")
    kill(anc.peer)
    wait_counter(edge, "successor_improper_disconnects")
    sender.join()
    # after the edge saw the drop, every message for the ancestor goes to the successor
    publish_range(pub, first, first + 50)
    anc.take()
    collect_until([anc, succ], set(range(first + 50)))  # nothing lost at QoS 1
    assert set(range(first, first + 50)) <= set(succ.ids)
    assert not set(range(first, first + 50)) & set(anc.ids)
    assert counter(edge, "successor_routed") >= 50
    assert edge.mqtt.status()["successors"]["dropped"] == 1
    assert succ.answers == []  # (routed data arrives on its own topics)
    if version == 5:  # a 5.0 successor sees whose messages it gets
        assert all(succ.marked[i] == [anc_id] for i in range(first, first + 50))

    # the ancestor returns: its traffic is its own again
    back = Mailbox(Peer(edge, anc_id, version=version))
    assert back.peer.subscribe("plant/#", 1) == 1
    wait_counter(edge, "successor_returns")
    routed = counter(edge, "successor_routed")
    publish_range(pub, 300, 350)
    collect_until([back], set(range(300, 350)))
    assert counter(edge, "successor_routed") == routed  # none of them went to the successor
    assert edge.mqtt.status()["successors"]["dropped"] == 0
    for p in (back.peer, succ.peer, pub):
        p.close()


def test_a_clean_disconnect_does_not_route_to_the_successor(edge):
    anc, succ = pair(edge, 4, "anc-clean", "succ-clean", clean=False)
    anc.peer.close()  # DISCONNECT: the persistent session waits, queueing
    wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 1)
    with Peer(edge, "pub-clean") as pub:
        publish_range(pub, 0, 20)
    wait_counter(edge, "deliveries_queued", 20)  # every one queued for the ancestor
    assert counter(edge, "successor_routed") == 0
    assert counter(edge, "successor_improper_disconnects") == 0
    succ.take()
    assert succ.ids == []
    back = Mailbox(Peer(edge, "anc-clean", clean=False))
    assert back.peer.session_present
    collect_until([back], set(range(20)))
    assert counter(edge, "successor_routed") == 0
    back.peer.close()
    succ.peer.close()


def test_a_keep_alive_expiry_is_improper_and_routes_to_the_successor(edge):
    succ = Mailbox(Peer(edge, "succ-ka"))
    assert succ.ask("announce", vendor="acme")["ok"]
    anc = Mailbox(Peer(edge, "anc-ka", keepalive=1))
    assert anc.peer.subscribe("plant/#", 1) == 1
    assert anc.ask("set", successor="succ-ka", vendor="acme")["ok"]
    sock = anc.peer.client.socket()
    anc.peer.client.loop_stop()  # silent from now on: no PINGREQ, the socket stays open
    try:
        wait_counter(edge, "closed_keep_alive_timeout")
        wait_counter(edge, "successor_improper_disconnects")
        with Peer(edge, "pub-ka") as pub:
            publish_range(pub, 0, 10)
        collect_until([succ], set(range(10)))
    finally:
        sock.close()
        succ.peer.close()


def test_a_vendor_mismatch_and_bad_requests_are_refused_with_an_answer(edge):
    succ = Mailbox(Peer(edge, "succ-v", version=5))
    assert succ.ask("announce", vendor="acme")["ok"]
    other = Mailbox(Peer(edge, "bob-v", user="bob"))  # same vendor, another identity
    assert other.ask("announce", vendor="acme")["ok"]
    anc = Mailbox(Peer(edge, "anc-v", version=5))
    assert anc.ask("candidates", vendor="globex")["candidates"] == []
    refused = anc.ask("set", successor="succ-v", vendor="globex")
    assert refused["ok"] is False and refused["why"] == "vendor_mismatch", refused
    assert refused["error"].startswith("successor: set: ")
    assert anc.ask("candidates", vendor="acme")["candidates"] == ["succ-v"]  # not bob's
    assert anc.ask("set", successor="bob-v", vendor="acme")["why"] == "other_identity"
    assert anc.ask("set", successor="nobody", vendor="acme")["why"] == "unknown_client"
    assert anc.ask("set", successor="anc-v", vendor="acme")["why"] == "self"
    assert anc.ask("set", successor="succ-v")["why"] == "bad_vendor"
    assert anc.ask("candidates", vendor="x" * 65)["why"] == "bad_vendor"
    assert anc.ask("set", payload=b"not json")["why"] == "bad_request"
    assert anc.ask("set", payload=b"[1, 2]")["why"] == "bad_request"
    assert anc.ask("set", payload=b"{" + b" " * 2_000 + b"}")["why"] == "bad_request"
    assert anc.ask("bogus", vendor="acme")["why"] == "unknown_verb"
    assert edge.mqtt.status()["successors"]["successors"] == 0
    assert counter(edge, "successor_refused_vendor_mismatch") == 1
    # nothing of it reached the fabric, and the connection goes on
    assert anc.peer.subscribe("plant/#", 1) == 1
    assert counter(edge, "publishes_in") == 0
    # the reserved space is the edge's: no subscription to it (answers need none)
    assert anc.peer.subscribe("$successor/#", 1) == Reason.NOT_AUTHORIZED
    assert other.peer.subscribe("$successor/reply/set", 1) == 0x80
    assert counter(edge, "subscriptions_refused_reserved") == 2
    # a withdrawn candidate is no candidate
    assert succ.ask("withdraw")["ok"]
    assert anc.ask("candidates", vendor="acme")["candidates"] == []
    for box in (succ, other, anc):
        box.peer.close()


def test_a_5_0_request_is_answered_on_its_response_topic_with_its_correlation_data(edge):
    succ = Mailbox(Peer(edge, "succ-rr", version=5))
    assert succ.ask("announce", vendor="acme")["ok"]
    sock, _ = raw_connect(edge, "anc-rr", version=5)
    try:
        props = [(codec.PROP["response_topic"], "my/answers"),
                 (codec.PROP["correlation_data"], b"c-42")]
        sock.sendall(codec.encode_publish("$successor/set", b'{"successor": "succ-rr", '
                                          b'"vendor": "globex"}', 1, packet_id=7,
                                          version=5, props=props))
        first, body = read_packet(sock)
        answer = codec.decode(first, body, 5)
        assert isinstance(answer, codec.Publish) and answer.topic == "my/answers"
        assert codec.prop(answer.props, "correlation_data") == b"c-42"
        assert json.loads(answer.payload)["why"] == "vendor_mismatch"
        first, body = read_packet(sock)
        ack = codec.decode(first, body, 5)
        assert ack.type == PacketType.PUBACK and ack.packet_id == 7
        assert ack.reason == Reason.IMPLEMENTATION_SPECIFIC
        sock.sendall(codec.encode_publish("$successor/set", b'{"successor": "succ-rr", '
                                          b'"vendor": "acme"}', 2, packet_id=8, version=5))
        first, body = read_packet(sock)
        answer = codec.decode(first, body, 5)
        assert answer.topic == REPLY + "set" and json.loads(answer.payload)["ok"]
        first, body = read_packet(sock)
        rec = codec.decode(first, body, 5)
        assert rec.type == PacketType.PUBREC and rec.packet_id == 8 and rec.reason == 0
        sock.sendall(codec.encode_ack(PacketType.PUBREL, 8, 5))
        first, body = read_packet(sock)
        comp = codec.decode(first, body, 5)
        assert comp.type == PacketType.PUBCOMP and comp.reason == 0
    finally:
        sock.close()
        succ.peer.close()


def test_a_successor_set_over_5_0_is_kept_while_a_persistent_ancestor_is_away(edge):
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    anc, succ = pair(edge, 5, "anc-p5", "succ-p5", clean=False, props=props)
    kill(anc.peer)
    wait_counter(edge, "successor_improper_disconnects")
    with Peer(edge, "pub-p5") as pub:
        publish_range(pub, 0, 10)
    collect_until([succ], set(range(10)))
    again = Mailbox(Peer(edge, "anc-p5", version=5, clean=False, props=props))
    assert again.peer.session_present  # its persistent session was kept, not queued into
    wait_counter(edge, "successor_returns")
    with Peer(edge, "pub-p5b") as pub:
        publish_range(pub, 10, 20)
    collect_until([again], set(range(10, 20)))
    again.peer.close()
    succ.peer.close()


def test_messages_wait_for_an_absent_successor_and_go_to_it_when_it_connects(edge):
    succ = Mailbox(Peer(edge, "succ-away", clean=False))  # persistent: its records stay
    assert succ.ask("announce", vendor="acme")["ok"]
    anc = Mailbox(Peer(edge, "anc-away"))
    assert anc.peer.subscribe("plant/#", 1) == 1
    assert anc.ask("set", successor="succ-away", vendor="acme")["ok"]
    succ.peer.close()
    wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 1)
    kill(anc.peer)
    wait_counter(edge, "successor_improper_disconnects")
    with Peer(edge, "pub-away") as pub:
        publish_range(pub, 0, 10)
    wait_counter(edge, "deliveries_queued", 10)  # held by the ancestor's session
    assert counter(edge, "successor_routed") == 0
    back = Mailbox(Peer(edge, "succ-away", clean=False))
    collect_until([back], set(range(10)))
    assert counter(edge, "successor_handed_over") >= 10
    back.peer.close()


def test_the_records_are_bounded(edge):
    edge.mqtt.successors.max_nodes = 2
    boxes = [Mailbox(Peer(edge, f"many-{i}")) for i in range(3)]
    assert [b.ask("announce", vendor="acme")["ok"] for b in boxes] == [True, True, False]
    assert boxes[2].ask("candidates", vendor="acme")["why"] == "full"
    assert counter(edge, "successor_refused_full") == 2
    boxes[0].peer.close()  # a clean session's records go with it
    wait_for(lambda: edge.mqtt.status()["successors"]["nodes"] == 1)
    assert boxes[2].ask("candidates", vendor="acme")["candidates"] == ["many-1"]
    for box in boxes[1:]:
        box.peer.close()


def test_a_takeover_by_the_ancestor_keeps_its_successor(edge):
    anc, succ = pair(edge, 4, "anc-take", "succ-take")
    again = Mailbox(Peer(edge, "anc-take"))  # the edge still held the first connection
    wait_counter(edge, "sessions_taken_over")
    assert edge.mqtt.status()["successors"]["successors"] == 1
    assert again.peer.subscribe("plant/#", 1) == 1
    kill(again.peer)
    wait_counter(edge, "successor_improper_disconnects")
    with Peer(edge, "pub-take") as pub:
        publish_range(pub, 0, 10)
    collect_until([succ], set(range(10)))
    anc.peer.client.loop_stop()
    succ.peer.close()
