"""Dissect native frames in a packet capture (pcap or pcapng) with scapy and the codec.

scapy reads the capture and finds UDP datagrams to or from the native port (IPv4 fragments
are reassembled); the reference decoder validates each datagram as one frame. A malformed
frame becomes a record with its reason, never an exception: a capture of a misbehaving peer
is exactly what this tool is for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datapath.errors import UserError
from datapath.protocol.codec import decode_frame
from datapath.protocol.errors import ProtocolError
from datapath.protocol.message_layout import Qos

TopicName = Callable[[int], str | None]


@dataclass
class CaptureSummary:
    packets: int = 0
    native_datagrams: int = 0
    frames: int = 0
    messages: int = 0
    admin_entries: Counter = field(default_factory=Counter)
    malformed: Counter = field(default_factory=Counter)
    other_packets: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "packets": self.packets,
            "native_datagrams": self.native_datagrams,
            "frames": self.frames,
            "messages": self.messages,
            "admin_entries": dict(self.admin_entries),
            "malformed": dict(self.malformed),
            "other_packets": self.other_packets,
        }


def _datagrams(path: Path, port: int, summary: CaptureSummary) -> Iterator[tuple]:
    """(packet number, time, src, dst, udp payload bytes) for UDP datagrams on ``port``."""
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
            yield from _native(number, packet, port, summary, IP, IPv6, UDP)
    if fragments:
        by_id = {(p[IP].src, p[IP].dst, p[IP].id): n for n, p in fragments}
        for packet in defragment([p for _, p in fragments]):
            key = (packet[IP].src, packet[IP].dst, packet[IP].id) if IP in packet else None
            yield from _native(by_id.get(key, 0), packet, port, summary, IP, IPv6, UDP)


def _native(number: int, packet: Any, port: int, summary: CaptureSummary, ip: type,
            ipv6: type, udp: type) -> Iterator[tuple]:
    if udp not in packet or port not in (packet[udp].sport, packet[udp].dport):
        summary.other_packets += 1
        return
    net = packet[ip] if ip in packet else packet[ipv6] if ipv6 in packet else None
    src = f"{net.src}:{packet[udp].sport}" if net is not None else f":{packet[udp].sport}"
    dst = f"{net.dst}:{packet[udp].dport}" if net is not None else f":{packet[udp].dport}"
    summary.native_datagrams += 1
    yield number, float(packet.time), src, dst, bytes(packet[udp].payload)


def dissect(path: str | Path, port: int, topic_name: TopicName | None = None,
            summary: CaptureSummary | None = None) -> Iterator[dict[str, Any]]:
    """One record per message, admin entry or malformed frame, in capture order."""
    summary = summary if summary is not None else CaptureSummary()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no such capture file: {path}", component="pcap")
    for number, ts, src, dst, data in _datagrams(path, port, summary):
        base = {"packet": number, "time": ts, "src": src, "dst": dst}
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
                topic = m.topic or (topic_name(m.topic_key) if topic_name else None)
                yield {**common, "kind": "message", "sequence": m.sequence,
                       "topic_key": f"{m.topic_key:#018x}", "topic": topic,
                       "namespace": m.namespace_id, "schema": m.schema_id,
                       "qos": Qos(m.qos).name, "flags": m.flags, "payload_len": m.payload_len,
                       "publish_ts_ns": m.publish_ts_ns}
        else:
            body, entries = frame.admin()
            for entry in entries:
                summary.admin_entries[head.frame_type.name] += 1
                fields = {k: (v.name if hasattr(v, "name") else v)
                          for k, v in _fields(entry).items()}
                yield {**common, "kind": "admin", **body, **fields}


def _fields(entry: Any) -> dict[str, Any]:
    return {name: getattr(entry, name) for name in entry.__slots__}


def format_record(record: dict[str, Any]) -> str:
    """One human-readable line for a record of ``dissect``."""
    head = f"#{record['packet']} {record['time']:.6f} {record['src']} > {record['dst']}"
    if record["kind"] == "malformed":
        return f"{head} MALFORMED {record['reason']} at byte {record['offset']} " \
               f"({record['bytes']} bytes)"
    if record["kind"] == "message":
        topic = f" topic={record['topic']}" if record["topic"] else ""
        return (f"{head} {record['frame_type']} stream={record['stream']} "
                f"seq={record['sequence']} key={record['topic_key']}{topic} "
                f"ns={record['namespace']} schema={record['schema']} qos={record['qos']} "
                f"len={record['payload_len']}")
    skip = {"packet", "time", "src", "dst", "kind", "frame_type", "stream", "source_session"}
    rest = " ".join(f"{k}={v}" for k, v in record.items() if k not in skip)
    return f"{head} {record['frame_type']} stream={record['stream']} {rest}"
