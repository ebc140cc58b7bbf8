"""Addresses: host names wherever an address is given, IPv6 where the socket can carry it,
refusals that name the key and say what to write; NATS dot subjects refused with their
native spelling."""

from __future__ import annotations

import json
import socket

import pytest

from appliance.client import ClientError, connect
from appliance.config import ConfigError, parse_config
from appliance.node import Appliance
from appliance.ops.cli import main
from tests.appliance.helpers import FABRIC_KEY, free_port


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


requires_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(),
                                   reason="this host has no IPv6 loopback (::1)")


def test_host_names_in_a_config_resolve_when_it_is_loaded() -> None:
    cfg = parse_config({
        "appliance": {"name": "names"},
        "fabric": {"listen": "localhost:47470", "key": FABRIC_KEY},
        "neighbours": [{"name": "b", "address": "localhost:47480"}],
        "clients": {"udp": "localhost:47471"}, "mgmt": {"listen": "localhost:0"}})
    assert cfg.fabric_listen == ("127.0.0.1", 47470)
    assert cfg.clients_udp == ("127.0.0.1", 47471)
    assert cfg.neighbours[0].address == ("127.0.0.1", 47480)


@pytest.mark.parametrize("section, value, message", [
    ({"clients": {"udp": "no-such-host.invalid:47471"}}, None,
     "clients.udp: cannot resolve host name 'no-such-host.invalid'"),
    ({"clients": {"udp": "[::1]:47471"}}, None,
     "clients.udp: [::1]: IPv6 is not supported on the UDP data path yet"),
    ({"fabric": {"listen": "[::1]:47470"}}, None, "fabric.listen: [::1]: IPv6 is not supported"),
    ({"clients": {"udp": "::1:47471"}}, None, "clients.udp: write an IPv6 address in brackets"),
    ({"clients": {"udp": "bad_host!:1"}}, None, "clients.udp: 'bad_host!' is not a host name"),
    ({"mgmt": {"listen": "[::zz]:8470"}}, None, "mgmt.listen: must be \"HOST:PORT\""),
])
def test_a_bad_address_is_refused_naming_the_key_and_what_to_write(section, value,
                                                                  message) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"appliance": {"name": "bad"}, **section})
    assert message in str(info.value)


@pytest.fixture(scope="module")
def appliance():
    port = free_port()
    app = Appliance(parse_config({
        "appliance": {"name": "addr"}, "clients": {"udp": f"localhost:{port}"},
        "pm": {"require_passwords": False,
               "identities": {"feed": {"publish": ["prices/#"], "subscribe": ["prices/#"]}}},
    })).start()
    yield port
    app.stop()


def test_connect_and_the_command_line_take_a_host_name(appliance, capsys) -> None:
    with connect(f"localhost:{appliance}", "feed", timeout_s=10) as client:
        sub = client.subscribe("prices/#")
        client.publish("prices/eu/x", b"by name", flush=True)
        got = sub.get(timeout=10)
        assert got is not None and got.payload == b"by name"
    assert main(["pub", "--appliance", f"localhost:{appliance}", "--identity", "feed",
                 "--topic", "prices/eu/y", "--count", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sent"] == 2


@pytest.mark.parametrize("url, message", [
    ("[::1]:47471", "IPv6 is not supported on the UDP data path yet"),
    ("udp://no-such-host.invalid:47471", "cannot resolve host name 'no-such-host.invalid'"),
])
def test_connect_refuses_what_it_cannot_reach_saying_why(url, message) -> None:
    with pytest.raises(ClientError, match=message.replace("[", r"\[")):
        connect(url, "feed", timeout_s=1)


@pytest.mark.parametrize("call, spelling", [
    (lambda c: c.subscribe("prices.>"), "write 'prices/+/#'"),
    (lambda c: c.subscribe("prices.*.ibm"), "write 'prices/+/ibm'"),
    (lambda c: c.publish("prices.eu.>", b""), "write 'prices/eu/+/#'"),
])
def test_nats_dot_subjects_are_refused_with_their_native_spelling(appliance, call,
                                                                  spelling) -> None:
    with connect(f"127.0.0.1:{appliance}", "feed", timeout_s=10) as client:
        with pytest.raises(ClientError, match="NATS dot syntax") as info:
            call(client)
        assert spelling in str(info.value)


@requires_ipv6
def test_the_management_api_listens_on_ipv6_and_status_reads_it(capsys) -> None:
    app = Appliance(parse_config({"appliance": {"name": "v6"}, "mgmt": {"listen": "[::1]:0"},
                                  "clients": {"udp": f"127.0.0.1:{free_port()}"}})).start()
    try:
        url = app.mgmt.url
        assert url.startswith("http://[::1]:")
        assert main(["status", "--mgmt", url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["node"]["name"] == "v6"
    finally:
        app.stop()


def test_a_config_refuses_nats_dot_subjects_in_entitlements_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"appliance": {"name": "dots"},
                      "pm": {"require_passwords": False,
                             "identities": {"feed": {"subscribe": ["prices.>"]}}}})
    assert str(info.value).startswith("config: pm.identities.feed.subscribe: pattern "
                                      "'prices.>' is in NATS dot syntax")
    assert "write 'prices/+/#'" in str(info.value)
    cfg = parse_config({"appliance": {"name": "dots"},  # a dotted level without wildcards
                        "pm": {"require_passwords": False,
                               "identities": {"feed": {"subscribe": ["prices.eu/#"]}}}})
    assert cfg.identities["feed"].subscribe == ("prices.eu/#",)


def test_rdma_addresses_take_host_names_too() -> None:
    cfg = parse_config({
        "appliance": {"name": "rd"}, "fabric": {"listen": "127.0.0.1:47470", "key": FABRIC_KEY},
        "neighbours": [{"name": "b", "address": "127.0.0.1:47480", "transport": "rdma",
                        "rdma_local": "localhost", "rdma_remote": "localhost",
                        "rdma_port": 47490}]})
    assert (cfg.neighbours[0].rdma.local, cfg.neighbours[0].rdma.remote) == ("127.0.0.1",
                                                                            "127.0.0.1")
    with pytest.raises(ConfigError, match="neighbours\\[0\\].rdma_remote: cannot resolve"):
        parse_config({
            "appliance": {"name": "rd"},
            "fabric": {"listen": "127.0.0.1:47470", "key": FABRIC_KEY},
            "neighbours": [{"name": "b", "address": "127.0.0.1:47480", "transport": "rdma",
                            "rdma_remote": "no-such-host.invalid", "rdma_port": 47490}]})
