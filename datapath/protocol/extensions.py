"""Encode and read the message extensions of ``extension_layout``: the header block (user
properties) and the segment descriptor at the end of a message's payload region.

Appliances forward them as payload bytes; the subscribing client reads them (``split``) and
drops a message whose extensions do not parse (``ExtensionError``, counted by the caller).
"""

from __future__ import annotations

from collections.abc import Mapping

from datapath.protocol import extension_layout as xl
from datapath.protocol import message_layout as ml

Buffer = bytes | bytearray | memoryview
HeaderValue = str | bytes

_ENTRY = xl.HEADER_ENTRY_STRUCT
_TAIL = xl.HEADER_TAIL_STRUCT
_SEGMENT = xl.SEGMENT_STRUCT
HEADERS_FLAG = int(ml.MessageFlags.HEADERS)
SEGMENT_FLAG = int(ml.MessageFlags.SEGMENT)
EXTENSION_FLAGS = HEADERS_FLAG | SEGMENT_FLAG


class ExtensionError(ValueError):
    """A header block or segment descriptor that does not parse, or headers over a limit."""


def encode_headers(headers: Mapping[str, HeaderValue]) -> bytes:
    """The header block of ``headers`` (str -> str or bytes); ExtensionError naming the limit
    when there are too many, a key or value is of the wrong type, or the block is too large.
    An empty mapping encodes to ``b""`` (no block, no flag)."""
    if not isinstance(headers, Mapping):
        raise ExtensionError(f"headers are a mapping of str to str or bytes, not "
                             f"{type(headers).__name__}")
    if len(headers) > xl.MAX_HEADERS:
        raise ExtensionError(f"{len(headers)} headers; a message carries at most "
                             f"{xl.MAX_HEADERS}")
    parts = []
    size = xl.HEADER_TAIL_BYTES
    for key, value in headers.items():
        if not isinstance(key, str) or not key:
            raise ExtensionError(f"a header key is a non-empty str, not {key!r}")
        k = key.encode("utf-8")
        if len(k) > xl.MAX_HEADER_KEY_BYTES:
            raise ExtensionError(f"header key {key[:40]!r}... is {len(k)} UTF-8 bytes; at "
                                 f"most {xl.MAX_HEADER_KEY_BYTES}")
        if isinstance(value, str):
            kind, v = xl.HEADER_TEXT, value.encode("utf-8")
        elif isinstance(value, (bytes, bytearray, memoryview)):
            kind, v = xl.HEADER_BYTES_VALUE, bytes(value)
        else:
            raise ExtensionError(f"header {key!r}: a value is str or bytes, not "
                                 f"{type(value).__name__}")
        size += xl.HEADER_ENTRY_BYTES + len(k) + len(v)
        if size > xl.MAX_HEADER_BLOCK_BYTES:
            raise ExtensionError(f"headers take more than {xl.MAX_HEADER_BLOCK_BYTES} bytes "
                                 f"encoded (the header block's limit; {xl.HEADER_ENTRY_BYTES} "
                                 "bytes per header besides its key and value)")
        parts.append(_ENTRY.pack(kind, len(k), len(v)) + k + v)
    if not parts:
        return b""
    parts.append(_TAIL.pack(len(parts), size))
    return b"".join(parts)


def encode_segment(segment_id: int, total_len: int, offset: int, index: int,
                   count: int) -> bytes:
    """A segment descriptor (16 bytes)."""
    return _SEGMENT.pack(segment_id, total_len, offset, index, count)


def decode_headers(block: Buffer) -> dict[str, HeaderValue]:
    """The headers of a whole header block (its tail included); ExtensionError if it does not
    parse exactly."""
    n = len(block)
    if n < xl.HEADER_TAIL_BYTES or n > xl.MAX_HEADER_BLOCK_BYTES:
        raise ExtensionError(f"a header block of {n} bytes")
    count, block_len = _TAIL.unpack_from(block, n - xl.HEADER_TAIL_BYTES)
    if block_len != n or count == 0 or count > xl.MAX_HEADERS:
        raise ExtensionError(f"header block tail: count {count}, block_len {block_len} of {n}")
    out: dict[str, HeaderValue] = {}
    pos, end = 0, n - xl.HEADER_TAIL_BYTES
    for _ in range(count):
        if pos + xl.HEADER_ENTRY_BYTES > end:
            raise ExtensionError("a header entry runs past the block")
        kind, klen, vlen = _ENTRY.unpack_from(block, pos)
        pos += xl.HEADER_ENTRY_BYTES
        if kind > xl.HEADER_BYTES_VALUE or klen == 0 or pos + klen + vlen > end:
            raise ExtensionError(f"a header entry: kind {kind}, key {klen}, value {vlen} bytes")
        try:
            key = bytes(block[pos : pos + klen]).decode("utf-8")
            raw = bytes(block[pos + klen : pos + klen + vlen])
            value: HeaderValue = raw.decode("utf-8") if kind == xl.HEADER_TEXT else raw
        except UnicodeDecodeError:
            raise ExtensionError("a header key or text value is not UTF-8") from None
        if key in out:
            raise ExtensionError(f"header {key!r} twice")
        out[key] = value
        pos += klen + vlen
    if pos != end:
        raise ExtensionError(f"{end - pos} bytes after the last header")
    return out


def split(region: Buffer, flags: int
          ) -> tuple[Buffer, dict[str, HeaderValue] | None, tuple[int, ...] | None]:
    """A payload region with extensions -> (application payload, headers or None, segment
    descriptor ``(segment_id, total_len, offset, index, count)`` or None). ExtensionError when
    they do not parse."""
    end = len(region)
    segment = None
    if flags & SEGMENT_FLAG:
        if end < xl.SEGMENT_DESCRIPTOR_BYTES:
            raise ExtensionError(f"a segment of {end} bytes has no room for its descriptor")
        end -= xl.SEGMENT_DESCRIPTOR_BYTES
        segment = _SEGMENT.unpack_from(region, end)
    headers = None
    if flags & HEADERS_FLAG:
        if end < xl.HEADER_TAIL_BYTES:
            raise ExtensionError(f"{end} bytes, no room for a header block's tail")
        block_len = _TAIL.unpack_from(region, end - xl.HEADER_TAIL_BYTES)[1]
        if block_len > end:
            raise ExtensionError(f"a header block of {block_len} bytes in {end}")
        headers = decode_headers(memoryview(region)[end - block_len : end])
        end -= block_len
    return memoryview(region)[:end], headers, segment
