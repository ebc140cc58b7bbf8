"""``topicwire pcap FILE [--config FILE]... [--port N]... [--registry FILE] [--json]``.

Dissects native frames: one line per message or admin entry and a summary; malformed frames
are reported with their reason and counted, never fatal. Which UDP datagrams it reads: those
on every port a ``--config`` names (fabric listen, neighbours, groups, clients) and every
``--port``; without either, port 47470 and any datagram that starts with the frame magic.
Topic keys print in hex, times in ISO-8601 UTC; topics come from the message, the capture's
REGISTRY_UPDATE frames or ``--registry``. Repeated tail probes (the same RETRANSMISSION again
and again on a quiet stream) fold into one line saying how many there were. ``--json``
prints JSON lines (one object per record, then ``{"summary": {...}}``).
"""

from __future__ import annotations

import argparse
import json
import sys

from datapath.config import NATIVE_UDP_PORT


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1..65535, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``pcap``."""
    parser = subparsers.add_parser("pcap", help="dissect native frames in a capture file")
    parser.add_argument("file", help="pcap or pcapng capture")
    parser.add_argument("--port", type=_port, action="append", default=[],
                        help="a UDP port of the native protocol (repeatable; default "
                        f"{NATIVE_UDP_PORT} and any datagram starting with the frame magic)")
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="an appliance config: read every UDP port it names (repeatable)")
    parser.add_argument("--registry", help="topic-key registry file, to print topic names")
    parser.add_argument("--no-fold", action="store_true",
                        help="print every tail probe instead of folding repeats")
    parser.add_argument("--json", action="store_true", help="JSON lines instead of text")
    parser.set_defaults(handler=run)


def config_ports(path: str) -> set[int]:
    """Every UDP port an appliance config names for native frames."""
    from appliance.config import load_config

    cfg = load_config(path)
    ports: set[int] = set()
    for address in (cfg.fabric_listen, cfg.clients_udp):
        if address is not None:
            ports.add(address[1])
    ports.update(n.address[1] for n in cfg.neighbours if n.transport == "udp")
    ports.update(g.port for g in cfg.groups)
    ports.discard(0)  # a port the kernel picks: not known before the run
    return ports


def run(args: argparse.Namespace) -> int:
    from datapath.protocol.pcap import (
        CaptureSummary,
        Ports,
        dissect,
        fold_tail_probes,
        format_record,
    )

    topic_name = None
    if args.registry:
        from datapath.topics.registry import KeyRegistry

        registry = KeyRegistry.load(args.registry)

        def topic_name(key: int) -> str | None:
            found = registry.lookup(key)
            return found[1] if found else None

    named = set(args.port)
    for path in args.config:
        named |= config_ports(path)
    ports = Ports(frozenset(named), sniff=False) if named else Ports(
        frozenset({NATIVE_UDP_PORT}), sniff=True)
    summary = CaptureSummary()
    records = dissect(args.file, ports, topic_name, summary)
    if not args.no_fold:
        records = fold_tail_probes(records, summary)
    out = sys.stdout
    for record in records:
        out.write((json.dumps(record) if args.json else format_record(record)) + "\n")
    totals = summary.as_dict()
    if args.json:
        out.write(json.dumps({"summary": {**totals, "ports": sorted(ports.ports),
                                          "any_port_with_magic": ports.sniff}}) + "\n")
    else:
        malformed = sum(summary.malformed.values())
        where = ", ".join(str(p) for p in sorted(ports.ports))
        where = f"port {where}" + (" and any port with the frame magic" if ports.sniff else "")
        out.write(
            f"summary: {totals['packets']} packets, {totals['native_datagrams']} native "
            f"datagrams on {where}, {totals['frames']} frames, {totals['messages']} "
            f"messages, {sum(summary.admin_entries.values())} admin entries, {malformed} "
            f"malformed{_detail(summary.malformed)}, {totals['other_packets']} other packets, "
            f"{totals['tail_probes_folded']} repeated tail probes folded\n")
    return 0


def _detail(counter: dict[str, int]) -> str:
    if not counter:
        return ""
    return " (" + ", ".join(f"{k}: {v}" for k, v in sorted(counter.items())) + ")"
