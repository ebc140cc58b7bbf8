"""The header block and segment descriptor (extension_layout.py): encode, split, and every
way a hostile block is refused."""

import random

import pytest

from datapath.protocol import extension_layout as xl
from datapath.protocol.codec import decode_frame, encode_data_frame
from datapath.protocol.extensions import (
    HEADERS_FLAG,
    SEGMENT_FLAG,
    ExtensionError,
    decode_headers,
    encode_headers,
    encode_segment,
    split,
)

HEADERS = {"a": "1", "bin": b"\x00\xff", "\u00e9": "\u2713", "empty": ""}


def test_headers_round_trip_with_their_types():
    block = encode_headers(HEADERS)
    assert decode_headers(block) == HEADERS
    payload, headers, segment = split(b"payload" + block, HEADERS_FLAG)
    assert bytes(payload) == b"payload" and headers == HEADERS and segment is None
    assert encode_headers({}) == b""


def test_a_segment_with_headers_splits_into_its_parts():
    region = b"chunk" + encode_headers({"k": "v"}) + encode_segment(7, 100, 0, 0, 20)
    payload, headers, segment = split(region, HEADERS_FLAG | SEGMENT_FLAG)
    assert (bytes(payload), headers, segment) == (b"chunk", {"k": "v"}, (7, 100, 0, 0, 20))
    payload, headers, segment = split(b"x" + encode_segment(7, 100, 5, 1, 20), SEGMENT_FLAG)
    assert (bytes(payload), headers, segment) == (b"x", None, (7, 100, 5, 1, 20))


def test_a_message_without_extensions_is_byte_identical_and_views_split_it():
    plain = encode_data_frame([{"topic_key": 1, "sequence": 1, "payload": b"abc"}])
    assert plain[32 + 31] == 0  # no flag, no block
    frame = encode_data_frame([{"topic_key": 1, "sequence": 1, "flags": HEADERS_FLAG,
                                "payload": b"abc" + encode_headers({"k": "v"})}])
    m = next(decode_frame(frame).messages())
    payload, headers, _ = m.extensions()
    assert bytes(payload) == b"abc" and headers == {"k": "v"}


@pytest.mark.parametrize("headers, limit", [
    ({f"k{i}": "" for i in range(xl.MAX_HEADERS + 1)}, f"at most {xl.MAX_HEADERS}"),
    ({"k": "v" * xl.MAX_HEADER_BLOCK_BYTES}, f"{xl.MAX_HEADER_BLOCK_BYTES} bytes"),
    ({"k" * (xl.MAX_HEADER_KEY_BYTES + 1): ""}, f"at most {xl.MAX_HEADER_KEY_BYTES}"),
    ({"": "v"}, "non-empty str"),
    ({1: "v"}, "non-empty str"),
    ({"k": 1.5}, "str or bytes, not float"),
])
def test_headers_over_a_limit_or_of_the_wrong_type_are_refused_naming_why(headers, limit):
    with pytest.raises(ExtensionError, match=limit):
        encode_headers(headers)


def _entry(kind, key, value):
    return xl.HEADER_ENTRY_STRUCT.pack(kind, len(key), len(value)) + key + value


def _block(*entries, count=None, extra=b""):
    body = b"".join(entries) + extra
    return body + xl.HEADER_TAIL_STRUCT.pack(len(entries) if count is None else count,
                                             len(body) + 4)


@pytest.mark.parametrize("region", [
    _block(_entry(0, b"k", b"v"), count=2),  # a count above the entries
    _block(_entry(0, b"k", b"v"), count=0),
    _block(_entry(0, b"k", b"v"), extra=b"zz"),  # bytes after the last entry
    _block(_entry(2, b"k", b"v")),  # unknown value kind
    _block(_entry(0, b"", b"v")),  # empty key
    _block(_entry(0, b"\xff", b"v")),  # key not UTF-8
    _block(_entry(0, b"k", b"\xc3")),  # text value not UTF-8
    _block(_entry(0, b"k", b"v"), _entry(1, b"k", b"w")),  # a key twice
    b"abc" + xl.HEADER_TAIL_STRUCT.pack(1, 200),  # block longer than the region
    b"\x00\x01",  # no room for the tail
    b"a" * 2000 + xl.HEADER_TAIL_STRUCT.pack(1, 1500),  # above the block limit
    xl.HEADER_ENTRY_STRUCT.pack(0, 1, 60000) + b"k" + xl.HEADER_TAIL_STRUCT.pack(1, 9),
])
def test_hostile_header_blocks_are_refused(region):
    with pytest.raises(ExtensionError):
        split(region, HEADERS_FLAG)


def test_a_segment_flag_without_room_for_the_descriptor_is_refused():
    with pytest.raises(ExtensionError):
        split(b"x" * (xl.SEGMENT_DESCRIPTOR_BYTES - 1), SEGMENT_FLAG)


def test_random_bytes_never_raise_anything_but_extension_error():
    rng = random.Random(7)
    good = b"p" + encode_headers(HEADERS) + encode_segment(1, 10, 0, 0, 1)
    for _ in range(3000):
        region = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            region[rng.randrange(len(region))] = rng.randrange(256)
        region = region[: rng.randint(0, len(region))] if rng.random() < 0.3 else region
        try:
            split(bytes(region), HEADERS_FLAG | SEGMENT_FLAG)
        except ExtensionError:
            pass
