"""The Wireshark dissector is generated from the layouts and decodes what the codec decodes.

tshark (Debian's) runs the shipped dissector over the golden vectors, over seeded mutants of
them (every malformed frame flagged with the codec's reason and byte offset) and over a
capture of two real appliances on loopback with clients.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from appliance.ops.cli import main
from appliance.ops.wireshark import SHIPPED_DISSECTOR, generate
from datapath.config import NATIVE_UDP_PORT
from tests.appliance.wireshark_view import (
    assert_same,
    codec_view,
    requires_tshark,
    tshark_frames,
)

GOLDEN = Path(__file__).resolve().parents[1] / "datapath" / "protocol" / "golden"
VECTORS = [bytes.fromhex(v["hex"]) for v in json.loads((GOLDEN / "vectors.json").read_text())]


def _udp(payload: bytes, dport: int = NATIVE_UDP_PORT) -> Ether:
    return Ether() / IP(src="127.0.0.1", dst="127.0.0.1") / UDP(sport=40001, dport=dport) / payload


def test_the_shipped_dissector_is_what_the_layouts_generate() -> None:
    assert SHIPPED_DISSECTOR.read_text() == generate(), (
        "appliance/ops/wireshark/topicwire.lua is stale: run `topicwire dissector --out "
        "appliance/ops/wireshark/topicwire.lua`")


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
    rng = random.Random(22)
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
