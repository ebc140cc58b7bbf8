"""The persistence kernels against their pure-Python twins on generated inputs."""

from __future__ import annotations

import random
import struct
import zlib

import numpy as np
import pytest

from appliance.persistence import _kernels as k

_HEADER = struct.Struct("<IIQQ")


def encode_twin(records: list[tuple[int, int, bytes]]) -> bytes:
    """Records as layout.py draws them, with zlib's CRC-32."""
    out = bytearray()
    for seq, ts, payload in records:
        body = struct.pack("<IQQ", len(payload), seq, ts) + payload
        out += struct.pack("<I", zlib.crc32(body)) + body + bytes(-len(payload) % 8)
    return bytes(out)


def scan_twin(data: bytes, prev_seq: int, max_payload: int) -> tuple[list, int, int]:
    """(records (seq, ts, offset, length), position after the last valid, status)."""
    pos, out = 0, []
    while pos < len(data):
        if len(data) - pos < 24:
            return out, pos, k.SCAN_INCOMPLETE
        crc, n, seq, ts = _HEADER.unpack_from(data, pos)
        if n > max_payload:
            return out, pos, k.SCAN_CORRUPT
        size = 24 + (n + 7) // 8 * 8
        if len(data) - pos < size:
            return out, pos, k.SCAN_INCOMPLETE
        if zlib.crc32(data[pos + 4 : pos + 24 + n]) != crc or seq <= prev_seq:
            return out, pos, k.SCAN_CORRUPT
        out.append((seq, ts, pos, n))
        prev_seq = seq
        pos += size
    return out, pos, k.SCAN_END


def _records(rng: random.Random, count: int) -> list[tuple[int, int, bytes]]:
    seq = rng.randrange(1, 1000)
    out = []
    for _ in range(count):
        seq += rng.randrange(1, 3)
        out.append((seq, rng.randrange(1 << 63), rng.randbytes(rng.choice((0, 1, 7, 8, 63, 64,
                                                                          rng.randrange(2000))))))
    return out


def _array(data: bytes, extra: int = 0) -> np.ndarray:
    buf = np.zeros((len(data) + extra + 7) // 8 * 8 + 8, np.uint8)
    buf[: len(data)] = np.frombuffer(data, np.uint8)
    return buf


def _scan(buf: np.ndarray, end: int, prev: int, max_payload: int = 1 << 20):
    cap = 4096
    seqs, stamps = np.zeros(cap, np.uint64), np.zeros(cap, np.uint64)
    offsets, lengths = np.zeros(cap, np.int64), np.zeros(cap, np.int64)
    count, pos, status = k._scan(buf, 0, end, np.uint64(prev), max_payload, k.TABLES, seqs,
                                 stamps, offsets, lengths)
    records = list(zip(seqs[:count].tolist(), stamps[:count].tolist(),
                       offsets[:count].tolist(), lengths[:count].tolist()))
    return records, int(pos), int(status)


@pytest.mark.parametrize("seed", range(20))
def test_crc32_is_zlibs_crc32(seed):
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(1, 5000))
    buf = _array(data)
    start = rng.randrange(0, len(data)) // 4 * 4
    end = rng.randrange(start, len(data) + 1)
    assert k._crc32(buf, start, end, k.TABLES) == zlib.crc32(data[start:end])


@pytest.mark.parametrize("seed", range(20))
def test_encode_writes_the_twins_bytes(seed):
    rng = random.Random(seed)
    records = _records(rng, rng.randrange(1, 60))
    src = b"".join(p for _, _, p in records)
    lengths = np.array([len(p) for _, _, p in records], np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    expected = encode_twin(records)
    out = np.full(len(expected) + 64, 0xAA, np.uint8)
    end = k._encode(out, 8, np.array([r[0] for r in records], np.uint64),
                    np.array([r[1] for r in records], np.uint64), np.frombuffer(src, np.uint8),
                    offsets, lengths, k.TABLES)
    assert end == 8 + len(expected)
    assert out[8:end].tobytes() == expected


@pytest.mark.parametrize("seed", range(30))
def test_scan_agrees_with_its_twin_on_damaged_logs(seed):
    rng = random.Random(seed)
    data = bytearray(encode_twin(_records(rng, rng.randrange(1, 40))))
    damage = rng.choice(("none", "truncate", "flip", "garbage", "zeros", "big_length"))
    if damage == "truncate":
        del data[rng.randrange(len(data)):]
    elif damage == "flip":
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif damage == "garbage":
        data += rng.randbytes(rng.randrange(1, 100))
    elif damage == "zeros":
        data += bytes(rng.randrange(1, 100))
    elif damage == "big_length":
        data += struct.pack("<II", 0, 0xFFFF_FFF0) + bytes(40)
    data = bytes(data)
    assert _scan(_array(data), len(data), 0) == scan_twin(data, 0, 1 << 20)


def test_scan_refuses_a_sequence_that_does_not_rise():
    data = encode_twin([(5, 0, b"a"), (6, 0, b"b"), (6, 0, b"c")])
    records, pos, status = _scan(_array(data), len(data), 0)
    assert [r[0] for r in records] == [5, 6] and status == k.SCAN_CORRUPT and pos == 64
    records, _, status = _scan(_array(data), len(data), 5)
    assert records == [] and status == k.SCAN_CORRUPT
