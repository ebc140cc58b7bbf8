"""``topicwire move-clients (--all | --identity NAME | SESSION ...) [--reason TEXT]``: ask an
appliance's client sessions to move to their standby appliance.

Sends ``POST /clients/move`` to the appliance's management API (options as ``topicwire
shutdown`` takes them). Each chosen session whose client has a standby (``connect(...,
standby=)``, ``--standby``) is told to move: its session ends at this appliance and the client
logs in at its standby, makes its subscriptions again there and fills what it missed from the
cache (docs/fault-tolerance.md, "Moves asked by the appliance"). Sessions whose client has
no standby stay. Use it to empty an appliance before maintenance, or to move one client.

Prints the answer (sessions asked, not movable, unknown) as JSON. Exit codes: 0 the command
was applied (also when no session could move); 2 the command line is wrong or the token
refused; 1 the appliance could not be reached or refused the command.
"""

from __future__ import annotations

import argparse
import json


def _session(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a session number (topicwire status lists them), "
                                         f"not {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``move-clients``."""
    from appliance.ops.cli.status_cmd import add_mgmt_options

    parser = subparsers.add_parser("move-clients", help="ask an appliance's client sessions "
                                   "to move to their standby appliance (POST /clients/move)")
    chosen = parser.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--all", action="store_true", help="every client session")
    chosen.add_argument("--identity", metavar="NAME", help="the sessions of this identity")
    chosen.add_argument("sessions", nargs="*", type=_session, default=[], metavar="SESSION",
                        help="session numbers")
    parser.add_argument("--reason", default="", help="why (told to the clients, logged)")
    add_mgmt_options(parser, "the appliance's mgmt.token (default $TOPICWIRE_MGMT_TOKEN)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from appliance.ops.cli.status_cmd import _tls, _token, base_url
    from appliance.ops.mgmt.requests import post_move_clients

    if args.all:
        body: dict = {"all": True}
    elif args.identity is not None:
        body = {"identity": args.identity}
    else:
        body = {"sessions": args.sessions}
    if args.reason:
        body["reason"] = args.reason
    url = base_url(args.mgmt)
    answer = post_move_clients(url, _token(args), body, args.timeout, _tls(args, url))
    print(json.dumps({k: answer.get(k, []) for k in ("asked", "not_movable", "unknown")}))
    return 0
