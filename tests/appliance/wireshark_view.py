"""What tshark with the generated dissector and what the codec each make of a frame.

Both views have the same shape: ``header``, ``messages``, ``body``, ``entries``, ``auth``
(field name -> value) and ``malformed`` ((reason, byte offset) or None), so a test compares
them field by field.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from appliance.ops.wireshark import SHIPPED_DISSECTOR
from datapath.protocol import extension_layout as xl
from datapath.protocol import frame_layout as fl
from datapath.protocol.codec import decode_frame
from datapath.protocol.errors import ProtocolError
from datapath.protocol.extensions import EXTENSION_FLAGS, ExtensionError

TSHARK = shutil.which("tshark")
requires_tshark = pytest.mark.skipif(
    TSHARK is None, reason="tshark is not installed (`make setup` installs Debian's tshark)")

_BYTES_FIELDS = {"payload", "mac", "app_payload", "value_bytes"}
_TEXT_FIELDS = {"topic", "name", "pattern", "selector", "client_id", "successor_id", "document",
                "key", "value"}
_GENERATED_TEXT_FIELDS = {"topic_name"}
"""Texts the dissector adds from what it saw before (no bytes of their own)."""


def tshark_frames(pcap: Path) -> list[dict[str, Any] | None]:
    """Per packet: the dissector's view of its native frame, or None (no topicwire layer)."""
    return [layers[0] if layers else None for layers in tshark_layers(pcap)]


def tshark_layers(pcap: Path) -> list[list[dict[str, Any]]]:
    """Per packet: the dissector's views of every native frame in it (a TCP segment holds
    several; a frame reassembled from segments shows in the packet that completes it)."""
    done = subprocess.run([TSHARK, "-n", "-2", "-X", f"lua_script:{SHIPPED_DISSECTOR}", "-r",
                           str(pcap), "-T", "pdml"], capture_output=True, text=True,
                          timeout=120)  # -2: two passes, keys named by later updates too
    assert done.returncode == 0, done.stderr
    assert "Lua" not in done.stderr, done.stderr  # a Lua error in the dissector
    return [[_tshark_view(layer) for layer in packet.findall("proto[@name='topicwire']")]
            for packet in ET.fromstring(done.stdout).iter("packet")]


def _value(field: ET.Element) -> Any:
    leaf = field.get("name").rsplit(".", 1)[1]
    if leaf in _BYTES_FIELDS:
        return field.get("value", "")
    if leaf == "malformed" or leaf in _GENERATED_TEXT_FIELDS:
        return field.get("show")
    if leaf in _TEXT_FIELDS:  # the bytes it covers ("show" escapes control characters)
        return bytes.fromhex(field.get("value", "")).decode("utf-8", "replace")
    return int(field.get("show"), 0)


def _raw(field: ET.Element, frame_start: int, raw: dict[str, str]) -> None:
    """Note the bytes a field covers (its offset in the frame: its size) and their hex."""
    if field.get("value") is not None and field.get("size") != "0":
        raw[f"{int(field.get('pos')) - frame_start}:{field.get('size')}"] = field.get("value")


def _leaves(node: ET.Element, frame_start: int, raw: dict[str, str]) -> dict[str, Any]:
    out = {}
    for field in node.findall("field"):
        name = field.get("name")
        if not name.startswith("topicwire."):  # the expert item of malformed extensions
            continue
        if name == "topicwire.headers":  # a message's header block: key -> value
            out["headers"] = _headers(field, frame_start, raw)
        elif name == "topicwire.segment":
            out["segment"] = _leaves(field, frame_start, raw)
        elif name == "topicwire.message.extension_error":
            out["extension_error"] = field.get("show")
        else:
            out[name.rsplit(".", 1)[1]] = _value(field)
            _raw(field, frame_start, raw)
    return out


