"""The management HTTP API: JSON views of the status snapshot, Prometheus ``/metrics``, commands.

``MgmtServer`` is a ``ThreadingHTTPServer`` on its own thread (one more thread per request).
Reads take ``Appliance.status()``, the control agent's published snapshot, and serialise it
on the request's thread: the data path is never asked anything and never waits. Commands go
through ``Appliance.submit`` (the control agent applies them between duty cycles). With
``mgmt.process = true`` (the default) this server runs in the management API's own process
(appliance/ops/mgmt/child.py) over ``SnapshotAppliance``: ``status()`` is the latest snapshot
the appliance sent, ``submit()`` forwards the command to the appliance.

Endpoints (docs/appliance.md, "Management API"):

    GET    /                       the endpoint list
    GET    /status                 the whole snapshot
    GET    /node /neighbours /subscriptions /routes /channels /offload /denials
           /auth /clients /counters   one section each: {"<section>": ...}
    GET    /metrics                Prometheus text (or OpenMetrics when Accept asks for it)
    POST   /routes                 {"source", "destination", "path"}: set a route override
    DELETE /routes                 {"source", "destination"} (or ?source=&destination=): clear it
    DELETE /clients/<session>      end a client session (the client is told)
    POST /clients/<session>/move   ask a client session to move to its standby
    POST /clients/move             ask {"all": true} | {"identity": N} | {"sessions": [...]}
    POST   /shutdown               {"reason"?}: drain and stop the appliance as on SIGTERM

Commands need ``Authorization: Bearer <token>`` (``mgmt.token`` or ``mgmt.token_file``):
no header or a wrong token is 401, and with no token configured every command is refused
with 403. When ``mgmt.listen`` is not a loopback address and a token is configured, reads
need the token too. Every error is a JSON object ``{"error": "<component>: ...", "status":
code}``.

Nothing a client sends is trusted to be HTTP: the handler reads the request line and headers
itself, against the bounds of ``appliance/ops/mgmt/config.py`` (line and header sizes, number
of headers, body size, one deadline for the whole request), and answers anything malformed
with a JSON 4xx (413, 414, 431, 501 or 505 where they fit) without reading past it; at most
``MGMT_MAX_CONNECTIONS`` connections are served at once, one more is answered 503. Every
answer is logged as one debug line; a failure of the API's own code is one error line (no
traceback) and a 500; a handler thread never raises out.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import re
import socket
import ssl
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from http import HTTPStatus
from http.client import HTTPMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

from appliance.addresses import format_host_port
from appliance.config import ApplianceConfig, ConfigError, parse_address
from appliance.ops.mgmt.config import (
    MGMT_LINGER_BYTES,
    MGMT_LINGER_S,
    MGMT_LISTEN_BACKLOG,
    MGMT_LOGGED_TEXT_CHARS,
    MGMT_MAX_BODY_BYTES,
    MGMT_MAX_CONNECTIONS,
    MGMT_MAX_HEADER_BYTES,
    MGMT_MAX_HEADER_LINE_BYTES,
    MGMT_MAX_HEADERS,
    MGMT_MAX_QUERY_FIELDS,
    MGMT_MAX_REQUEST_LINE_BYTES,
    MGMT_OVERLOAD_LOG_INTERVAL_S,
    MGMT_REQUEST_TIMEOUT_S,
    MGMT_RETRY_AFTER_S,
    MGMT_SHUTDOWN_POLL_S,
)

log = logging.getLogger("topicwire.mgmt")

SECTIONS = ("node", "neighbours", "subscriptions", "routes", "channels", "offload", "denials",
            "auth", "clients", "counters")
"""Status sections served one each under ``GET /<section>``."""

ENDPOINTS = (
    ("GET", "/", "this list"),
    ("GET", "/status", "the whole status snapshot"),
    *(("GET", f"/{s}", f"the status snapshot's {s!r} section") for s in SECTIONS),
    ("GET", "/metrics", "Prometheus metrics"),
    ("GET", "/healthz", "200 while the appliance's agents run, 503 once one failed (no token)"),
    ("GET", "/readyz", "200 when it forwards: started, with P&M's document, not stopping; "
     "else 503 with the reasons (no token)"),
    ("POST", "/routes", "set a route override {source, destination, path} (token)"),
    ("DELETE", "/routes", "clear a route override {source, destination} (token)"),
    ("DELETE", "/clients/<session>", "end a client session (token)"),
    ("POST", "/clients/<session>/move", "ask a client session to move to its standby "
     "{reason?} (token)"),
    ("POST", "/clients/move", "ask client sessions to move to their standby: {all: true} | "
     "{identity} | {sessions: [...]}, {reason?} (token)"),
    ("POST", "/shutdown", "drain and stop the appliance as on SIGTERM {reason?} (token)"),
)
"""What ``GET /`` lists: (method, path, what)."""


def read_token(config: ApplianceConfig) -> str | None:
    """The token of ``mgmt.token`` or ``mgmt.token_file`` (stripped), or None."""
    mgmt = config.mgmt
    if "token" in mgmt and "token_file" in mgmt:
        raise ConfigError("mgmt.token: give mgmt.token or mgmt.token_file, not both")
    if "token" in mgmt:
        token = mgmt["token"]
        if not isinstance(token, str) or not token.strip():
            raise ConfigError("mgmt.token: must be a non-empty string")
        return token.strip()
    if "token_file" in mgmt:
        path = Path(str(mgmt["token_file"]))
        if not path.is_absolute():
            path = (config.source.parent if config.source else Path.cwd()) / path
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"mgmt.token_file: cannot read {path}: {exc}") from None
        if not token:
            raise ConfigError(f"mgmt.token_file: {path} is empty; put the token in it")
        return token
    return None


METHODS = ("GET", "POST", "DELETE", "PUT", "PATCH")
"""Methods the API knows (PUT and PATCH to say 405 with ``Allow``); any other is 501."""

_TCHAR = rb"!#$%&'*+\-.^_`|~0-9A-Za-z"
_REQUEST_LINE = re.compile(rb"([" + _TCHAR + rb"]+) ([\x21-\x7e]+) HTTP/([0-9])\.([0-9])")
_VERSION = re.compile(rb"HTTP/([0-9]+)\.[0-9]+")
_NOT_IN_REQUEST_LINE = re.compile(rb"[^\x20-\x7e\r\n]")
_HEADER_LINE = re.compile(rb"([" + _TCHAR + rb"]+):(.*)", re.DOTALL)
_NOT_IN_HEADER_VALUE = re.compile(rb"[^\t\x20-\x7e\x80-\xff]")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")
_BYTE_COUNT = re.compile(r"[0-9]+")
_SESSION = re.compile(r"[0-9]{1,18}")


def _clip(text: str, chars: int = MGMT_LOGGED_TEXT_CHARS) -> str:
    """A client's text for a log line or an error: printable ASCII (anything else escaped), cut
    to ``chars`` characters."""
    cut = text[:chars]
    shown = _NOT_PRINTABLE_ASCII.sub(lambda m: ascii(m.group())[1:-1], cut)
    return shown + (f"... ({len(text)} characters)" if len(text) > chars else "")


def _describe(exc: BaseException) -> str:
    """One line for an exception: its type, message and where it was raised (no traceback)."""
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" at {Path(where[0].filename).name}:{where[0].lineno} in {where[0].name}" \
        if where else ""
    return f"{type(exc).__name__}: {_clip(str(exc))}{at}"


class _HttpError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None,
                 close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}
        self.close = close


class _ConnectionGone(Exception):
    """Reading the request or writing the answer failed: the client went away or stopped
    reading (nobody to answer; the connection ends)."""


class _Server(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` that serves at most ``MGMT_MAX_CONNECTIONS`` connections at
    once (one more gets a 503 from the accepting thread, which never blocks on it) and logs a
    failure as one line."""

    daemon_threads = True
    request_queue_size = MGMT_LISTEN_BACKLOG
    mgmt: MgmtServer

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 tls: ssl.SSLContext | None = None, sock: socket.socket | None = None) -> None:
        """``sock``: a socket already bound and listening (the appliance's, handed to the
        management API's process) instead of a new one on ``address``."""
        super().__init__(address, handler, bind_and_activate=sock is None)
        if sock is not None:
            self.socket.close()
            self.socket = sock
            self.server_address = sock.getsockname()
            self.server_name, self.server_port = str(self.server_address[0]), \
                int(self.server_address[1])
        self.tls = tls
        """HTTPS when set: each connection's handshake runs on its own thread (``_Handler``),
        under the request deadline, so a client that never finishes it holds no one up."""
        self.tls_failures = 0
        self.lock = threading.Lock()
        self.open: set[socket.socket] = set()
        self.errors: Counter[int] = Counter()
        self._turned_away = 0
        self._warned_at = -MGMT_OVERLOAD_LOG_INTERVAL_S

    def get_request(self) -> tuple[Any, Any]:
        request, address = super().get_request()
        if self.tls is not None:
            request = self.tls.wrap_socket(request, server_side=True,
                                           do_handshake_on_connect=False)
        return request, address

    def count_error(self, status: int) -> None:
        with self.lock:
            self.errors[int(status)] += 1

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            full = len(self.open) >= MGMT_MAX_CONNECTIONS
            if not full:
                self.open.add(request)
        if full:
            self._turn_away(request, client_address)
            return
        try:
            super().process_request(request, client_address)
        except Exception as exc:  # no thread for it: the process is out of threads
            with self.lock:
                self.open.discard(request)
            log.warning("mgmt: %s: no thread to serve the connection: %s",
                        _peer(client_address), _describe(exc))
            self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.open.discard(request)

    def _turn_away(self, request: socket.socket, client_address: Any) -> None:
        self.count_error(HTTPStatus.SERVICE_UNAVAILABLE)
        doc = {"error": f"mgmt: {MGMT_MAX_CONNECTIONS} connections are open, the most this API "
                        "serves at once (MGMT_MAX_CONNECTIONS); retry in a moment",
               "status": int(HTTPStatus.SERVICE_UNAVAILABLE)}
        body = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
        head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: {MGMT_RETRY_AFTER_S}\r\n"
                "Cache-Control: no-store\r\nConnection: close\r\n\r\n").encode()
        try:
            request.setblocking(False)  # the accepting thread must never wait on a client
            try:
                for _ in range(16):  # drop what already came, so that closing does not reset
                    if not request.recv(65536):
                        break
            except BlockingIOError:
                pass
            request.send(head + body)  # a fresh connection's send buffer takes it whole
        except OSError:
            pass
        self.shutdown_request(request)
        now = time.monotonic()
        with self.lock:
            self._turned_away += 1
            warn = now - self._warned_at >= MGMT_OVERLOAD_LOG_INTERVAL_S
            if warn:
                count, self._turned_away, self._warned_at = self._turned_away, 0, now
        log.debug("mgmt: %s -> 503 too many connections", _peer(client_address),
                  extra={"peer": _peer(client_address), "status": 503})
        if warn:
            log.warning("mgmt: the management API turned away %d connection(s) with 503: %d "
                        "were open, the most it serves at once (MGMT_MAX_CONNECTIONS)", count,
                        MGMT_MAX_CONNECTIONS, extra={"turned_away": count})

    def end_connections(self) -> None:
        """Shut every open connection (``close()``): their threads see the end and return."""
        with self.lock:
            sockets = list(self.open)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Not reached (the handler catches everything); one line, not a traceback, if it is."""
        log.error("mgmt: %s: the connection's handler failed: %s", _peer(client_address),
                  _describe(sys.exc_info()[1] or RuntimeError("unknown")))


def _peer(client_address: Any) -> str:
    try:
        return f"{client_address[0]}:{client_address[1]}"
    except (TypeError, IndexError):
        return str(client_address)


class _Server6(_Server):
    """The same server on an IPv6 address (``mgmt.listen = "[::1]:8470"``)."""

    address_family = socket.AF_INET6


class MgmtServer:
    """The running API; ``close()`` stops it (safe twice)."""

    def __init__(self, appliance: Any, host: str, port: int, token: str | None,
                 tls: ssl.SSLContext | None = None, *, sock: socket.socket | None = None,
                 channels: Callable[[], list[dict[str, Any]]] | None = None,
                 pid: int | None = None,
                 gc_stats: Callable[[], list[dict[str, int]]] | None = None) -> None:
        """``appliance`` gives ``status()``, ``submit()``, ``failure()`` (and ``_stopped``):
        the ``Appliance`` itself, or in the management API's own process the latest snapshot
        it received (appliance/ops/mgmt/child.py), which also passes the listening ``sock``,
        the ``channels`` rows, the appliance's ``pid`` and its ``gc_stats`` for /metrics."""
        self.appliance = appliance
        self.token = token
        loopback = ipaddress.ip_address(host).is_loopback
        self.reads_need_token = token is not None and not loopback
        server_class = _Server6 if ":" in host else _Server
        try:
            self.httpd = server_class((host, port), _Handler, tls, sock)
        except OSError as exc:
            raise ConfigError(f"mgmt.listen: cannot listen on {format_host_port(host, port)} "
                              f"({exc.strerror}); pick another port or stop its owner") from None
        self.httpd.mgmt = self
        self._metrics_inputs = (channels, pid, gc_stats)
        self._registry: Any = None
        self._registry_lock = threading.Lock()
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        kwargs={"poll_interval": MGMT_SHUTDOWN_POLL_S},
                                        name="mgmt", daemon=True)
        self._closed = False

    @property
    def registry(self) -> Any:
        """prometheus_client's registry behind /metrics, made at the first scrape: numpy and
        prometheus_client (appliance/ops/mgmt/metrics.py) load then, not while the API's own
        process starts beside the appliance (seconds of a boot under emulation)."""
        with self._registry_lock:
            if self._registry is None:
                from appliance.ops.mgmt.metrics import (
                    ApiCollector,
                    appliance_channel_samples,
                    registry_of,
                )

                channels, pid, gc_stats = self._metrics_inputs
                appliance = self.appliance
                if channels is None:
                    def channels() -> list[dict[str, Any]]:
                        return appliance_channel_samples(appliance)
                self._registry = registry_of(appliance.status,
                                             ApiCollector(self.errors, self.connections),
                                             channels, pid=pid, gc_stats=gc_stats)
            return self._registry

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        scheme = 'https' if self.httpd.tls is not None else 'http'
        return f"{scheme}://{format_host_port(*self.address)}"

    def errors(self) -> dict[int, int]:
        """Error answers so far by status code (``topicwire_mgmt_errors_total``)."""
        with self.httpd.lock:
            return dict(self.httpd.errors)

    def connections(self) -> int:
        """Connections open now (``topicwire_mgmt_connections``)."""
        with self.httpd.lock:
            return len(self.httpd.open)

    def start(self) -> MgmtServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.end_connections()
        self.httpd.server_close()
        self._thread.join(MGMT_REQUEST_TIMEOUT_S)
        # the connections' threads see their end at once; a refusal may linger that long
        deadline = time.monotonic() + MGMT_LINGER_S + MGMT_SHUTDOWN_POLL_S
        while self.connections() and time.monotonic() < deadline:
            time.sleep(0.01)

    # --- authorisation ------------------------------------------------------------------------
    def check_token(self, header: str | None, what: str) -> None:
        if self.token is None:
            raise _HttpError(HTTPStatus.FORBIDDEN, f"mgmt: {what} changes state and this "
                             "appliance has no management token; set mgmt.token or "
                             "mgmt.token_file in its config to allow it")
        challenge = {"WWW-Authenticate": 'Bearer realm="topicwire"'}
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise _HttpError(HTTPStatus.UNAUTHORIZED, f"mgmt: {what} needs the management "
                             "token: send Authorization: Bearer <token> (mgmt.token)", challenge)
        if not hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"),
                                   self.token.encode()):
            raise _HttpError(HTTPStatus.UNAUTHORIZED, "mgmt: the bearer token is wrong; use "
                             "the appliance's mgmt.token", challenge)

    # --- requests -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        status = self.appliance.status()
        if not status:
            raise _HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "mgmt: the appliance has not "
                             "published its status yet; retry in a moment")
        return status

    def health(self, path: str) -> tuple[int, dict[str, Any]]:
        """``/healthz``: live (the agents run); ``/readyz``: ready to forward."""
        failure = self.appliance.failure()
        if failure is not None:
            return HTTPStatus.SERVICE_UNAVAILABLE, {
                "status": "failing", "error": _clip(f"{type(failure).__name__}: {failure}", 300)}
        if path == "/healthz":
            return HTTPStatus.OK, {"status": "ok"}
        status = self.appliance.status()
        reasons = []
        if not status:
            reasons.append("starting: no status published yet")
        elif not (status.get("node") or {}).get("pm"):
            reasons.append("no P&M document yet (logins are refused)")
        if getattr(self.appliance, "_stopped", False):
            reasons.append("stopping")
        if reasons:
            return HTTPStatus.SERVICE_UNAVAILABLE, {"status": "not ready", "reasons": reasons}
        return HTTPStatus.OK, {"status": "ready"}

    def get(self, path: str) -> dict[str, Any]:
        if path == "/":
            node = self.appliance.status().get("node", {})
            return {"node": node.get("name"), "reads_need_token": self.reads_need_token,
                    "endpoints": [{"method": m, "path": p, "what": w} for m, p, w in ENDPOINTS]}
        if path == "/status":
            return self.status()
        section = path[1:]
        if section in SECTIONS:
            return {section: self.status().get(section, {} if section in (
                "node", "offload", "auth", "counters") else [])}
        raise AssertionError(path)  # routed only for known paths

    def command(self, method: str, path: str, body: dict[str, Any], query: dict[str, str]
                ) -> dict[str, Any]:
        if path == "/routes" and method == "POST":
            args = {"source": _name(body, "source"), "destination": _name(body, "destination"),
                    "path": _path(body)}
            return self._submit("set_route", args)
        if path == "/routes" and method == "DELETE":
            merged = {**query, **body}
            args = {"source": _name(merged, "source"),
                    "destination": _name(merged, "destination")}
            return self._submit("clear_route", args)
        if path.startswith("/clients/") and path.endswith("/move") and method == "POST":
            return self._submit("move_clients", _move_args(path, body))
        if path.startswith("/clients/") and method == "DELETE":
            text = path[len("/clients/"):]
            if not _SESSION.fullmatch(text):
                raise _HttpError(HTTPStatus.BAD_REQUEST, f"mgmt: {_clip(text, 40)!r} is not a "
                                 "session number; GET /clients lists them")
            return self._submit("disconnect_client", {"session": int(text)})
        if path == "/shutdown" and method == "POST":
            unknown = sorted(set(body) - {"reason"})
            reason = body.get("reason", "")
            if unknown or not isinstance(reason, str):
                raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: POST /shutdown takes an empty "
                                 "body or {\"reason\": \"<text>\"}"
                                 + (f", not {', '.join(map(repr, unknown))}" if unknown else ""))
            return self._submit("shutdown", {"reason": reason} if reason else {})
        raise AssertionError((method, path))

    def _submit(self, command: str, args: dict[str, Any]) -> dict[str, Any]:
        result = self.appliance.submit(command, args)
        if result.get("ok"):
            log.info("mgmt: %s %s applied", command, json.dumps(args, sort_keys=True),
                     extra={"command": command, "command_args": args})
            return result
        error = str(result.get("error", f"mgmt: {command} refused"))
        busy = "not running" in error or "not applied within" in error
        raise _HttpError(HTTPStatus.SERVICE_UNAVAILABLE if busy else HTTPStatus.CONFLICT, error)


