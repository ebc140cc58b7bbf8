"""``topicwire pcap FILE [--port N] [--registry FILE] [--json]``: dissect native frames.

Prints one line per message or admin entry and a summary; malformed frames are reported
with their reason and counted, never fatal. ``--json`` prints JSON lines (one object per
record, then ``{"summary": {...}}``).
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
    parser.add_argument("--port", type=_port, default=NATIVE_UDP_PORT,
                        help=f"UDP port of the native protocol (default {NATIVE_UDP_PORT})")
    parser.add_argument("--registry", help="topic-key registry file, to print topic names")
    parser.add_argument("--json", action="store_true", help="JSON lines instead of text")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from datapath.protocol.pcap import CaptureSummary, dissect, format_record

    topic_name = None
    if args.registry:
        from datapath.topics.registry import KeyRegistry

        registry = KeyRegistry.load(args.registry)

        def topic_name(key: int) -> str | None:
            found = registry.lookup(key)
            return found[1] if found else None

    summary = CaptureSummary()
    out = sys.stdout
    for record in dissect(args.file, args.port, topic_name, summary):
        out.write((json.dumps(record) if args.json else format_record(record)) + "\n")
    totals = summary.as_dict()
    if args.json:
        out.write(json.dumps({"summary": totals}) + "\n")
    else:
        malformed = sum(summary.malformed.values())
        out.write(
            f"summary: {totals['packets']} packets, {totals['native_datagrams']} native "
            f"datagrams on port {args.port}, {totals['frames']} frames, {totals['messages']} "
            f"messages, {sum(summary.admin_entries.values())} admin entries, {malformed} "
            f"malformed{_detail(summary.malformed)}, {totals['other_packets']} other packets\n")
    return 0


def _detail(counter: dict[str, int]) -> str:
    if not counter:
        return ""
    return " (" + ", ".join(f"{k}: {v}" for k, v in sorted(counter.items())) + ")"