def _headers(node: ET.Element, frame_start: int, raw: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in node.findall("field"):
        if field.get("name") == "topicwire.header":
            entry = _leaves(field, frame_start, raw)
            if "key" in entry:  # (an entry that does not fit its block shows no key)
                out[entry["key"]] = entry.get("value", entry.get("value_bytes"))
        else:
            _raw(field, frame_start, raw)
    return out


def _tshark_view(layer: ET.Element) -> dict[str, Any]:
    start = int(layer.get("pos"))
    view: dict[str, Any] = {"header": {}, "body": {}, "messages": [], "entries": [], "auth": {},
                            "malformed": None, "raw": {}}
    malformed = {}
    for field in layer.findall("field"):
        name = field.get("name")
        if not name.startswith("topicwire."):  # the expert item of a malformed frame
            continue
        if name == "topicwire.message":
            view["messages"].append(_leaves(field, start, view["raw"]))
        elif name == "topicwire.entry":
            view["entries"].append(_leaves(field, start, view["raw"]))
        elif name == "topicwire.auth":
            view["auth"] = _leaves(field, start, view["raw"])
        elif name.startswith("topicwire.malformed"):
            malformed[name] = _value(field)
        elif name.count(".") == 1:
            view["header"][name.split(".")[1]] = _value(field)
            _raw(field, start, view["raw"])
        else:
            view["body"][name.rsplit(".", 1)[1]] = _value(field)
            _raw(field, start, view["raw"])
    if malformed:
        view["malformed"] = (malformed["topicwire.malformed"],
                             malformed["topicwire.malformed_offset"])
    return view


def codec_view(data: bytes) -> dict[str, Any]:
    """The codec's decode of one datagram in the shape of ``tshark_frames``' views."""
    try:
        frame = decode_frame(data)
    except ProtocolError as exc:
        return {"malformed": (exc.reason.name.lower(), exc.offset)}
    return _frame_view(frame)


def codec_stream_views(stream: bytes) -> list[tuple[dict[str, Any], bytes]]:
    """The codec's decode of a byte stream (TCP): each frame's view and bytes, up to the
    first malformed one, whose view says why and which takes the rest of the stream."""
    out, offset = [], 0
    while offset < len(stream):
        try:
            frame = decode_frame(stream, offset, len(stream) - offset, exact=False)
        except ProtocolError as exc:
            out.append(({"malformed": (exc.reason.name.lower(), exc.offset - offset)},
                        stream[offset:]))
            break
        end = offset + frame.header.frame_len
        out.append((_frame_view(decode_frame(stream[offset:end])), stream[offset:end]))
        offset = end
    return out


def _frame_view(frame: Any) -> dict[str, Any]:
    head = frame.header
    header = {name: int(getattr(head, name)) for name in fl.FRAME_HEADER_DTYPE.names
              if name != "magic"}
    view: dict[str, Any] = {"header": {**header, "magic": fl.FRAME_MAGIC}, "body": {},
                            "messages": [], "entries": [], "auth": {}, "malformed": None}
    if frame.is_message_frame:
        for m in frame.messages():
            snap = m.snapshot()
            shown = {**snap, "payload": snap["payload"].hex(), "payload_len": m.payload_len,
                     "topic_len": m.topic_len}
            if m.flags & EXTENSION_FLAGS:
                shown.update(_extensions_view(m))
            view["messages"].append(shown)
    else:
        body, entries = frame.admin()
        view["body"] = body
        view["entries"] = [{k: (v if isinstance(v, str) else int(v))
                            for k, v in dataclasses.asdict(e).items()} for e in entries]
    if frame.auth is not None:
        view["auth"] = {"key_id": frame.auth.key_id, "epoch": frame.auth.epoch,
                        "auth_seq": frame.auth.auth_seq, "mac": frame.auth.mac.hex()}
    return view


def _extensions_view(m: Any) -> dict[str, Any]:
    """A message's header block and segment descriptor as the dissector shows them."""
    try:
        payload, headers, segment = m.extensions()
    except ExtensionError:
        return {"extension_error": True}
    out: dict[str, Any] = {"app_payload": bytes(payload).hex()}
    if headers is not None:
        out["headers"] = {k: v if isinstance(v, str) else v.hex() for k, v in headers.items()}
    if segment is not None:
        out["segment"] = dict(zip(xl.SEGMENT_FIELDS, segment))
    return out


def assert_same(tshark: dict[str, Any] | None, codec: dict[str, Any], data: bytes) -> None:
    """Every field the codec decodes, tshark shows with the same value, at the right bytes."""
    assert tshark is not None, "tshark did not dissect the frame"
    assert tshark["malformed"] == codec["malformed"], (tshark["malformed"], codec["malformed"])
    if codec["malformed"] is not None:
        return
    for part in ("header", "body", "auth"):
        for name, value in codec[part].items():
            assert tshark[part].get(name) == value, (part, name, tshark[part], value)
    for group in ("messages", "entries"):
        assert len(tshark[group]) == len(codec[group]), group
        for shown, decoded in zip(tshark[group], codec[group]):
            for name, value in decoded.items():
                if name == "extension_error":  # the dissector says why in its own words
                    assert shown.get(name), (group, name, shown, decoded)
                    continue
                assert shown.get(name) == value, (group, name, shown, decoded)
    for where, value in tshark["raw"].items():
        pos, size = map(int, where.split(":"))
        assert data[pos : pos + size].hex() == value, (where, value)