def _name(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise _HttpError(HTTPStatus.BAD_REQUEST, f"mgmt: {key!r} is required: an appliance "
                         "name (GET /routes shows them)")
    return value


def _path(doc: dict[str, Any]) -> list[str]:
    value = doc.get("path")
    if (not isinstance(value, list) or len(value) < 2
            or not all(isinstance(x, str) and x for x in value)):
        raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: 'path' is required: a list of at "
                         "least two appliance names from source to destination")
    return value


def _move_args(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """``move_clients``'s arguments from ``POST /clients/<session>/move`` (the session, and an
    optional reason in the body) or ``POST /clients/move`` (the body as it is: the appliance
    checks it and answers 400 with what it takes)."""
    if path == "/clients/move":
        unknown = sorted(set(body) - {"all", "identity", "sessions", "reason"})
        chosen = [k for k in ("all", "identity", "sessions") if k in body]
        if unknown or len(chosen) != 1:
            raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: POST /clients/move takes one of "
                             "{\"all\": true}, {\"identity\": \"<name>\"} or {\"sessions\": "
                             "[<session>, ...]}, and an optional \"reason\""
                             + (f"; not {', '.join(map(repr, unknown))}" if unknown else ""))
        return dict(body)
    text = path[len("/clients/"):-len("/move")]
    if not _SESSION.fullmatch(text):
        raise _HttpError(HTTPStatus.BAD_REQUEST, f"mgmt: {_clip(text, 40)!r} is not a session "
                         "number; GET /clients lists them")
    unknown = sorted(set(body) - {"reason"})
    if unknown:
        raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: POST /clients/<session>/move takes an "
                         "empty body or {\"reason\": \"<text>\"}, not "
                         + ", ".join(map(repr, unknown)))
    return {"sessions": [int(text)], **({"reason": body["reason"]} if "reason" in body else {})}


