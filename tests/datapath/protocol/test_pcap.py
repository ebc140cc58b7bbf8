"""``topicwire pcap`` prints every native message and admin entry, reports malformed frames."""

import json
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
from datapath.protocol.codec import encode_data_frame
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
    summary = out[-1]
    assert summary.startswith("summary:")
    assert "2 malformed (bad_magic: 1, length_mismatch: 1)" in summary
    assert "1 other packets" in summary


def test_pcap_json_lines_end_with_the_summary(capture, capsys):
    assert main(["pcap", str(capture), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    summary = records[-1]["summary"]
    messages = [r for r in records[:-1] if r["kind"] == "message"]
    assert summary["messages"] == len(messages) == 5 + 1 + 1  # golden, IPv6, fragmented
    assert summary["malformed"] == {"bad_magic": 1, "length_mismatch": 1}
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
