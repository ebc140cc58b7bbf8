"""The codec and the scapy layer produce and read the same stored golden bytes."""

import json
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP

from datapath.config import NATIVE_UDP_PORT
from datapath.protocol import admin_layout as al
from datapath.protocol import scapy_native as sn
from datapath.protocol.codec import decode_frame, encode_admin, encode_data_frame
from datapath.protocol.frame_layout import FrameType

VECTORS = json.loads((Path(__file__).parent / "golden" / "vectors.json").read_text())
IDS = [v["name"] for v in VECTORS]

ENTRY_TYPES = {t: layout.entry_type for t, layout in al.ADMIN_LAYOUTS.items()}
SCAPY_NAMES = {"payload": "data", "name": "node_name", "flags": "sub_flags"}


def _value(v):
    return bytes.fromhex(v["hex"]) if isinstance(v, dict) else v


def _entry(ftype, fields):
    return ENTRY_TYPES[FrameType(ftype)](**{k: _value(v) for k, v in fields.items()})


def _scapy_fields(fields, entry_cls):
    out = {}
    for key, value in fields.items():
        value = _value(value)
        name = key
        if key in SCAPY_NAMES and not (key == "flags" and entry_cls is sn.NativeMessage):
            name = SCAPY_NAMES[key]
        if isinstance(value, str):
            value = value.encode()
        out[name] = value
    return out


@pytest.mark.parametrize("vector", VECTORS, ids=IDS)
def test_codec_encodes_exactly_the_golden_bytes(vector):
    header = vector["header"]
    if "messages" in vector:
        msgs = [{k: _value(v) for k, v in m.items()} for m in vector["messages"]]
        data = encode_data_frame(msgs, **header)
    else:
        ftype = FrameType(header["frame_type"])
        entries = [_entry(ftype, e) for e in vector["entries"]]
        data = bytes(encode_admin(ftype, entries, body_header=vector["body_header"],
                                  source_session=header["source_session"],
                                  stream_id=header["stream_id"],
                                  send_ts_ns=header["send_ts_ns"],
                                  auth=tuple(vector["auth"]) if vector["auth"] else None))
    assert data.hex() == vector["hex"]


@pytest.mark.parametrize("vector", VECTORS, ids=IDS)
def test_scapy_builds_exactly_the_golden_bytes(vector):
    header = dict(vector["header"])
    ftype = header.pop("frame_type")
    cls = sn.ENTRY_CLASSES[ftype]
    items = vector.get("messages") or vector["entries"]
    entries = [cls(**_scapy_fields(item, cls)) for item in items]
    extra = {}
    if vector.get("body_header"):
        extra["registry_version"] = vector["body_header"]["version"]
    if vector.get("auth"):
        key_id, epoch, auth_seq = vector["auth"]
        extra["flags"] = "AUTH_TRAILER"
        extra["auth"] = sn.AuthTrailer(key_id=key_id, epoch=epoch, auth_seq=auth_seq)
    frame = sn.NativeFrame(frame_type=ftype, entries=entries, **header, **extra)
    assert bytes(frame).hex() == vector["hex"]


@pytest.mark.parametrize("vector", VECTORS, ids=IDS)
def test_codec_and_scapy_read_back_the_same_fields(vector):
    data = bytes.fromhex(vector["hex"])
    frame = decode_frame(data)
    dissected = sn.NativeFrame(data)
    assert int(dissected.frame_type) == frame.header.frame_type == vector["header"]["frame_type"]
    assert dissected.frame_len == frame.header.frame_len == len(data)
    assert dissected.msg_count == frame.header.msg_count
    if "messages" in vector:
        decoded = [m.snapshot() for m in frame.messages()]
        for want, got, scapy_msg in zip(vector["messages"], decoded, dissected.entries):
            assert got["payload"] == _value(want["payload"]) == scapy_msg.data
            assert got["topic_key"] == want["topic_key"] == scapy_msg.topic_key
            assert got["sequence"] == want["sequence"] == scapy_msg.sequence
            assert got["topic"] == want.get("topic", "") == scapy_msg.topic.decode()
        assert len(decoded) == len(vector["messages"])
    else:
        body, entries = frame.admin()
        assert body == (vector["body_header"] or {})
        assert entries == [_entry(frame.header.frame_type, e) for e in vector["entries"]]
        assert len(dissected.entries) == len(entries)
    assert bytes(dissected) == data


def test_scapy_dissects_native_frames_inside_udp_on_the_configured_port():
    data = bytes.fromhex(VECTORS[0]["hex"])
    wire = bytes(IP(src="127.0.0.1", dst="127.0.0.1") / UDP(sport=40000, dport=NATIVE_UDP_PORT)
                 / data)
    packet = IP(wire)
    assert packet.haslayer(sn.NativeFrame)
    assert packet[sn.NativeFrame].entries[0].topic_key == VECTORS[0]["messages"][0]["topic_key"]


def test_bind_port_makes_scapy_dissect_another_port():
    data = bytes.fromhex(VECTORS[0]["hex"])
    wire = bytes(IP() / UDP(sport=40000, dport=41234) / data)
    assert not IP(wire).haslayer(sn.NativeFrame)
    sn.bind_port(41234)
    assert IP(wire).haslayer(sn.NativeFrame)
