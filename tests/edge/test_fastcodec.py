"""The compiled framing kernel (fastcodec.py, _kernels.py) held to codec.py: the same packets,
the same refusals (reason, reason code and detail), the same bytes consumed, over random valid
and malformed packets, and over every way a stream can be split into reads."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.edge.mqtt import _kernels as K
from appliance.edge.mqtt import codec, fastcodec
from appliance.edge.mqtt.codec import PacketType, Reason, Refusal
from tests.edge.mqtt_reference import compiled, reference

BIG = 1 << 20


# --- packets ------------------------------------------------------------------------------------
topics = st.one_of(st.text(max_size=12), st.sampled_from(["a/b", "", "x\x00y", "é/€/𝄞"]))
props_5 = st.lists(st.sampled_from([
    (0x01, 1), (0x02, 30), (0x03, "text/plain"), (0x08, "re/ply"), (0x09, b"\x00\x01"),
    (0x23, 3), (0x26, ("k", "v")), (0x0B, 5), (0x11, 9)]), max_size=3)


@st.composite
def publishes(draw) -> bytes:
    qos = draw(st.integers(0, 2))
    topic = draw(st.one_of(topics.map(str.encode), st.binary(max_size=8)))
    payload = draw(st.binary(max_size=40))
    version = draw(st.sampled_from([codec.V311, codec.V5]))
    props = draw(props_5) if version == codec.V5 and draw(st.booleans()) else None
    return codec.encode_publish(topic, payload, qos, draw(st.booleans()), draw(st.booleans())
                                if qos else False, draw(st.integers(1, 65535)), version, props)


@st.composite
def acks(draw) -> bytes:
    ptype = draw(st.sampled_from([PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL,
                                  PacketType.PUBCOMP]))
    body = draw(st.integers(0, 65535)).to_bytes(2, "big")
    tail = draw(st.sampled_from([b"", b"\x00", b"\x10", b"\x92", b"\x87", b"\x05",
                                 b"\x00\x00", b"\x00\x03\x1f\x00\x00", b"\x92\x00"]))
    flags = 0b0010 if ptype == PacketType.PUBREL else 0
    if draw(st.integers(0, 9)) == 0:
        flags = draw(st.integers(0, 15))
    return codec.packet(ptype, flags, body + tail)


others = st.sampled_from([
    codec.packet(PacketType.PINGREQ, 0, b""),
    codec.encode_subscribe(3, [("a/+", 1)]),
    codec.encode_subscribe(3, [("a/+", 1)], codec.V5),
    codec.encode_connect("c1"),
    codec.encode_connect("c5", version=codec.V5),
    codec.packet(PacketType.DISCONNECT, 0, b""),
    codec.packet(PacketType.UNSUBSCRIBE, 0b0010, b"\x00\x01\x00\x01a"),
    codec.packet(PacketType.CONNACK, 0, b"\x00\x00"),
    codec.encode_auth(0x18, [(0x15, "SCRAM-SHA-256")]),
])


@st.composite
def mutated(draw, packet) -> bytes:
    """A packet with a few bytes changed, cut or added (most stay framable)."""
    data = bytearray(draw(packet))
    for _ in range(draw(st.integers(0, 2))):
        what = draw(st.integers(0, 3))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if what == 0 and data:
            data[i] = draw(st.integers(0, 255))
        elif what == 1 and len(data) > 2:  # the body shorter, the length kept right
            del data[i if i >= 2 else 2]
            data[1:2] = codec.varint(max(len(data) - 2, 0))[:1]
        elif what == 2:
            data.insert(i, draw(st.integers(0, 255)))
        else:
            data[0] = (data[0] & 0xF0) | draw(st.integers(0, 15))
    return bytes(data)


any_packet = st.one_of(publishes(), acks(), others, mutated(publishes()), mutated(acks()),
                       mutated(others), st.binary(min_size=1, max_size=12))
streams = st.lists(any_packet, min_size=1, max_size=8).map(b"".join)
versions = st.sampled_from([0, codec.V311, codec.V5])
max_packets = st.sampled_from([BIG, 64, 20])


# --- the differential tests ---------------------------------------------------------------------
@settings(max_examples=2_000, deadline=None)
@given(streams, versions, max_packets)
def test_a_stream_in_one_read_frames_and_decodes_as_codec_does(data, version, max_packet):
    assert compiled([data], version, max_packet) == reference(data, version, max_packet)


@settings(max_examples=400, deadline=None)
@given(streams, versions, max_packets, st.data())
def test_a_stream_split_into_random_reads_frames_as_codec_does(data, version, max_packet,
                                                                draw):
    cuts = sorted(draw.draw(st.sets(st.integers(1, max(len(data) - 1, 1)), max_size=6)))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    assert compiled(chunks, version, max_packet) == reference(data, version, max_packet)


def test_a_stream_split_at_every_byte_boundary_frames_as_codec_does():
    """Every split into two reads, and one byte a read, of a stream of every kind of hot
    path packet with a malformed one at its end."""
    stream = b"".join([
        codec.encode_publish("a/b", b"x" * 130, 1, False, False, 7),  # 2-byte length
        codec.encode_publish("é/€", b"", 0),
        codec.encode_ack(PacketType.PUBACK, 9),
        codec.encode_ack(PacketType.PUBREL, 10),
        codec.packet(PacketType.PINGREQ, 0, b""),
        codec.encode_publish("a/b", b"y", 2, True, True, 11),
        codec.packet(PacketType.PUBLISH, 0x02, b"\x00\x02\xc3\x28\x00\x01z"),  # bad UTF-8
        codec.encode_ack(PacketType.PUBCOMP, 12),  # after the refusal: not taken
    ])
    want = reference(stream, codec.V311, BIG)
    assert isinstance(want[0][-1], Refusal) and want[0][-1].reason == "bad_utf8"
    for cut in range(len(stream) + 1):
        assert compiled([stream[:cut], stream[cut:]], codec.V311, BIG) == want, cut
    assert compiled([stream[i:i + 1] for i in range(len(stream))], codec.V311, BIG) == want
    # a table of 2 rows: the rest is framed by the next calls
    assert compiled([stream], codec.V311, BIG, rows=2) == want


def test_five_point_zero_publish_properties_and_acks_with_reasons_decode_as_codec_does():
    stream = b"".join([
        codec.encode_publish("t", b"p", 1, False, False, 1, codec.V5),
        codec.encode_publish("t", b"p", 1, False, False, 2, codec.V5,
                             [(0x23, 4), (0x26, ("a", "b")), (0x02, 60)]),
        codec.encode_ack(PacketType.PUBREC, 3, codec.V5, 0x10),
        codec.packet(PacketType.PUBACK, 0, b"\x00\x04\x00\x03\x1f\x00\x00"),  # props: slow
        codec.encode_publish("t", b"p", 1, False, False, 5, codec.V5, [(0x01, 1), (0x01, 0)]),
    ])
    got = compiled([stream], codec.V5, BIG)
    assert got == reference(stream, codec.V5, BIG)
    packets = got[0]
    assert packets[1].props == [(0x23, 4), (0x26, ("a", "b")), (0x02, 60)]
    assert packets[2] == codec.Ack(PacketType.PUBREC, 3, 0x10, [])
    assert packets[4] == Refusal("bad_property", Reason.PROTOCOL_ERROR,
                                 "property payload_format_indicator given twice")


@settings(max_examples=3_000, deadline=None)
@given(st.binary(max_size=16))
def test_the_kernels_utf8_check_is_pythons_strict_decoder_and_the_nul_rule(raw):
    arr = np.frombuffer(bytearray(raw), np.uint8)
    try:
        want = K.ERR_NUL if "\x00" in raw.decode("utf-8") else 0
    except UnicodeDecodeError:
        want = K.ERR_UTF8
    assert K._utf8_error(arr, 0, len(arr)) == want


def test_utf8_boundaries_surrogates_overlongs_and_the_largest_code_point():
    for raw, ok in [(b"\xed\x9f\xbf", True), (b"\xed\xa0\x80", False), (b"\xc0\xaf", False),
                    (b"\xe0\x9f\xbf", False), (b"\xf4\x8f\xbf\xbf", True),
                    (b"\xf4\x90\x80\x80", False), (b"\xf0\x8f\xbf\xbf", False),
                    (b"\xef\xbf\xbf", True), (b"\xe2\x82", False)]:
        arr = np.frombuffer(bytearray(raw), np.uint8)
        assert (K._utf8_error(arr, 0, len(arr)) == 0) == ok, raw


def test_many_connections_in_one_call_each_stop_at_their_own_error():
    """``frame_segments``: one call over three connections' input; the middle one's reserved
    packet type stops it alone, the third's malformed PUBLISH is its last packet."""
    good = codec.encode_publish("a/b", b"1", 1, False, False, 1) + codec.encode_ack(
        PacketType.PUBACK, 2)
    bad_type = codec.encode_ack(PacketType.PUBACK, 3) + b"\x00\x00" + good
    bad_utf8 = good + codec.packet(PacketType.PUBLISH, 0, b"\x00\x01\xff") + good
    partial = good + good[:5]
    parts = [good, bad_type, bad_utf8, partial]
    buf = bytearray(b"".join(parts))
    segments, start = [], 0
    for part in parts:
        segments.append((start, start + len(part), codec.V311, BIG))
        start += len(part)
    got = fastcodec.frame_segments(buf, segments)
    for (seg_start, _, _, _), part, (pos, packets, stop) in zip(segments, parts, got,
                                                                strict=True):
        want_packets, want_pos, want_stop = reference(part, codec.V311, BIG)
        assert (packets, pos - seg_start, stop) == (want_packets, want_pos, want_stop)
    assert got[1][2] == Refusal("bad_packet_type", Reason.MALFORMED, "packet type 0 is reserved")
    assert got[2][1][-1].reason == "bad_utf8"
    assert len(got[0][1]) == 2 and got[3][0] == segments[3][0] + len(good)


