"""The Wireshark dissector is generated from the layouts and decodes what the codec decodes.

tshark (Debian's) runs the shipped dissector over the golden vectors, over seeded mutants of
them (every malformed frame flagged with the codec's reason and byte offset) and over a
capture of two real appliances on loopback with clients.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap, wrpcap

from appliance.client import connect
from appliance.config import load_config
from appliance.node import Appliance
from appliance.ops.cli import main
from appliance.ops.wireshark import SHIPPED_DISSECTOR, generate
from channels.base import FrameBatch
from channels.tcp import TcpChannel
from datapath.config import NATIVE_UDP_PORT
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.codec import encode_admin, encode_data_frame
from datapath.protocol.frame_layout import FrameType
from tests.appliance.helpers import FABRIC_KEY, free_port, wait_for
from tests.appliance.wireshark_view import (
    assert_same,
    codec_stream_views,
    codec_view,
    requires_tshark,
    tshark_frames,
    tshark_layers,
)

GOLDEN = Path(__file__).resolve().parents[1] / "datapath" / "protocol" / "golden"
VECTORS = [bytes.fromhex(v["hex"]) for v in json.loads((GOLDEN / "vectors.json").read_text())]


def _udp(payload: bytes, dport: int = NATIVE_UDP_PORT) -> Ether:
    return Ether() / IP(src="127.0.0.1", dst="127.0.0.1") / UDP(sport=40001, dport=dport) / payload


def test_the_shipped_dissector_is_what_the_layouts_generate() -> None:
    assert SHIPPED_DISSECTOR.read_text() == generate(), (
        "the declarations in appliance/ops/wireshark/topicwire.lua are stale: run `topicwire "
        "dissector --out appliance/ops/wireshark/topicwire.lua`")


def test_the_dissector_command_writes_the_generated_dissector(tmp_path, capsys) -> None:
    out = tmp_path / "topicwire.lua"
    assert main(["dissector", "--out", str(out)]) == 0
    assert out.read_text() == generate()
    assert main(["dissector", "--out", str(tmp_path / "no" / "such" / "dir.lua")]) == 2
    assert "dissector: cannot write" in capsys.readouterr().err


@requires_tshark
def test_tshark_decodes_every_field_of_every_golden_vector(tmp_path) -> None:
    pcap = tmp_path / "golden.pcap"
    # the golden vectors on the default port, and once more on a port no config names
    wrpcap(str(pcap), [_udp(v) for v in VECTORS] + [_udp(v, dport=51234) for v in VECTORS])
    shown = tshark_frames(pcap)
    assert len(shown) == 2 * len(VECTORS)
    for view, data in zip(shown, VECTORS + VECTORS):
        assert_same(view, codec_view(data), data)
        assert view["malformed"] is None


@requires_tshark
def test_tshark_names_message_keys_from_the_captures_registry_updates(tmp_path) -> None:
    named = encode_admin(FrameType.REGISTRY_UPDATE, [al.RegistryEntry(0xAB, 0, "seen/later")],
                         body_header={"version": 1})
    message = encode_data_frame([{"topic_key": 0xAB, "sequence": 1, "payload": b"p"}])
    other = encode_data_frame([{"topic_key": 0xCD, "sequence": 1, "payload": b"p"}])
    pcap = tmp_path / "named.pcap"
    wrpcap(str(pcap), [_udp(message), _udp(bytes(named)), _udp(message), _udp(other)])
    shown = tshark_frames(pcap)
    names = [view["messages"][0].get("topic_name") for view in (shown[0], shown[2], shown[3])]
    assert names == ["seen/later", "seen/later", None]


def _mutant(rng: random.Random) -> bytes:
    data = bytearray(rng.choice(VECTORS))
    kind = rng.randrange(6)
    if kind == 0:  # a few random bytes anywhere
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == 1:  # cut short
        data = data[: rng.randint(1, len(data) - 1)]
    elif kind == 2:  # longer than it says
        data += bytes(rng.choice((1, 8, 16)))
    elif kind == 3:  # a count or a length in the header
        at, width = rng.choice(((6, 2), (8, 4)))
        data[at : at + width] = rng.randrange(0, 80).to_bytes(width, "big")
    elif kind == 4:  # a body byte set to a value that breaks enums, qos, lengths, UTF-8
        data[rng.randrange(32, len(data))] = rng.choice((0x03, 0x10, 0x80, 0xC0, 0xFF))
    else:  # cut at a multiple of 8 with frame_len kept honest: the body walk decides
        data = data[: max(32, rng.randrange(32, len(data)) // 8 * 8)]
        data[8:12] = len(data).to_bytes(4, "big")
    return bytes(data)


@requires_tshark
def test_tshark_flags_malformed_frames_with_the_codecs_reason_and_offset(tmp_path) -> None:
    # a seed whose 600 mutants reach every reason (and malformed message extensions) over
    # the golden vectors as they are now: a new vector changes what each seed makes
    rng = random.Random(42)
    frames = [_mutant(rng) for _ in range(600)]
    pcap = tmp_path / "mutants.pcap"
    wrpcap(str(pcap), [_udp(f) for f in frames])
    reasons = set()
    for view, data in zip(tshark_frames(pcap), frames):
        expected = codec_view(data)
        assert_same(view, expected, data)
        if expected["malformed"]:
            reasons.add(expected["malformed"][0])
    assert reasons >= {"too_short", "bad_magic", "bad_version", "unknown_type", "unknown_flags",
                       "bad_frame_length", "length_mismatch", "bad_count", "message_overrun",
                       "trailing_bytes", "bad_qos", "bad_field"}, reasons


def _mark(pcap: Path, proc: subprocess.Popen, port: int, marker: bytes) -> None:
    """Send ``marker`` to ``port`` until dumpcap has written it: everything captured before
    it is in the file then (libpcap hands packets over in blocks, not one by one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        def written() -> bool:
            if proc.poll() is not None:
                pytest.skip(f"dumpcap cannot capture on lo here: {proc.stderr.read().strip()}")
            probe.sendto(marker, ("127.0.0.1", port))
            return pcap.exists() and marker in pcap.read_bytes()
        wait_for(written, timeout_s=30, interval_s=0.1, what=f"dumpcap writing {marker!r}")


def _start_capture(pcap: Path, ports: list[int], sentinel: int,
                   transport: str = "udp") -> subprocess.Popen:
    """dumpcap on loopback for ``ports`` and ``sentinel``, live when this returns (or a skip
    when this host lets no one capture)."""
    if shutil.which("dumpcap") is None:
        pytest.skip("dumpcap is not installed (Debian's wireshark-common, which tshark needs)")
    flt = (f"({transport} and (" + " or ".join(f"port {p}" for p in ports) + ")) or "
           f"(udp and port {sentinel})")
    proc = subprocess.Popen(["dumpcap", "-q", "-i", "lo", "-f", flt, "-P", "-w", str(pcap)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _mark(pcap, proc, sentinel, b"capture started")
    return proc


def _fabric_config(path: Path, name: str, port: int, client_port: int, peer: str,
                   peer_port: int) -> Path:
    path.write_text("\n".join([
        "[appliance]", f'name = "{name}"', "heartbeat_interval_ms = 50",
        "[fabric]", f'listen = "127.0.0.1:{port}"', f'key = "{FABRIC_KEY}"',
        "[[neighbours]]", f'name = "{peer}"', f'address = "127.0.0.1:{peer_port}"',
        "[clients]", f'udp = "127.0.0.1:{client_port}"',
        "[pm]", "require_passwords = false",
        "[pm.identities.feed]", 'publish = ["#"]', 'subscribe = ["#"]']) + "\n")
    return path


@requires_tshark
def test_tshark_decodes_a_capture_of_two_real_appliances_and_their_clients(tmp_path,
                                                                           capsys) -> None:
    fa, fb, ca, cb, sentinel = (free_port() for _ in range(5))
    configs = [_fabric_config(tmp_path / "a.toml", "wa", fa, ca, "wb", fb),
               _fabric_config(tmp_path / "b.toml", "wb", fb, cb, "wa", fa)]
    pcap = tmp_path / "fabric.pcap"
    dumpcap = _start_capture(pcap, [fa, fb, ca, cb], sentinel)
    apps = []
    try:
        apps = [Appliance(load_config(c)).start() for c in configs]
        with connect(f"127.0.0.1:{cb}", "feed", timeout_s=10) as sc, \
                connect(f"127.0.0.1:{ca}", "feed", timeout_s=10) as pc:
            sub = sc.subscribe("prices/#")
            deadline = time.monotonic() + 30
            got = None
            while got is None and time.monotonic() < deadline:
                pc.publish("prices/eu/ibm", b"across the fabric", flush=True)
                got = sub.get(timeout=0.2)
            assert got is not None and got.topic == "prices/eu/ibm"
    finally:
        for app in apps:
            app.stop()
        _mark(pcap, dumpcap, sentinel, b"capture ends")
        dumpcap.send_signal(signal.SIGINT)
        dumpcap.wait(30)
    packets = rdpcap(str(pcap))
    shown = tshark_frames(pcap)
    assert len(shown) == len(packets)
    types = set()
    for packet, view in zip(packets, shown):
        data = bytes(packet[UDP].payload)
        if packet[UDP].dport == sentinel:
            assert view is None
            continue
        expected = codec_view(data)
        assert_same(view, expected, data)
        assert expected["malformed"] is None
        types.add(expected["header"]["frame_type"])
    assert {FrameType.HELLO, FrameType.HEARTBEAT, FrameType.CONTROL, FrameType.DATA,
            FrameType.REGISTRY_UPDATE} <= types, types
    # the same capture through `topicwire pcap`: the ports of both configs, topics named
    assert main(["pcap", str(pcap), "--json", "--config", str(configs[0]), "--config",
                 str(configs[1])]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    summary = records.pop()["summary"]
    sentinels = sum(1 for packet in packets if packet[UDP].dport == sentinel)
    assert summary["malformed"] == {} and summary["other_packets"] == sentinels
    assert summary["ports"] == sorted([fa, fb, ca, cb])
    data = [r for r in records if r["kind"] == "message" and r["frame_type"] == "DATA"]
    assert data and {r["topic"] for r in data} == {"prices/eu/ibm"}
    # and in tshark: each DATA message carries its topic or is named by an update
    shown_topics = {m.get("topic") or m.get("topic_name") for view in shown if view
                    for m in view["messages"]}
    assert shown_topics == {"prices/eu/ibm"}, shown_topics


@requires_tshark
def test_tshark_decodes_frames_on_a_tcp_channel_as_the_codec_decodes_the_stream(tmp_path) -> None:
    """Frames back to back on a real TCP channel (channels/tcp.py) on loopback, written in
    pieces that do not follow frame boundaries, the last one malformed (a frame_len no frame
    can have: the channel closes the connection there, the dissector flags it)."""
    bad = bytearray(VECTORS[0])
    bad[8:12] = (fl.MAX_FRAME_BYTES + 8).to_bytes(4, "big")
    stream = b"".join(VECTORS) + bytes(bad)
    server = TcpChannel(listen=("127.0.0.1", 0))
    sentinel = free_port()
    pcap = tmp_path / "tcp.pcap"
    dumpcap = _start_capture(pcap, [server.local_address[1]], sentinel, transport="tcp")
    try:
        with socket.create_connection(server.local_address) as client:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            batch, got = FrameBatch(64, fl.MAX_FRAME_BYTES), []
            for start in range(0, len(stream), 333):  # segments cut mid-frame
                client.sendall(stream[start : start + 333])

            def every_good_frame() -> bool:
                count = server.receive(batch, timeout_ns=10_000_000)
                got.extend(bytes(batch.frame(i)) for i in range(count))
                return len(got) >= len(VECTORS)
            wait_for(every_good_frame, what="the TCP channel cutting out every good frame")
            assert got == VECTORS  # (the channel drops the bad one and the connection)
    finally:
        server.close()
        _mark(pcap, dumpcap, sentinel, b"capture ends")
        dumpcap.send_signal(signal.SIGINT)
        dumpcap.wait(30)
    shown = [view for layers in tshark_layers(pcap) for view in layers]
    expected = codec_stream_views(stream)
    assert len(shown) == len(expected) == len(VECTORS) + 1
    for view, (decoded, data) in zip(shown, expected):
        assert_same(view, decoded, data)
    assert shown[-1]["malformed"] == ("bad_frame_length", fl.FRAME_LEN_OFFSET)
