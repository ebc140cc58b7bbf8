"""The batch kernels decide exactly what the reference decoder decides, and pack what it reads.

The kernels run with NUMBA_BOUNDSCHECK=1 (tests/conftest.py): a read past a buffer raises.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.batch import (
    STATUS_NOT_PROCESSED,
    decode_frames,
    new_message_batch,
    pack_frames,
)
from datapath.protocol.codec import decode_frame, decode_header, encode_admin
from datapath.protocol.errors import MalformedReason, ProtocolError
from datapath.protocol.frame_layout import MESSAGE_FRAME_TYPES
from tests.datapath.protocol.frames import data_frame

FIELDS = ("topic_key", "sequence", "publish_ts_ns", "namespace_id", "schema_id", "qos",
          "flags", "payload_len", "topic_len")


def twin_decode(buf, offsets, lengths, exact=True):
    """Slow twin of _kernels._decode_frames, built on the reference decoder.

    Like the kernel, it checks admin frames up to their header only: their bodies belong to
    the control path, which decodes them with codec.decode_frame.
    """
    statuses, records = [], []
    for i, (off, length) in enumerate(zip(offsets, lengths)):
        try:
            header = decode_header(buf, off, length, exact=exact)
            if header.frame_type not in MESSAGE_FRAME_TYPES:
                statuses.append(0)
                continue
            frame = decode_frame(buf, off, length, exact=exact)
        except ProtocolError as exc:
            statuses.append(int(exc.reason))
            continue
        statuses.append(0)
        for m in frame.messages():
            rec = {f: getattr(m, f) for f in FIELDS}
            rec["payload_offset"] = m.offset + 40
            rec["frame_index"] = i
            records.append(rec)
    return statuses, records


def kernel_decode(buf, offsets, lengths, exact=True, capacity=4096):
    out = new_message_batch(capacity)
    status = np.zeros(len(offsets), np.uint8)
    types = np.zeros(len(offsets), np.uint8)
    result = decode_frames(np.frombuffer(buf, np.uint8), np.array(offsets, np.int64),
                           np.array(lengths, np.int64), out, status, types, exact=exact)
    records = [{f: int(out[k][f]) for f in (*FIELDS, "payload_offset", "frame_index")}
               for k in range(result.messages)]
    return [int(s) for s in status[: result.frames]], records, result


def assert_same_as_twin(buf, offsets, lengths, exact=True):
    want_status, want_records = twin_decode(buf, offsets, lengths, exact)
    got_status, got_records, result = kernel_decode(buf, offsets, lengths, exact)
    assert result.frames == len(offsets)
    assert got_status == want_status
    assert got_records == want_records


def test_kernel_decodes_a_batch_of_valid_frames_like_the_reference():
    frames = [data_frame(n, payload_size=n * 3, topic="a/b" if n % 2 else "") for n in
              range(1, 8)]
    buf = b"".join(frames)
    offsets = np.cumsum([0] + [len(f) for f in frames[:-1]])
    assert_same_as_twin(buf, offsets, [len(f) for f in frames])


def test_a_malformed_frame_in_a_batch_is_skipped_and_the_rest_decoded():
    good, bad = data_frame(2), bytearray(data_frame(3))
    bad[fl.FRAME_HEADER_BYTES + 30] = 9  # qos 9
    buf = good + bytes(bad) + good
    got_status, records, _ = kernel_decode(buf, [0, len(good), len(good) + len(bad)],
                                           [len(good), len(bad), len(good)])
    assert got_status == [0, int(MalformedReason.BAD_QOS), 0]
    assert [r["frame_index"] for r in records] == [0, 0, 2, 2]


def test_admin_frames_pass_the_kernel_with_no_messages():
    admin = bytes(encode_admin(fl.FrameType.NAK, [al.SeqRange(1, 2)]))
    got_status, records, _ = kernel_decode(admin, [0], [len(admin)])
    assert got_status == [0] and records == []


def test_a_full_batch_stops_before_the_frame_that_does_not_fit():
    frames = [data_frame(3)] * 3
    buf = b"".join(frames)
    out = new_message_batch(7)
    status = np.zeros(3, np.uint8)
    types = np.zeros(3, np.uint8)
    n = len(frames[0])
    result = decode_frames(buf, np.array([0, n, 2 * n]), np.array([n, n, n]), out, status, types)
    assert (result.messages, result.frames) == (6, 2)
    assert status[2] == STATUS_NOT_PROCESSED


def test_pack_then_decode_reproduces_the_batch_and_splits_frames_at_the_bound():
    src = b"".join(data_frame(50, payload_size=30) for _ in range(4))
    lengths = [len(data_frame(50, payload_size=30))] * 4
    offsets = np.cumsum([0] + lengths[:-1])
    _, records, _ = kernel_decode(src, offsets, lengths)
    batch = new_message_batch(256)
    _, _, r = kernel_decode(src, offsets, lengths)
    status = np.zeros(4, np.uint8)
    decode_frames(src, offsets, np.array(lengths), batch, status, np.zeros(4, np.uint8))
    out = np.zeros(1 << 16, np.uint8)
    f_off = np.zeros(64, np.int64)
    f_len = np.zeros(64, np.int64)
    packed = pack_frames(batch, r.messages, src, out, f_off, f_len, max_frame_bytes=1024,
                         source_session=1, stream_id=2)
    assert packed.messages == 200 and packed.frames > 1
    assert all(f_len[: packed.frames] <= 1024)
    _, again, _ = kernel_decode(bytes(out), f_off[: packed.frames], f_len[: packed.frames])
    keep = ("topic_key", "sequence", "publish_ts_ns", "qos", "payload_len")
    assert [{k: r[k] for k in keep} for r in again] == [{k: r[k] for k in keep}
                                                        for r in records]
    for rec_new, rec_old in zip(again, records):
        new = bytes(out[rec_new["payload_offset"]:][: rec_new["payload_len"]])
        assert new == src[rec_old["payload_offset"]:][: rec_old["payload_len"]]


def test_pack_stops_cleanly_when_the_output_buffer_is_full():
    src = data_frame(20, payload_size=100)
    batch = new_message_batch(32)
    r = decode_frames(src, np.array([0]), np.array([len(src)]), batch, np.zeros(1, np.uint8),
                      np.zeros(1, np.uint8))
    out = np.zeros(600, np.uint8)
    packed = pack_frames(batch, r.messages, src, out, np.zeros(8, np.int64),
                         np.zeros(8, np.int64))
    assert 0 < packed.messages < 20
    assert decode_frame(bytes(out[: packed.end_offset])).header.msg_count == packed.messages


# --- property tests: random and mutated bytes ---------------------------------------------

VALID = [data_frame(1), data_frame(4, topic="x/y"), data_frame(2, payload_size=0),
         bytes(encode_admin(fl.FrameType.SUBSCRIBE, [al.Subscription(1, 2, 0, 0, "a/#")])),
         bytes(encode_admin(fl.FrameType.REGISTRY_UPDATE, [al.RegistryEntry(1, 0, "t")],
                            body_header={"version": 1}, auth=(1, 1, 1)))]


@st.composite
def mutated_frames(draw):
    frame = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 6))):
        action = draw(st.sampled_from(["flip", "set", "truncate", "extend"]))
        if action == "flip" and frame:
            i = draw(st.integers(0, len(frame) - 1))
            frame[i] ^= 1 << draw(st.integers(0, 7))
        elif action == "set" and frame:
            i = draw(st.integers(0, len(frame) - 1))
            frame[i] = draw(st.sampled_from([0, 1, 7, 8, 0x7F, 0x80, 0xFF]))
        elif action == "truncate":
            del frame[draw(st.integers(0, len(frame))):]
        else:
            frame += draw(st.binary(max_size=24))
    return bytes(frame)


def _only_protocol_errors(data):
    try:
        frame = decode_frame(data)
    except ProtocolError as exc:
        assert isinstance(exc.reason, MalformedReason)
        return
    for m in frame.messages():
        m.snapshot()
    if not frame.is_message_frame:
        frame.admin()


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_the_codecs_own_error(data):
    _only_protocol_errors(data)


@settings(max_examples=600, deadline=None)
@given(mutated_frames())
def test_mutated_frames_raise_only_the_codecs_own_error(data):
    _only_protocol_errors(data)


@settings(max_examples=400, deadline=None)
@given(mutated_frames(), st.binary(min_size=1, max_size=64))
def test_kernel_and_reference_agree_and_stay_inside_the_frame(data, tail):
    # The frame is followed by unrelated bytes: a decoder that looked past its length would
    # decide differently (or, in the kernel under NUMBA_BOUNDSCHECK, raise at the buffer end).
    buf = data + tail
    assert_same_as_twin(buf, [0], [len(data)])
    assert_same_as_twin(data, [0], [len(data)])
    assert_same_as_twin(buf, [0], [len(buf)], exact=False)
