"""MQTT over TLS (server certificate, optional and required client certificates, a client
certificate's CN as the P&M identity) and over WebSocket (subprotocol ``mqtt``), with
paho-mqtt and raw ``ssl``/``websockets`` peers on 127.0.0.1; test certificates are made with
the ``openssl`` CLI in a temporary directory."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from appliance.config import ConfigError, parse_config
from appliance.edge.mqtt import codec
from appliance.edge.node import EdgeAppliance
from tests.edge.conftest import DEADLINE_S, counter, edge_doc, start_edge, wait_counter
from tests.edge.peers import Peer


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """A CA, the server's certificate (127.0.0.1) and client certificates by CN, made with
    the ``openssl`` CLI (EC P-256 keys)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    d = tmp_path_factory.mktemp("pki")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=test CA", cwd=d)
    out = {"ca": (str(d / "ca.crt"), str(d / "ca.key"))}
    for cn in ("127.0.0.1", "alice", "mallory"):
        name = cn.replace(".", "_")
        _openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}", cwd=d)
        (d / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1\n" if cn == "127.0.0.1"
                                       else "basicConstraints=CA:FALSE\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                 "-out", f"{name}.crt", cwd=d)
        out[cn] = (str(d / f"{name}.crt"), str(d / f"{name}.key"))
    return out


def tls_edge(pki, **extra) -> EdgeAppliance:
    cert, key = pki["127.0.0.1"]
    return start_edge(tls_listen="127.0.0.1:0", tls_cert_file=cert, tls_key_file=key,
                      tls_ca_file=pki["ca"][0], **extra)


def client_ctx(pki, cn: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki["ca"][0])
    if cn is not None:
        ctx.load_cert_chain(*pki[cn])
    return ctx


def tls_port(edge) -> int:
    return edge.mqtt.addresses["tls"][1]


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_mqtt_over_tls_with_a_password_reaches_tcp_clients(pki, version):
    edge = tls_edge(pki)
    try:
        with Peer(edge, f"tls-sub-{version}", version=version, port=tls_port(edge),
                  tls=client_ctx(pki)) as sub, Peer(edge, f"tcp-pub-{version}") as pub:
            assert sub.rc == 0 and sub.subscribe("secure/#", 1) == 1
            pub.publish("secure/a", b"over tls", 1)
            assert sub.next().payload == b"over tls"
        assert counter(edge, "connections_opened_tls") == 1
    finally:
        edge.stop()


def test_a_client_certificate_cn_is_the_identity(pki):
    edge = tls_edge(pki, tls_identity_from_cert=True)
    try:
        port = tls_port(edge)
        with Peer(edge, "by-cert", user=None, port=port, tls=client_ctx(pki, "alice")) as peer:
            assert peer.rc == 0 and peer.subscribe("alice/#", 1) == 1   # alice may
        assert counter(edge, "connects_by_certificate") == 1
        unknown = Peer(edge, "no-identity", user=None, port=port, tls=client_ctx(pki, "mallory"))
        unknown.client.loop_stop()
        assert unknown.rc.value == 0x87
        assert counter(edge, "connect_refused_cert_identity") == 1
        other = Peer(edge, "other-user", user="bob", port=port, tls=client_ctx(pki, "alice"))
        other.client.loop_stop()
        assert other.rc.value == 0x86
        no_cert = Peer(edge, "no-cert", user=None, port=port, tls=client_ctx(pki))
        no_cert.client.loop_stop()
        assert no_cert.rc.value == 0x87    # no certificate and no username: anonymous
    finally:
        edge.stop()


def test_a_required_client_certificate_refuses_the_handshake_without_one(pki):
    edge = tls_edge(pki, tls_require_client_cert=True)
    try:
        raw = socket.create_connection(("127.0.0.1", tls_port(edge)), timeout=DEADLINE_S)
        with client_ctx(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            # TLS 1.3: the refusal of the missing certificate arrives with the first read
            with pytest.raises((ssl.SSLError, ConnectionError)):
                tls.sendall(codec.encode_connect("x", username="alice",
                                                 password=b"alice-secret"))
                if not tls.recv(1):
                    raise ConnectionError("closed")
        with Peer(edge, "with-cert", port=tls_port(edge), tls=client_ctx(pki, "alice")) as ok:
            assert ok.rc == 0
    finally:
        edge.stop()


def test_tls_keys_are_checked_naming_the_key(pki, tmp_path):
    doc = edge_doc(tls_listen="127.0.0.1:0")
    with pytest.raises(ConfigError, match="mqtt.tls_cert_file: required with mqtt.tls_listen"):
        parse_config(doc)
    doc = edge_doc(tls_cert_file=pki["127.0.0.1"][0])
    with pytest.raises(ConfigError, match="mqtt.tls_cert_file: only with mqtt.tls_listen"):
        parse_config(doc)
    doc = edge_doc(tls_listen="127.0.0.1:0", tls_cert_file=pki["127.0.0.1"][0],
                   tls_key_file=pki["127.0.0.1"][0], tls_require_client_cert=True)
    with pytest.raises(ConfigError, match="mqtt.tls_require_client_cert: needs mqtt.tls_ca"):
        parse_config(doc)
    del doc["mqtt"]["tls_require_client_cert"]
    edge = EdgeAppliance(parse_config(doc))   # the certificate given as its own key
    with pytest.raises(ConfigError, match="mqtt.tls_cert_file: .* does not load"):
        edge.start()
    bad = tmp_path / "missing.pem"
    with pytest.raises(ConfigError, match="mqtt.tls_key_file: no such file"):
        parse_config(edge_doc(tls_listen="127.0.0.1:0", tls_cert_file=pki["ca"][0],
                              tls_key_file=str(bad)))


@pytest.fixture
def ws_edge():
    edge = start_edge(ws_listen="127.0.0.1:0")
    try:
        yield edge
    finally:
        edge.stop()


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_mqtt_over_websocket_reaches_tcp_clients_both_ways(ws_edge, version):
    port = ws_edge.mqtt.addresses["ws"][1]
    with Peer(ws_edge, f"ws-{version}", version=version, transport="websockets",
              port=port) as ws, Peer(ws_edge, f"tcp-{version}") as tcp:
        assert ws.rc == 0
        assert ws.subscribe("web/in/#", 1) == 1 and tcp.subscribe("web/out/#", 1) == 1
        tcp.publish("web/in/a", b"to the browser", 1)
        assert ws.next().payload == b"to the browser"
        ws.publish("web/out/b", b"from the browser", 2)
        assert tcp.next().payload == b"from the browser"
    assert counter(ws_edge, "connections_opened_ws") == 1


def _ws_exchange(port: int, subprotocols, messages) -> bytes:
    """Send ``messages`` over a WebSocket and return what comes back until it closes."""
    from websockets.asyncio.client import connect

    async def run() -> bytes:
        got = b""
        async with connect(f"ws://127.0.0.1:{port}/mqtt", subprotocols=subprotocols,
                           open_timeout=DEADLINE_S) as ws:
            for m in messages:
                await ws.send(m)
            try:
                async with asyncio.timeout(DEADLINE_S):
                    async for reply in ws:
                        got += reply if isinstance(reply, bytes) else reply.encode()
                        if got[:1] == b"\x20" and len(got) >= 4:
                            break
            except Exception:
                pass
        return got

    return asyncio.run(run())


def test_a_packet_may_span_websocket_messages(ws_edge):
    port = ws_edge.mqtt.addresses["ws"][1]
    connect = codec.encode_connect("split", username="alice", password=b"alice-secret")
    got = _ws_exchange(port, ["mqtt"], [connect[:5], connect[5:]])
    assert got == b"\x20\x02\x00\x00"       # CONNACK accepted


def test_websocket_peers_without_the_mqtt_subprotocol_or_with_text_are_closed(ws_edge):
    port = ws_edge.mqtt.addresses["ws"][1]
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus, match="HTTP 400"):   # refused by the handshake
        _ws_exchange(port, None, [])
    assert _ws_exchange(port, ["mqtt"], ["CONNECT as text"]) == b""
    wait_counter(ws_edge, "closed_ws_text_message")
    with Peer(ws_edge, "ws-after", transport="websockets", port=port) as peer:
        assert peer.rc == 0


def test_garbage_on_the_tls_and_websocket_ports_ends_only_that_connection(pki):
    edge = tls_edge(pki, ws_listen="127.0.0.1:0")
    try:
        for name in ("tls", "ws"):
            with socket.create_connection(("127.0.0.1", edge.mqtt.addresses[name][1]),
                                          timeout=DEADLINE_S) as sock:
                sock.sendall(b"\x10\xff\xff\xff\xff garbage that is neither TLS nor HTTP\r\n\r\n")
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65_536):   # until the edge closes it
                    pass
        with Peer(edge, "after-garbage", port=tls_port(edge), tls=client_ctx(pki)) as peer, \
                Peer(edge, "after-garbage-ws", transport="websockets",
                     port=edge.mqtt.addresses["ws"][1]) as ws:
            assert peer.rc == 0 and ws.rc == 0
            assert ws.subscribe("g/#", 1) == 1
            peer.publish("g/1", b"still up", 1)
            assert ws.next().payload == b"still up"
    finally:
        edge.stop()


