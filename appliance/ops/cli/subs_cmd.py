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

SUBS_REPLAY_MAX_REQUESTS = 10_000
"""Most requests one replay takes: each costs up to a few milliseconds (pattern inclusion
against the list), so a file ten times longer would run for minutes, looking hung."""


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


SUBS_REPLAY_MAX_BYTES = 16 * 1024 * 1024
"""Largest request file read (10,000 requests of the longest patterns fit)."""


def _read_lines(name: str) -> list[str]:
    if name == "-":
        text = sys.stdin.read(SUBS_REPLAY_MAX_BYTES + 1)
        if len(text) > SUBS_REPLAY_MAX_BYTES:
            raise UserError(f"standard input holds more than {SUBS_REPLAY_MAX_BYTES:,} "
                            "characters; split the requests", component="subs")
        return text.splitlines()
    path = Path(name)
    try:
        with path.open("rb") as f:
            data = f.read(SUBS_REPLAY_MAX_BYTES + 1)
        if len(data) > SUBS_REPLAY_MAX_BYTES:
            raise UserError(f"{path} is larger than {SUBS_REPLAY_MAX_BYTES:,} bytes; split "
                            "the requests", component="subs")
        return data.decode("utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"no such file: {path}", component="subs") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}", component="subs") from None


def run(args: argparse.Namespace) -> int:
    from datapath.topics.algebra import TopicError
    from datapath.topics.sublist import replay

    lines = _read_lines(args.file)
    requests = sum(1 for line in lines if line.strip())
    if requests > SUBS_REPLAY_MAX_REQUESTS:
        raise UserError(f"{args.file}: {requests:,} requests, at most "
                        f"{SUBS_REPLAY_MAX_REQUESTS:,} are replayed at once; split the file",
                        component="subs")
    try:
        sublist = replay(lines)
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
