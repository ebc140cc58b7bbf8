"""The RDMA channel's pack/unpack kernels against slow pure-Python twins, and round trips.

No RDMA device is needed: these are the bytes one RDMA SEND carries (channels._rdma_layout).
"""

import struct

import numpy as np
import pytest

from channels import _rdma_kernels as k
from channels._rdma_layout import (
    PACKET_HEADER_BYTES,
    PACKET_MAGIC,
    PACKET_VERSION,
    RECORD_HEADER_BYTES,
    packets_for_frame,
    record_bytes,
)

MAX_FRAME = 65_504


# --- twins -----------------------------------------------------------------------------------

def _record(segment: bytes, frame_bytes: int) -> bytes:
    pad = -len(segment) % 8
    return struct.pack("<II", len(segment), frame_bytes) + segment + bytes(pad)


def _header(records: int, sequence: int, size: int) -> bytes:
    return struct.pack("<HBBHHII", PACKET_MAGIC, PACKET_VERSION, 0, records, 0,
                       sequence & 0xFFFFFFFF, size)


def pack_twin(frames, packet_bytes, max_packets, sequence_first, max_frame=MAX_FRAME):
    """(taken, [packet bytes], refused, nbytes): the spec of ``_pack`` in plain Python."""
    packets: list[list[bytes]] = []  # records of each packet
    sizes: list[int] = []
    taken = refused = nbytes = 0

    def free() -> int:
        return packet_bytes - sizes[-1] - RECORD_HEADER_BYTES if packets else -1

    def add(record: bytes, new: bool) -> None:
        if new:
            packets.append([])
            sizes.append(PACKET_HEADER_BYTES)
        packets[-1].append(record)
        sizes[-1] += len(record)

    for frame in frames:
        if len(frame) > max_frame:
            taken += 1
            refused += 1
            continue
        room = packet_bytes - PACKET_HEADER_BYTES - RECORD_HEADER_BYTES
        if len(frame) <= free():
            add(_record(frame, len(frame)), False)
        elif len(frame) <= room:
            if len(packets) + 1 > max_packets:
                break
            add(_record(frame, len(frame)), True)
        else:
            pieces = []
            rest = frame
            if free() > 0:
                pieces.append((rest[: free()], False))
                rest = rest[free():]
            while rest:
                pieces.append((rest[:room], True))
                rest = rest[room:]
            if len(packets) + sum(new for _, new in pieces) > max_packets:
                break
            for piece, new in pieces:
                add(_record(piece, len(frame)), new)
        taken += 1
        nbytes += len(frame)
    out = [_header(len(recs), sequence_first + i, size) + b"".join(recs)
           for i, (recs, size) in enumerate(zip(packets, sizes))]
    return taken, out, refused, nbytes


def unpack_twin(packet, cursor, sequence, slot_bytes, capacity, partial, max_frame=MAX_FRAME):
    """(frames, new cursor, torn, oversized, bad, partial): the spec of ``_unpack``.

    ``partial`` is the frame being put back together: (bytes so far, its length) or None."""
    frames: list[bytes] = []
    torn = oversized = 0
    if cursor == 0:
        if len(packet) < PACKET_HEADER_BYTES:
            return frames, len(packet), 0, 0, 1, partial
        magic, version, _, _, _, seq, size = struct.unpack_from("<HBBHHII", packet)
        if (magic, version, seq, size) != (PACKET_MAGIC, PACKET_VERSION,
                                           sequence & 0xFFFFFFFF, len(packet)):
            return frames, len(packet), 0, 0, 1, partial
        cursor = PACKET_HEADER_BYTES
    while cursor < len(packet):
        if cursor + RECORD_HEADER_BYTES > len(packet):
            torn, partial, cursor = torn + 1, None, len(packet)
            break
        segment, frame_bytes = struct.unpack_from("<II", packet, cursor)
        size = record_bytes(segment)
        if cursor + size > len(packet) or segment > frame_bytes or frame_bytes > max_frame:
            torn, partial, cursor = torn + 1, None, len(packet)
            break
        if partial is not None and (partial[1] != frame_bytes
                                    or len(partial[0]) + segment > frame_bytes):
            torn, partial = torn + 1, None
            continue
        so_far = partial[0] if partial else b""
        data = packet[cursor + RECORD_HEADER_BYTES : cursor + RECORD_HEADER_BYTES + segment]
        done = len(so_far) + segment == frame_bytes
        if done and len(frames) >= capacity:
            break
        cursor += size
        if done:
            partial = None
            if frame_bytes > slot_bytes:
                oversized += 1
            else:
                frames.append(so_far + data)
        else:
            partial = (so_far + data, frame_bytes)
    return frames, cursor, torn, oversized, 0, partial


# --- helpers over the kernels ----------------------------------------------------------------

def as_arrays(frames):
    lengths = np.array([len(f) for f in frames], np.int64)
    offsets = np.zeros(len(frames), np.int64)
    if len(frames):
        offsets[1:] = np.cumsum(lengths)[:-1]
    buf = np.frombuffer(b"".join(frames) + b"\0", np.uint8).copy()
    return buf, offsets, lengths


