"""FrameBatch, send-timestamp stamping, argument checks, the error tree and ChannelSink."""

import errno

import numpy as np
import pytest

from channels.base import (
    ChannelSink,
    FrameBatch,
    as_frame_arrays,
    decode_batch,
    stamp_send_ts,
)
from channels.errors import ChannelDeviceError, ChannelError, ChannelUserError, os_error
from channels.udp import UdpChannel
from datapath.errors import DeviceError, UserError
from datapath.protocol.admin_layout import SeqRange
from datapath.protocol.batch import new_message_batch
from datapath.protocol.codec import decode_frame, encode_admin
from datapath.protocol.frame_layout import FrameType
from tests.channels.peer import make_frame


def test_a_batch_is_one_buffer_cut_into_fixed_slots():
    batch = FrameBatch(4, 256)
    assert batch.buf.shape == (1024,) and batch.offsets.tolist() == [0, 256, 512, 768]
    frame = make_frame(9, 3)
    assert batch.append(frame, peer_id=77) == 0 and batch.append(frame) == 1
    assert batch.count == 2 and batch.peer_ids[:2].tolist() == [77, -1]
    assert bytes(batch.frame(1)) == frame and batch.buf[256 : 256 + len(frame)].tobytes() == frame


def test_a_batch_refuses_bad_sizes_and_overfilling_with_the_component_named():
    with pytest.raises(ChannelUserError, match="^channels: .*capacity"):
        FrameBatch(0)
    with pytest.raises(ChannelUserError, match="multiple of 8"):
        FrameBatch(2, 100)
    batch = FrameBatch(1, 64)
    with pytest.raises(ChannelUserError, match="larger slots"):
        batch.append(bytes(65))
    batch.append(bytes(64))
    with pytest.raises(ChannelUserError, match="full"):
        batch.append(bytes(8))


def test_send_stamps_the_clock_into_send_ts_but_not_into_signed_frames():
    batch = FrameBatch(3, 256)
    batch.append(make_frame(1, 1))
    signed = encode_admin(FrameType.NAK, [SeqRange(1, 2)], auth=(1, 2, 3))
    batch.append(signed)
    batch.append(bytes(16))  # shorter than a header: left alone
    stamp_send_ts(batch.arrays(), 3, now_ns=0x1122334455667788)
    assert decode_frame(bytes(batch.frame(0))).header.send_ts_ns == 0x1122334455667788
    assert bytes(batch.frame(1)) == bytes(signed)
    assert bytes(batch.frame(2)) == bytes(16)


def test_raw_frame_arrays_are_checked_once_per_call():
    buf = np.zeros(100, np.uint8)
    with pytest.raises(ChannelUserError, match="outside its buffer"):
        as_frame_arrays((buf, np.array([90]), np.array([20]), 1))
    with pytest.raises(ChannelUserError, match="uint8"):
        as_frame_arrays((bytearray(10), [0], [10], 1))
    arrays = as_frame_arrays((buf, [0, 50], [50, 50], 2))
    assert arrays.count == 2 and arrays.offsets.dtype == np.int64
    # one frame in one-slot int64 arrays (a client's publish): checked, taken as they are
    with pytest.raises(ChannelUserError, match="outside its buffer"):
        as_frame_arrays((buf, np.array([-1], np.int64), np.array([10], np.int64), 1))
    offsets, lengths = np.array([10], np.int64), np.array([90], np.int64)
    arrays = as_frame_arrays((buf, offsets, lengths, 1))
    assert arrays.offsets is offsets and arrays.lengths is lengths and arrays.count == 1


def test_errors_belong_to_the_project_tree_and_carry_errno():
    err = os_error("binding UDP 127.0.0.1:1", errno.EADDRINUSE)
    assert isinstance(err, ChannelDeviceError) and isinstance(err, DeviceError)
    assert isinstance(err, ChannelError) and err.errno == errno.EADDRINUSE
    assert str(err).startswith("channels: binding UDP") and "EADDRINUSE" in str(err)
    assert issubclass(ChannelUserError, UserError)


def test_decode_batch_counts_what_the_decoder_rejects_per_reason():
    batch = FrameBatch(4, 256)
    good = make_frame(1, 1)
    batch.append(good)
    batch.append(b"XX" + good[2:])           # bad magic
    batch.append(good[:40])                   # shorter than frame_len says
    batch.append(bytes(8))                    # too short
    with UdpChannel() as ch:
        status = np.zeros(4, np.uint8)
        result = decode_batch(batch, new_message_batch(8), status, np.zeros(4, np.uint8),
                              ch.stats)
        assert result.messages == 1 and result.frames == 4
        assert ch.stats.malformed == 3
        assert ch.stats.snapshot()["malformed_by_reason"] == {
            "bad_magic": 1, "bad_frame_length": 1, "too_short": 1}


def test_channel_sink_batches_frames_per_destination():
    with UdpChannel() as a, UdpChannel() as b:
        sink = ChannelSink(a, capacity=4, slot_bytes=256)
        for i in range(3):
            sink.send_frame(memoryview(make_frame(1, i)), b.local_address)
        assert sink.pending == 3
        assert sink.flush() == 3 and sink.pending == 0
        got = FrameBatch(8, 256)
        assert b.receive(got, timeout_ns=2_000_000_000) == 3
        assert [decode_frame(bytes(got.frame(i))).header.source_session for i in range(3)] \
            == [1, 1, 1]


def test_close_twice_is_safe_and_a_closed_channel_says_so():
    ch = UdpChannel()
    with ch:
        pass
    ch.close()
    assert ch.closed
    with pytest.raises(ChannelUserError, match="closed"):
        ch.receive(FrameBatch(1, 64))
