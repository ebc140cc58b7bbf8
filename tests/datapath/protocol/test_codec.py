"""The reference decoder refuses every malformed case of docs/protocol.md with its reason."""

import pytest

from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol.codec import (
    FrameWriter,
    decode_frame,
    encode_admin,
    encode_data_frame,
    iter_frames,
    set_mac,
)
from datapath.protocol.errors import MalformedReason as R
from datapath.protocol.errors import ProtocolError
from tests.datapath.protocol.frames import data_frame, patched

FIRST_MSG = fl.FRAME_HEADER_BYTES


def reason_of(data, **kw):
    with pytest.raises(ProtocolError) as info:
        decode_frame(data, **kw)
    return info.value.reason


def test_a_valid_frame_round_trips_every_message_field():
    frame = decode_frame(data_frame(3))
    got = [m.snapshot() for m in frame.messages()]
    assert [m["topic_key"] for m in got] == [100, 101, 102]
    assert [m["payload"] for m in got] == [b"\x00" * 5, b"\x01" * 6, b"\x02" * 7]
    assert [m["qos"] for m in got] == [0, 1, 2]
    assert frame.header.source_session == 1 and frame.header.stream_id == 2


@pytest.mark.parametrize("data, reason", [
    (b"", R.TOO_SHORT),
    (data_frame()[:31], R.TOO_SHORT),
    (patched(data_frame(), 0, b"\x00\x00"), R.BAD_MAGIC),
    (patched(data_frame(), fl.VERSION_OFFSET, b"\x02"), R.BAD_VERSION),
    (patched(data_frame(), fl.TYPE_OFFSET, b"\x00"), R.UNKNOWN_TYPE),
    (patched(data_frame(), fl.TYPE_OFFSET, bytes([fl.MAX_FRAME_TYPE + 1])), R.UNKNOWN_TYPE),
    (patched(data_frame(), fl.FLAGS_OFFSET, b"\x80\x00"), R.UNKNOWN_FLAGS),
    (patched(data_frame(), fl.FRAME_LEN_OFFSET, (8).to_bytes(4, "big")), R.BAD_FRAME_LENGTH),
    (patched(data_frame(), fl.FRAME_LEN_OFFSET, (1 << 31).to_bytes(4, "big")),
     R.BAD_FRAME_LENGTH),
    (patched(data_frame(), fl.FRAME_LEN_OFFSET, (len(data_frame()) - 3).to_bytes(4, "big")),
     R.BAD_FRAME_LENGTH),
    (patched(data_frame(), fl.FRAME_LEN_OFFSET, (len(data_frame()) - 8).to_bytes(4, "big")),
     R.LENGTH_MISMATCH),
    (data_frame() + bytes(8), R.LENGTH_MISMATCH),
    (patched(data_frame(), fl.MSG_COUNT_OFFSET, b"\x00\x00"), R.BAD_COUNT),
    (patched(data_frame(), fl.MSG_COUNT_OFFSET, b"\xff\xff"), R.BAD_COUNT),
    (patched(data_frame(), fl.MSG_COUNT_OFFSET, b"\x00\x04"), R.MESSAGE_OVERRUN),
    (patched(data_frame(), fl.MSG_COUNT_OFFSET, b"\x00\x02"), R.TRAILING_BYTES),
    (patched(data_frame(), FIRST_MSG + ml.QOS_OFFSET, b"\x03"), R.BAD_QOS),
    (patched(data_frame(), FIRST_MSG + ml.MSG_FLAGS_OFFSET, b"\x80"), R.UNKNOWN_FLAGS),
    (patched(data_frame(), FIRST_MSG + ml.PAYLOAD_LEN_OFFSET, b"\xff\xff\xff\xff"),
     R.MESSAGE_OVERRUN),
    (patched(data_frame(), FIRST_MSG + ml.TOPIC_LEN_OFFSET, b"\x01\x00"), R.MESSAGE_OVERRUN),
])
def test_each_malformed_case_is_refused_with_its_reason(data, reason):
    assert reason_of(data) == reason


def test_a_frame_with_an_auth_flag_but_no_room_for_the_trailer_is_refused():
    admin = bytes(encode_admin(fl.FrameType.ACK, [al.Ack(1, 2)]))
    assert reason_of(patched(admin, fl.FLAGS_OFFSET, b"\x00\x01")) == R.BAD_FRAME_LENGTH


