"""Segmentation and reassembly (datapath/protocol/segments.py): a message cut and put back,
and hostile segments (bad counts, overlaps, gaps, oversize totals, floods) refused and
counted with the reassembler's state bounded."""

import random
import time

import numpy as np

from channels.base import FrameBatch
from channels.tcp import TcpChannel
from datapath.config import MAX_FRAME_BYTES
from datapath.protocol import extension_layout as xl
from datapath.protocol.codec import FrameWriter, decode_frame
from datapath.protocol.extensions import encode_headers, split
from datapath.protocol.segments import (
    SEGMENT_CHUNK_BYTES,
    SEGMENT_REGION_BYTES,
    Reassembler,
    segment,
)

KEY = ("origin", 1, 0xABC)


def _segments(payload, headers=None, segment_id=5):
    block = encode_headers(headers or {})
    out = []
    for region, flags in segment(payload, block, SEGMENT_CHUNK_BYTES, segment_id):
        assert len(region) <= SEGMENT_REGION_BYTES
        out.append(split(region, flags))
    return out


def _feed(r, parts, key=KEY, now=0):
    result = None
    for chunk, headers, desc in parts:
        result = r.add(key, desc, chunk, headers, "first", now)
    return result


def test_a_message_cut_into_segments_comes_back_whole_with_its_headers():
    payload = random.Random(1).randbytes(100_000)
    parts = _segments(payload, {"k": "v"})
    assert len(parts) == -(-(len(payload) + len(encode_headers({"k": "v"}))) //
                           SEGMENT_CHUNK_BYTES)
    assert parts[0][1] == {"k": "v"} and all(h is None for _, h, _ in parts[1:])
    r = Reassembler()
    assert _feed(r, parts[:-1]) is None and r.messages_in_progress == 1
    assert r.bytes_in_progress == len(payload)
    assert _feed(r, parts[-1:]) == (payload, {"k": "v"}, "first")
    assert r.messages_in_progress == 0 and r.bytes_in_progress == 0
    assert r.counters["completed"] == 1


def test_an_empty_or_small_message_is_one_segment():
    for payload in (b"", b"x" * 10):
        (part,) = _segments(payload)
        assert Reassembler().add(KEY, part[2], part[0], None, 1, 0) == (payload, None, 1)


def test_a_missing_segment_drops_the_message_whole_and_later_ones_are_orphans():
    parts = _segments(bytes(10_000))
    r = Reassembler()
    assert _feed(r, parts[:2] + parts[3:]) is None
    assert r.counters["dropped_gap"] == 1 and r.counters["segments_orphaned"] == \
        len(parts) - 4
    assert r.messages_in_progress == 0 and r.bytes_in_progress == 0
    assert r.counters["completed"] == 0


def test_repeated_reordered_and_overlapping_segments_drop_the_message():
    parts = _segments(bytes(10_000))
    for bad in (parts[:3] + parts[2:],  # a repeat
                parts[:1] + parts[2:3] + parts[1:2] + parts[3:],  # reordered
                ):
        r = Reassembler()
        assert _feed(r, bad) is None and r.counters["dropped_gap"] == 1
        assert r.bytes_in_progress == 0
    # an overlap: segment 1 claims an offset inside segment 0
    r = Reassembler()
    chunk, h, (sid, total, off, index, count) = parts[1]
    _feed(r, parts[:1])
    assert r.add(KEY, (sid, total, off - 8, index, count), chunk, h, 0, 0) is None
    assert r.counters["dropped_gap"] == 1 and r.bytes_in_progress == 0


def test_descriptors_that_contradict_themselves_are_refused():
    r = Reassembler()
    chunk = b"x" * 100
    hostile = [
        (1, 100, 0, 0, 0),  # zero segments
        (1, 100, 0, 3, 3),  # index past the count
        (1, xl.MAX_MESSAGE_BYTES + 1, 0, 0, 2),  # above 16 MiB
        (1, 50, 0, 0, 2),  # the chunk runs past the total
        (1, 100, 0, 0, 2),  # not the last, yet it reaches the total
        (1, 1000, 0, 1, 2),  # the last, yet it ends short of the total
        (1, 1000, 8, 0, 2),  # segment 0 not at offset 0
    ]
    for desc in hostile:
        assert r.add(KEY, desc, chunk, None, 0, 0) is None
    assert r.counters["refused_bad_segment"] == len(hostile)
    assert r.messages_in_progress == 0 and r.bytes_in_progress == 0
    parts = _segments(bytes(5_000))
    _feed(r, parts[:1])
    chunk, _, desc = parts[1]
    assert r.add(KEY, desc, chunk, {"late": "headers"}, 0, 0) is None  # only segment 0 has them
    assert r.messages_in_progress == 0


