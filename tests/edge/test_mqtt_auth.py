"""MQTT 5.0 enhanced authentication with SCRAM-SHA-256 at the edge (handle_auth.py): raw
MQTT packets (codec.py's encoders) over real sockets to an edge started in this process, and
scramp's ``ScramClient`` as the client's side of SCRAM. paho-mqtt 2.x sends the
Authentication Method/Data properties but does not handle an AUTH packet from the server
(its packet handler has no AUTH case), so no paho client can finish the exchange."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys

import pytest
from scramp import ScramClient

from appliance.config import ConfigError, parse_config
from appliance.edge.mqtt import codec
from appliance.edge.mqtt.codec import PacketType
from appliance.edge.node import EdgeAppliance
from tests.appliance.helpers import run_appliance, stop, write_config
from tests.edge.conftest import (
    DEADLINE_S,
    closed_by_peer,
    counter,
    edge_doc,
    raw,
    read_packet,
    wait_counter,
    wait_for,
)
from tests.edge.test_remote_pm_credentials import edge_toml, pm_toml

METHOD = "SCRAM-SHA-256"
BOB_SCRAM = "bob-scram-pw"


def scram_line(password: str) -> str:
    """The stored keys as an operator makes them: the documented command line."""
    out = subprocess.run([sys.executable, "-m", "appliance.control.credentials", "--scram"],
                         input=password + "\n", capture_output=True, text=True, check=True,
                         timeout=60)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def bob_keys() -> str:
    return scram_line(BOB_SCRAM)


@pytest.fixture
def scram_edge(bob_keys):
    doc = edge_doc(connect_timeout_ms=3_000)
    doc["pm"]["identities"]["bob"]["scram_sha256"] = bob_keys
    appliance = EdgeAppliance(parse_config(doc)).start()
    try:
        yield appliance
    finally:
        appliance.stop()


def auth_props(data: bytes, method: str = METHOD) -> codec.Props:
    return [(codec.PROP["authentication_method"], method),
            (codec.PROP["authentication_data"], data)]


def props_of(first: int, body: bytes) -> codec.Props:
    """The properties of an AUTH or CONNACK the edge sent."""
    if first >> 4 == PacketType.CONNACK:
        return codec.connack_props(body)
    pkt = codec.decode(first, body, codec.V5)
    assert isinstance(pkt, codec.Auth), pkt
    return pkt.props


def begin(appliance, user: str, secret: str, **connect):
    """CONNECT with SCRAM's client-first: (socket, scramp client, the edge's answer)."""
    client = ScramClient([METHOD], user, secret)
    sock = raw(appliance)
    sock.sendall(codec.encode_connect(
        connect.pop("client_id", "scram-" + user), version=codec.V5,
        props=auth_props(client.get_client_first().encode(), connect.pop("method", METHOD)),
        **connect))
    return sock, client, read_packet(sock)


def scram_login(appliance, user: str, secret: str, **connect
                ) -> tuple[socket.socket, ScramClient, tuple[int, bytes]]:
    """The whole exchange; returns the socket, the client and the final CONNACK."""
    sock, client, (first, body) = begin(appliance, user, secret, **connect)
    assert first >> 4 == PacketType.AUTH, (first, body)
    props = props_of(first, body)
    assert body[0] == codec.Reason.CONTINUE_AUTHENTICATION
    assert codec.prop(props, "authentication_method") == METHOD
    client.set_server_first(codec.prop(props, "authentication_data").decode())
    sock.sendall(codec.encode_auth(codec.Reason.CONTINUE_AUTHENTICATION,
                                   auth_props(client.get_client_final().encode())))
    return sock, client, read_packet(sock)


def connack_code(answer: tuple[int, bytes]) -> int:
    first, body = answer
    assert first >> 4 == PacketType.CONNACK, answer
    return body[1]


def assert_closed(sock: socket.socket) -> None:
    assert closed_by_peer(sock) == b""
    sock.close()


def test_scram_login_is_the_identity_within_its_entitlements_and_reauthenticates(scram_edge):
    sock, client, answer = scram_login(scram_edge, "bob", BOB_SCRAM)
    assert connack_code(answer) == 0
    props = props_of(*answer)
    assert codec.prop(props, "authentication_method") == METHOD
    client.set_server_final(codec.prop(props, "authentication_data").decode())  # edge proven
    assert wait_counter(scram_edge, "connects_by_scram") == 1
    # bob's entitlements: bob/# yes, alice/# no
    sock.sendall(codec.encode_subscribe(1, [("bob/#", 1), ("alice/#", 1)], codec.V5))
    first, body = read_packet(sock)
    assert first >> 4 == PacketType.SUBACK and body[-2:] == bytes([1, 0x87]), body
    sock.sendall(codec.encode_publish("bob/t", b"by-scram", 1, packet_id=7, version=codec.V5))
    got = {}
    while {PacketType.PUBACK, PacketType.PUBLISH} - set(got):
        first, body = read_packet(sock)
        got[first >> 4] = body
    assert got[PacketType.PUBLISH].endswith(b"by-scram")
    # re-authentication (AUTH 0x19) on the same connection, then it goes on working
    again = ScramClient([METHOD], "bob", BOB_SCRAM)
    sock.sendall(codec.encode_auth(codec.Reason.RE_AUTHENTICATE,
                                   auth_props(again.get_client_first().encode())))
    first, body = read_packet(sock)
    assert first >> 4 == PacketType.AUTH and body[0] == codec.Reason.CONTINUE_AUTHENTICATION
    again.set_server_first(codec.prop(props_of(first, body), "authentication_data").decode())
    sock.sendall(codec.encode_auth(codec.Reason.CONTINUE_AUTHENTICATION,
                                   auth_props(again.get_client_final().encode())))
    first, body = read_packet(sock)
    assert first >> 4 == PacketType.AUTH and body[0] == codec.Reason.SUCCESS
    again.set_server_final(codec.prop(props_of(first, body), "authentication_data").decode())
    sock.sendall(codec.packet(PacketType.PINGREQ, 0, b""))
    assert read_packet(sock)[0] >> 4 == PacketType.PINGRESP
    assert wait_counter(scram_edge, "reauths_by_scram") == 1
    sock.close()


def test_wrong_password_unknown_identity_and_mismatched_names_are_refused(scram_edge):
    bystander, _, answer = scram_login(scram_edge, "bob", BOB_SCRAM, client_id="bystander")
    assert connack_code(answer) == 0
    sock, _, answer = scram_login(scram_edge, "bob", "not-" + BOB_SCRAM)
    assert connack_code(answer) == codec.Reason.BAD_USERNAME_OR_PASSWORD
    assert_closed(sock)
    # an identity without stored keys (alice has a password only) and an unknown one look
    # alike: a salt each (the same again for the same name), then the proof refused
    salts = []
    for user in ("alice", "nobody", "nobody"):
        sock, client, (first, body) = begin(scram_edge, user, "x")
        assert first >> 4 == PacketType.AUTH
        server_first = codec.prop(props_of(first, body), "authentication_data").decode()
        salts.append(server_first.split(",s=")[1].split(",")[0])
        client.set_server_first(server_first)
        sock.sendall(codec.encode_auth(codec.Reason.CONTINUE_AUTHENTICATION,
                                       auth_props(client.get_client_final().encode())))
        assert connack_code(read_packet(sock)) == codec.Reason.BAD_USERNAME_OR_PASSWORD
        assert_closed(sock)
    assert salts[1] == salts[2] != salts[0]
    # the CONNECT's User Name names another identity; a password beside the method
    sock, _, answer = begin(scram_edge, "bob", BOB_SCRAM, username="alice")
    assert connack_code(answer) == codec.Reason.BAD_USERNAME_OR_PASSWORD
    assert_closed(sock)
    sock, _, answer = begin(scram_edge, "bob", BOB_SCRAM, username="bob", password=b"pw")
    assert connack_code(answer) == codec.Reason.BAD_USERNAME_OR_PASSWORD
    assert_closed(sock)
    for name in ("scram_bad_proof", "scram_no_scram_credential", "scram_unknown_identity",
                 "scram_username", "auth_with_password"):
        wait_counter(scram_edge, "connect_refused_" + name)
    bystander.sendall(codec.packet(PacketType.PINGREQ, 0, b""))
    assert read_packet(bystander)[0] >> 4 == PacketType.PINGRESP
    bystander.close()


def test_an_unknown_method_is_refused_with_0x8c(scram_edge):
    sock, _, answer = begin(scram_edge, "bob", BOB_SCRAM, method="PLAIN")
    assert connack_code(answer) == codec.Reason.BAD_AUTHENTICATION_METHOD
    assert_closed(sock)
    assert wait_counter(scram_edge, "connect_refused_auth_method") == 1


def test_auth_out_of_sequence_closes_that_connection_with_its_reason(scram_edge):
    # another packet where the client-final belongs: CONNACK 0x82
    sock, _, (first, _body) = begin(scram_edge, "bob", BOB_SCRAM)
    assert first >> 4 == PacketType.AUTH
    sock.sendall(codec.packet(PacketType.PINGREQ, 0, b""))
    assert connack_code(read_packet(sock)) == codec.Reason.PROTOCOL_ERROR
    assert_closed(sock)
    # AUTH from a client that connected with a password: DISCONNECT 0x82
    sock = raw(scram_edge)
    sock.sendall(codec.encode_connect("pw", version=codec.V5, username="alice",
                                      password=b"alice-secret"))
    assert connack_code(read_packet(sock)) == 0
    sock.sendall(codec.encode_auth(codec.Reason.RE_AUTHENTICATE, auth_props(b"n,,n=alice,r=x")))
    assert read_packet(sock) == (PacketType.DISCONNECT << 4, bytes([0x82]))
    assert_closed(sock)
    # a client-final without a re-authentication begun; a re-authentication as someone else
    sock, _, answer = scram_login(scram_edge, "bob", BOB_SCRAM)
    assert connack_code(answer) == 0
    sock.sendall(codec.encode_auth(codec.Reason.CONTINUE_AUTHENTICATION, auth_props(b"c=biws")))
    assert read_packet(sock) == (PacketType.DISCONNECT << 4, bytes([0x82]))
    assert_closed(sock)
    sock, _, answer = scram_login(scram_edge, "bob", BOB_SCRAM)
    assert connack_code(answer) == 0
    other = ScramClient([METHOD], "alice", "x")
    sock.sendall(codec.encode_auth(codec.Reason.RE_AUTHENTICATE,
                                   auth_props(other.get_client_first().encode())))
    assert read_packet(sock) == (PacketType.DISCONNECT << 4, bytes([0x87]))
    assert_closed(sock)
    # AUTH is no 3.1.1 packet: that connection is closed
    sock = raw(scram_edge)
    sock.sendall(codec.encode_connect("v3", username="alice", password=b"alice-secret"))
    assert connack_code(read_packet(sock)) == 0
    sock.sendall(codec.encode_auth(codec.Reason.RE_AUTHENTICATE))
    assert_closed(sock)
    for name in ("connect_refused_auth_protocol", "closed_auth_without_method",
                 "closed_auth_protocol", "closed_reauth_refused_identity",
                 "refused_auth_unsupported"):
        wait_counter(scram_edge, name)


def test_a_challenge_larger_than_the_clients_maximum_packet_size_is_not_sent(scram_edge):
    client = ScramClient([METHOD], "bob", BOB_SCRAM)
    sock = raw(scram_edge)
    sock.sendall(codec.encode_connect("small", version=codec.V5, props=auth_props(
        client.get_client_first().encode()) + [(codec.PROP["maximum_packet_size"], 40)]))
    assert_closed(sock)
    assert wait_counter(scram_edge, "closed_connect_refused_client_max_packet") == 1


@pytest.mark.parametrize("data", [b"", b"\xff\xfe\x00", b"n,,", b"garbage", b"n,,n=bob",
                                  b"p=tls-unique,,n=bob,r=abc", b"n,,n=bob,r=" + b"x" * 3000])
def test_a_bad_client_first_is_refused_cleanly_and_the_edge_serves_on(scram_edge, data, caplog):
    sock = raw(scram_edge)
    sock.sendall(codec.encode_connect("bad", version=codec.V5, props=auth_props(data)))
    assert connack_code(read_packet(sock)) == codec.Reason.NOT_AUTHORIZED
    assert_closed(sock)
    assert wait_counter(scram_edge, "connect_refused_scram_malformed") == 1
    sock, _, answer = scram_login(scram_edge, "bob", BOB_SCRAM)
    assert connack_code(answer) == 0
    sock.close()
    assert counter(scram_edge, "closed_internal_error") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_bad_client_final_is_refused_and_the_exchange_is_bounded_in_time(scram_edge):
    sock, _, (first, _body) = begin(scram_edge, "bob", BOB_SCRAM)
    sock.sendall(codec.encode_auth(codec.Reason.CONTINUE_AUTHENTICATION,
                                   auth_props(b"c=biws,r=wrong-nonce,p=AAAA")))
    assert connack_code(read_packet(sock)) == codec.Reason.NOT_AUTHORIZED
    assert_closed(sock)
    # no client-final at all: closed at mqtt.connect_timeout_ms (3 s) from the TCP connect
    sock, _, (first, _body) = begin(scram_edge, "bob", BOB_SCRAM)
    assert first >> 4 == PacketType.AUTH
    assert_closed(sock)
    assert wait_counter(scram_edge, "closed_auth_timeout") == 1


@pytest.mark.parametrize("value,why", [
    ("pencil", "scram-sha-256:ITER"),
    ("scram-sha-256:100:" + "00" * 16 + ":" + "00" * 32 + ":" + "00" * 32, "iteration count"),
    ("scram-sha-256:4096:00:" + "00" * 32 + ":" + "00" * 32, "salt"),
    (42, "must be a string")])
def test_a_bad_scram_credential_stops_the_config_naming_its_key(value, why):
    doc = edge_doc()
    doc["pm"]["identities"]["bob"]["scram_sha256"] = value
    with pytest.raises(ConfigError) as err:
        parse_config(doc)
    assert "pm.identities.bob.scram_sha256" in str(err.value) and why in str(err.value)


def test_a_remote_pm_edge_logs_in_by_scram_with_the_keys_pm_distributes(tmp_path, bob_keys):
    from tests.appliance.helpers import free_port

    pm_fabric, edge_fabric, mqtt_port = free_port(), free_port(), free_port()
    edge = run_appliance(write_config(tmp_path / "edge.toml",
                                      edge_toml(edge_fabric, pm_fabric, mqtt_port)))
    pm = None
    try:
        # sensor's table is the last of pm_toml: its stored keys join it
        pm = run_appliance(write_config(tmp_path / "pm.toml", pm_toml(
            pm_fabric, edge_fabric, "pw") + f'scram_sha256 = "{bob_keys}"\n'))

        class Far:
            port = mqtt_port

        def login() -> int:
            sock, client, answer = scram_login(Far, "sensor", BOB_SCRAM)
            code = connack_code(answer)
            if code == 0:
                client.set_server_final(codec.prop(props_of(*answer),
                                                   "authentication_data").decode())
            sock.close()
            return code

        wait_for(lambda: login() == 0, DEADLINE_S, "a SCRAM login once P&M's document "
                 "reached the edge")
        sock, _, answer = scram_login(Far, "sensor", "wrong")
        assert connack_code(answer) == codec.Reason.BAD_USERNAME_OR_PASSWORD
        sock.close()
        assert edge.poll() is None and pm.poll() is None
    finally:
        for proc in (edge, pm):
            if proc is not None:
                stop(proc)


def test_stored_keys_read_in_both_forms_and_carried_in_the_pm_document(bob_keys):
    import base64

    from appliance.control.credentials import parse_scram, scram_from_document

    keys = parse_scram(bob_keys)
    assert keys.iterations == 4096 and len(keys.salt) == 32
    b64 = [base64.b64encode(x).decode() for x in (keys.salt, keys.stored_key, keys.server_key)]
    assert parse_scram(f"SCRAM-SHA-256$4096:{b64[0]}${b64[1]}:{b64[2]}") == keys
    assert scram_from_document(keys.document()) == keys
    assert scram_from_document({"i": 1, "salt": "00"}) is None
    bad = subprocess.run([sys.executable, "-m", "appliance.control.credentials", "--scram",
                          "--iterations", "100"], input="pw\n", capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--iterations must be in [4096" in bad.stderr