def kernel_pack(frames, packet_bytes, max_packets, sequence_first, slot_first=0, ring_slots=None,
                max_frame=MAX_FRAME):
    ring_slots = ring_slots or max(max_packets, 1)
    buf, offsets, lengths = as_arrays(frames)
    ring = np.full(ring_slots * packet_bytes, 0xAB, np.uint8)  # garbage where nothing is written
    plen = np.zeros(max(max_packets, 1), np.int64)
    out = np.zeros(4, np.int64)
    k._pack(buf, offsets, lengths, len(frames), ring, slot_first, ring_slots, packet_bytes,
            max_packets, sequence_first, max_frame, plen, out)
    packets = []
    for i in range(int(out[1])):
        base = ((slot_first + i) % ring_slots) * packet_bytes
        packets.append(bytes(ring[base : base + int(plen[i])]))
    return int(out[0]), packets, int(out[2]), int(out[3])


class Unpacker:
    """The kernel's receive side over whole packets, keeping its state between calls."""

    def __init__(self, slot_bytes, capacity):
        self.slot_bytes, self.capacity = slot_bytes, capacity
        self.reassembly = np.zeros(MAX_FRAME, np.uint8)
        self.state = np.zeros(2, np.int64)
        self.out = np.zeros(5, np.int64)

    def unpack(self, packet, cursor, sequence, first=0):
        src = np.frombuffer(packet, np.uint8).copy()
        dst = np.zeros(self.capacity * self.slot_bytes, np.uint8)
        lengths = np.zeros(self.capacity, np.int64)
        k._unpack(src, 0, len(packet), cursor, sequence, MAX_FRAME, dst, self.slot_bytes,
                  lengths, first, self.capacity, self.reassembly, self.state, self.out)
        n = int(self.out[0])
        frames = [bytes(dst[(first + i) * self.slot_bytes:][: lengths[first + i]])
                  for i in range(n)]
        return frames, int(self.out[1]), int(self.out[2]), int(self.out[3]), int(self.out[4])

    @property
    def partial(self):
        fill = int(self.state[0])
        return (bytes(self.reassembly[:fill]), int(self.state[1])) if fill else None


def random_frames(rng, count, max_len):
    sizes = rng.integers(0, max_len + 1, count)
    return [rng.integers(0, 256, int(s), dtype=np.uint8).tobytes() for s in sizes]


# --- pack ------------------------------------------------------------------------------------

def test_small_frames_share_one_packet_with_a_header_that_says_so():
    frames = [b"a" * 40, b"b" * 13, b""]
    taken, packets, refused, nbytes = kernel_pack(frames, 4096, 1, 7)
    assert (taken, refused, nbytes, len(packets)) == (3, 0, 53, 1)
    packet = packets[0]
    assert packet == pack_twin(frames, 4096, 1, 7)[1][0]
    assert struct.unpack_from("<HBBHHII", packet) == (PACKET_MAGIC, 1, 0, 3, 0, 7, len(packet))
    assert len(packet) == PACKET_HEADER_BYTES + record_bytes(40) + record_bytes(13) + 8


def test_a_frame_larger_than_a_packet_is_cut_into_segments_in_consecutive_packets():
    frame = bytes(range(256)) * 40  # 10,240 bytes
    taken, packets, _, _ = kernel_pack([frame], 1024, 20, 1)
    assert taken == 1 and len(packets) == packets_for_frame(len(frame), 1024) == 11
    assert [struct.unpack_from("<I", p, 8)[0] for p in packets] == list(range(1, 12))
    segments = [p[24 : 24 + struct.unpack_from("<I", p, 16)[0]] for p in packets]
    assert b"".join(segments) == frame
    assert all(struct.unpack_from("<I", p, 20)[0] == len(frame) for p in packets)


def test_packing_never_splits_a_frame_across_a_packet_it_does_not_have():
    frames = [b"x" * 900, b"y" * 900, b"z" * 3000]
    taken, packets, _, _ = kernel_pack(frames, 1024, 2, 1)
    assert taken == 2 and len(packets) == 2  # the third would need 3 more packets
    taken, packets, _, _ = kernel_pack(frames, 1024, 5, 1)
    assert taken == 3 and len(packets) == 5  # 900 | 900 + first 96 | 3 x rest


def test_frames_longer_than_the_channel_allows_are_taken_and_refused():
    taken, packets, refused, nbytes = kernel_pack([b"a" * 100, b"b" * 65, b"c" * 8], 1024, 4, 1,
                                                  max_frame=64)
    assert (taken, refused, nbytes) == (3, 2, 8)
    assert len(packets) == 1


def test_packets_wrap_around_the_send_ring():
    frames = [b"p" * 1000] * 3
    taken, packets, _, _ = kernel_pack(frames, 1024, 3, 5, slot_first=3, ring_slots=4)
    assert taken == 3 and len(packets) == 3
    assert [p[24:1024] for p in packets] == [b"p" * 1000] * 3


