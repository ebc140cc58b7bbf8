"""Fixtures of the MQTT edge tests: an edge appliance started for real in this process, with
P&M identities that have passwords, and helpers that wait with deadlines."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from appliance.config import parse_config
from appliance.control.credentials import hash_password
from appliance.edge.mqtt import codec
from appliance.edge.node import EdgeAppliance
from tests.appliance import helpers
from tests.appliance.helpers import free_port

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}
DEADLINE_S = 30.0


def edge_doc(**mqtt: Any) -> dict:
    """An edge config document: clients over UDP, embedded P&M, ``[mqtt]`` on a free port."""
    hashes = {name: hash_password(pw, n=1 << 10) for name, pw in PASSWORDS.items()}
    return {
        "appliance": {"name": "edge1", "role": "edge"},
        "clients": {"udp": f"127.0.0.1:{free_port()}"},
        "pm": {"require_passwords": False, "identities": {
            "alice": {"publish": ["#"], "subscribe": ["#"], "password": hashes["alice"]},
            "bob": {"publish": ["bob/#", "public/#"], "subscribe": ["bob/#", "public/#"],
                    "password": hashes["bob"]},
            "native": {"publish": ["#"], "subscribe": ["#"]},
        }},
        "mqtt": {"listen": "127.0.0.1:0", **mqtt},
    }


def start_edge(**mqtt: Any) -> EdgeAppliance:
    return EdgeAppliance(parse_config(edge_doc(**mqtt))).start()


@pytest.fixture
def edge() -> Iterator[EdgeAppliance]:
    appliance = start_edge(max_packet_bytes=4_096, max_subscriptions=8)
    try:
        yield appliance
    finally:
        appliance.stop()


def port_of(broker: Any) -> int:
    """The MQTT port of an edge appliance (or of a reference broker with ``port``)."""
    port = getattr(broker, "port", None)
    return port if port is not None else broker.mqtt.address[1]


def wait_for(predicate: Callable[[], Any], timeout_s: float = DEADLINE_S, what: str = "") -> Any:
    """tests/appliance/helpers.py's ``wait_for`` with the edge tests' deadline and a 20 ms
    poll."""
    return helpers.wait_for(predicate, timeout_s, 0.02, what or repr(predicate))


def counter(appliance: EdgeAppliance, name: str) -> int:
    return appliance.mqtt.status()["counters"].get(name, 0)


def wait_counter(appliance: EdgeAppliance, name: str, at_least: int = 1) -> int:
    return wait_for(lambda: counter(appliance, name) >= at_least and counter(appliance, name),
                    what=f"counter {name} >= {at_least} (now {appliance.mqtt.status()})")


def raw(appliance: EdgeAppliance) -> socket.socket:
    """A plain TCP connection to the edge's MQTT port (a hostile or scripted peer)."""
    sock = socket.create_connection(("127.0.0.1", port_of(appliance)), timeout=DEADLINE_S)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {out!r}")
        out += chunk
    return out


def closed_by_peer(sock: socket.socket) -> bytes:
    """Read until the edge closes the connection (deadline: the socket's timeout); returns
    what it sent before."""
    out = b""
    while True:
        try:
            chunk = sock.recv(65_536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def read_packet(sock: socket.socket) -> tuple[int, bytes]:
    """One MQTT packet from the edge: (first byte, body)."""
    first = recv_exactly(sock, 1)[0]
    header = b""
    while True:
        header += recv_exactly(sock, 1)
        got = codec.read_remaining_length(header)
        if got is not None:
            break
    return first, recv_exactly(sock, got[0])


def raw_connect(appliance: EdgeAppliance, client_id: str, version: int = 4,
                clean: bool = True, props: codec.Props | None = None,
                keep_alive_s: int = 60, will: codec.Will | None = None
                ) -> tuple[socket.socket, bytes]:
    """A scripted peer logged in as alice: its socket and the CONNACK's body."""
    sock = raw(appliance)
    sock.sendall(codec.encode_connect(client_id, version=version, username="alice",
                                      password=b"alice-secret", keep_alive_s=keep_alive_s,
                                      clean=clean, props=props, will=will))
    first, body = read_packet(sock)
    assert first >> 4 == codec.PacketType.CONNACK and body[1] == 0, body
    return sock, body


def logged_in(appliance: EdgeAppliance, version: int = 4, client_id: str = "raw",
              keep_alive_s: int = 60) -> socket.socket:
    return raw_connect(appliance, client_id, version, keep_alive_s=keep_alive_s)[0]
