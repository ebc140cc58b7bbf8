"""The management HTTP API: JSON views of the status snapshot, Prometheus ``/metrics``, commands.

``MgmtServer`` is a ``ThreadingHTTPServer`` on its own thread (one more thread per request).
Reads take ``Appliance.status()``, the control agent's published snapshot, and serialise it
on the request's thread: the data path is never asked anything and never waits. Commands go
through ``Appliance.submit`` (the control agent applies them between duty cycles).

Endpoints (docs/appliance.md, "Management API"):

    GET    /                       the endpoint list
    GET    /status                 the whole snapshot
    GET    /node /neighbours /subscriptions /routes /channels /offload /denials
           /auth /clients /counters   one section each: {"<section>": ...}
    GET    /metrics                Prometheus text (or OpenMetrics when Accept asks for it)
    POST   /routes                 {"source", "destination", "path"}: set a route override
    DELETE /routes                 {"source", "destination"} (or ?source=&destination=): clear it
    DELETE /clients/<session>      end a client session (the client is told)

Commands need ``Authorization: Bearer <token>`` (``mgmt.token`` or ``mgmt.token_file``):
no header or a wrong token is 401, and with no token configured every command is refused
with 403. When ``mgmt.listen`` is not a loopback address and a token is configured, reads
need the token too. Every error is a JSON object ``{"error": "<component>: ...", "status":
code}``.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from appliance.config import ApplianceConfig, ConfigError, parse_address
from appliance.ops.mgmt.config import (
    MGMT_MAX_BODY_BYTES,
    MGMT_REQUEST_TIMEOUT_S,
    MGMT_SHUTDOWN_POLL_S,
)
from appliance.ops.mgmt.metrics import exposition, registry_of

log = logging.getLogger("topicwire.mgmt")

SECTIONS = ("node", "neighbours", "subscriptions", "routes", "channels", "offload", "denials",
            "auth", "clients", "counters")
"""Status sections served one each under ``GET /<section>``."""

ENDPOINTS = (
    ("GET", "/", "this list"),
    ("GET", "/status", "the whole status snapshot"),
    *(("GET", f"/{s}", f"the status snapshot's {s!r} section") for s in SECTIONS),
    ("GET", "/metrics", "Prometheus metrics"),
    ("POST", "/routes", "set a route override {source, destination, path} (token)"),
    ("DELETE", "/routes", "clear a route override {source, destination} (token)"),
    ("DELETE", "/clients/<session>", "end a client session (token)"),
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


class _HttpError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None,
                 close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}
        self.close = close


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    mgmt: MgmtServer


class MgmtServer:
    """The running API; ``close()`` stops it (safe twice)."""

    def __init__(self, appliance: Any, host: str, port: int, token: str | None) -> None:
        self.appliance = appliance
        self.token = token
        loopback = ipaddress.IPv4Address(host).is_loopback
        self.reads_need_token = token is not None and not loopback
        self.registry = registry_of(appliance.status)
        try:
            self.httpd = _Server((host, port), _Handler)
        except OSError as exc:
            raise ConfigError(f"mgmt.listen: cannot listen on {host}:{port} ({exc.strerror}); "
                              "pick another port or stop its owner") from None
        self.httpd.mgmt = self
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        kwargs={"poll_interval": MGMT_SHUTDOWN_POLL_S},
                                        name="mgmt", daemon=True)
        self._closed = False

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def start(self) -> MgmtServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(MGMT_REQUEST_TIMEOUT_S)

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
        if not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise _HttpError(HTTPStatus.UNAUTHORIZED, "mgmt: the bearer token is wrong; use "
                             "the appliance's mgmt.token", challenge)

    # --- requests -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        status = self.appliance.status()
        if not status:
            raise _HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "mgmt: the appliance has not "
                             "published its status yet; retry in a moment")
        return status

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
        if path.startswith("/clients/") and method == "DELETE":
            text = path[len("/clients/"):]
            if not text.isdigit():
                raise _HttpError(HTTPStatus.BAD_REQUEST, f"mgmt: {text!r} is not a session "
                                 "number; GET /clients lists them")
            return self._submit("disconnect_client", {"session": int(text)})
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
    if path.startswith("/clients/") and path.count("/") == 2:
        return ("command" if method == "DELETE" else ""), {"DELETE"}
    known = ", ".join(f"{m} {p}" for m, p, _ in ENDPOINTS)
    raise _HttpError(HTTPStatus.NOT_FOUND, f"mgmt: no endpoint {method} {path}; known: {known}")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "topicwire-mgmt/1"
    protocol_version = "HTTP/1.1"
    timeout = MGMT_REQUEST_TIMEOUT_S

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def _handle(self, method: str) -> None:
        mgmt = self.server.mgmt
        raw_path, _, raw_query = self.path.partition("?")
        path = unquote(raw_path).rstrip("/") or "/"
        try:
            kind, allowed = _route(method, path)
            if not kind:
                raise _HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"mgmt: {path} does not take "
                                 f"{method}; it takes {', '.join(sorted(allowed))}",
                                 {"Allow": ", ".join(sorted(allowed))})
            if kind == "command":
                mgmt.check_token(self.headers.get("Authorization"), f"{method} {path}")
                body = self._body()
                query = {k: v[-1] for k, v in parse_qs(raw_query).items()}
                self._json(HTTPStatus.OK, mgmt.command(method, path, body, query))
                return
            if mgmt.reads_need_token:
                mgmt.check_token(self.headers.get("Authorization"), f"GET {path}")
            if kind == "metrics":
                body, content_type = exposition(mgmt.registry, self.headers.get("Accept"))
                self._send(HTTPStatus.OK, body, content_type)
            else:
                self._json(HTTPStatus.OK, mgmt.get(path))
        except _HttpError as exc:
            if exc.close:
                self.close_connection = True
            self._json(exc.status, {"error": str(exc), "status": int(exc.status)}, exc.headers)
        except Exception as exc:  # a bug here must not kill the server: answer and log it
            log.exception("mgmt: %s %s failed", method, path)
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR,
                       {"error": f"mgmt: internal error ({type(exc).__name__}); see the "
                                 "appliance's log", "status": 500})

    def _body(self) -> dict[str, Any]:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise _HttpError(HTTPStatus.LENGTH_REQUIRED, "mgmt: send the body with a "
                             "Content-Length (chunked bodies are not read)", close=True)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: Content-Length is not a number",
                             close=True) from None
        if length < 0 or length > MGMT_MAX_BODY_BYTES:
            raise _HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"mgmt: a body of {length} "
                             f"bytes; at most {MGMT_MAX_BODY_BYTES}", close=True)
        if length == 0:
            return {}
        raw = self.rfile.read(length)
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _HttpError(HTTPStatus.BAD_REQUEST, f"mgmt: the body is not JSON ({exc})") \
                from None
        if not isinstance(doc, dict):
            raise _HttpError(HTTPStatus.BAD_REQUEST, "mgmt: the body must be a JSON object, "
                             "such as {\"source\": \"core1\", \"destination\": \"core2\"}")
        return doc

    def _json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        body = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
        self._send(status, body, "application/json", headers)

    def _send(self, status: int, body: bytes, content_type: str,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None
                   ) -> None:
        """http.server's own refusals (bad request line, unsupported method) as JSON too."""
        self.close_connection = True
        text = message or HTTPStatus(code).phrase
        body = (json.dumps({"error": f"mgmt: {text}", "status": int(code)}) + "\n").encode()
        self.send_response(code, message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and code >= 200 and code not in (204, 304):
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("mgmt: %s %s", self.address_string(), format % args)


def serve(appliance: Any, config: ApplianceConfig) -> MgmtServer:
    """Start the API on ``mgmt.listen`` (the management hook ``Appliance.start`` calls)."""
    host, port = parse_address(config.mgmt["listen"], "mgmt.listen", allow_zero_port=True)
    token = read_token(config)
    server = MgmtServer(appliance, host, port, token).start()
    if not ipaddress.IPv4Address(host).is_loopback:
        log.warning("%s: management API on %s, reachable from other hosts%s", config.name,
                    server.url, "" if token else " and without a token for reads")
    log.info("%s: management API on %s", config.name, server.url,
             extra={"url": server.url, "commands": token is not None})
    return server
