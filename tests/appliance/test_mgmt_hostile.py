"""Hostile HTTP against the management API: every malformed request gets a JSON error, and
nothing a client sends puts a traceback in the log.

A real appliance (``topicwire run``, JSON logs at debug level to a file) with ``mgmt.listen``
on loopback, and raw sockets that send what no HTTP client would: request lines and header
lines past their limits, too many headers, unknown methods, HTTP/0.9 and HTTP/2 request lines,
bytes that are not HTTP at all, paths that are not ASCII or not UTF-8 once %-decoded, bad
%-escapes, NULs and ``..``, odd query strings, every wrong Content-Length, bodies that are not
JSON or the wrong JSON, chunked and other transfer codings, clients that send nothing or send
slowly, more connections at once than the API serves; then requests that hypothesis builds.

Every answer must be a JSON error ``{"error": "mgmt: ...", "status": code}`` with a 4xx code
(413, 414, 431, 501, 503 or 505 where they fit; never 500), or, for a connection that sent
nothing, a close; the log must hold one JSON record per line (nothing written around the
logging, such as socketserver's tracebacks), no record with a traceback, and one debug record
per refusal; afterwards ``GET /status`` still answers. In this process, a ``MgmtServer`` over
an appliance that fails shows a fault of the API's own side as a 500 and one error record.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families as parse_prom

from appliance.ops.mgmt.config import (
    MGMT_MAX_BODY_BYTES,
    MGMT_MAX_CONNECTIONS,
    MGMT_MAX_HEADER_BYTES,
    MGMT_MAX_HEADER_LINE_BYTES,
    MGMT_MAX_HEADERS,
    MGMT_MAX_QUERY_FIELDS,
    MGMT_MAX_REQUEST_LINE_BYTES,
    MGMT_REQUEST_TIMEOUT_S,
)
from appliance.ops.mgmt.server import MgmtServer
from tests.appliance.helpers import CLI, FABRIC_KEY, ROOT, free_port, stop, wait_for, wait_ready
from tests.appliance.mgmt_fabric import http

TOKEN = "hostile-mgmt-token-0123456789"
AUTH = f"Authorization: Bearer {TOKEN}".encode()
ANSWER_S = 5.0
"""A refusal must come within this (far less than the request timeout)."""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class Exchange:
    answers: list[Answer]
    raw: bytes
    eof: bool
    elapsed_s: float


class Api:
    """The appliance under attack: its API port, its log file, its process."""

    def __init__(self, port: int, log_path: Path, proc: subprocess.Popen) -> None:
        self.port = port
        self.log_path = log_path
        self.proc = proc
        self.lock = threading.Lock()
        self.requests = 0
        self.refusals = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def exchange(self, data: bytes | Callable[[socket.socket], None], *,
                 half_close: bool = True, wait_s: float = ANSWER_S) -> Exchange:
        """Send ``data`` (bytes, or a function that sends on the socket) on a new connection,
        then (``half_close``) end the sending side; read what comes back until the server
        closes or ``wait_s`` passes."""
        with self.lock:
            self.requests += 1
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=wait_s)
        start = time.monotonic()

        def send() -> None:
            try:
                if callable(data):
                    data(sock)
                else:
                    sock.sendall(data)
                if half_close:
                    sock.shutdown(socket.SHUT_WR)
            except OSError:  # the server may close before it read everything: that is fine
                pass

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        raw, eof = b"", False
        try:
            while (left := start + wait_s - time.monotonic()) > 0:
                sock.settimeout(left)
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    break
                except ConnectionResetError:
                    eof = True
                    break
                if not chunk:
                    eof = True
                    break
                raw += chunk
        finally:
            sock.close()
            sender.join(5)
        answers = parse_answers(raw)
        with self.lock:
            self.refusals += sum(a.status >= 400 for a in answers)
        return Exchange(answers, raw, eof, time.monotonic() - start)


def parse_answers(raw: bytes) -> list[Answer]:
    """The HTTP/1.1 responses in ``raw`` (interim 1xx ones left out); fails on anything else."""
    answers = []
    while raw:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        assert sep, f"an incomplete response: {raw[:300]!r}"
        lines = head.decode("latin-1").split("\r\n")
        match = re.fullmatch(r"HTTP/1\.1 (\d{3}) .*", lines[0])
        assert match, f"not an HTTP/1.1 status line: {lines[0]!r}"
        headers = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            assert colon, f"a malformed response header: {line!r}"
            headers[name.strip().lower()] = value.strip()
        status = int(match.group(1))
        if 100 <= status < 200:
            raw = rest
            continue
        length = int(headers.get("content-length", "0"))
        answers.append(Answer(status, headers, rest[:length]))
        raw = rest[length:]
    return answers


def assert_json_error(answer: Answer, head: bool = False) -> dict:
    """A JSON error ``{"error": "<component>: ...", "status": code}``, never a 500."""
    assert answer.status != 500, answer
    assert 400 <= answer.status < 600, answer
    assert answer.headers.get("content-type") == "application/json", answer
    if head and not answer.body:  # an answer to HEAD carries no body
        return {}
    doc = json.loads(answer.body)
    assert set(doc) == {"error", "status"} and doc["status"] == answer.status, doc
    assert isinstance(doc["error"], str) and doc["error"].startswith(("mgmt: ", "control: ")), doc
    return doc


def refused(ex: Exchange, *statuses: int) -> dict:
    """The first answer is one JSON error of ``statuses``, and it came at once."""
    assert ex.answers, f"no answer (the connection was closed): {ex.raw[:300]!r}"
    answer = ex.answers[0]
    assert answer.status in statuses, (answer, ex.raw[:300])
    assert ex.elapsed_s < ANSWER_S, ex.elapsed_s
    return assert_json_error(answer)


def request(line: bytes, headers: tuple[bytes, ...] = (), body: bytes = b"",
            length: bool = True) -> bytes:
    """One request: ``line``, ``headers``, a Content-Length for ``body`` (unless not
    ``length``, or one is among the headers), then ``body``."""
    hdrs = list(headers)
    if length and body and not any(h.lower().startswith(b"content-length:") for h in hdrs):
        hdrs.append(b"Content-Length: %d" % len(body))
    return line + b"\r\n" + b"".join(h + b"\r\n" for h in hdrs) + b"\r\n" + body


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mgmt-hostile")
    port = free_port()
    config = tmp / "hostile.toml"
    config.write_text(f'[appliance]\nname = "hostile"\n'
                      f'[fabric]\nlisten = "127.0.0.1:{free_port()}"\nkey = "{FABRIC_KEY}"\n'
                      f'[pm]\nanonymous = true\nrequire_passwords = false\n'
                      f'[mgmt]\nlisten = "127.0.0.1:{port}"\ntoken = "{TOKEN}"\n'
                      f'[log]\nformat = "json"\nlevel = "debug"\n')
    log_path = tmp / "appliance.log"
    with log_path.open("w") as err:
        proc = subprocess.Popen([*CLI, "run", "--config", str(config)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=err, text=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        wait_ready(proc)
        yield Api(port, log_path, proc)
    finally:
        code = stop(proc)
    assert code == 0, log_path.read_text(errors="replace")[-3000:]
    assert_clean_log(log_path.read_text(encoding="utf-8", errors="replace"))


def log_records(text: str) -> list[dict]:
    """The JSON records of the log; fails on a line that is not one (a traceback or anything
    else written to standard error around the logging)."""
    records = []
    for line in text.split("\n"):
        if line:
            try:
                records.append(json.loads(line))
            except ValueError:
                raise AssertionError(f"a log line that is not a JSON record: {line!r}") from None
    return records


def assert_clean_log(text: str) -> list[dict]:
    """No traceback: no line outside the records, no record carrying one. numba's own debug
    records are left out (compiling a kernel logs the typing attempts it makes, tracebacks
    included, at debug level; they are not errors)."""
    records = log_records(text)
    for doc in records:
        if doc["component"].startswith("numba."):
            continue
        assert "exc" not in doc["fields"] and "stack" not in doc["fields"], doc
        assert "Traceback" not in doc["msg"], doc
    return records


# --- one hostile request at a time --------------------------------------------------------------

_RANDOM = random.Random(20240611)
_GARBAGE = bytes(_RANDOM.randrange(256) for _ in range(4096))
_TLS_HELLO = bytes.fromhex("16030100a5010000a10303") + bytes(range(32)) + b"\x00\x20" + \
    bytes(range(0xC0, 0xE0)) + b"\x01\x00"
_LONG = MGMT_MAX_REQUEST_LINE_BYTES
_FILL = MGMT_MAX_HEADER_LINE_BYTES - 100
_POST = b"POST /routes HTTP/1.1"
_ROUTE = json.dumps({"source": "hostile", "destination": "nowhere",
                     "path": ["hostile", "nowhere"]}).encode()

CASES = [
    # request line
    ("request-line-over-limit", request(b"GET /" + b"a" * (4 * _LONG) + b" HTTP/1.1"), {414}),
    ("request-line-without-end", b"GET /" + b"a" * 100_000, {414}),
    ("request-line-megabytes", b"GET /" + b"a" * 3_000_000 + b" HTTP/1.1\r\n\r\n", {414}),
    ("method-long", request(b"A" * (_LONG - 20) + b" / HTTP/1.1"), {501}),
    ("method-brew", request(b"BREW /status HTTP/1.1", (b"Host: x",)), {501}),
    ("method-lower-case", request(b"get /status HTTP/1.1"), {501}),
    ("method-options", request(b"OPTIONS * HTTP/1.1"), {501}),
    ("method-connect", request(b"CONNECT 127.0.0.1:22 HTTP/1.1"), {501}),
    ("method-trace", request(b"TRACE /status HTTP/1.1"), {501}),
    ("method-empty", request(b" /status HTTP/1.1"), {400}),
    ("http-0.9", b"GET /status\r\n", {400}),
    ("http-2", request(b"GET /status HTTP/2.0"), {505}),
    ("http-9.9", request(b"GET /status HTTP/9.9"), {505}),
    ("http-version-junk", request(b"GET /status HTTP/1.x"), {400}),
    ("http-version-lower-case", request(b"GET /status http/1.1"), {400}),
    ("request-line-four-words", request(b"GET /status HTTP/1.1 extra"), {400}),
    ("request-line-tabs", request(b"GET\t/status\tHTTP/1.1"), {400}),
    ("request-line-double-space", request(b"GET  /status HTTP/1.1"), {400}),
    ("request-line-bare-cr", request(b"GET /status\rX HTTP/1.1"), {400}),
    ("request-line-nul", request(b"GET /sta\x00tus HTTP/1.1"), {400}),
    # not HTTP at all
    ("tls-client-hello", _TLS_HELLO, {400}),
    ("nul-bytes", b"\x00" * 64, {400}),
    ("random-bytes", _GARBAGE, {400}),
    ("empty-lines", b"\r\n" * 10, {400}),
    ("ssh-banner", b"SSH-2.0-OpenSSH_9.2p1\r\n", {400}),
    ("escape-sequences", b"\x1b[2J\x1b[31mGET / HTTP/1.1\r\n\r\n", {400}),
    # headers
    ("header-line-over-limit", request(b"GET /status HTTP/1.1",
                                       (b"X-Big: " + b"a" * (2 * MGMT_MAX_HEADER_LINE_BYTES),)),
     {431}),
    ("headers-too-many", request(b"GET /status HTTP/1.1",
                                 tuple(b"X-%d: y" % i for i in range(MGMT_MAX_HEADERS + 1))),
     {431}),
    ("headers-too-large-together",
     request(b"GET /status HTTP/1.1", tuple(b"X-%d: " % i + b"a" * _FILL for i in range(
         MGMT_MAX_HEADER_BYTES // _FILL + 2))), {431}),
    ("headers-without-end", b"GET /status HTTP/1.1\r\n" + b"X: y\r\n" * 100_000, {431}),
    ("header-without-colon", request(b"GET /status HTTP/1.1", (b"NoColonHere",)), {400}),
    ("header-space-before-colon", request(b"GET /status HTTP/1.1", (b"Host : x",)), {400}),
    ("header-empty-name", request(b"GET /status HTTP/1.1", (b": x",)), {400}),
    ("header-folded", request(b"GET /status HTTP/1.1", (b"X-A: a", b"  folded")), {400}),
    ("header-nul", request(b"GET /status HTTP/1.1", (b"X-A: a\x00b",)), {400}),
    ("header-bare-cr", request(b"GET /status HTTP/1.1", (b"X-A: a\rb",)), {400}),
    ("header-utf8-name", request(b"GET /status HTTP/1.1", ("X-Stätus: a".encode(),)), {400}),
    ("expect-unknown", request(b"GET /status HTTP/1.1", (b"Expect: 200-ok",)), {417}),
    ("authorization-binary", request(_POST, (b"Authorization: Bearer \xff\xfe\x80",), _ROUTE),
     {401}),
    ("authorization-huge", request(_POST, (b"Authorization: Bearer " + b"t" * _FILL,), _ROUTE),
     {401}),
    ("ended-in-headers", b"GET /status HTTP/1.1\r\nHost: x\r\n", {400}),
    # paths and query strings
    ("path-raw-utf8", request("GET /stätus HTTP/1.1".encode()), {400}),
    ("path-raw-latin1", request(b"GET /\xff\xfe HTTP/1.1"), {400}),
    ("path-escape-not-utf8", request(b"GET /%ff%fe HTTP/1.1"), {400}),
    ("path-escape-truncated-utf8", request(b"GET /status%c3 HTTP/1.1"), {400}),
    ("path-escape-overlong-utf8", request(b"GET /%c0%af HTTP/1.1"), {400}),
    ("path-escape-surrogate", request(b"GET /%ed%a0%80 HTTP/1.1"), {400}),
    ("path-escape-half", request(b"GET /status% HTTP/1.1"), {400}),
    ("path-escape-not-hex", request(b"GET /%zz HTTP/1.1"), {400}),
    ("path-escape-nul", request(b"GET /status%00 HTTP/1.1"), {400}),
    ("path-escape-crlf", request(b"GET /%0d%0aSet-Cookie:%20x=1 HTTP/1.1"), {400}),
    ("path-dot-dot", request(b"GET /../../etc/passwd HTTP/1.1"), {404}),
    ("path-dot-dot-escaped", request(b"GET /%2e%2e/%2e%2e/status HTTP/1.1"), {404}),
    ("path-dot-dot-inside", request(b"GET /status/../metrics HTTP/1.1"), {404}),
    ("path-long", request(b"GET /" + b"a" * (_LONG - 100) + b" HTTP/1.1"), {404}),
    ("path-asterisk", request(b"GET * HTTP/1.1"), {400}),
    ("path-absolute-form", request(b"GET http://127.0.0.1/status HTTP/1.1"), {400}),
    ("path-no-slash", request(b"GET status HTTP/1.1"), {400}),
    ("session-not-ascii-digit", request(b"DELETE /clients/%C2%B2 HTTP/1.1", (AUTH,)), {400}),
    ("session-arabic-digit", request(b"DELETE /clients/%D9%A5 HTTP/1.1", (AUTH,)), {400}),
    ("session-thousands-of-digits", request(b"DELETE /clients/" + b"9" * 5000 + b" HTTP/1.1",
                                            (AUTH,)), {400}),
    ("session-negative", request(b"DELETE /clients/-1 HTTP/1.1", (AUTH,)), {400}),
    ("query-not-utf8", request(b"DELETE /routes?source=%ff&destination=x HTTP/1.1", (AUTH,)),
     {400}),
    ("query-bad-escape", request(b"DELETE /routes?source=%zz&destination=x HTTP/1.1", (AUTH,)),
     {400}),
    ("query-too-many-fields", request(b"DELETE /routes?" + b"a=1&" * (
        MGMT_MAX_QUERY_FIELDS + 1) + b" HTTP/1.1", (AUTH,)), {400}),
    ("query-thousands-of-fields", request(b"DELETE /routes?" + b"&" * (_LONG - 100)
                                          + b" HTTP/1.1", (AUTH,)), {400}),
    ("query-nul", request(b"DELETE /routes?source=%00&destination=x HTTP/1.1", (AUTH,)), {400}),
    # Content-Length and transfer codings
    ("content-length-negative", request(_POST, (AUTH, b"Content-Length: -1")), {400}),
    ("content-length-minus-zero", request(_POST, (AUTH, b"Content-Length: -0")), {400}),
    ("content-length-not-a-number", request(_POST, (AUTH, b"Content-Length: abc")), {400}),
    ("content-length-float", request(_POST, (AUTH, b"Content-Length: 1e3")), {400}),
    ("content-length-plus", request(_POST, (AUTH, b"Content-Length: +5"), b"{}   "), {400}),
    ("content-length-superscript", request(_POST, (AUTH, b"Content-Length: \xb2"), b"{}"), {400}),
    ("content-length-list", request(_POST, (AUTH, b"Content-Length: 2, 2"), b"{}"), {400}),
    ("content-length-twice-different", request(_POST, (AUTH, b"Content-Length: 2",
                                                       b"Content-Length: 3"), b"{} "), {400}),
    ("content-length-huge", request(_POST, (AUTH, b"Content-Length: " + b"9" * 40)), {413}),
    ("content-length-over-limit", request(_POST, (AUTH, b"Content-Length: %d" % (
        MGMT_MAX_BODY_BYTES + 1))), {413}),
    ("content-length-and-chunked", request(_POST, (AUTH, b"Content-Length: 5",
                                                   b"Transfer-Encoding: chunked"),
                                           b"0\r\n\r\n"), {400}),
    ("chunked", request(_POST, (AUTH, b"Transfer-Encoding: chunked"), b"2\r\n{}\r\n0\r\n\r\n",
                        length=False), {411}),
    ("chunked-without-token", request(_POST, (b"Transfer-Encoding: chunked",),
                                      b"2\r\n{}\r\n0\r\n\r\n", length=False), {401, 411}),
    ("transfer-encoding-gzip", request(_POST, (AUTH, b"Transfer-Encoding: gzip"), b"x",
                                       length=False), {501}),
    ("get-with-a-body", request(b"GET /status HTTP/1.1", (), b"hello"), {400}),
    ("get-chunked", request(b"GET /status HTTP/1.1", (b"Transfer-Encoding: chunked",),
                            b"0\r\n\r\n", length=False), {400, 411}),
    ("body-shorter-than-its-length", request(_POST, (AUTH, b"Content-Length: 100"), b"{}"),
     {400}),
    ("body-megabytes", request(_POST, (AUTH,), b"{" + b" " * 5_000_000 + b"}"), {413}),
    # bodies that are not JSON or the wrong JSON
    ("body-not-json", request(_POST, (AUTH,), b"{not json"), {400}),
    ("body-empty-object-text", request(_POST, (AUTH,), b" "), {400}),
    ("body-list", request(_POST, (AUTH,), b'["hostile", "nowhere"]'), {400}),
    ("body-string", request(_POST, (AUTH,), b'"hostile"'), {400}),
    ("body-null", request(_POST, (AUTH,), b"null"), {400}),
    ("body-number", request(_POST, (AUTH,), b"1e999999"), {400}),
    ("body-nested-deeply", request(_POST, (AUTH,), b"[" * 30_000 + b"]" * 30_000), {400}),
    ("body-nested-objects", request(_POST, (AUTH,), b'{"a":' * 10_000 + b"1" + b"}" * 10_000),
     {400}),
    ("body-huge-integer", request(_POST, (AUTH,), b'{"source": ' + b"1" * 5000 + b"}"), {400}),
    ("body-not-utf8", request(_POST, (AUTH,), b'{"source": "\xff\xfe"}'), {400}),
    ("body-lone-surrogate", request(_POST, (AUTH,), b'{"source": "\\ud800", "destination": '
                                    b'"\\udfff", "path": ["\\ud800", "\\udfff"]}'), {409}),
    ("body-nan", request(_POST, (AUTH,), b'{"source": NaN, "destination": Infinity}'), {400}),
    ("body-wrong-types", request(_POST, (AUTH,), b'{"source": [], "destination": {}, '
                                 b'"path": "hostile"}'), {400}),
    ("body-path-of-thousands", request(_POST, (AUTH,), json.dumps({
        "source": "hostile", "destination": "x", "path": ["hostile"] * 5000}).encode()),
     {409}),
    ("body-unknown-appliances", request(_POST, (AUTH,), _ROUTE), {409}),
    ("body-duplicate-keys", request(_POST, (AUTH,), b'{"source": "a", "source": 1}'), {400}),
    ("delete-body-list", request(b"DELETE /routes HTTP/1.1", (AUTH,), b"[1]"), {400}),
]


@pytest.mark.parametrize("data,statuses", [pytest.param(d, s, id=i) for i, d, s in CASES])
def test_a_hostile_request_gets_a_json_error_at_once(api, data, statuses):
    ex = api.exchange(data)
    refused(ex, *statuses)
    assert ex.eof  # and the connection ended (the client had stopped sending)


def test_connections_that_are_not_http_are_answered_without_waiting_for_a_line_end(api):
    """Bytes that cannot start a request line are refused at once, even without a newline
    (a TLS handshake waits for the server, it never sends one)."""
    for data in (_TLS_HELLO.replace(b"\n", b""), b"\x00\x01\x02", b"\x80" * 10):
        refused(api.exchange(data, half_close=False), 400)


def test_an_answer_to_head_has_no_body(api):
    ex = api.exchange(request(b"HEAD /status HTTP/1.1"))
    assert [a.status for a in ex.answers] == [501] and ex.answers[0].body == b""
    assert ex.answers[0].headers["content-type"] == "application/json" and ex.eof


def test_odd_but_valid_requests_get_their_answer(api):
    answers = api.exchange(request(b"GET /metrics HTTP/1.1", (
        b"Accept: application/openmetrics-text; version=1.x; escaping=values",))).answers
    assert [a.status for a in answers] == [200]
    assert b"topicwire_node_info" in answers[0].body  # the names are not escaped away
    for line in (b"GET /status HTTP/1.0", b"GET /status?%ff=%00&&&==&x HTTP/1.1",
                 b"GET /status/ HTTP/1.1"):
        answers = api.exchange(request(line, (b"X-Odd: \xff\xfe\t tab",))).answers
        assert [a.status for a in answers] == [200], line
        assert "node" in json.loads(answers[0].body)
    # a client may send one empty line before its request line
    assert [a.status for a in api.exchange(b"\r\n" + request(b"GET /node HTTP/1.1")).answers] \
        == [200]


def test_expect_100_continue_is_answered_before_the_body_is_read(api):
    sock = socket.create_connection(("127.0.0.1", api.port), timeout=ANSWER_S)
    with sock:
        sock.sendall(request(_POST, (AUTH, b"Expect: 100-continue",
                                     b"Content-Length: %d" % len(_ROUTE))))
        assert sock.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n")
        sock.sendall(_ROUTE)
        sock.shutdown(socket.SHUT_WR)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    assert_json_error(parse_answers(raw)[0])


def test_keep_alive_survives_a_refusal_but_not_a_broken_request(api):
    # 404 keeps the connection: the next request on it is answered
    ex = api.exchange(request(b"GET /nope HTTP/1.1") + request(b"GET /node HTTP/1.1"))
    assert [a.status for a in ex.answers] == [404, 200]
    # garbage after a good request: the good one is answered, then the garbage refused
    ex = api.exchange(request(b"GET /node HTTP/1.1") + request(b"BREW / HTTP/1.1")
                      + request(b"GET /node HTTP/1.1"))
    assert [a.status for a in ex.answers] == [200, 501]  # and nothing after it is read
    assert ex.answers[1].headers.get("connection") == "close"
    # a refused body is not read as the next request
    ex = api.exchange(request(_POST, (b"Content-Length: 18",), b"GET /node HTTP/1.1"))
    assert [a.status for a in ex.answers] == [401]
    assert ex.answers[0].headers.get("connection") == "close"


def test_slow_and_silent_clients_are_cut_off_after_the_request_timeout(api):
    def dribble(prefix: bytes) -> Callable[[socket.socket], None]:
        def send(sock: socket.socket) -> None:
            sock.sendall(prefix)
            for _ in range(int(4 * MGMT_REQUEST_TIMEOUT_S)):
                time.sleep(0.5)
                sock.sendall(b"a")
        return send

    wait_s = MGMT_REQUEST_TIMEOUT_S + 5
    slow = {
        "silent": b"",
        "request-line-in-parts": dribble(b"GET /st"),
        "header-in-parts": dribble(b"GET /status HTTP/1.1\r\nX-Slow: "),
        "body-never-sent": request(_POST, (AUTH, b"Content-Length: 100"), b'{"source"'),
        "idle-after-a-request": request(b"GET /node HTTP/1.1"),
    }
    with ThreadPoolExecutor(len(slow)) as pool:
        futures = {name: pool.submit(api.exchange, data, half_close=False, wait_s=wait_s)
                   for name, data in slow.items()}
        time.sleep(1)
        # the API is not blocked meanwhile
        assert http("GET", api.url + "/node")[0] == 200
        done = {name: f.result() for name, f in futures.items()}
    for name, ex in done.items():
        assert ex.eof, name  # closed by the server
        assert MGMT_REQUEST_TIMEOUT_S - 1 <= ex.elapsed_s <= MGMT_REQUEST_TIMEOUT_S + 3, \
            (name, ex.elapsed_s)
    assert done["silent"].raw == b""  # nothing came, nothing is answered
    for name in ("request-line-in-parts", "header-in-parts", "body-never-sent"):
        assert [a.status for a in done[name].answers] == [408], name
        assert_json_error(done[name].answers[0])
    assert [a.status for a in done["idle-after-a-request"].answers] == [200]


def test_connections_past_the_bound_get_503_and_the_api_recovers(api):
    held: list[socket.socket] = []
    try:
        for _ in range(MGMT_MAX_CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", api.port), timeout=ANSWER_S))

        def turned_away() -> bool:
            ex = api.exchange(request(b"GET /status HTTP/1.1"))
            if ex.answers and ex.answers[0].status == 503:
                doc = refused(ex, 503)
                assert str(MGMT_MAX_CONNECTIONS) in doc["error"]
                assert ex.answers[0].headers.get("retry-after")
                return True
            return False

        wait_for(turned_away, timeout_s=10)
        # a burst while full: every one is turned away at once, none waits
        with ThreadPoolExecutor(16) as pool:
            for ex in pool.map(lambda _: api.exchange(request(b"GET /status HTTP/1.1")),
                               range(48)):
                refused(ex, 503)
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: http("GET", api.url + "/status")[0] == 200, timeout_s=10)
    assert "management API turned away" in api.log()  # logged once, as a warning


def test_many_hostile_connections_at_once(api):
    """The whole table, four times over, from 32 clients at once: each answer is the case's
    refusal, or a 503 when the API is full."""
    cases = [(d, s) for _, d, s in CASES] * 4
    _RANDOM.shuffle(cases)

    def one(case: tuple[bytes, set[int]]) -> None:
        data, statuses = case
        ex = api.exchange(data, wait_s=2 * ANSWER_S)
        assert ex.answers, f"no answer: {data[:100]!r}"
        assert ex.answers[0].status in statuses | {503}, (ex.answers[0], data[:100])
        assert_json_error(ex.answers[0])

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(one, cases))
    assert http("GET", api.url + "/status")[0] == 200


class _Broken:
    """An appliance whose status snapshot and commands fail: a fault on the API's side."""

    def status(self) -> dict:
        raise RuntimeError("snapshot exploded")

    def submit(self, command: str, args: dict) -> dict:
        raise OSError("a socket of the appliance's own, not the client's")


