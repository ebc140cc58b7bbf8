"""Wireshark's view of native protocol v1: a Lua dissector generated from the layout modules.

The shipped ``topicwire.lua`` has two parts. Down to ``WALKER_MARKER``: the layouts of
``datapath/protocol`` (frame header, message header, every admin entry, their enums and
bounds) as Lua tables, written by ``generate()``. Below it: the walker, hand-written Lua that
applies the codec's checks in the codec's order to those tables (edit it there). A test
regenerates the file and compares, so the declarations cannot drift from the codec.

    topicwire dissector --out topicwire.lua
    tshark -X lua_script:topicwire.lua -r capture.pcap -V
"""

from __future__ import annotations

import struct
from enum import IntEnum
from pathlib import Path

import numpy as np

from datapath.config import MAX_FRAME_BYTES, NATIVE_UDP_PORT
from datapath.protocol import admin_layout as al
from datapath.protocol import extension_layout as xl
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml

HERE = Path(__file__).parent
SHIPPED_DISSECTOR = HERE / "topicwire.lua"
"""The dissector as shipped (package data): ``generate()``'s output."""
WALKER_MARKER = "-- ==== end of the generated declarations; the walker below is hand-written ===="
"""The line between the generated declarations and the walker in ``topicwire.lua``."""

_HEX_FIELDS = {"magic", "flags", "topic_key"}
"""Shown in hex: identifiers read as bit patterns (topic keys are hex everywhere)."""
_TIME_FIELDS = {"send_ts_ns", "publish_ts_ns"}
"""ns since the Unix epoch: the tree shows them as ISO-8601 too."""
_WIDTHS = {"B": 1, "H": 2, "I": 4, "Q": 8}

_ENUMS: dict[str, type[IntEnum]] = {
    "frame_type": fl.FrameType, "qos": ml.Qos, "role": al.NodeRole, "state": al.FlowState,
    "policy": al.FlowPolicy, "op": al.SuccessorOp, "kind": al.ControlKind,
    "value_kind": xl.ValueKind,
}
"""Every enum a field holds, by field name (the admin layouts name theirs)."""

_CONSTANTS = {
    "FRAME_MAGIC": fl.FRAME_MAGIC, "PROTOCOL_VERSION": fl.PROTOCOL_VERSION,
    "FRAME_ALIGNMENT_BYTES": fl.FRAME_ALIGNMENT_BYTES, "FRAME_HEADER_BYTES":
    fl.FRAME_HEADER_BYTES, "MAX_FRAME_TYPE": int(fl.MAX_FRAME_TYPE), "KNOWN_FRAME_FLAGS":
    fl.KNOWN_FRAME_FLAGS, "AUTH_TRAILER_FLAG": int(fl.FrameFlags.AUTH_TRAILER),
    "AUTH_TRAILER_BYTES": fl.AUTH_TRAILER_BYTES, "AUTH_MAC_BYTES": fl.AUTH_MAC_BYTES,
    "MAX_FRAME_BYTES": MAX_FRAME_BYTES, "MAGIC_OFFSET": fl.MAGIC_OFFSET,
    "VERSION_OFFSET": fl.VERSION_OFFSET, "TYPE_OFFSET": fl.TYPE_OFFSET,
    "FLAGS_OFFSET": fl.FLAGS_OFFSET, "MSG_COUNT_OFFSET": fl.MSG_COUNT_OFFSET,
    "FRAME_LEN_OFFSET": fl.FRAME_LEN_OFFSET, "MESSAGE_HEADER_BYTES": ml.MESSAGE_HEADER_BYTES,
    "MAX_MESSAGES_PER_FRAME": ml.MAX_MESSAGES_PER_FRAME, "MAX_QOS": int(ml.MAX_QOS),
    "KNOWN_MESSAGE_FLAGS": ml.KNOWN_MESSAGE_FLAGS, "QOS_OFFSET": ml.QOS_OFFSET,
    "MSG_FLAGS_OFFSET": ml.MSG_FLAGS_OFFSET, "PAYLOAD_LEN_OFFSET": ml.PAYLOAD_LEN_OFFSET,
    "PAYLOAD_OFFSET": ml.PAYLOAD_OFFSET, "NATIVE_UDP_PORT": NATIVE_UDP_PORT,
    "HEADERS_FLAG": int(ml.MessageFlags.HEADERS), "SEGMENT_FLAG": int(ml.MessageFlags.SEGMENT),
    "HEADER_ENTRY_BYTES": xl.HEADER_ENTRY_BYTES, "HEADER_TAIL_BYTES": xl.HEADER_TAIL_BYTES,
    "SEGMENT_DESCRIPTOR_BYTES": xl.SEGMENT_DESCRIPTOR_BYTES, "MAX_HEADERS": xl.MAX_HEADERS,
    "MAX_HEADER_BLOCK_BYTES": xl.MAX_HEADER_BLOCK_BYTES,
    "HEADER_TEXT": int(xl.ValueKind.TEXT),
}


def _field(name: str, offset: int, width: int, enum: str | None = None) -> str:
    parts = [f'name = "{name}"', f"offset = {offset}", f"width = {width}"]
    if name in _HEX_FIELDS:
        parts.append("hex = true")
    if name in _TIME_FIELDS:
        parts.append("time = true")
    if enum:
        parts.append(f'enum = "{enum}"')
    return "{" + ", ".join(parts) + "}"