def _route(method: str, path: str) -> tuple[str, set[str]]:
    """("read" | "metrics" | "command", allowed methods) of a known path; 404 otherwise."""
    if path in ("/", "/status") or path[1:] in SECTIONS:
        allowed = {"GET", "POST", "DELETE"} if path == "/routes" else {"GET"}
        if method == "GET":
            return "read", allowed
        if method in allowed:
            return "command", allowed
        return "", allowed
    if path == "/metrics":
        return ("metrics" if method == "GET" else ""), {"GET"}
    if path in ("/healthz", "/readyz"):
        return ("health" if method == "GET" else ""), {"GET"}
    if path == "/shutdown":
        return ("command" if method == "POST" else ""), {"POST"}
    if path == "/clients/move" or (path.startswith("/clients/") and path.endswith("/move")
                                   and path.count("/") == 3):
        return ("command" if method == "POST" else ""), {"POST"}
    if path.startswith("/clients/") and path.count("/") == 2:
        return ("command" if method == "DELETE" else ""), {"DELETE"}
    known = ", ".join(f"{m} {p}" for m, p, _ in ENDPOINTS)
    raise _HttpError(HTTPStatus.NOT_FOUND, f"mgmt: no endpoint {method} {_clip(path, 100)}; "
                     f"known: {known}")


