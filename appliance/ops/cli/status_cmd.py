"""``topicwire status [--mgmt URL] [--json] [--token T] [--ca-file F]``: an appliance's state.

Reads ``GET /status`` from the appliance's management API (``mgmt.listen``; default
``http://127.0.0.1:8470``, or ``$TOPICWIRE_MGMT``) and prints the node, neighbours,
subscriptions, routes, channels with their statistics, offload counters, entitlement
denials, admin-frame authentication and client sessions as rich tables; ``--json`` prints
the snapshot as it came. An ``https://`` URL (the API with ``mgmt.tls_cert_file``) is
checked against ``--ca-file`` (default: the system's CAs), with ``--cert-file``/``--key-file``
when the API requires client certificates. The token (``--token``, ``--token-file`` or
``$TOPICWIRE_MGMT_TOKEN``) is sent as ``Authorization: Bearer``: reads need it only when the
API listens on a non-loopback address with a token set.

Exit codes: 0 printed; 2 the command line is wrong (a URL that is not ``http(s)://HOST:PORT``,
a CA or certificate file that does not load,
a token file that cannot be read, a token the appliance refuses: fix the arguments);
1 the appliance could not be reached or did not answer like a topicwire management API
(not running, wrong port, no ``mgmt.listen``: start it or point ``--mgmt`` at it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from appliance.ops.mgmt.config import (
    MGMT_DEFAULT_HOST,
    MGMT_DEFAULT_PORT,
    STATUS_HTTP_TIMEOUT_S,
    STATUS_MAX_TIMEOUT_S,
)
from appliance.ops.mgmt.requests import request_json

DEFAULT_URL = f"http://{MGMT_DEFAULT_HOST}:{MGMT_DEFAULT_PORT}"
"""Where ``topicwire status`` looks without ``--mgmt`` or ``$TOPICWIRE_MGMT``."""
WIDTH_NOT_A_TERMINAL = 160
"""Table width when standard output is not a terminal (files, pipes)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``status``."""
    parser = subparsers.add_parser("status", help="show an appliance's status (its management "
                                   "API) as tables")
    parser.add_argument("--json", action="store_true", help="print the status snapshot as JSON")
    add_mgmt_options(parser, "bearer token (default $TOPICWIRE_MGMT_TOKEN); only needed when "
                     "the API protects reads")
    parser.set_defaults(handler=run)


def add_mgmt_options(parser: argparse.ArgumentParser, token_help: str) -> None:
    """The options of a command that talks to a management API: ``--mgmt``, the token
    (``--token``, ``--token-file``), TLS (``--ca-file``, ``--cert-file``, ``--key-file``) and
    ``--timeout`` (``status``, ``shutdown``, ``move-clients``)."""
    parser.add_argument("--mgmt", metavar="URL", default=None,
                        help=f"the management API (default $TOPICWIRE_MGMT or {DEFAULT_URL})")
    parser.add_argument("--token", default=None, help=token_help)
    parser.add_argument("--token-file", type=Path, default=None, metavar="FILE",
                        help="read the bearer token from FILE")
    parser.add_argument("--ca-file", type=Path, default=None, metavar="FILE",
                        help="for https: the CA certificates (PEM) that signed the API's "
                        "certificate (default: the system's)")
    parser.add_argument("--cert-file", type=Path, default=None, metavar="FILE",
                        help="for https: this client's certificate (PEM), when the API "
                        "requires one (mgmt.tls_client_ca_file)")
    parser.add_argument("--key-file", type=Path, default=None, metavar="FILE",
                        help="the private key of --cert-file (PEM; default: in it)")
    parser.add_argument("--timeout", type=_timeout, default=STATUS_HTTP_TIMEOUT_S, metavar="S",
                        help=f"seconds to wait for the answer (default {STATUS_HTTP_TIMEOUT_S})")


def _timeout(text: str) -> float:
    """``--timeout``: seconds, more than 0 and at most STATUS_MAX_TIMEOUT_S."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= STATUS_MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"give seconds above 0 and at most "
                                         f"{STATUS_MAX_TIMEOUT_S:g}, not {text!r}")
    return value


def base_url(text: str | None) -> str:
    """``--mgmt`` as ``http(s)://HOST:PORT`` (a bare ``HOST:PORT`` is taken as http)."""
    from urllib.parse import urlsplit

    from appliance.ops.mgmt.errors import StatusUsageError

    text = text or os.environ.get("TOPICWIRE_MGMT") or DEFAULT_URL
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 \
            or parts.path not in ("", "/"):
        raise StatusUsageError(f"--mgmt {text!r}: give the management API as http://HOST:PORT "
                               f"or https://HOST:PORT (the appliance's mgmt.listen), e.g. "
                               f"{DEFAULT_URL}")
    return f"{parts.scheme}://{parts.netloc}"


def _tls(args: argparse.Namespace, url: str) -> Any:
    """The TLS context of an https URL (None for http); a file that does not load is a
    usage error."""
    from appliance.ops.mgmt.errors import StatusUsageError
    from appliance.ops.tls import TlsFileError, client_context

    if not url.startswith("https://"):
        if args.ca_file or args.cert_file:
            raise StatusUsageError("--ca-file and --cert-file are for an https:// --mgmt URL")
        return None
    try:
        return client_context(args.ca_file, args.cert_file, args.key_file)
    except TlsFileError as exc:
        raise StatusUsageError(str(exc)) from None