PUB = PacketType.PUBLISH
KERNEL_ERRORS = [  # (error the kernel must find itself, the packet, protocol level)
    (K.ERR_RESERVED_TYPE, b"\x00", codec.V311),
    (K.ERR_REMAINING_LENGTH, b"\x30\xff\xff\xff\xff", codec.V311),
    (K.ERR_OVERSIZE, b"\x30\xff\xff\x7f", codec.V311),
    (K.ERR_QOS3, codec.packet(PUB, 0x06, b"\x00\x01a\x00\x01"), codec.V311),
    (K.ERR_DUP_QOS0, codec.packet(PUB, 0x08, b"\x00\x01a"), codec.V5),
    (K.ERR_TRUNCATED, codec.packet(PUB, 0, b"\x00"), codec.V311),
    (K.ERR_TRUNCATED, codec.packet(PUB, 0, b"\x00\x05ab"), codec.V311),
    (K.ERR_TRUNCATED, codec.packet(PUB, 0x02, b"\x00\x01a\x00"), codec.V311),
    (K.ERR_UTF8, codec.packet(PUB, 0, b"\x00\x02\xed\xa0"), codec.V311),
    (K.ERR_NUL, codec.packet(PUB, 0, b"\x00\x02a\x00"), codec.V5),
    (K.ERR_PUBLISH_ID0, codec.packet(PUB, 0x04, b"\x00\x01a\x00\x00"), codec.V311),
    (K.ERR_ACK_FLAGS, codec.packet(PacketType.PUBREL, 0, b"\x00\x01"), codec.V311),
    (K.ERR_ACK_FLAGS, codec.packet(PacketType.PUBACK, 2, b"\x00\x01"), codec.V311),
    (K.ERR_ACK_ID0, codec.packet(PacketType.PUBCOMP, 0, b"\x00\x00"), codec.V5),
    (K.ERR_TRUNCATED, codec.packet(PacketType.PUBACK, 0, b"\x01"), codec.V5),
    (K.ERR_ACK_REASON, codec.packet(PacketType.PUBREC, 0, b"\x00\x01\x92"), codec.V5),
    (K.ERR_ACK_REASON, codec.packet(PacketType.PUBREL, 2, b"\x00\x01\x10"), codec.V5),
    (K.ERR_TRAILING, codec.packet(PacketType.PUBACK, 0, b"\x00\x01\x00"), codec.V311),
]


