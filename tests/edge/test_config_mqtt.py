"""``[mqtt]`` and identity passwords are checked as strictly as the rest of the config: every
refusal is a ``ConfigError`` naming the key; the credential format round-trips."""

from __future__ import annotations

import socket

import pytest

from appliance.config import ConfigError, parse_config
from appliance.control.credentials import hash_password, parse_hash, verify_password
from appliance.edge.node import EdgeAppliance
from tests.edge.conftest import edge_doc


def refusal(doc: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    return str(info.value)


@pytest.mark.parametrize(("change", "key"), [
    ({"listen": None}, "mqtt.listen: required"),
    ({"listen": "no-such-host.invalid:1883"}, "mqtt.listen: cannot resolve host name"),
    ({"listen": "239.1.1.1:1883"}, "mqtt.listen: 239.1.1.1 is a multicast group"),
    ({"max_packet_bytes": 10}, "mqtt.max_packet_bytes: must be an integer in [64,"),
    ({"max_packet_bytes": "big"}, "mqtt.max_packet_bytes: must be an integer"),
    ({"max_connections": 100_001},
     "mqtt.max_connections: must be an integer in [1, 100000]"),
    ({"max_subscriptions": 0}, "mqtt.max_subscriptions: must be an integer"),
    ({"max_inflight": 1.5}, "mqtt.max_inflight: must be an integer"),
    ({"max_queued": -1}, "mqtt.max_queued: must be an integer in [0, 1000000]"),
    ({"allow_anonymous": "yes"}, "mqtt.allow_anonymous: must be true or false"),
    ({"tls": True}, "mqtt.tls: unknown key"),
    ({"max_offline_sessions": -1},
     "mqtt.max_offline_sessions: must be an integer in [0, 100000]"),
    ({"max_session_expiry_s": "1h"}, "mqtt.max_session_expiry_s: must be an integer"),
    ({"topic_alias_maximum": 70_000}, "mqtt.topic_alias_maximum: must be an integer in [0, "
                                      "65535]"),
    ({"server_keep_alive_s": -5}, "mqtt.server_keep_alive_s: must be an integer"),
    ({"response_information": 7}, "mqtt.response_information: must be a string"),
    ({"response_information": "r/#"}, "mqtt.response_information: 'r/#' is not a topic"),
    ({"response_information": "r/{user}/"}, "the only placeholder is {client_id}"),
    ({"ws_listen": "no-such-host.invalid:80"}, "mqtt.ws_listen"),
    ({"tls_listen": "127.0.0.1:0"}, "mqtt.tls_cert_file: required with mqtt.tls_listen"),
    ({"tls_listen": "239.1.1.1:8883"}, "mqtt.tls_listen: 239.1.1.1 is a multicast group"),
    ({"tls_require_client_cert": "yes"}, "mqtt.tls_require_client_cert: must be true or false"),
    ({"tls_identity_from_cert": True}, "mqtt.tls_identity_from_cert: only with mqtt.tls_listen"),
    ({"tls_ca_file": "/nonexistent/ca.pem"}, "mqtt.tls_ca_file: no such file"),
])
def test_bad_mqtt_values_are_refused_naming_the_key(change, key):
    doc = edge_doc()
    for k, v in change.items():
        if v is None:
            del doc["mqtt"][k]
        else:
            doc["mqtt"][k] = v
    assert key in refusal(doc)


def test_mqtt_needs_role_edge_and_a_client_endpoint():
    doc = edge_doc()
    doc["appliance"]["role"] = "core"
    assert refusal(doc).startswith("config: mqtt: only for appliance.role = \"edge\"")
    doc = edge_doc()
    del doc["clients"]["udp"]
    assert "mqtt.listen: needs clients.udp or clients.shm" in refusal(doc)


def test_a_password_must_be_a_scrypt_hash_not_a_password():
    doc = edge_doc()
    doc["pm"]["identities"]["alice"]["password"] = "hunter2"
    message = refusal(doc)
    assert message.startswith("config: pm.identities.alice.password: must be \"scrypt:")
    assert "hunter2" not in message
    doc["pm"]["identities"]["alice"]["password"] = "scrypt:3:8:1:" + "00" * 16 + ":" + "00" * 32
    assert "N must be a power of two" in refusal(doc)


def test_a_port_in_use_fails_the_start_naming_mqtt_listen():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        doc = edge_doc()
        doc["mqtt"]["listen"] = f"127.0.0.1:{busy.getsockname()[1]}"
        edge = EdgeAppliance(parse_config(doc))
        with pytest.raises(ConfigError, match="mqtt.listen: 127.0.0.1:[0-9]+ is in use"):
            edge.start()
        assert edge.mqtt is None


def test_a_websocket_port_in_use_fails_the_start_naming_mqtt_ws_listen():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        doc = edge_doc(ws_listen=f"127.0.0.1:{busy.getsockname()[1]}")
        edge = EdgeAppliance(parse_config(doc))
        with pytest.raises(ConfigError, match="mqtt.ws_listen: 127.0.0.1:[0-9]+ is in use"):
            edge.start()
        assert edge.mqtt is None


def test_scrypt_credentials_verify_only_their_password():
    stored = hash_password("correct horse", n=1 << 10)
    assert parse_hash(stored).n == 1 << 10
    assert verify_password(stored, b"correct horse")
    assert not verify_password(stored, b"correct horsf")
    assert not verify_password("not a hash", b"correct horse")
    assert hash_password("x", n=1 << 10) != hash_password("x", n=1 << 10)  # salted


def test_the_provisioning_command_prints_a_hash_of_the_password_it_reads():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "appliance.control.credentials"],
                          input="s3cret pass\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    stored = done.stdout.strip()
    assert stored.startswith("scrypt:16384:8:1:") and verify_password(stored, b"s3cret pass")
    empty = subprocess.run([sys.executable, "-m", "appliance.control.credentials"], input="",
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "give the password on standard input" in empty.stderr