def test_a_failure_of_the_api_itself_is_a_500_and_one_log_record(caplog):
    server = MgmtServer(_Broken(), "127.0.0.1", 0, TOKEN).start()
    try:
        with caplog.at_level(logging.DEBUG, logger="topicwire.mgmt"):
            read = http("GET", server.url + "/status")
            command = http("DELETE", server.url + "/clients/1", token=TOKEN)
    finally:
        server.close()
    assert read[0] == 500 and read[2] == {
        "error": "mgmt: internal error (RuntimeError); see the appliance's log", "status": 500}
    assert command[0] == 500 and command[2]["error"] == \
        "mgmt: internal error (OSError); see the appliance's log"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2 and all(r.exc_info is None and "\n" not in r.getMessage()
                                    for r in errors)
    assert errors[0].getMessage().startswith("mgmt: GET /status failed: RuntimeError: snapshot "
                                             "exploded at test_mgmt_hostile.py:")


def test_close_ends_open_connections_at_once():
    server = MgmtServer(_Broken(), "127.0.0.1", 0, None).start()
    idle = socket.create_connection(server.address, timeout=ANSWER_S)
    with idle:
        wait_for(lambda: server.connections() == 1)
        start = time.monotonic()
        server.close()
        assert time.monotonic() - start < 2  # not the request timeout
        assert idle.recv(100) == b""  # closed, without an answer
    assert server.connections() == 0