@pytest.mark.parametrize("mutate, reason", [
    (lambda b: patched(b, fl.MSG_COUNT_OFFSET, b"\x00\x00"), R.BAD_COUNT),
    (lambda b: patched(b, fl.MSG_COUNT_OFFSET, b"\x00\x02"), R.MESSAGE_OVERRUN),
    (lambda b: patched(b, FIRST_MSG + 8, b"\x02\x00"), R.MESSAGE_OVERRUN),
    (lambda b: patched(b, FIRST_MSG + 16, b"\xff\xfe"), R.BAD_FIELD),
])
def test_admin_bodies_are_checked_entry_by_entry(mutate, reason):
    admin = bytes(encode_admin(fl.FrameType.SUBSCRIBE, [al.Subscription(1, 0, 0, 0, "a/+")]))
    assert reason_of(mutate(admin)) == reason


def test_an_admin_enum_out_of_range_is_a_bad_field():
    admin = bytes(encode_admin(fl.FrameType.FLOW_CONTROL, [
        al.FlowControl(al.FlowState.ON, al.FlowPolicy.THROTTLE, 1, 2, 1)]))
    assert reason_of(patched(admin, FIRST_MSG, b"\x07")) == R.BAD_FIELD


def test_the_decoder_never_looks_past_the_length_it_is_given():
    frame = data_frame(2)
    tail = b"\xff" * 64
    decoded = decode_frame(frame + tail, 0, len(frame))
    assert decoded.header.frame_len == len(frame)
    truncated = frame[:-8]
    with pytest.raises(ProtocolError):
        decode_frame(truncated + frame[-8:] + tail, 0, len(truncated))


def test_frames_back_to_back_in_a_stream_are_iterated_in_order():
    a, b = data_frame(1), data_frame(2)
    frames = list(iter_frames(a + b))
    assert [f.header.msg_count for f in frames] == [1, 2]
    assert [f.offset for f in frames] == [0, len(a)]


def test_frame_writer_refuses_a_message_that_does_not_fit_and_writes_nothing():
    buf = bytearray(128)
    writer = FrameWriter(buf)
    writer.begin(source_session=9)
    assert writer.append(1, 1, 0, b"a" * 40)
    before = bytes(buf)
    assert not writer.append(2, 2, 0, b"b" * 40)
    assert bytes(buf) == before
    length = writer.finish(send_ts_ns=5)
    frame = decode_frame(bytes(buf[:length]))
    assert frame.header.msg_count == 1 and frame.header.send_ts_ns == 5


def test_frame_writer_fills_a_frame_up_to_the_protocol_bound():
    buf = bytearray(2 * 65536)
    writer = FrameWriter(buf)
    writer.begin()
    while writer.append(1, 1, 0):
        pass
    length = writer.finish()
    assert length <= 65504
    assert decode_frame(bytes(buf[:length])).header.msg_count == ml.MAX_MESSAGES_PER_FRAME


def test_an_oversized_single_message_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="does not fit"):
        encode_data_frame([{"payload": bytes(ml.MAX_PAYLOAD_BYTES + 1)}])
    assert decode_frame(encode_data_frame([{"payload": bytes(ml.MAX_PAYLOAD_BYTES)}]))


def test_auth_trailer_is_parsed_and_the_mac_covers_everything_before_it():
    admin = encode_admin(fl.FrameType.SUBSCRIBE, [al.Subscription(1, 0, 0, 0, "a/#")],
                         auth=(7, 2, 41))
    set_mac(admin, b"M" * 16)
    frame = decode_frame(bytes(admin))
    assert frame.auth.key_id == 7 and frame.auth.auth_seq == 41 and frame.auth.mac == b"M" * 16
    assert bytes(frame.signed_bytes()) == bytes(admin[:-16])
    assert frame.admin()[1][0].pattern == "a/#"


def test_errors_name_the_component_and_what_happens():
    with pytest.raises(ProtocolError, match=r"^protocol: malformed frame \(bad_magic at byte 0\)"):
        decode_frame(bytes(32))


def test_a_subscribe_entry_carries_its_selector_and_old_entries_have_none():
    sub = al.Subscription(3, 1, 0, 0, "quotes/#", "price > 100 AND symbol = 'IBM'")
    frame = bytes(encode_admin(fl.FrameType.SUBSCRIBE, [sub]))
    assert decode_frame(frame).admin()[1] == [sub]
    # an entry from before selectors: the selector_len u32 was reserved, written as zero
    old = bytes(encode_admin(fl.FrameType.SUBSCRIBE, [al.Subscription(3, 1, 0, 0, "a/#")]))
    fixed = fl.FRAME_HEADER_BYTES
    assert old[fixed + 12 : fixed + 16] == bytes(4)
    assert decode_frame(old).admin()[1][0].selector == ""
    with pytest.raises(ValueError, match="1024"):
        encode_admin(fl.FrameType.SUBSCRIBE, [al.Subscription(3, 1, 0, 0, "a/#", "x" * 1025)])