@pytest.mark.parametrize("seed", range(40))
def test_pack_matches_its_twin(seed):
    rng = np.random.default_rng(seed)
    packet_bytes = int(rng.choice([256, 512, 1024, 4096, 16384]))
    frames = random_frames(rng, int(rng.integers(0, 60)),
                           int(rng.choice([64, 300, 2000, 20000])))
    max_packets = int(rng.integers(0, 30))
    sequence = int(rng.integers(0, 2**32 + 5))
    got = kernel_pack(frames, packet_bytes, max_packets, sequence)
    assert got == pack_twin(frames, packet_bytes, max_packets, sequence)


# --- unpack ----------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(40))
def test_unpack_matches_its_twin_packet_by_packet(seed):
    rng = np.random.default_rng(1000 + seed)
    packet_bytes = int(rng.choice([256, 1024, 4096]))
    frames = random_frames(rng, int(rng.integers(1, 50)), int(rng.choice([100, 1500, 9000])))
    _, packets, _, _ = kernel_pack(frames, packet_bytes, 10_000, 1)
    slot_bytes = int(rng.choice([64, 512, 2048, 16384]))
    capacity = int(rng.integers(1, 9))
    kernel = Unpacker(slot_bytes, capacity)
    partial = None
    for seq, packet in enumerate(packets, start=1):
        if rng.random() < 0.1:  # corrupt a byte of some packets
            bad = bytearray(packet)
            bad[int(rng.integers(0, len(bad)))] ^= 0xFF
            packet = bytes(bad)
        cursor = 0
        while True:
            twin = unpack_twin(packet, cursor, seq, slot_bytes, capacity, partial)
            got = kernel.unpack(packet, cursor, seq)
            assert got == twin[:5]
            partial = twin[5]
            assert kernel.partial == partial
            cursor = got[1]
            if cursor >= len(packet) or got[4]:
                break


@pytest.mark.parametrize("seed", range(30))
def test_frames_come_back_intact_and_in_order_through_any_packet_and_batch_size(seed):
    rng = np.random.default_rng(2000 + seed)
    packet_bytes = int(rng.choice([256, 1024, 4096, 16384]))
    frames = random_frames(rng, int(rng.integers(1, 200)), int(rng.choice([64, 1500, 65504])))
    slot_bytes = 65_504
    capacity = int(rng.integers(1, 70))
    # the sender packs in calls limited to a few packets, as credits allow (at least the
    # packets of the largest frame: the channel never offers fewer)
    least = packets_for_frame(max(map(len, frames)), packet_bytes) + 1
    packets, sent = [], 0
    while sent < len(frames):
        taken, more, _, _ = kernel_pack(frames[sent:], packet_bytes,
                                        least + int(rng.integers(0, 40)), len(packets) + 1)
        assert taken > 0
        sent += taken
        packets += more
    kernel = Unpacker(slot_bytes, capacity)
    received = []
    for seq, packet in enumerate(packets, start=1):
        cursor = 0
        while cursor < len(packet):
            got, cursor, torn, oversized, bad = kernel.unpack(packet, cursor, seq)
            assert (torn, oversized, bad) == (0, 0, 0)
            received += got
    assert received == frames


def test_a_frame_larger_than_the_batch_slot_is_dropped_and_counted_never_cut():
    frames = [b"a" * 100, b"b" * 3000, b"c" * 100, b"d" * 600]
    _, packets, _, _ = kernel_pack(frames, 1024, 20, 1)
    kernel = Unpacker(512, 8)
    received, oversized = [], 0
    for seq, packet in enumerate(packets, start=1):
        got, cursor, _, dropped, _ = kernel.unpack(packet, 0, seq)
        assert cursor == len(packet)
        received += got
        oversized += dropped
    assert received == [b"a" * 100, b"c" * 100] and oversized == 2


def test_a_packet_with_the_wrong_sequence_or_magic_is_skipped_whole():
    _, (packet,), _, _ = kernel_pack([b"x" * 64], 1024, 1, 9)
    kernel = Unpacker(2048, 4)
    assert kernel.unpack(packet, 0, 8) == ([], len(packet), 0, 0, 1)
    assert kernel.unpack(b"\0" + packet[1:], 0, 9)[4] == 1
    assert kernel.unpack(packet, 0, 9) == ([b"x" * 64], len(packet), 0, 0, 0)


def test_a_full_batch_leaves_the_rest_of_the_packet_for_the_next_call():
    frames = [bytes([i]) * 24 for i in range(10)]
    _, (packet,), _, _ = kernel_pack(frames, 4096, 1, 1)
    kernel = Unpacker(64, 4)
    got, cursor, *_ = kernel.unpack(packet, 0, 1)
    assert got == frames[:4] and cursor < len(packet)
    got, cursor, *_ = kernel.unpack(packet, cursor, 1)
    assert got == frames[4:8]
    got, cursor, *_ = kernel.unpack(packet, cursor, 1)
    assert got == frames[8:] and cursor == len(packet)