def test_websocket_over_tls_with_a_certificate_identity(pki):
    edge = tls_edge(pki, ws_listen="127.0.0.1:0", ws_tls=True, tls_identity_from_cert=True)
    try:
        port = edge.mqtt.addresses["ws"][1]
        with Peer(edge, "wss-cert", user=None, version=5, transport="websockets", port=port,
                  tls=client_ctx(pki, "alice")) as peer, Peer(edge, "wss-tcp") as tcp:
            assert peer.rc == 0 and peer.subscribe("wss/#", 1) == 1
            tcp.publish("wss/a", b"encrypted", 1)
            assert peer.next().payload == b"encrypted"
        assert counter(edge, "connections_opened_wss") == 1
        assert counter(edge, "connects_by_certificate") == 1
    finally:
        edge.stop()


def test_ws_tls_needs_the_websocket_and_tls_listeners():
    with pytest.raises(ConfigError, match="mqtt.ws_tls: only with mqtt.ws_listen"):
        parse_config(edge_doc(ws_tls=True))
    with pytest.raises(ConfigError, match="mqtt.ws_tls: needs mqtt.tls_listen"):
        parse_config(edge_doc(ws_listen="127.0.0.1:0", ws_tls=True))
    with pytest.raises(ConfigError, match="mqtt.ws_tls: must be true or false"):
        parse_config(edge_doc(ws_listen="127.0.0.1:0", ws_tls="on"))


def test_a_websocket_flood_is_held_back_not_buffered(ws_edge):
    """A peer that sends faster than its connection reads: the edge stops reading its socket
    (two packets' worth unread, plus the message being taken) instead of buffering the
    megabyte it sends."""
    from websockets.asyncio.client import connect

    port = ws_edge.mqtt.addresses["ws"][1]
    login = codec.encode_connect("flood", username="alice", password=b"alice-secret")
    # QoS 0 PUBLISHes sent before the CONNACK could be read: the connection is busy
    # logging in while the flood arrives
    flood = codec.encode_publish("flood/x", b"f" * 1000, 0) * 50

    async def run() -> int:
        async with connect(f"ws://127.0.0.1:{port}/mqtt", subprotocols=["mqtt"],
                           open_timeout=DEADLINE_S) as ws:
            await ws.send(login)
            for _ in range(20):
                await ws.send(flood)
            reader = [c for c in ws_edge.mqtt.open if c.transport == "ws"][0].reader
            peak = len(reader._buf)
            await ws.close()
            return peak

    peak = asyncio.run(run())
    assert peak <= 3 * 65_536   # mqtt.max_packet_bytes's default: 2 packets + 1 message
    wait_counter(ws_edge, "publishes_in", 1)
