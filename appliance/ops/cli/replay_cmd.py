"""``topicwire replay``: print the messages an appliance's cache keeps on a pattern.

    topicwire replay 'orders/#' --appliance udp://127.0.0.1:47471 --from-time 2026-11-27T10:00:00Z
    topicwire replay 'orders/eu/#' --appliance shm://core1 --from-seq 1 --json

One line per message (``TOPIC PAYLOAD``; ``--json``: one JSON object per line with the cache
sequence, the publisher's sequence and the publish time), in the order the cache kept them,
then it exits 0. ``--from-time`` takes ISO 8601 (a time without a zone is UTC);
``--from-seq`` a cache sequence (``cache_seq`` of a message printed before); neither: from
the oldest message kept. Bad arguments exit 2; a refusal (no cache, not entitled) exits 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

from appliance.ops.cli.pubsub_cmd import APPLIANCE_ENV, _password, _url
from datapath.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``replay``."""
    p = subparsers.add_parser("replay", help="print the messages an appliance's cache keeps")
    p.add_argument("pattern", help="topic pattern, e.g. 'orders/#'")
    p.add_argument("--appliance", metavar="ADDR", default=os.environ.get(APPLIANCE_ENV),
                   help=f"udp://HOST:PORT, HOST:PORT or shm://RING (default ${APPLIANCE_ENV})")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from-time", metavar="ISO8601",
                       help="from the first message published at or after this time")
    start.add_argument("--from-seq", metavar="N", type=int,
                       help="from this cache sequence")
    p.add_argument("--json", action="store_true", help="print messages as JSON lines")
    p.add_argument("--identity", default="anonymous", help="who to log in as")
    p.add_argument("--password-file", metavar="FILE", default=None,
                   help="the identity's password on the first line of FILE")
    p.set_defaults(handler=run_replay)


def parse_time_ns(text: str) -> int:
    """ISO 8601 -> wall-clock ns since the epoch (no zone: UTC); a ``UserError`` naming
    ``--from-time`` otherwise."""
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z")
                                         else text)
    except ValueError:
        raise UserError(f"--from-time {text!r} is not an ISO 8601 time such as "
                        "2026-11-27T10:00:00Z", component="replay") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    ns = int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1_000
    if ns < 0:
        raise UserError(f"--from-time {text!r} is before 1970", component="replay")
    return ns


def _line(msg, as_json: bool) -> str:  # noqa: ANN001 - appliance.client.Message
    try:
        text, encoding = msg.payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = msg.payload.hex(), "hex"
    if not as_json:
        return f"{msg.topic} {text}"
    seconds, ns = divmod(msg.publish_ts_ns, 1_000_000_000)  # no float: --from-time takes it
    when = (dt.datetime.fromtimestamp(seconds, dt.UTC)
            + dt.timedelta(microseconds=ns // 1_000))
    return json.dumps({"cache_seq": msg.cache_seq, "topic": msg.topic, "payload": text,
                       "encoding": encoding, "sequence": msg.sequence, "qos": msg.qos,
                       "origin": msg.origin, "stream": msg.stream,
                       "publish_ts_ns": msg.publish_ts_ns,
                       "published": when.isoformat(timespec="microseconds")})


def run_replay(args: argparse.Namespace) -> int:
    from appliance.client import ClientError, connect
    from datapath.topics.algebra import TopicError, split_pattern

    if not args.appliance:
        raise UserError(f"give --appliance ADDR (udp://HOST:PORT, HOST:PORT, shm://RING) or "
                        f"set ${APPLIANCE_ENV}", component="replay")
    try:
        split_pattern(args.pattern)
    except TopicError as exc:
        raise UserError(f"pattern {args.pattern!r}: {exc}", component="replay") from None
    if args.from_seq is not None and args.from_seq < 0:
        raise UserError("--from-seq must not be negative", component="replay")
    from_time = parse_time_ns(args.from_time) if args.from_time is not None else None
    password = _password(args.password_file, "replay")
    with connect(_url(args.appliance), args.identity, password=password) as client:
        try:
            messages = client.replay(args.pattern, from_time_ns=from_time,
                                     from_sequence=args.from_seq)
            count = 0
            for msg in messages:
                print(_line(msg, args.json), flush=False)
                count += 1
        except ClientError as exc:
            print(f"topicwire: {exc}", file=sys.stderr)
            return 1
    sys.stdout.flush()
    print(f"topicwire: replay: {count} messages", file=sys.stderr)
    return 0
