"""The persistence kernels against their pure-Python twins on generated inputs."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from appliance.persistence import _kernels as k

_HEADER = struct.Struct("<IIQQ")
_CRC_TABLE = [0] * 256
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE[_i] = _c


def crc32c_twin(data: bytes) -> int:
    """CRC-32C, a byte at a time (check value of b"123456789": 0xE3069283)."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ _CRC_TABLE[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


def encode_twin(records: list[tuple[int, int, bytes]]) -> bytes:
    """Records as layout.py draws them, with CRC-32C."""
    out = bytearray()
    for seq, ts, payload in records:
        body = struct.pack("<IQQ", len(payload), seq, ts) + payload
        out += struct.pack("<I", crc32c_twin(body)) + body + bytes(-len(payload) % 8)
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
        if crc32c_twin(data[pos + 4 : pos + 24 + n]) != crc or seq <= prev_seq:
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


CRCS = [k._crc32c_sw] + ([k._crc32c_hw] if k.HW_CRC else [])


def test_the_twin_gives_crc32c_check_value():
    assert crc32c_twin(b"123456789") == 0xE3069283


@pytest.mark.parametrize("crc", CRCS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("seed", range(20))
def test_crc32c_kernels_agree_with_the_twin(seed, crc):
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(1, 3000))
    buf = _array(data)
    start = rng.randrange(0, len(data))
    end = rng.randrange(start, len(data) + 1)
    got = crc(buf, buf.view(np.uint32), buf.view(np.uint64), start, end, k.TABLES)
    assert got == crc32c_twin(data[start:end])


def _append(out, pos, limit, records, prev=0, max_payload=1 << 20, interval=256):
    src = b"".join(p for _, _, p in records)
    lengths = np.array([len(p) for _, _, p in records], np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    meta = np.zeros(k.META_FIELDS, np.uint64)
    idx = [np.zeros(1024, np.uint64), np.zeros(1024, np.uint64), np.zeros(1024, np.int64)]
    i, end, status = k._append(out, pos, limit, np.array([r[0] for r in records], np.uint64),
                               np.array([r[1] for r in records], np.uint64),
                               np.frombuffer(src, np.uint8), offsets, lengths, 0,
                               np.uint64(prev), max_payload, 1000, interval, meta, *idx,
                               k.TABLES)
    return int(i), int(end), int(status), meta, idx


@pytest.mark.parametrize("seed", range(20))
def test_append_writes_the_twins_bytes_and_indexes_them(seed):
    rng = random.Random(seed)
    records = _records(rng, rng.randrange(1, 60))
    expected = encode_twin(records)
    out = np.full(len(expected) + 64, 0xAA, np.uint8)
    i, end, status, meta, (iseq, its, ipos) = _append(out, 8, len(out), records)
    assert (i, end, status) == (len(records), 8 + len(expected), k.APPEND_DONE)
    assert out[8:end].tobytes() == expected
    # the index twin: an entry at each record that opens a new 256-byte bucket
    entries, bucket, running, pos = [], 0, 0, 1008
    for seq, ts, p in records:
        running = max(running, ts)
        if pos // 256 + 1 > bucket:
            entries.append((seq, running, pos))
            bucket = pos // 256 + 1
        pos += 24 + (len(p) + 7) // 8 * 8
    count = int(meta[k.META_INDEX_COUNT])
    assert list(zip(iseq[:count].tolist(), its[:count].tolist(), ipos[:count].tolist())) == \
        entries
    assert (int(meta[k.META_FIRST]), int(meta[k.META_LAST]), int(meta[k.META_RECORDS]),
            int(meta[k.META_MAX_TS])) == (records[0][0], records[-1][0], len(records),
                                          max(r[1] for r in records))


def test_append_stops_where_the_next_record_does_not_fit_or_is_refused():
    records = [(1, 0, b"a" * 10), (2, 0, b"b" * 10), (3, 0, b"c" * 10)]
    out = np.zeros(256, np.uint8)
    assert _append(out, 0, 80, records)[:3] == (2, 80, k.APPEND_NO_ROOM)
    assert _append(out, 0, 256, records, prev=1)[:3] == (0, 0, k.APPEND_BAD_SEQUENCE)
    assert _append(out, 0, 256, records, max_payload=9)[:3] == (0, 0, k.APPEND_BAD_LENGTH)
    bad = [(1, 0, b"a"), (5, 0, b"b"), (5, 0, b"c")]
    assert _append(out, 0, 256, bad)[:3] == (2, 64, k.APPEND_BAD_SEQUENCE)


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


@pytest.mark.parametrize("writer", [k._write_record_sw] + ([k._write_record_hw] if k.HW_CRC
                                                             else []),
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("offset", [0, 3, 8])
@pytest.mark.parametrize("length", [0, 5, 8, 61, 1024])
def test_both_record_writers_write_the_twins_record(writer, offset, length):
    payload = bytes(range(256)) * 5
    src = np.frombuffer(bytes(offset) + payload[:length] + bytes(16), np.uint8).copy()
    out = np.full(2048, 0xAA, np.uint8)
    writer(out, out.view(np.uint32), out.view(np.uint64), 16, 77, 99, src,
           src[: len(src) & ~7].view(np.uint64), offset, length, k.TABLES)
    expected = encode_twin([(77, 99, payload[:length])])
    assert out[16 : 16 + len(expected)].tobytes() == expected