def _dtype_fields(dtype: np.dtype) -> str:
    rows = []
    for name in dtype.names:
        sub, offset = dtype.fields[name][:2]
        rows.append(_field(name, offset, sub.itemsize, name if name in _ENUMS else None))
    return "{\n  " + ",\n  ".join(rows) + ",\n}"


def _struct_fields(layout_struct: struct.Struct, names: tuple[str, ...],
                   enums: dict[str, str]) -> str:
    """Lua rows of a struct's members; reserved members (``_r``...) become ``reserved``..."""
    rows, offset = [], 0
    for code, name in zip(layout_struct.format.lstrip(">"), names):
        width = _WIDTHS[code]
        shown = "reserved" + name[2:] if name.startswith("_") else name
        rows.append(_field(shown, offset, width, enums.get(name)))
        offset += width
    return "{" + ", ".join(rows) + "}"


def _admin_layouts() -> str:
    rows = []
    for frame_type, layout in sorted(al.ADMIN_LAYOUTS.items()):
        enums = {name: name for name, enum in layout.enums}
        for name, enum in layout.enums:
            assert _ENUMS[name] is enum, f"wireshark: enum of {name} is not {enum.__name__}"
        body = layout.body_header
        body_names = al.BODY_HEADER_FIELDS.get(frame_type, ())
        texts = ", ".join(f'"{t}"' for t in layout.texts)
        rows.append(
            f"[{int(frame_type)}] = {{ -- {frame_type.name}\n"
            f'  entry = "{layout.entry_type.__name__.lower()}",\n'
            f"  fixed_bytes = {layout.entry_struct.size},\n"
            f"  fields = {_struct_fields(layout.entry_struct, layout.fields, enums)},\n"
            f"  texts = {{{texts}}},\n"
            f"  text_limit_bytes = {layout.text_limit_bytes},\n"
            f'  body_name = "{frame_type.name.lower()}",\n'
            f"  body_bytes = {body.size if body else 0},\n"
            f"  body_fields = {_struct_fields(body, body_names, {}) if body else '{}'},\n"
            f"  names_keys = {_names_keys(layout)},\n}}")
    return "{\n" + ",\n".join(rows) + ",\n}"


def _names_keys(layout: al.AdminLayout) -> str:
    """Whether an entry names a topic key (``topic_key`` first, its only text ``topic``): the
    dissector keeps these to name the keys of later messages."""
    names = layout.fields[0] == "topic_key" and layout.texts == ("topic",)
    assert not names or layout.entry_struct.format.lstrip(">")[0] == "Q"
    return "true" if names else "false"


def _enum_tables() -> str:
    rows = []
    for name, enum in _ENUMS.items():
        values = ", ".join(f'[{int(m)}] = "{m.name}"' for m in enum)
        rows.append(f"  {name} = {{{values}}}")
    return "{\n" + ",\n".join(rows) + ",\n}"


def _auth_fields() -> str:
    names = ("key_id", "epoch", "auth_seq")
    return _struct_fields(fl.AUTH_TRAILER_STRUCT, names, {})


def generate() -> str:
    """The whole dissector (Lua source) for the layouts this codec speaks."""
    constants = ",\n".join(f"  {k} = {v}" for k, v in _CONSTANTS.items())
    message_types = ", ".join(f"[{int(t)}] = true" for t in sorted(fl.MESSAGE_FRAME_TYPES))
    declarations = "\n\n".join([
        "-- topicwire native protocol v1 (docs/protocol.md): Wireshark dissector.\n"
        "-- The declarations down to the marker line are GENERATED by `topicwire dissector`\n"
        "-- from datapath/protocol (frame_layout, message_layout, extension_layout,\n"
        "-- admin_layout): do not edit\n"
        "-- them, regenerate. The walker below the marker is hand-written.\n"
        "--   tshark -X lua_script:topicwire.lua -r capture.pcap -V\n"
        "-- or copy it to Wireshark's personal Lua plugins folder.",
        f"local C = {{\n{constants},\n}}",
        f"local ENUMS = {_enum_tables()}",
        f"local HEADER_FIELDS = {_dtype_fields(fl.FRAME_HEADER_DTYPE)}",
        f"local MESSAGE_FIELDS = {_dtype_fields(ml.MESSAGE_HEADER_DTYPE)}",
        f"local AUTH_FIELDS = {_auth_fields()}",
        "local HEADER_ENTRY_FIELDS = " + _struct_fields(
            xl.HEADER_ENTRY_STRUCT, xl.HEADER_ENTRY_FIELDS, {"value_kind": "value_kind"}),
        "local HEADER_TAIL_FIELDS = " + _struct_fields(
            xl.HEADER_TAIL_STRUCT, xl.HEADER_TAIL_FIELDS, {}),
        "local SEGMENT_FIELDS = " + _struct_fields(xl.SEGMENT_STRUCT, xl.SEGMENT_FIELDS, {}),
        f"local MESSAGE_FRAME_TYPES = {{{message_types}}}",
        f"local ADMIN_LAYOUTS = {_admin_layouts()}",
    ])
    return declarations + "\n\n" + WALKER_MARKER + "\n" + _walker()


def _walker() -> str:
    """The hand-written walker: the shipped file below ``WALKER_MARKER``."""
    text = SHIPPED_DISSECTOR.read_text()
    at = text.find(WALKER_MARKER + "\n")
    if at < 0:
        raise RuntimeError(f"wireshark: {SHIPPED_DISSECTOR} has no line {WALKER_MARKER!r}")
    return text[at + len(WALKER_MARKER) + 1:]
