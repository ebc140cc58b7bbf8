"""Schemas: fields at fixed offsets, and value intervals as raw unsigned intervals."""

from __future__ import annotations

import pytest

from nic_offload.errors import SchemaError
from nic_offload.schema import Schema


def test_values_round_trip_through_a_payload():
    schema = Schema.of("q", 3, [("sym", 0, "ascii", 8), ("px", 8, "f64"), ("n", 16, "i16")])
    payload = schema.encode({"sym": "IBM", "px": 101.25, "n": -3}, 24)
    assert len(payload) == 24
    assert schema.decode(payload) == {"sym": "IBM", "px": 101.25, "n": -3}


def test_a_signed_interval_across_zero_becomes_two_raw_intervals():
    field = Schema.of("q", 1, [("n", 0, "i8")]).field("n")
    assert field.raw_intervals(-2, 3) == [(0, 3), (254, 255)]
    assert field.raw_intervals(-128, -1) == [(128, 255)]
    assert field.raw_intervals(5, 1000) == [(5, 127)]
    assert field.raw_intervals(3, 2) == []


def test_ascii_raw_order_is_text_order():
    field = Schema.of("q", 1, [("s", 0, "ascii", 4)]).field("s")
    words = ["", "A", "AA", "AB", "B", "IBM", "Z", "ZZZZ"]
    assert sorted(words, key=field.raw_of) == sorted(words)


def test_overlapping_fields_are_refused():
    with pytest.raises(SchemaError, match="overlap"):
        Schema.of("q", 1, [("a", 0, "u32"), ("b", 2, "u16")])


@pytest.mark.parametrize(("fields", "message"), [
    ([("a", 0, "u33")], "unknown type"),
    ([("a", 0, "ascii")], "need a width"),
    ([("a", 0, "u32", 8)], "4 bytes wide"),
    ([("a", -1, "u8")], "offset >= 0"),
    ([("a", 0, "u8"), ("a", 1, "u8")], "distinct"),
])
def test_bad_fields_are_refused_with_advice(fields, message):
    with pytest.raises(SchemaError, match=message):
        Schema.of("q", 1, fields)


def test_schema_ids_are_sixteen_bits_and_not_zero():
    with pytest.raises(SchemaError, match="opaque"):
        Schema.of("q", 0, [])
    assert Schema.from_dict(Schema.of("q", 9, [("a", 4, "u32")]).to_dict()).field("a").offset == 4
