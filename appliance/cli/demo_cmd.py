"""``topicwire demo``: the end-to-end demo on this host (see appliance/demo.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from datapath.config import NATIVE_UDP_PORT

DEMO_MESSAGES = 20_000


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``demo``."""
    parser = subparsers.add_parser(
        "demo", help="publish, capture, route and dissect native frames on this host")
    parser.add_argument("--messages", type=int, default=DEMO_MESSAGES,
                        help=f"messages to publish (default {DEMO_MESSAGES})")
    parser.add_argument("--port", type=int, default=NATIVE_UDP_PORT,
                        help=f"UDP port on 127.0.0.1 (default {NATIVE_UDP_PORT})")
    parser.add_argument("--out", type=Path, default=Path("out/demo"),
                        help="where the capture and registry are written (default out/demo)")
    parser.add_argument("--no-capture", action="store_true", help="skip the tcpdump capture")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from appliance.demo import run_demo
    from datapath.errors import UserError

    if args.messages < 1:
        raise UserError("--messages must be at least 1", component="demo")
    console = Console()
    with console.status("publishing, capturing and routing on 127.0.0.1 ..."):
        result = run_demo(args.messages, args.port, args.out, capture=not args.no_capture)
    table = Table(title="subscribers (seed 000 lists: newest entry decides)")
    for column in ("subscriber", "subscription list", "delivered", "expected (naive replay)"):
        table.add_column(column)
    for name, entries in result.lists.items():
        table.add_row(name, " ".join(entries) or "(empty)", str(result.delivered[name]),
                      str(result.expected[name]))
    console.print(table)
    rate = result.sent / result.elapsed_s if result.elapsed_s else 0.0
    console.print(f"sent {result.sent} messages in {result.frames_sent} frames, received "
                  f"{result.received}, malformed {result.malformed}, {rate:,.0f} msg/s "
                  "(one process, loopback UDP)")
    if result.captured_messages is not None:
        console.print(f"capture {args.out / 'demo.pcap'}: {result.captured_messages} messages "
                      f"dissected ({result.capture_note}); first lines of "
                      f"`topicwire pcap {args.out / 'demo.pcap'} --port {args.port} "
                      f"--registry {args.out / 'registry.json'}`:")
        for line in result.pcap_lines:
            console.print("  " + line, highlight=False, markup=False, soft_wrap=True)
    elif result.capture_note:
        console.print(result.capture_note)
    console.print("demo: OK" if result.ok else "demo: FAILED (see the counts above)")
    return 0 if result.ok else 1