def _target(target: str) -> tuple[str, str]:
    """(path, raw query) of a request target: a path from ``/`` that is UTF-8 once %-decoded
    and holds no control character; 400 otherwise."""
    if not target.startswith("/"):
        raise _HttpError(HTTPStatus.BAD_REQUEST, f"mgmt: {_clip(target, 100)!r} is not a path; "
                         "send the path from / (origin form), such as GET /status")
    if _BAD_ESCAPE.search(target):
        raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: a '%' in the path or query is not "
                         "followed by two hex digits; escape '%' as %25")
    raw_path, _, raw_query = target.partition("?")
    try:
        path = unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: the path is not UTF-8 once "
                         "%-decoded") from None
    if _CONTROL.search(path):
        raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: the path holds a control character "
                         "once %-decoded")
    return path.rstrip("/") or "/", raw_query


def _query(raw_query: str) -> dict[str, str]:
    """A command's query string as {name: value} (the last of a repeated name); 400 when it is
    not UTF-8, holds control characters or has over ``MGMT_MAX_QUERY_FIELDS`` fields."""
    try:
        fields = parse_qsl(raw_query, keep_blank_values=True, errors="strict",
                           max_num_fields=MGMT_MAX_QUERY_FIELDS)
    except ValueError:  # not UTF-8 once decoded, or too many fields
        raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: the query string must be at most "
                         f"{MGMT_MAX_QUERY_FIELDS} name=value fields of %-escaped UTF-8, such "
                         "as ?source=core1&destination=core2") from None
    if any(_CONTROL.search(name + value) for name, value in fields):
        raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: the query string holds a control "
                         "character once %-decoded")
    return dict(fields)


