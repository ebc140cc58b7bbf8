"""``topicwire shutdown [--mgmt URL] [--token T] [--reason TEXT]``: drain and stop an appliance.

Sends ``POST /shutdown`` to the appliance's management API (``mgmt.listen``; default
``http://127.0.0.1:8470``, or ``$TOPICWIRE_MGMT``) with the token (``--token``, ``--token-file``
or ``$TOPICWIRE_MGMT_TOKEN``, as ``topicwire status`` takes it): the appliance drains as on
SIGTERM (logins refused, clients and neighbours logged out, queued frames sent) and its
``topicwire run`` exits (with ``--shutdown-exit-code``; an appliance image then powers off:
docs/images.md, "Shutdown"). It prints the appliance's answer and returns once the appliance
accepted the command, not when it has stopped.

Exit codes: 0 the appliance is stopping; 2 the command line is wrong or the token refused
(no token configured at the appliance: commands are off); 1 the appliance could not be
reached or refused (already stopping: 503).
"""

from __future__ import annotations

import argparse
import sys

from appliance.ops.mgmt.requests import post_shutdown


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``shutdown``."""
    from appliance.ops.cli.status_cmd import add_mgmt_options

    parser = subparsers.add_parser("shutdown", help="drain and stop an appliance through its "
                                   "management API (POST /shutdown)")
    add_mgmt_options(parser, "the appliance's mgmt.token (default $TOPICWIRE_MGMT_TOKEN)")
    parser.add_argument("--reason", default="", help="why (goes into the appliance's drain "
                        "log line)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from appliance.ops.cli.status_cmd import _tls, _token, base_url

    url = base_url(args.mgmt)
    answer = post_shutdown(url, _token(args), args.reason, args.timeout, _tls(args, url))
    print(f"{url}: the appliance is stopping ({answer.get('reason', '')})",
          file=sys.stderr)
    return 0
