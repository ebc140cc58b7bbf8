"""``topicwire subs replay FILE [--publish TOPIC]... [--json]``: seed 000 subscription lists.

FILE holds one request a line (``+a/#`` subscribes, ``-a/b/#`` unsubscribes, a bare pattern
subscribes; blank lines are skipped; ``-`` reads standard input). Prints the resulting list
and, for each ``--publish`` topic, whether it is delivered.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from datapath.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``subs replay``."""
    parser = subparsers.add_parser("subs", help="subscription lists with +/- entries")
    commands = parser.add_subparsers(dest="subs_command", metavar="COMMAND", required=True)
    replay = commands.add_parser("replay", help="replay requests into a list and decide topics")
    replay.add_argument("file", help="requests, one a line ('+a/#', '-a/b/#'); '-' for stdin")
    replay.add_argument("--publish", action="append", default=[], metavar="TOPIC",
                        help="a published topic to decide (repeatable)")
    replay.add_argument("--json", action="store_true",
                        help='print {"list": [...], "decisions": {topic: bool}}')
    replay.set_defaults(handler=run)


def _read_lines(name: str) -> list[str]:
    if name == "-":
        return sys.stdin.read().splitlines()
    path = Path(name)
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"no such file: {path}", component="subs") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}", component="subs") from None


def run(args: argparse.Namespace) -> int:
    from datapath.topics.algebra import TopicError
    from datapath.topics.sublist import replay

    try:
        sublist = replay(_read_lines(args.file))
        decisions = {topic: sublist.decides(topic) for topic in args.publish}
    except TopicError as exc:
        source = "standard input" if args.file == "-" else args.file
        raise UserError(f"{source}: {str(exc).removeprefix('topics: ')}",
                        component="subs") from None
    entries = [str(e) for e in sublist.entries]
    if args.json:
        print(json.dumps({"list": entries, "decisions": decisions}))
        return 0
    print("list: " + (" ".join(entries) if entries else "(empty)"))
    for topic, deliver in decisions.items():
        print(f"{topic}: {'deliver' if deliver else 'do not deliver'}")
    return 0
