"""``topicwire pcap`` prints every native message and admin entry, reports malformed frames."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP, fragment
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from appliance.ops.cli import main
from datapath.config import NATIVE_UDP_PORT
from datapath.protocol import admin_layout as al
from datapath.protocol.codec import encode_admin, encode_data_frame
from datapath.protocol.frame_layout import FrameType
from datapath.topics.registry import KeyRegistry
from tests.datapath.protocol.frames import data_frame

VECTORS = json.loads((Path(__file__).parent / "golden" / "vectors.json").read_text())


def udp(payload, dport=NATIVE_UDP_PORT, src="127.0.0.1"):
    return Ether() / IP(src=src, dst="127.0.0.1") / UDP(sport=40001, dport=dport) / payload


@pytest.fixture
def capture(tmp_path):
    packets = [udp(bytes.fromhex(v["hex"])) for v in VECTORS]
    packets.append(udp(b"not a native frame at all, only some bytes"))  # bad magic
    packets.append(udp(data_frame(2) + bytes(8)))  # datagram longer than its frame
    packets.append(udp(b"dns?", dport=53))
    packets.append(Ether() / IPv6(src="::1", dst="::1") / UDP(sport=1, dport=NATIVE_UDP_PORT)
                   / data_frame(1))
    big = encode_data_frame([{"topic_key": 99, "sequence": 5, "payload": b"z" * 5000}])
    packets += fragment(udp(big, src="10.9.0.1"), fragsize=1400)
    path = tmp_path / "native.pcap"
    wrpcap(str(path), packets)
    return path


def test_pcap_prints_a_line_per_message_and_entry_and_a_summary(capture, capsys):
    assert main(["pcap", str(capture)]) == 0
    out = capsys.readouterr().out.splitlines()
    data_lines = [line for line in out if " DATA " in line]
    assert any("key=0x1122334455667788" in line and "seq=1 " in line for line in data_lines)
    assert any("topic=nyse/rtf/ibm" in line for line in data_lines)
    assert any("NAK" in line and "first_seq=10 last_seq=12" in line for line in out)
    assert any("key=0x0000000000000063" in line and "len=5000" in line for line in out)
    assert any("headers={trace-id=abc123,bin=0x00ff}" in line for line in data_lines)
    assert any("headers={k=v} segment=5:1/3 bytes=0+11/3000" in line for line in data_lines)
    summary = out[-1]
    assert summary.startswith("summary:")
    assert "2 malformed (bad_magic: 1, length_mismatch: 1)" in summary
    assert "1 other packets" in summary


def test_pcap_json_lines_end_with_the_summary(capture, capsys):
    assert main(["pcap", str(capture), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    summary = records[-1]["summary"]
    messages = [r for r in records[:-1] if r["kind"] == "message"]
    golden = sum(len(v.get("messages", ())) for v in VECTORS)
    assert summary["messages"] == len(messages) == golden + 1 + 1  # golden, IPv6, fragmented
    assert summary["malformed"] == {"bad_magic": 1, "length_mismatch": 1}
    with_headers = [r for r in messages if "headers" in r]
    assert {"trace-id": "abc123", "bin": {"hex": "00ff"}} in [r["headers"] for r in with_headers]
    (seg,) = [r for r in messages if "segment" in r]
    assert seg["segment"] == {"id": 5, "total_len": 3000, "offset": 0, "index": 0, "count": 3}
    assert seg["app_payload_len"] == len(b"first-chunk")
    assert {r["reason"] for r in records if r.get("kind") == "malformed"} == {
        "bad_magic", "length_mismatch"}


def test_pcap_on_another_port_sees_only_that_port(tmp_path, capsys):
    path = tmp_path / "other.pcap"
    wrpcap(str(path), [udp(data_frame(3), dport=5555), udp(data_frame(1))])
    assert main(["pcap", str(path), "--port", "5555"]) == 0
    out = capsys.readouterr().out
    assert out.count(" DATA ") == 3
    assert "1 other packets" in out


@pytest.mark.parametrize("args, message", [
    (["pcap", "/nonexistent.pcap"], "no such capture file"),
    (["pcap", __file__], "cannot read capture"),
])
def test_pcap_refuses_bad_files_with_exit_2(args, message, capsys):
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_pcap_refuses_a_bad_port_through_the_installed_command(capture):
    exe = shutil.which("topicwire") or str(Path(sys.executable).parent / "topicwire")
    done = subprocess.run([exe, "pcap", str(capture), "--port", "70000"], capture_output=True,
                          text=True)
    assert done.returncode == 2
    assert "port must be 1..65535" in done.stderr


# --- ports, topic names, one way to print keys and times, folded tail probes (issue 22) ------

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z"


def _registry_update(*entries):
    return bytes(encode_admin(FrameType.REGISTRY_UPDATE,
                              [al.RegistryEntry(key, 0, topic) for key, topic in entries],
                              body_header={"version": 1}))


def _message(key, seq, frame_type=FrameType.DATA):
    return encode_data_frame([{"topic_key": key, "sequence": seq, "payload": b"p"}],
                             frame_type=frame_type, source_session=3, stream_id=4)


def test_pcap_reads_native_frames_on_any_port_by_default_and_only_named_ports_when_told(
        tmp_path, capsys):
    path = tmp_path / "clients.pcap"
    wrpcap(str(path), [udp(data_frame(1), dport=47471), udp(b"XX not native", dport=47471),
                       udp(data_frame(2), dport=50000)])
    assert main(["pcap", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])["summary"]
    assert summary["messages"] == 3 and summary["malformed"] == {}
    assert summary["other_packets"] == 1  # no magic, not on a named port
    config = tmp_path / "a.toml"
    config.write_text('[appliance]\nname = "a"\n[fabric]\nlisten = "127.0.0.1:47480"\n'
                      '[clients]\nudp = "127.0.0.1:47471"\n')
    assert main(["pcap", str(path), "--json", "--config", str(config)]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])["summary"]
    assert summary["ports"] == [47471, 47480] and not summary["any_port_with_magic"]
    assert summary["messages"] == 1 and summary["malformed"] == {"too_short": 1}
    assert summary["other_packets"] == 1  # port 50000: no config names it


def test_pcap_names_topics_from_the_captures_registry_updates_and_a_registry_file(
        tmp_path, capsys):
    registry = KeyRegistry()
    filed = registry.key_for("from/the/file")
    registry_path = tmp_path / "registry.json"
    registry.save(registry_path)
    path = tmp_path / "named.pcap"
    wrpcap(str(path), [udp(_message(0xAB, 1)), udp(_registry_update((0xAB, "seen/later"))),
                       udp(_message(filed, 2)), udp(_message(0xCD, 3))])
    assert main(["pcap", str(path), "--json", "--registry", str(registry_path)]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()[:-1]]
    topics = {r["topic_key"]: r["topic"] for r in records if r["kind"] == "message"}
    assert topics == {"0x00000000000000ab": "seen/later", f"{filed:#018x}": "from/the/file",
                      "0x00000000000000cd": None}
    entry = next(r for r in records if r["kind"] == "admin")
    assert entry["topic_key"] == "0x00000000000000ab"  # hex in admin entries as in messages
    assert all(re.fullmatch(ISO, r["time"]) for r in records)
    assert all(re.fullmatch(ISO, r["publish_time"]) for r in records if r["kind"] == "message")


def test_pcap_folds_repeated_tail_probes_into_one_line(tmp_path, capsys):
    probes = [udp(_message(7, 5, FrameType.RETRANSMISSION)) for _ in range(4)]
    path = tmp_path / "probes.pcap"
    wrpcap(str(path), [udp(_message(7, 5)), *probes, udp(_message(7, 6))])
    assert main(["pcap", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[5] for line in lines[:-1]] == [
        "DATA", "RETRANSMISSION", "RETRANSMISSION", "DATA"]
    assert "tail probe repeated 3 more times since #3" in lines[2]
    assert "3 repeated tail probes folded" in lines[-1]
    assert main(["pcap", str(path), "--no-fold"]) == 0
    assert capsys.readouterr().out.count(" RETRANSMISSION ") == 4