def test_each_error_is_found_by_the_kernel_itself_with_codecs_refusal():
    """Not left to Python: the kernel reports each error (the segment's error column), and
    its refusal is codec.py's, the good packet before it taken."""
    good = codec.encode_ack(PacketType.PUBACK, 1)
    for err, packet, version in KERNEL_ERRORS:
        buf = bytearray(good + packet)
        segs = np.zeros((1, K.SEG_COLUMNS), np.int64)
        segs[0, :4] = (0, len(buf), version, 1000)
        out = np.zeros((4, K.OUT_COLUMNS), np.int64)
        assert K.frame_packets(np.frombuffer(buf, np.uint8), segs, out) == 1
        assert segs[0, K.SEG_ERROR] == err, packet
        got = compiled([bytes(buf)], version, 1000)
        assert got == reference(bytes(buf), version, 1000), packet
        refused = got[2] if got[2] is not None else got[0][-1]
        assert isinstance(refused, Refusal) and got[0][0] == codec.Ack(PacketType.PUBACK, 1)


def test_a_running_edge_loads_the_kernel_at_start_and_compiles_nothing_for_its_packets(
        tmp_path):
    """``topicwire run`` on the user's cache (as ``topicwire warm`` leaves it, no bounds
    checks): a client's PUBLISHes and acknowledgements go through the kernel, and ``/status``
    shows no kernel compiled after start (the kernel was preloaded with the appliance's)."""
    import socket
    import subprocess
    import sys

    from tests.appliance.helpers import ROOT, production_env, run_appliance, stop, write_config
    from tests.appliance.mgmt_fabric import http
    from tests.edge.conftest import DEADLINE_S, read_packet, wait_for
    from tests.edge.test_run_edge import edge_toml

    env = production_env()
    warm = subprocess.run([sys.executable, "-c", "import sys; from appliance.ops.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "warm"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert warm.returncode == 0, warm.stderr
    from tests.appliance.helpers import free_port

    mqtt_port, mgmt_port, udp_port = free_port(), free_port(), free_port()
    config = write_config(tmp_path / "edge.toml", edge_toml(mqtt_port, mgmt_port, udp_port))
    proc = run_appliance(config, env=env)
    base = f"http://127.0.0.1:{mgmt_port}"

    def status() -> dict:
        code, _, doc = http("GET", base + "/status")
        return doc if code == 200 else {}

    try:
        with socket.create_connection(("127.0.0.1", mqtt_port), timeout=DEADLINE_S) as sock:
            sock.sendall(codec.encode_connect("fastcodec", username="sensor", password=b"s3nsor"))
            first, body = read_packet(sock)
            assert (first >> 4, body[1]) == (PacketType.CONNACK, 0)
            sock.sendall(b"".join(codec.encode_publish("plant/x", b"%d" % i, 1, False, False,
                                                       i + 1) for i in range(20)))
            acks = [read_packet(sock) for _ in range(20)]
            assert acks == [(0x40, (i + 1).to_bytes(2, "big")) for i in range(20)]
        seen = status()["node"]["uptime_s"]  # then a snapshot built after the traffic
        doc = wait_for(lambda: (s if (s := status()).get("node", {}).get("uptime_s", 0) > seen
                                and s["mqtt"]["counters"].get("publishes_in") == 20 else None))
        jit = doc["jit"]
        assert jit["warmed"] and jit["preloaded_signatures"] > 0, jit
        assert jit["compiled_after_start"] == {}, jit["compiled_after_start"]
    finally:
        assert stop(proc) == 0