class _Handler(BaseHTTPRequestHandler):
    """One connection: reads each request itself (bounded; see the module docstring) and
    answers it; nothing it does raises out of ``handle``."""

    server: _Server
    server_version = "topicwire-mgmt/1"
    protocol_version = "HTTP/1.1"
    timeout = MGMT_REQUEST_TIMEOUT_S  # re-armed to the request's deadline before each read

    # --- the connection -----------------------------------------------------------------------
    def setup(self) -> None:
        self.peer = _peer(self.client_address)
        self._unread = False
        self._handshake_failed = False
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(MGMT_REQUEST_TIMEOUT_S)
            try:
                self.request.do_handshake()
            except (OSError, ValueError) as exc:  # not TLS, no client certificate, too slow
                self._handshake_failed = True
                with self.server.lock:
                    self.server.tls_failures += 1
                log.debug("mgmt: %s: TLS handshake failed: %s", self.peer,
                          _clip(str(exc) or type(exc).__name__), extra={"peer": self.peer})
        super().setup()

    def handle(self) -> None:
        self.close_connection = True
        if self._handshake_failed:
            return
        try:
            self.handle_one_request()
            while not self.close_connection:
                self.handle_one_request()
        except (OSError, _ConnectionGone) as exc:  # the client went away or stopped reading
            log.debug("mgmt: %s: connection ended: %s", self.peer, _clip(str(exc) or
                      type(exc).__name__), extra={"peer": self.peer})
        except Exception as exc:  # a bug of this handler: the connection ends, the API does not
            log.error("mgmt: %s: the connection's handler failed: %s", self.peer,
                      _describe(exc), extra={"peer": self.peer})
        finally:
            if self._unread:
                self._linger()

    def _linger(self) -> None:
        """After a refusal that left the request unread: drop what the client still sends
        (``MGMT_LINGER_S``, ``MGMT_LINGER_BYTES``) before closing, so that it reads the answer
        rather than a reset."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            deadline, left = time.monotonic() + MGMT_LINGER_S, MGMT_LINGER_BYTES
            while left > 0 and (wait := deadline - time.monotonic()) > 0:
                self.connection.settimeout(wait)
                data = self.connection.recv(min(left, 65536))
                if not data:
                    break
                left -= len(data)
        except OSError:
            pass

    # --- one request --------------------------------------------------------------------------
    def handle_one_request(self) -> None:
        self.close_connection = True
        self.command, self.path, self.request_version = "", "", self.protocol_version
        self.requestline = ""
        self.headers = HTTPMessage()
        self._deadline = time.monotonic() + MGMT_REQUEST_TIMEOUT_S
        self._received = 0
        self._body_length = 0
        self._expect_continue = False
        self._unread = True  # until the request is read to its end
        try:
            try:
                if not self._read_head():
                    self._unread = False
                    return
            except TimeoutError:
                if not self._received:  # idle: nothing of a request came
                    self._unread = False
                    log.debug("mgmt: %s: closed after %s s without a request", self.peer,
                              MGMT_REQUEST_TIMEOUT_S, extra={"peer": self.peer})
                    return
                raise _HttpError(HTTPStatus.REQUEST_TIMEOUT, "mgmt: the request did not arrive "
                                 f"whole within {MGMT_REQUEST_TIMEOUT_S} s "
                                 "(MGMT_REQUEST_TIMEOUT_S); send it at once", close=True) \
                    from None
            self._unread = self._body_length > 0
            if self.command not in METHODS:
                raise _HttpError(HTTPStatus.NOT_IMPLEMENTED, f"mgmt: {_clip(self.command, 40)} "
                                 "is not a method this API knows; it takes GET, POST and DELETE",
                                 {"Allow": "GET, POST, DELETE"}, close=True)
            self._handle(self.command)
        except _HttpError as exc:
            self._refuse(exc)

    def _read_line(self, limit: int, request_line: bool = False) -> bytes:
        """The next line with its LF before the request's deadline: at most ``limit`` bytes
        (longer: the first ``limit + 1``), b"" when the connection ended first, the bytes so far
        when it ended inside the line. Raises TimeoutError past the deadline; a request line
        with a byte that is not printable ASCII is refused at once (a client that is not
        speaking HTTP may never send a line end)."""
        parts: list[bytes] = []
        size = 0
        while True:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request's deadline passed")
            self.connection.settimeout(left)
            data = self.rfile.peek(1)  # what is buffered, or one read from the socket
            if not data:
                break
            room = limit + 1 - size
            end = data.find(b"\n", 0, room)
            chunk = self.rfile.read(end + 1 if end >= 0 else min(len(data), room))
            parts.append(chunk)
            size += len(chunk)
            self._received += len(chunk)
            if request_line and _NOT_IN_REQUEST_LINE.search(chunk):
                raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: the request line holds bytes "
                                 "that are not printable ASCII; this is an HTTP/1.1 API "
                                 "(not TLS, not HTTP/2)", close=True)
            if end >= 0 or size > limit:
                break
        return b"".join(parts)

    def _read_head(self) -> bool:
        """Read and check the request line and headers; False when the connection ended before
        a request began. Sets ``command``, ``path``, ``headers``, ``_body_length``."""
        line = self._read_line(MGMT_MAX_REQUEST_LINE_BYTES, request_line=True)
        if line in (b"\r\n", b"\n"):  # one empty line before a request is tolerated (RFC 9112)
            self._received = 0
            line = self._read_line(MGMT_MAX_REQUEST_LINE_BYTES, request_line=True)
        if not line:
            return False
        self.requestline = _clip(line.decode("ascii").rstrip("\r\n"))
        if len(line) > MGMT_MAX_REQUEST_LINE_BYTES:
            raise _HttpError(HTTPStatus.REQUEST_URI_TOO_LONG, "mgmt: the request line is over "
                             f"{MGMT_MAX_REQUEST_LINE_BYTES} bytes (MGMT_MAX_REQUEST_LINE_BYTES)",
                             close=True)
        if not line.endswith(b"\n"):
            raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: the connection ended inside the "
                             "request line", close=True)
        text = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        match = _REQUEST_LINE.fullmatch(text)
        if not match:
            words = text.split(b" ")
            version = _VERSION.fullmatch(words[-1])
            if len(words) == 3 and version and version[1] != b"1":
                raise _HttpError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "mgmt: "
                                 f"{_clip(words[2].decode(), 40)} is not served; send HTTP/1.1",
                                 close=True)
            if len(words) == 2:
                raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: a request line without a "
                                 "version (HTTP/0.9) is not served; send HTTP/1.1", close=True)
            raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: a malformed request line; send "
                             "METHOD /path HTTP/1.1, one space apart", close=True)
        major, minor = int(match[3]), int(match[4])
        if major != 1:
            raise _HttpError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"mgmt: HTTP/{major}.{minor} "
                             "is not served; send HTTP/1.1", close=True)
        self.command, self.path = match[1].decode("ascii"), match[2].decode("ascii")
        self.request_version = f"HTTP/{major}.{minor}"
        self._read_headers()
        tokens = {t.strip().lower() for v in self.headers.get_all("Connection", [])
                  for t in v.split(",")}
        self.close_connection = minor == 0 or "close" in tokens
        expect = [v.strip().lower() for v in self.headers.get_all("Expect", [])]
        if any(v != "100-continue" for v in expect):
            raise _HttpError(HTTPStatus.EXPECTATION_FAILED, "mgmt: the only Expect this API "
                             "meets is 100-continue", close=True)
        self._expect_continue = bool(expect) and minor >= 1
        self._body_length = self._framing()
        return True

    def _read_headers(self) -> None:
        headers = HTTPMessage()
        count = total = 0
        while True:
            line = self._read_line(MGMT_MAX_HEADER_LINE_BYTES)
            if len(line) > MGMT_MAX_HEADER_LINE_BYTES:
                raise _HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "mgmt: a header "
                                 f"line is over {MGMT_MAX_HEADER_LINE_BYTES} bytes "
                                 "(MGMT_MAX_HEADER_LINE_BYTES)", close=True)
            if not line.endswith(b"\n"):
                raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: the connection ended inside "
                                 "the headers", close=True)
            if line in (b"\r\n", b"\n"):
                break
            count += 1
            total += len(line)
            if count > MGMT_MAX_HEADERS:
                raise _HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "mgmt: over "
                                 f"{MGMT_MAX_HEADERS} header lines (MGMT_MAX_HEADERS)",
                                 close=True)
            if total > MGMT_MAX_HEADER_BYTES:
                raise _HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "mgmt: the header "
                                 f"lines are over {MGMT_MAX_HEADER_BYTES} bytes together "
                                 "(MGMT_MAX_HEADER_BYTES)", close=True)
            match = _HEADER_LINE.fullmatch(line[:-2] if line.endswith(b"\r\n") else line[:-1])
            value = match[2].strip(b" \t") if match else b""
            if not match or _NOT_IN_HEADER_VALUE.search(value):
                raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: a malformed header line; send "
                                 "Name: value (no space before the colon, no folded lines, no "
                                 "control characters)", close=True)
            headers[match[1].decode("ascii")] = value.decode("latin-1")
        self.headers = headers

    def _framing(self) -> int:
        """The body's length from Content-Length; transfer codings and any doubt about where
        the body ends are refused (the connection is closed: the rest is not read)."""
        codings = self.headers.get_all("Transfer-Encoding", [])
        lengths = self.headers.get_all("Content-Length", [])
        if codings and lengths:
            raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: both Transfer-Encoding and "
                             "Content-Length; send the body with a Content-Length only",
                             close=True)
        if codings:
            if "chunked" in ",".join(codings).lower():
                raise _HttpError(HTTPStatus.LENGTH_REQUIRED, "mgmt: send the body with a "
                                 "Content-Length (chunked bodies are not read)", close=True)
            raise _HttpError(HTTPStatus.NOT_IMPLEMENTED, "mgmt: Transfer-Encoding "
                             f"{_clip(','.join(codings), 40)!r} is not supported; send the body "
                             "with a Content-Length", close=True)
        if not lengths:
            return 0
        values = {v.strip() for v in lengths}
        value = values.pop()
        if values or not _BYTE_COUNT.fullmatch(value):
            raise _HttpError(HTTPStatus.BAD_REQUEST, f"mgmt: Content-Length "
                             f"{_clip(', '.join(lengths), 40)!r} is not one byte count",
                             close=True)
        if len(value) > 18 or int(value) > MGMT_MAX_BODY_BYTES:
            raise _HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"mgmt: a body of "
                             f"{_clip(value, 40)} bytes; at most {MGMT_MAX_BODY_BYTES} "
                             "(MGMT_MAX_BODY_BYTES)", close=True)
        return int(value)

    def _handle(self, method: str) -> None:
        mgmt = self.server.mgmt
        path = self.path
        try:
            path, raw_query = _target(self.path)
            kind, allowed = _route(method, path)
            if not kind:
                raise _HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"mgmt: {_clip(path, 100)} does "
                                 f"not take {method}; it takes {', '.join(sorted(allowed))}",
                                 {"Allow": ", ".join(sorted(allowed))})
            if kind == "command":
                mgmt.check_token(self.headers.get("Authorization"), f"{method} {path}")
                body = self._body()
                query = _query(raw_query)
                self._json(HTTPStatus.OK, mgmt.command(method, path, body, query))
                return
            if self._body_length:
                raise _HttpError(HTTPStatus.BAD_REQUEST, f"mgmt: GET {path} takes no body",
                                 close=True)
            if kind == "health":  # for probes: no token, nothing but the verdict
                self._json(*mgmt.health(path))
                return
            if mgmt.reads_need_token:
                mgmt.check_token(self.headers.get("Authorization"), f"GET {path}")
            if kind == "metrics":
                from appliance.ops.mgmt.metrics import exposition

                body, content_type = exposition(mgmt.registry, self.headers.get("Accept"))
                self._send(HTTPStatus.OK, body, content_type)
            else:
                self._json(HTTPStatus.OK, mgmt.get(path))
        except (_HttpError, _ConnectionGone):
            raise  # a refusal, or the connection is gone (handle() ends it)
        except Exception as exc:  # a bug here must not kill the server: answer, one log line
            log.error("mgmt: %s %s failed: %s", method, _clip(path, 100), _describe(exc),
                      extra={"peer": self.peer})
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR,
                       {"error": f"mgmt: internal error ({type(exc).__name__}); see the "
                                 "appliance's log", "status": 500})

    def _body(self) -> dict[str, Any]:
        """The body: a JSON object of at most ``MGMT_MAX_BODY_BYTES``, read before the
        request's deadline (408 after it)."""
        length = self._body_length
        if length == 0:
            return {}
        parts: list[bytes] = []
        got = 0
        try:
            if self._expect_continue:
                self.send_response_only(HTTPStatus.CONTINUE)
                self.end_headers()
            while got < length:
                left = self._deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the request's deadline passed")
                self.connection.settimeout(left)
                chunk = self.rfile.read1(min(length - got, 65536))
                if not chunk:
                    raise _HttpError(HTTPStatus.BAD_REQUEST, f"mgmt: the body ended after {got} "
                                     f"of its {length} bytes (Content-Length)", close=True)
                parts.append(chunk)
                got += len(chunk)
        except TimeoutError:
            raise _HttpError(HTTPStatus.REQUEST_TIMEOUT, f"mgmt: {got} of the body's {length} "
                             f"bytes came within {MGMT_REQUEST_TIMEOUT_S} s "
                             "(MGMT_REQUEST_TIMEOUT_S); send it at once", close=True) from None
        except OSError as exc:
            raise _ConnectionGone(str(exc) or type(exc).__name__) from None
        self._unread = False
        try:
            doc = json.loads(b"".join(parts))
        except RecursionError:
            raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: the body is JSON nested too "
                             "deeply") from None
        except ValueError as exc:  # not JSON, not UTF-8, or a number past int's digit limit
            raise _HttpError(HTTPStatus.BAD_REQUEST, f"mgmt: the body is not JSON "
                             f"({_clip(str(exc), 120)})") from None
        if not isinstance(doc, dict):
            raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: the body must be a JSON object, "
                             "such as {\"source\": \"core1\", \"destination\": \"core2\"}")
        return doc

    # --- answers ------------------------------------------------------------------------------
    def _refuse(self, exc: _HttpError) -> None:
        if exc.close or self._unread:  # what follows on the connection is not a request
            self.close_connection = True
        self._json(exc.status, {"error": str(exc), "status": int(exc.status)}, exc.headers)

    def _json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        body = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
        error = doc.get("error") if status >= 400 and isinstance(doc, dict) else None
        self._send(status, body, "application/json", headers, error)

    def _send(self, status: int, body: bytes, content_type: str,
              headers: dict[str, str] | None = None, error: str | None = None) -> None:
        """One answer (no body to HEAD), logged as one debug line."""
        request = self.requestline or "-"
        if status >= 400:
            self.server.count_error(status)
        log.debug("mgmt: %s \"%s\" -> %d%s", self.peer, request, status,
                  f" {_clip(str(error))}" if error else "",
                  extra={"peer": self.peer, "request": request, "status": int(status)})
        self._headers_buffer: list[bytes] = []
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        try:
            self.connection.settimeout(MGMT_REQUEST_TIMEOUT_S)  # a client that does not read
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError as exc:
            raise _ConnectionGone(str(exc) or type(exc).__name__) from None

    def send_error(self, code: int, message: str | None = None, explain: str | None = None
                   ) -> None:
        """http.server's own refusals (not reached: requests are read here) as JSON too."""
        text = message or HTTPStatus(code).phrase
        self._refuse(_HttpError(code, f"mgmt: {_clip(text)}", close=True))

    def version_string(self) -> str:
        return self.server_version  # not the Python version

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Answers are logged by ``_send``."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("mgmt: %s %s", self.peer, _clip(format % args), extra={"peer": self.peer})