def _token(args: argparse.Namespace) -> str | None:
    from appliance.ops.mgmt.errors import StatusUsageError

    if args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise StatusUsageError(f"--token-file {args.token_file}: cannot read it ({exc})") \
                from None
        return token or None
    return args.token or os.environ.get("TOPICWIRE_MGMT_TOKEN") or None


def run(args: argparse.Namespace) -> int:
    from appliance.ops.mgmt.errors import StatusUnreachable

    url = base_url(args.mgmt)
    status = request_json(url, "/status", _token(args), args.timeout, _tls(args, url))
    if not isinstance(status, dict) or "node" not in status:
        raise StatusUnreachable(f"{url}/status is not an appliance status snapshot")
    if args.json:
        sys.stdout.write(json.dumps(status, indent=2) + "\n")
        return 0
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else WIDTH_NOT_A_TERMINAL)
    for renderable in tables(status):
        console.print(renderable)
    return 0


# --- the tables ------------------------------------------------------------------------------

def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _table(title: str, columns: list[str], rows: list[list[Any]], *, numeric_from: int = 99
           ) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", title_style="bold",
                  min_width=len(title) + 4)
    for i, column in enumerate(columns):
        table.add_column(column, justify="right" if i >= numeric_from else "left")
    for row in rows:
        table.add_row(*(_fmt(r) if r is None or isinstance(r, str | int | float) else r
                       for r in row))
    if not rows:
        table.add_row(*(["(none)"] + [""] * (len(columns) - 1)))
    return table


def _counts(title: str, items: dict[str, Any], key: str = "counter") -> Any:
    return _table(title, [key, "count"], [[k, v] for k, v in sorted(items.items())],
                  numeric_from=1)


def tables(status: dict[str, Any]) -> list[Any]:
    """The rich renderables ``topicwire status`` prints, in order."""
    from rich.text import Text

    node = status.get("node", {})
    out: list[Any] = [Text.assemble(
        ("appliance ", "bold"), (str(node.get("name")), "bold cyan"),
        f"  id {node.get('id')}  role {node.get('role')}  P&M {node.get('pm') or '-'}  "
        f"up {_fmt(node.get('uptime_s'))} s  epoch {node.get('epoch')}")]
    out.append(_table("Neighbours", ["name", "id", "address", "state", "last heard ms",
                                     "rtt us"],
                      [[n.get("name"), str(n.get("id") or "-"), n.get("address"),
                        Text(str(n.get("state")), style="green" if n.get("state") == "up"
                             else "red"), n.get("last_heard_ms"), n.get("rtt_us")]
                       for n in status.get("neighbours", [])], numeric_from=4))
    out.append(_table("Subscriptions", ["origin", "namespace", "pattern", "qos", "clients"],
                      [[s.get("origin"), s.get("namespace"), s.get("pattern"), s.get("qos"),
                        s.get("clients")] for s in status.get("subscriptions", [])],
                      numeric_from=4))
    out.append(_table("Routes", ["source", "destination", "path", "cost"],
                      [[r.get("source"), r.get("destination"),
                        " -> ".join(str(x) for x in r.get("path", [])), r.get("cost")]
                       for r in status.get("routes", [])], numeric_from=3))
    out.append(_table("Channels", ["name", "kind", "frames in", "frames out", "bytes in",
                                   "bytes out", "loss", "naks", "retx", "p50 us", "p99 us",
                                   "jitter us"],
                      [[c.get("name"), c.get("kind"), c.get("frames_in"), c.get("frames_out"),
                        c.get("bytes_in"), c.get("bytes_out"), c.get("loss"), c.get("naks"),
                        c.get("retransmissions"), c.get("p50_us"), c.get("p99_us"),
                        c.get("jitter_us")] for c in status.get("channels", [])],
                      numeric_from=2))
    offload = status.get("offload", {})
    out.append(_counts("Offload verdicts (software NIC)", offload.get("verdicts", {}),
                       "verdict"))
    events = {k: v for k, v in offload.items() if k not in ("verdicts", "malformed")}
    out.append(_counts("Offload tables and events", events, "what"))
    if offload.get("malformed"):
        out.append(_counts("Malformed frames", offload["malformed"], "reason"))
    out.append(_table("Entitlement denials", ["identity", "action", "pattern", "count"],
                      [[d.get("identity"), d.get("action"), d.get("pattern"), d.get("count")]
                       for d in status.get("denials", [])], numeric_from=3))
    auth = status.get("auth", {})
    out.append(_counts("Admin-frame authentication",
                       {"accepted": auth.get("accepted", 0),
                        **{f"rejected: {k}": v for k, v in auth.get("rejected", {}).items()}},
                       "result"))
    out.append(_table("Clients", ["session", "identity", "channel", "subscriptions",
                                  "published", "delivered"],
                      [[str(c.get("session")), c.get("identity"), c.get("channel"),
                        ", ".join(c.get("subscriptions", [])), c.get("published"),
                        c.get("delivered")] for c in status.get("clients", [])],
                      numeric_from=4))
    if status.get("counters"):
        out.append(_counts("Counters", status["counters"]))
    return out
