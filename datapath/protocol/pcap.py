"""Dissect native frames in a packet capture (pcap or pcapng) with scapy and the codec.

scapy reads the capture and finds the UDP datagrams that carry native frames (IPv4
fragments are reassembled): every datagram to or from one of the given ports, and with
``sniff`` every other datagram that starts with the frame magic (client and fabric ports
differ per config). The reference decoder validates each datagram as one frame. A malformed
frame becomes a record with its reason, never an exception: a capture of a misbehaving peer
is exactly what this tool is for.

Records print one way everywhere: topic keys in hex (``0x`` and 16 digits), times in
ISO-8601 UTC. Topic names come from the message itself, the capture's REGISTRY_UPDATE
frames (anywhere in the capture) or ``topic_name`` (a registry file), in that order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from datapath.errors import UserError
from datapath.protocol.codec import decode_frame
from datapath.protocol.errors import ProtocolError
from datapath.protocol.extensions import EXTENSION_FLAGS, ExtensionError
from datapath.protocol.frame_layout import FRAME_MAGIC, FrameType
from datapath.protocol.message_layout import Qos

TopicName = Callable[[int], str | None]
_MAGIC = FRAME_MAGIC.to_bytes(2, "big")


def key_text(key: int) -> str:
    """A topic key as every tool prints it: ``0x`` and 16 hex digits."""
    return f"{key:#018x}"


def iso_ns(ns: int) -> str:
    """ns since the Unix epoch as ISO-8601 UTC with nine fraction digits."""
    seconds, fraction = divmod(int(ns), 1_000_000_000)
    try:
        stamp = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return f"{ns}ns"
    return f"{stamp}.{fraction:09d}Z"


@dataclass
class CaptureSummary:
    packets: int = 0
    native_datagrams: int = 0
    frames: int = 0
    messages: int = 0
    admin_entries: Counter = field(default_factory=Counter)
    malformed: Counter = field(default_factory=Counter)
    other_packets: int = 0
    tail_probes_folded: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "packets": self.packets,
            "native_datagrams": self.native_datagrams,
            "frames": self.frames,
            "messages": self.messages,
            "admin_entries": dict(self.admin_entries),
            "malformed": dict(self.malformed),
            "other_packets": self.other_packets,
            "tail_probes_folded": self.tail_probes_folded,
        }


@dataclass(frozen=True)
class Ports:
    """Which UDP datagrams hold native frames: those to or from ``ports``, and with
    ``sniff`` any other that starts with the frame magic."""

    ports: frozenset[int]
    sniff: bool = True

    def holds(self, sport: int, dport: int, payload: bytes) -> bool:
        return (sport in self.ports or dport in self.ports
                or (self.sniff and payload[:2] == _MAGIC))


def _datagrams(path: Path, ports: Ports, summary: CaptureSummary) -> Iterator[tuple]:
    """(packet number, time ns, src, dst, udp payload) for the datagrams ``ports`` holds."""
    from scapy.error import Scapy_Exception
    from scapy.layers.inet import IP, UDP, defragment
    from scapy.layers.inet6 import IPv6
    from scapy.utils import PcapReader

    fragments = []
    try:
        reader = PcapReader(str(path))
    except (Scapy_Exception, OSError, EOFError) as exc:
        raise UserError(f"cannot read capture {path}: {exc}; give a pcap or pcapng file",
                        component="pcap") from None
    with reader:
        for number, packet in enumerate(reader, start=1):
            summary.packets += 1
            if IP in packet and (packet[IP].flags.MF or packet[IP].frag):
                fragments.append((number, packet))
                continue
            yield from _native(number, packet, ports, summary, IP, IPv6, UDP)
    if fragments:
        by_id = {(p[IP].src, p[IP].dst, p[IP].id): n for n, p in fragments}
        for packet in defragment([p for _, p in fragments]):
            key = (packet[IP].src, packet[IP].dst, packet[IP].id) if IP in packet else None
            yield from _native(by_id.get(key, 0), packet, ports, summary, IP, IPv6, UDP)


def _native(number: int, packet: Any, ports: Ports, summary: CaptureSummary, ip: type,
            ipv6: type, udp: type) -> Iterator[tuple]:
    if udp not in packet:
        summary.other_packets += 1
        return
    payload = bytes(packet[udp].payload)
    if not ports.holds(packet[udp].sport, packet[udp].dport, payload):
        summary.other_packets += 1
        return
    net = packet[ip] if ip in packet else packet[ipv6] if ipv6 in packet else None
    src = f"{net.src}:{packet[udp].sport}" if net is not None else f":{packet[udp].sport}"
    dst = f"{net.dst}:{packet[udp].dport}" if net is not None else f":{packet[udp].dport}"
    summary.native_datagrams += 1
    time_ns = int(Decimal(str(packet.time)) * 1_000_000_000)
    yield number, time_ns, src, dst, payload


def _as_ports(ports: int | Collection[int] | Ports) -> Ports:
    if isinstance(ports, Ports):
        return ports
    if isinstance(ports, int):
        return Ports(frozenset({ports}), sniff=False)
    return Ports(frozenset(ports), sniff=False)


def capture_registry(path: str | Path, ports: int | Collection[int] | Ports) -> dict[int, str]:
    """Topic key -> topic from every REGISTRY_UPDATE frame in the capture."""
    names: dict[int, str] = {}
    for *_, data in _datagrams(Path(path), _as_ports(ports), CaptureSummary()):
        if len(data) < 4 or data[3] != FrameType.REGISTRY_UPDATE:
            continue
        try:
            _, entries = decode_frame(data).admin()
        except ProtocolError:
            continue
        names.update((e.topic_key, e.topic) for e in entries)
    return names


def dissect(path: str | Path, ports: int | Collection[int] | Ports,
            topic_name: TopicName | None = None,
            summary: CaptureSummary | None = None) -> Iterator[dict[str, Any]]:
    """One record per message, admin entry or malformed frame, in capture order. The capture
    is read twice: first for its REGISTRY_UPDATE frames, so a message is named even when the
    frame naming its key comes later."""
    summary = summary if summary is not None else CaptureSummary()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no such capture file: {path}", component="pcap")
    ports = _as_ports(ports)
    names = capture_registry(path, ports)

    def name_of(key: int) -> str | None:
        return names.get(key) or (topic_name(key) if topic_name else None)

    for number, ts_ns, src, dst, data in _datagrams(path, ports, summary):
        base = {"packet": number, "time": iso_ns(ts_ns), "src": src, "dst": dst}
        try:
            frame = decode_frame(data)
        except ProtocolError as exc:
            summary.malformed[exc.reason.name.lower()] += 1
            yield {**base, "kind": "malformed", "reason": exc.reason.name.lower(),
                   "offset": exc.offset, "detail": str(exc), "bytes": len(data)}
            continue
        summary.frames += 1
        head = frame.header
        common = {**base, "frame_type": head.frame_type.name, "stream": head.stream_id,
                  "source_session": head.source_session}
        if frame.is_message_frame:
            for m in frame.messages():
                summary.messages += 1
                record = {**common, "kind": "message", "sequence": m.sequence,
                          "topic_key": key_text(m.topic_key),
                          "topic": m.topic or name_of(m.topic_key),
                          "namespace": m.namespace_id, "schema": m.schema_id,
                          "qos": Qos(m.qos).name, "flags": m.flags,
                          "payload_len": m.payload_len,
                          "publish_time": iso_ns(m.publish_ts_ns)}
                if m.flags & EXTENSION_FLAGS:
                    record.update(_extensions(m))
                yield record
        else:
            body, entries = frame.admin()
            for entry in entries:
                summary.admin_entries[head.frame_type.name] += 1
                yield {**common, "kind": "admin", **body, **_fields(entry)}


def _extensions(m: Any) -> dict[str, Any]:
    """A message's header block and segment descriptor as record fields (bytes values as
    ``{"hex": ...}``), or the reason they do not parse."""
    try:
        payload, headers, segment = m.extensions()
    except ExtensionError as exc:
        return {"extension_error": str(exc)}
    out: dict[str, Any] = {"app_payload_len": len(payload)}
    if headers is not None:
        out["headers"] = {k: v if isinstance(v, str) else {"hex": v.hex()}
                          for k, v in headers.items()}
    if segment is not None:
        out["segment"] = dict(zip(("id", "total_len", "offset", "index", "count"), segment))
    return out


def _fields(entry: Any) -> dict[str, Any]:
    out = {}
    for name in entry.__slots__:
        value = getattr(entry, name)
        out[name] = (value.name if hasattr(value, "name") else
                     key_text(value) if name == "topic_key" else value)
    return out


def fold_tail_probes(records: Iterable[dict[str, Any]],
                     summary: CaptureSummary | None = None) -> Iterator[dict[str, Any]]:
    """Records with repeated tail probes folded: a RETRANSMISSION of the same message of a
    stream as the one just before it on that stream (the sender's tail-loss probe,
    docs/reliability.md) is counted instead of passed on; a ``tail_probes`` record says how
    many were folded when the stream moves on or the capture ends."""
    last: dict[tuple, dict[str, Any]] = {}  # stream -> its last record passed on
    folds: dict[tuple, dict[str, Any]] = {}  # stream -> its open fold

    def close(stream: tuple) -> Iterator[dict[str, Any]]:
        fold = folds.pop(stream, None)
        if fold is not None:
            yield fold

    for record in records:
        if record["kind"] == "malformed":
            yield record
            continue
        stream = (record["src"], record["dst"], record["source_session"], record["stream"])
        prev = last.get(stream)
        if (record["kind"] == "message" and record["frame_type"] == "RETRANSMISSION"
                and prev is not None and prev["frame_type"] == "RETRANSMISSION"
                and prev.get("sequence") == record["sequence"]
                and prev.get("topic_key") == record["topic_key"]):
            fold = folds.setdefault(stream, {
                "kind": "tail_probes", "frame_type": "RETRANSMISSION", "src": record["src"],
                "dst": record["dst"], "stream": record["stream"],
                "source_session": record["source_session"], "sequence": record["sequence"],
                "topic_key": record["topic_key"], "repeats": 0,
                "first_packet": record["packet"], "first_time": record["time"]})
            fold.update(repeats=fold["repeats"] + 1, packet=record["packet"],
                        time=record["time"])
            if summary is not None:
                summary.tail_probes_folded += 1
            continue
        yield from close(stream)
        last[stream] = record
        yield record
    for stream in list(folds):
        yield from close(stream)


def _extension_text(record: dict[str, Any]) -> str:
    if "extension_error" in record:
        return f" extensions malformed ({record['extension_error']})"
    out = ""
    if "headers" in record:
        shown = ",".join(f"{k}={v if isinstance(v, str) else '0x' + v['hex']}"
                         for k, v in record["headers"].items())
        out += f" headers={{{shown}}}"
    seg = record.get("segment")
    if seg is not None:
        out += (f" segment={seg['id']}:{seg['index'] + 1}/{seg['count']} "
                f"bytes={seg['offset']}+{record['app_payload_len']}/{seg['total_len']}")
    return out


def format_record(record: dict[str, Any]) -> str:
    """One human-readable line for a record of ``dissect`` or ``fold_tail_probes``."""
    head = f"#{record['packet']} {record['time']} {record['src']} > {record['dst']}"
    if record["kind"] == "malformed":
        return f"{head} MALFORMED {record['reason']} at byte {record['offset']} " \
               f"({record['bytes']} bytes)"
    if record["kind"] == "tail_probes":
        return (f"{head} RETRANSMISSION stream={record['stream']} seq={record['sequence']} "
                f"key={record['topic_key']}: tail probe repeated {record['repeats']} more "
                f"times since #{record['first_packet']} {record['first_time']}")
    if record["kind"] == "message":
        topic = f" topic={record['topic']}" if record["topic"] else ""
        return (f"{head} {record['frame_type']} stream={record['stream']} "
                f"seq={record['sequence']} key={record['topic_key']}{topic} "
                f"ns={record['namespace']} schema={record['schema']} qos={record['qos']} "
                f"len={record['payload_len']} published={record['publish_time']}"
                f"{_extension_text(record)}")
    skip = {"packet", "time", "src", "dst", "kind", "frame_type", "stream", "source_session"}
    rest = " ".join(f"{k}={v}" for k, v in record.items() if k not in skip)
    return f"{head} {record['frame_type']} stream={record['stream']} {rest}"