def launch(appliance: Any, config: ApplianceConfig) -> Any:
    """The API's process, started at the beginning of ``Appliance.start`` (the listening
    socket bound, the process importing while the appliance starts); None with
    ``mgmt.process = false``. ``serve(..., launched=)`` completes it; ``close()`` ends it."""
    if not config.mgmt.get("process", True):
        return None
    from appliance.ops.mgmt.process import ProcessServer

    host, port = parse_address(config.mgmt["listen"], "mgmt.listen", allow_zero_port=True,
                               ipv6=True)
    return ProcessServer(appliance, config, host, port, read_token(config)).launch()


def serve(appliance: Any, config: ApplianceConfig, launched: Any = None) -> Any:
    """Start the API on ``mgmt.listen`` (the management hook ``Appliance.start`` calls): in a
    process of its own (``ProcessServer``, appliance/ops/mgmt/process.py; ``launched``: the
    one ``launch`` started) unless ``mgmt.process = false``, then on a thread of this process
    (``MgmtServer``)."""
    host, port = parse_address(config.mgmt["listen"], "mgmt.listen", allow_zero_port=True,
                               ipv6=True)
    token = read_token(config)
    tls = None
    if "tls_cert_file" in config.mgmt:
        from appliance.ops.tls import server_context

        tls = server_context(config.mgmt["tls_cert_file"], config.mgmt["tls_key_file"],
                             config.mgmt.get("tls_client_ca_file"))
    if config.mgmt.get("process", True):
        from appliance.ops.mgmt.process import ProcessServer

        server: MgmtServer | ProcessServer = (
            launched or ProcessServer(appliance, config, host, port, token)).start()
    else:
        server = MgmtServer(appliance, host, port, token, tls).start()
    if not ipaddress.ip_address(host).is_loopback:
        log.warning("%s: management API on %s, reachable from other hosts%s", config.name,
                    server.url, "" if token else " and without a token for reads")
    log.info("%s: management API on %s", config.name, server.url,
             extra={"url": server.url, "commands": token is not None})
    return server