# --- requests hypothesis builds ---------------------------------------------------------------

def _mostly(usual: st.SearchStrategy, odd: st.SearchStrategy, odds: int = 5
            ) -> st.SearchStrategy:
    """``usual`` for all but about one draw in ``odds``, ``odd`` for that one: most requests
    are well formed up to the one part that is not, so they reach the code past it."""
    return st.integers(1, odds).flatmap(lambda n: odd if n == 1 else usual)


_METHODS = _mostly(st.sampled_from([b"GET", b"GET", b"POST", b"DELETE", b"PUT", b"HEAD"]),
                   st.sampled_from([b"OPTIONS", b"BREW", b"get", b"", b"G\x00T"])
                   | st.binary(max_size=12), odds=8)
_TARGETS = _mostly(st.one_of(
    st.sampled_from([b"/", b"/status", b"/node", b"/routes", b"/metrics", b"/clients/1",
                     b"/clients/x", b"/status?x=1", b"/routes?source=a&destination=b",
                     b"//status", b"/status/..", b"/clients/%C2%B2"]),
    st.builds(bytes.__add__, st.sampled_from([b"/", b"/routes?", b"/clients/", b"/status?",
                                              b"/routes?source="]),
              st.text(max_size=30).map(lambda t: quote(t, safe="/?&=%").encode())),
    st.text(max_size=40).map(lambda t: b"/" + quote(t, safe="/?&=%").encode())),
    st.sampled_from([b"*", b"http://x/status", b"/%", b"/%zz", b"/%ff", b"/%00"])
    | st.builds(bytes.__add__, st.sampled_from([b"/", b"/routes?", b"/clients/"]),
                st.binary(max_size=40)) | st.binary(max_size=60), odds=6)
