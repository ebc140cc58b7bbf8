"""Shared subscriptions (``$share/GROUP/FILTER``): one member per message, round robin; a
message in flight to a member that went away goes to another member; bad group filters are
refused; entitlements apply to each member."""

from __future__ import annotations

import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from appliance.edge.mqtt import codec
from tests.edge.conftest import closed_by_peer, counter, raw_connect, read_packet, wait_counter
from tests.edge.peers import Peer


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_each_message_goes_to_one_member_round_robin(edge, version):
    with Peer(edge, f"m1-{version}", version=version) as m1, \
            Peer(edge, f"m2-{version}", version=version) as m2, \
            Peer(edge, f"all-{version}", version=version) as everyone, \
            Peer(edge, f"shp-{version}", version=version) as pub:
        assert m1.subscribe("$share/workers/jobs/#", 1) == 1
        assert m2.subscribe("$share/workers/jobs/#", 1) == 1
        assert everyone.subscribe("jobs/#", 1) == 1
        for i in range(6):
            pub.publish(f"jobs/{i}", str(i).encode(), 1)
        assert [everyone.next().payload for _ in range(6)] == [str(i).encode()
                                                               for i in range(6)]
        one = [m1.next().payload for _ in range(3)]
        two = [m2.next().payload for _ in range(3)]
        assert sorted(one + two) == [str(i).encode() for i in range(6)]
        assert one == [b"0", b"2", b"4"] and two == [b"1", b"3", b"5"]  # round robin
        assert m1.messages.empty() and m2.messages.empty()
    assert counter(edge, "shared_delivered") == 6


def test_a_message_in_flight_to_a_member_that_went_away_goes_to_another(edge):
    sock, _ = raw_connect(edge, "silent-member")          # joins first: gets the first message
    sock.sendall(codec.encode_subscribe(1, [("$share/g/work/#", 1)]))
    assert read_packet(sock) == (0x90, b"\x00\x01\x01")
    with Peer(edge, "live-member") as live, Peer(edge, "work-pub") as pub:
        assert live.subscribe("$share/g/work/#", 1) == 1
        pub.publish("work/1", b"first", 1)
        first, body = read_packet(sock)
        assert first == 0x32 and body.endswith(b"first")   # never acknowledged
        pub.publish("work/2", b"second", 1)
        assert live.next().payload == b"second"
        sock.close()                                       # gone with "first" in flight
        assert live.next().payload == b"first"
    assert counter(edge, "shared_redelivered") == 1


def test_a_message_is_not_lost_when_its_member_unsubscribes(edge):
    sock, _ = raw_connect(edge, "leaving-member")
    sock.sendall(codec.encode_subscribe(1, [("$share/g2/task/#", 1)]))
    read_packet(sock)
    with Peer(edge, "staying-member") as stay, Peer(edge, "task-pub") as pub:
        assert stay.subscribe("$share/g2/task/#", 1) == 1
        pub.publish("task/1", b"held", 1)
        assert read_packet(sock)[1].endswith(b"held")
        sock.sendall(codec.packet(codec.PacketType.UNSUBSCRIBE, 0b0010,
                                  b"\x00\x02" + b"\x00\x10$share/g2/task/#"))
        assert read_packet(sock)[0] == 0xB0                # UNSUBACK
        assert stay.next().payload == b"held"
    sock.close()


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_bad_shared_filters_and_denied_ones_are_refused(edge, version):
    sock, _ = raw_connect(edge, f"bad-share-{version}", version)
    filters = ["$share/g", "$share//x", "$share/g+/x", "$share/g/x/#/y", "$share/g/x/#"]
    sock.sendall(codec.encode_subscribe(1, [(f, 1) for f in filters], version))
    invalid = 0x80 if version == 4 else 0x8F
    first, body = read_packet(sock)
    assert first == 0x90 and list(body[-5:]) == [invalid] * 4 + [1]
    sock.close()
    with Peer(edge, f"bob-share-{version}", user="bob", version=version) as bob:
        assert bob.subscribe("$share/g/alice/#", 1) == (0x80 if version == 4 else 0x87)
        assert bob.subscribe("$share/g/bob/#", 1) == 1


def test_no_local_on_a_shared_subscription_is_a_protocol_error(edge):
    with Peer(edge, "nl-share", version=5) as peer:
        peer.client.subscribe("$share/g/x/#", options=SubscribeOptions(qos=1, noLocal=True))
        wait_counter(edge, "closed_shared_no_local")


def test_a_raw_no_local_shared_subscribe_gets_disconnect_0x82(edge):
    sock, _ = raw_connect(edge, "nl-raw", 5)
    sock.sendall(codec.encode_subscribe(1, [("$share/g/x/#", 0x05)], codec.V5))
    assert closed_by_peer(sock) == codec.encode_disconnect(codec.Reason.PROTOCOL_ERROR)


def test_an_offline_persistent_member_gets_nothing_while_another_is_connected(edge):
    away = Peer(edge, "away-member", clean=False)
    assert away.subscribe("$share/g3/part/#", 1) == 1
    away.close()
    wait_counter(edge, "sessions_offline")
    with Peer(edge, "here-member") as here, Peer(edge, "part-pub") as pub:
        assert here.subscribe("$share/g3/part/#", 1) == 1
        for i in range(4):
            pub.publish(f"part/{i}", str(i).encode(), 1)
        assert [here.next().payload for _ in range(4)] == [b"0", b"1", b"2", b"3"]
    assert not edge.mqtt.sessions["away-member"].queued
