"""Message schemas: field name -> offset, width and type inside a message payload.

Late schema binding (seed 002): payloads travel as raw bytes at fixed offsets, and the schema
(``schema_id`` in the message header) names them. The ACL compiler and the selector engine
read fields through a schema; the offload tables read the raw big-endian bytes, so every
value comparison is translated here into intervals of *raw* unsigned integers:

- ``u8 .. u64``: the raw value itself;
- ``i8 .. i64``: two's complement; a value interval that crosses 0 becomes two raw intervals
  (negative values are the top half of the raw range);
- ``ascii``: fixed-width text padded with NUL bytes (1, 2, 4 or 8 bytes); its raw big-endian
  integer orders exactly like the text, so ``symbol == 'IBM'`` and ``symbol < 'M'`` become
  raw intervals too;
- ``f32``/``f64``: readable (selectors), not usable in offloaded ACLs.

Offsets are bytes from the payload start (message byte 40); fields may not overlap.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from nic_offload.errors import SchemaError

MAX_SCHEMA_ID = (1 << 16) - 1
"""schema_id is u16 on the wire; 0 means opaque bytes (no schema)."""

TEXT_PAD = b"\x00"


class FieldType(Enum):
    """Field types: (struct code, width in bytes, signed?)."""

    U8 = ("B", 1, False)
    U16 = ("H", 2, False)
    U32 = ("I", 4, False)
    U64 = ("Q", 8, False)
    I8 = ("b", 1, True)
    I16 = ("h", 2, True)
    I32 = ("i", 4, True)
    I64 = ("q", 8, True)
    F32 = ("f", 4, True)
    F64 = ("d", 8, True)
    ASCII = ("s", 0, False)
    """Fixed width given per field (1, 2, 4 or 8 bytes for ACLs; any width to read)."""

    @property
    def code(self) -> str:
        return self.value[0]

    @property
    def is_integer(self) -> bool:
        return self.code in "BHIQbhiq"

    @property
    def is_float(self) -> bool:
        return self.code in "fd"


TYPE_NAMES = {t.name.lower(): t for t in FieldType}
RAW_WIDTHS_BYTES = (1, 2, 4, 8)
"""Widths whose raw bytes an offload table can compare as one unsigned integer."""


@dataclass(frozen=True, slots=True)
class SchemaField:
    """One field: ``width`` bytes of ``type`` at ``offset`` bytes into the payload."""

    name: str
    offset: int
    type: FieldType
    width: int

    @property
    def end(self) -> int:
        return self.offset + self.width

    @property
    def bits(self) -> int:
        return self.width * 8

    @property
    def raw_max(self) -> int:
        return (1 << self.bits) - 1

    @property
    def offloadable(self) -> bool:
        """Can an offload table compare it (as one unsigned integer of its raw bytes)?"""
        return not self.type.is_float and self.width in RAW_WIDTHS_BYTES

    def value_bounds(self) -> tuple[int, int]:
        """Smallest and largest value, in the value domain (ascii: its raw domain)."""
        if self.type.is_integer and self.type.value[2]:
            half = 1 << (self.bits - 1)
            return -half, half - 1
        return 0, self.raw_max

    def raw_of(self, value: int | str | bytes) -> int:
        """The raw unsigned integer of a value (ascii: text padded with NUL bytes)."""
        if self.type is FieldType.ASCII:
            data = value.encode("ascii") if isinstance(value, str) else value
            if not isinstance(data, bytes) or len(data) > self.width:
                raise SchemaError(f"{self.name}: {value!r} is not text of at most "
                                  f"{self.width} ASCII bytes")
            return int.from_bytes(data.ljust(self.width, TEXT_PAD), "big")
        if not isinstance(value, int) or isinstance(value, bool) or self.type.is_float:
            raise SchemaError(f"{self.name} ({self.type.name.lower()}) compares with integers "
                              f"in the offload, not {value!r}")
        low, high = self.value_bounds()
        if not low <= value <= high:
            raise SchemaError(f"{self.name}: {value} is outside {low}..{high}")
        return value & self.raw_max

    def raw_intervals(self, low: int, high: int) -> list[tuple[int, int]]:
        """Raw unsigned intervals (inclusive, sorted, disjoint) holding exactly the values
        ``low..high`` (value domain; ascii: raw domain); empty when ``low > high``."""
        vmin, vmax = self.value_bounds()
        low, high = max(low, vmin), min(high, vmax)
        if low > high:
            return []
        if low >= 0:
            return [(low, high)]
        if high < 0:
            return [(low & self.raw_max, high & self.raw_max)]
        return [(0, high), (low & self.raw_max, self.raw_max)]

    def read(self, payload: bytes | memoryview) -> int | float | str:
        """The field's value in ``payload`` (pure Python; the reference for selectors)."""
        data = bytes(payload[self.offset:self.end])
        if len(data) < self.width:
            raise SchemaError(f"{self.name}: the payload has {len(payload)} bytes, the field "
                              f"ends at {self.end}")
        if self.type is FieldType.ASCII:
            return data.rstrip(TEXT_PAD).decode("ascii", errors="replace")
        return struct.unpack(">" + self.type.code, data)[0]

    def read_raw(self, payload: bytes | memoryview) -> int:
        """The raw unsigned big-endian integer of the field's bytes."""
        data = bytes(payload[self.offset:self.end])
        if len(data) < self.width:
            raise SchemaError(f"{self.name}: the payload ends before byte {self.end}")
        return int.from_bytes(data, "big")

    def encode(self, value: int | float | str) -> bytes:
        if self.type is FieldType.ASCII:
            return self.raw_of(value).to_bytes(self.width, "big")
        try:
            return struct.pack(">" + self.type.code, value)
        except struct.error as exc:
            raise SchemaError(f"{self.name}: cannot encode {value!r} as "
                              f"{self.type.name.lower()} ({exc})") from None