_VERSIONS = _mostly(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0"]),
                    st.sampled_from([b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.1x", b"http/1.1", b"",
                                     b"HTTP/"]) | st.binary(max_size=10), odds=10)
_SPACES = _mostly(st.just(b" "), st.sampled_from([b"  ", b"\t", b""]), odds=20)
_HEADER_NAMES = _mostly(st.sampled_from([b"Host", b"Content-Length", b"Transfer-Encoding",
                                         b"Accept", b"Connection", b"Expect", b"Content-Type",
                                         b"Authorization", b"X-Any"]),
                        st.binary(max_size=20), odds=8)
_HEADER_VALUES = _mostly(
    st.sampled_from([b"0", b"5", b"-1", b"99999999999999999999", b"chunked", b"close",
                     b"keep-alive", b"100-continue", b"application/json", b"Bearer x",
                     b"Bearer " + TOKEN.encode(), b"text/plain",
                     b"application/openmetrics-text; version=1.x"])
    | st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=40).map(
        lambda t: t.encode("latin-1")),
    st.binary(max_size=60))
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.sampled_from(["source", "destination", "path", "x"]),
                                       inner, max_size=4), max_leaves=12)
_BODIES = st.binary(max_size=300) | _JSON.map(lambda v: json.dumps(v).encode())