def test_a_message_that_changes_its_count_or_total_midway_is_dropped():
    parts = _segments(bytes(10_000))
    for change in (lambda d: (d[0], d[1], d[2], d[3], d[4] + 1),
                   lambda d: (d[0], d[1] + 8, d[2], d[3], d[4])):
        r = Reassembler()
        _feed(r, parts[:2])
        chunk, h, desc = parts[2]
        assert r.add(KEY, change(desc), chunk, h, 0, 0) is None
        assert r.counters["dropped_gap"] == 1 and r.messages_in_progress == 0


def test_state_stays_bounded_by_messages_bytes_and_time():
    r = Reassembler(max_bytes=1_000_000, max_messages=4, timeout_ns=1_000)
    chunk = bytes(1_000)
    for sid in range(100):  # a flood of starts, each declaring 16 MiB or 200 kB
        total = xl.MAX_MESSAGE_BYTES if sid % 2 else 200_000
        r.add(("flood", sid % 7), (sid, total, 0, 0, 10_000), chunk, None, 0, sid)
        assert r.messages_in_progress <= 4 and r.bytes_in_progress <= 1_000_000
    assert r.counters["dropped_full"] >= 96 - 4
    assert r.expire(10_000) == r.counters["dropped_timeout"] > 0
    assert r.messages_in_progress == 0 and r.bytes_in_progress == 0
    # beginning a message again drops the earlier unfinished one (counted), never both kept
    parts = _segments(bytes(10_000))
    _feed(r, parts[:3])
    _feed(r, parts[:2])
    assert r.messages_in_progress == 1 and r.counters["dropped_gap"] == 1


def test_random_descriptors_never_break_the_bounds():
    rng = random.Random(3)
    r = Reassembler(max_bytes=10 * 1024 * 1024, max_messages=8, timeout_ns=10**9)
    for i in range(20_000):
        desc = (rng.randrange(4), rng.choice((0, 1, 100, 5_000, xl.MAX_MESSAGE_BYTES,
                                                 2**32 - 1)),
                rng.choice((0, 8, 1_352, rng.randrange(2**32))), rng.randrange(4),
                rng.randrange(5))
        r.add(("k", rng.randrange(3)), desc, bytes(rng.choice((0, 8, 1_352))), None, 0, i)
        assert r.messages_in_progress <= 8 and r.bytes_in_progress <= 10 * 1024 * 1024
        assert r.bytes_in_progress >= 0


def test_a_large_message_crosses_a_tcp_channel_as_segment_frames_and_comes_back_whole():
    """The TCP channel (channels/tcp.py) carries segments as any frames: a 2 MiB message cut
    by ``segment``, packed into 64 KiB frames, cut out of the stream again and put back."""
    payload = random.Random(5).randbytes(2 * 1024 * 1024)
    frames, buf = [], bytearray(MAX_FRAME_BYTES)
    writer = FrameWriter(buf)
    writer.begin(source_session=9, stream_id=9)
    for region, flags in segment(payload, encode_headers({"k": "v"}), SEGMENT_CHUNK_BYTES, 1):
        if not writer.append(7, 1, 0, region, flags=flags):
            frames.append(bytes(buf[: writer.finish()]))
            writer.begin(source_session=9, stream_id=9)
            assert writer.append(7, 1, 0, region, flags=flags)
    frames.append(bytes(buf[: writer.finish()]))
    r = Reassembler()
    whole = None
    with TcpChannel(listen=("127.0.0.1", 0)) as srv, \
            TcpChannel(connect=srv.local_address) as client:
        batch = FrameBatch(64, MAX_FRAME_BYTES)
        sent, got = 0, 0
        deadline = time.monotonic() + 30
        while whole is None and time.monotonic() < deadline:
            if sent < len(frames):
                sent += client.send(_arrays(frames[sent : sent + 8]))
            for i in range(srv.receive(batch, timeout_ns=10_000_000)):
                got += 1
                for m in decode_frame(bytes(batch.frame(i))).messages():
                    chunk, headers, desc = m.extensions()
                    whole = r.add(("tcp", 9, 7), desc, chunk, headers, None, 0) or whole
    assert got == len(frames) and whole is not None
    assert whole[0] == payload and whole[1] == {"k": "v"}


def _arrays(frames):
    lengths = np.array([len(f) for f in frames], np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    return (np.frombuffer(bytearray(b"".join(frames)), np.uint8), offsets, lengths, len(frames))