def _brief(value: object) -> str:
    """A value for a message (a container by its kind: one nested deeply cannot be printed)."""
    if isinstance(value, dict | list | tuple):
        return f"{type(value).__name__} of {len(value)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(value: object, field: object, what: str) -> int:
    """An offset or width: an integer (not a bool, a float or digits in a string)."""
    if isinstance(value, bool):
        raise SchemaError(f"field {field!r}: the {what} must be an integer, not {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise SchemaError(f"field {field!r}: the {what} must be an integer, not "
                          f"{_brief(value)}") from None


@dataclass(frozen=True)
class Schema:
    """A named layout of payload fields (``schema_id`` as in the message header)."""

    name: str
    schema_id: int
    fields: tuple[SchemaField, ...]

    def __post_init__(self) -> None:
        if not 0 < self.schema_id <= MAX_SCHEMA_ID:
            raise SchemaError(f"schema {self.name!r}: schema_id must be 1..{MAX_SCHEMA_ID} "
                              "(0 means opaque payload)")
        names: set[str] = set()
        spans = sorted((f.offset, f.end, f.name) for f in self.fields)
        for f in self.fields:
            if not f.name.isidentifier() or f.name in names:
                raise SchemaError(f"schema {self.name!r}: field names must be distinct "
                                  f"identifiers ({f.name!r})")
            names.add(f.name)
            if f.offset < 0 or f.width < 1:
                raise SchemaError(f"schema {self.name!r}: field {f.name!r} needs offset >= 0 "
                                  "and width >= 1")
            fixed = f.type.value[1]
            if fixed and f.width != fixed:
                raise SchemaError(f"schema {self.name!r}: {f.type.name.lower()} field "
                                  f"{f.name!r} is {fixed} bytes wide, not {f.width}")
        for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
            if start < end:
                raise SchemaError(f"schema {self.name!r}: fields {name!r} and {other!r} "
                                  "overlap; give each its own bytes")

    @classmethod
    def of(cls, name: str, schema_id: int,
           fields: Iterable[tuple[str, int, str] | tuple[str, int, str, int]]) -> Schema:
        """``Schema.of("quote", 7, [("price", 0, "u32"), ("symbol", 8, "ascii", 8)])``."""
        built = []
        for spec in fields:
            if not isinstance(spec, tuple | list) or len(spec) not in (3, 4):
                raise SchemaError(f"field {_brief(spec)}: give (name, offset, type) or (name, "
                                  "offset, type, width)")
            fname, offset, type_name = spec[0], spec[1], spec[2]
            if not isinstance(fname, str):
                raise SchemaError(f"field name {_brief(fname)} is not a string")
            ftype = TYPE_NAMES.get(type_name.lower()) if isinstance(type_name, str) else None
            if ftype is None:
                raise SchemaError(f"field {fname!r}: unknown type {_brief(type_name)}; types "
                                  f"are {', '.join(TYPE_NAMES)}")
            width = spec[3] if len(spec) > 3 else ftype.value[1]  # type: ignore[misc]
            if not width:
                raise SchemaError(f"field {fname!r}: ascii fields need a width")
            built.append(SchemaField(fname, _integer(offset, fname, "offset"), ftype,
                                     _integer(width, fname, "width")))
        return cls(name, schema_id, tuple(built))

    def field(self, name: str) -> SchemaField:
        for f in self.fields:
            if f.name == name:
                return f
        raise SchemaError(f"schema {self.name!r} has no field {name!r}; its fields are "
                          f"{', '.join(f.name for f in self.fields)}")

    def field_at(self, index: int) -> SchemaField:
        """The ``index``-th field in declaration order (the seed's ``FIELD(n)``)."""
        if not 0 <= index < len(self.fields):
            raise SchemaError(f"schema {self.name!r} has fields 0..{len(self.fields) - 1}, "
                              f"not FIELD({index})")
        return self.fields[index]

    @property
    def size(self) -> int:
        """Payload bytes the fields need."""
        return max((f.end for f in self.fields), default=0)

    def encode(self, values: Mapping[str, Any], size: int | None = None) -> bytes:
        """A payload holding ``values`` (missing fields are zero) of ``size`` bytes."""
        payload = bytearray(max(self.size, size or 0))
        for name, value in values.items():
            f = self.field(name)
            payload[f.offset:f.end] = f.encode(value)
        return bytes(payload)

    def decode(self, payload: bytes | memoryview) -> dict[str, int | float | str]:
        return {f.name: f.read(payload) for f in self.fields if f.end <= len(payload)}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "schema_id": self.schema_id,
                "fields": [{"name": f.name, "offset": f.offset, "type": f.type.name.lower(),
                            "width": f.width} for f in self.fields]}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Schema:
        try:
            return cls.of(doc["name"], int(doc["schema_id"]),
                          [(f["name"], f["offset"], f["type"], f["width"]) for f in doc["fields"]])
        except (KeyError, TypeError) as exc:
            raise SchemaError(f"schema document is incomplete ({exc!r}); write it with "
                              "Schema.to_dict()") from None