@st.composite
def _requests(draw) -> bytes:
    if draw(st.integers(0, 19)) == 0:  # now and then, bytes with no shape at all
        return draw(st.binary(max_size=400))
    method = draw(_METHODS)
    line = method + draw(_SPACES) + draw(_TARGETS) + draw(_SPACES) + draw(_VERSIONS)
    headers = draw(st.lists(st.tuples(_HEADER_NAMES, _SPACES, _HEADER_VALUES), max_size=4))
    if draw(st.booleans()):
        headers.append((b"Authorization", b" ", b"Bearer " + TOKEN.encode()))
    body = draw(_BODIES) if draw(st.booleans()) else b""
    if body and draw(_mostly(st.just(True), st.just(False))):
        headers.append((b"Content-Length", b" ", str(len(body)).encode()))
    head = line + b"\r\n" + b"".join(n + b":" + s + v + b"\r\n" for n, s, v in headers)
    return head + draw(_mostly(st.just(b"\r\n"), st.sampled_from([b"\n", b"", b"\r\n\r\n"]))) + body


@settings(max_examples=2000, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=_requests())
def test_generated_requests_get_json_answers_and_never_a_500(api, data):
    ex = api.exchange(data)
    assert ex.eof and ex.elapsed_s < ANSWER_S, (data, ex.elapsed_s)
    if data in (b"", b"\r\n", b"\n"):  # nothing was asked (one empty line is let pass)
        assert ex.raw == b"", data
        return
    assert ex.answers, f"no answer to {data!r}"
    event(f"first answer: {ex.answers[0].status}"
          + (f" {ex.answers[0].body[16:30].decode(errors='replace')}..."
             if ex.answers[0].status == 400 else ""))
    for answer in ex.answers:
        assert answer.status != 500 and 200 <= answer.status < 600, (answer, data)
        if answer.status >= 400:
            assert_json_error(answer, head=data.startswith(b"HEAD"))
        elif answer.headers.get("content-type") == "application/json":
            json.loads(answer.body)
        else:
            assert answer.headers.get("content-type", "").startswith(
                ("text/plain", "application/openmetrics-text")), (answer, data)


