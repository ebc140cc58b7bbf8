"""``topicwire dissector [--out FILE]``: the Wireshark Lua dissector of the native protocol.

Generated from the layout modules each time (appliance/ops/wireshark), so it always matches
this build's codec. Without ``--out`` it goes to stdout.

    topicwire dissector --out topicwire.lua
    tshark -X lua_script:topicwire.lua -r capture.pcap -V
"""

from __future__ import annotations

import argparse
import sys

from datapath.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``dissector``."""
    parser = subparsers.add_parser(
        "dissector", help="write the Wireshark/tshark Lua dissector of the native protocol")
    parser.add_argument("--out", metavar="FILE", help="write it here (default: stdout)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from appliance.ops.wireshark import generate

    text = generate()
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.out, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        raise UserError(f"cannot write {args.out}: {exc.strerror}; give a writable path",
                        component="dissector") from None
    print(f"dissector: wrote {args.out}; use it with tshark -X lua_script:{args.out}",
          file=sys.stderr)
    return 0