# --- afterwards ---------------------------------------------------------------------------------

def test_afterwards_the_api_answers_and_the_log_holds_no_traceback(api):
    code, _, doc = http("GET", api.url + "/status")
    assert code == 200 and doc["node"]["name"] == "hostile"
    def refusals_logged(records: list[dict]) -> int:
        return sum(doc["component"] == "mgmt" and doc["level"] == "debug"
                   and doc["fields"].get("status", 0) >= 400 for doc in records)

    def all_logged() -> bool:  # the last requests' records may still be on their way
        try:
            return refusals_logged(log_records(api.log())) >= api.refusals
        except ValueError:  # a record half written
            return False
    wait_for(all_logged, timeout_s=10)
    records = assert_clean_log(api.log())
    # every refusal is in the log, one record each
    logged = refusals_logged(records)
    assert logged >= api.refusals > 500, (logged, api.refusals, api.requests)
    # and counted: the API's own metrics
    code, _, text = http("GET", api.url + "/metrics")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in parse_prom(text) for s in family.samples}
    errors = {dict(labels)["status"]: n for (name, labels), n in samples.items()
              if name == "topicwire_mgmt_errors_total"}
    assert sum(errors.values()) >= api.refusals and {"400", "404", "413", "414", "431", "501",
                                                     "503", "505"} <= set(errors), errors
    assert samples[("topicwire_mgmt_connections", ())] >= 1  # this scrape's own
    print(f"{api.requests} hostile connections, {api.refusals} refusals, {logged} logged, "
          f"{len(records)} log records, no traceback")
