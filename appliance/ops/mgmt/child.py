"""The management API's own process (``mgmt.process = true``, the default): ``python -m
appliance.ops.mgmt.child``, started by the appliance (appliance/ops/mgmt/process.py).

It runs the same ``MgmtServer`` (HTTP parsing, TLS, token checks, JSON and Prometheus
rendering) as the in-process API, over ``SnapshotAppliance``: the latest snapshot the
appliance sent, instead of the appliance itself. So no request runs under the data path's
GIL, and what a scraper costs the appliance is fixed per snapshot period, whatever it asks.
This process imports neither numba nor the data path.

What it is given:

- standard input (the *feed*): frames ``[u32 length, big-endian][pickle]`` written only by
  the appliance. The first is the setup (listening socket's descriptor, token, TLS files,
  logging, the appliance's pid), then snapshots: ``{"status", "channels", "gc", "failure",
  "stopped", "log"}`` (``log``: the appliance's logging format and level, which a reload may
  change). The end of the feed (the appliance closed it or died) ends this process;
  so does the appliance's death through ``PR_SET_PDEATHSIG`` (strictly: the end of the
  appliance's thread that started this process, its main thread or, after a restart, its
  ``mgmt-feed`` thread, which lives as long as the API).
- a stream socket (the *link*) to the appliance: this process sends one JSON line per command
  (``{"id", "command", "args"}``) and ``{"ready": url}`` once it serves; the appliance answers
  each command with ``{"id", "result"}``. At most ``MGMT_MAX_FORWARDED`` commands wait at once:
  one more is answered 503 with ``Retry-After``. Nothing from the appliance's side of this
  socket is unpickled by the appliance: what a client sends reaches it only as checked JSON.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import logging
import os
import pickle
import signal
import socket
import sys
import threading
from typing import Any, BinaryIO

from appliance.ops.mgmt.config import (
    FEED_HEADER,
    MGMT_LINK_MAX_LINE_BYTES,
    MGMT_MAX_FORWARDED,
    MGMT_RETRY_AFTER_S,
)

log = logging.getLogger("topicwire.mgmt")

PR_SET_PDEATHSIG = 1


def read_frame(feed: BinaryIO) -> Any | None:
    """The next feed frame (unpickled), or None at the end of the feed."""
    head = _read_exact(feed, FEED_HEADER.size)
    if head is None:
        return None
    body = _read_exact(feed, FEED_HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _read_exact(feed: BinaryIO, size: int) -> bytes | None:
    parts, got = [], 0
    while got < size:
        chunk = feed.read(size - got)
        if not chunk:
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class SnapshotAppliance:
    """What ``MgmtServer`` asks of an appliance, answered from the latest snapshot (reads) and
    over the link (commands)."""

    def __init__(self, link: socket.socket, first: dict[str, Any],
                 submit_timeout_s: float) -> None:
        self._link = link
        self.submit_timeout_s = submit_timeout_s
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[threading.Event, dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._slots = threading.BoundedSemaphore(MGMT_MAX_FORWARDED)
        self._link_up = True
        self.update(first)

    def update(self, snapshot: dict[str, Any]) -> None:
        """Take a new snapshot (one reference swap each: a request reads one or the other)."""
        self._status = snapshot.get("status") or {}
        self._channels = snapshot.get("channels") or []
        self._gc = snapshot.get("gc") or []
        self._failure = snapshot.get("failure")
        self._stopped = bool(snapshot.get("stopped"))

    # --- reads ----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return self._status

    def channels(self) -> list[dict[str, Any]]:
        return self._channels

    def gc_stats(self) -> list[dict[str, int]]:
        return self._gc

    def failure(self) -> BaseException | None:
        """The agent failure the appliance reported, as an exception of the same class name."""
        if not self._failure:
            return None
        name, text = self._failure
        return type(str(name), (Exception,), {})(text)

    # --- commands -------------------------------------------------------------------------------
    def submit(self, command: str, args: dict[str, Any]) -> dict[str, Any]:
        from http import HTTPStatus

        from appliance.ops.mgmt.server import _HttpError

        if not self._slots.acquire(blocking=False):
            raise _HttpError(HTTPStatus.SERVICE_UNAVAILABLE, f"mgmt: {MGMT_MAX_FORWARDED} "
                             "commands are already waiting for the appliance, the most the "
                             "API forwards at once (MGMT_MAX_FORWARDED); retry in a moment",
                             {"Retry-After": str(MGMT_RETRY_AFTER_S)})
        done, out = threading.Event(), {}
        with self._lock:
            ident = next(self._ids)
            self._pending[ident] = (done, out)
        try:
            line = (json.dumps({"id": ident, "command": command, "args": args},
                               separators=(",", ":")) + "\n").encode()
            try:
                if len(line) > MGMT_LINK_MAX_LINE_BYTES:
                    raise ValueError("the command is too long for the link")
                with self._send_lock:
                    self._link.sendall(line)
            except OSError:
                return {"ok": False, "error": "appliance: not running (the management API "
                        "lost its link to the appliance)"}
            # the appliance applies them one at a time, each within its submit timeout
            wait_s = self.submit_timeout_s * MGMT_MAX_FORWARDED + 1.0
            if not done.wait(wait_s) or not out:
                if not self._link_up:
                    return {"ok": False, "error": "appliance: not running (the management "
                            "API lost its link to the appliance)"}
                return {"ok": False, "error": f"mgmt: {command!r} not applied within "
                        f"{wait_s} s; the appliance is busy or stopping"}
            if out.get("internal"):  # the appliance's own fault: a 500, as in its process
                raise type(str(out["internal"]), (Exception,), {})(str(out.get("error")))
            return out
        finally:
            with self._lock:
                self._pending.pop(ident, None)
            self._slots.release()

    def read_answers(self) -> None:
        """The link's reading loop (a thread): hands each answer to its waiting request."""
        reader = self._link.makefile("rb")
        try:
            while True:
                line = reader.readline(MGMT_LINK_MAX_LINE_BYTES)
                if not line or not line.endswith(b"\n"):
                    break
                try:
                    doc = json.loads(line)
                    ident, result = doc["id"], doc["result"]
                except (ValueError, KeyError, TypeError):
                    log.error("mgmt: an answer from the appliance that is not one; ignored")
                    continue
                with self._lock:
                    waiter = self._pending.get(ident)
                if waiter is not None and isinstance(result, dict):
                    waiter[1].update(result)
                    waiter[0].set()
        except OSError:
            pass
        finally:
            self._link_up = False
            with self._lock:
                waiters = list(self._pending.values())
            for done, _ in waiters:
                done.set()


def _die_with_parent(parent: int) -> None:
    """Ask the kernel for SIGTERM when the appliance ends (Linux), besides the feed's end."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it ended before the request was made
        os._exit(0)


def main() -> int:
    # Ctrl-C and SIGHUP are the appliance's to handle: it ends this process by closing the feed
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # the imports first: the appliance starts this process early (ProcessServer.launch) and
    # sends the setup once its channels and agents run, so they overlap with its own start
    from appliance.ops.mgmt.logs import configure
    from appliance.ops.mgmt.server import MgmtServer

    feed = os.fdopen(sys.stdin.fileno(), "rb", buffering=0)
    setup = read_frame(feed)
    if setup is None:
        return 0
    _die_with_parent(setup["pid"])
    configure(setup["log"], setup["log"].get("node"))
    first = read_frame(feed)
    if first is None:
        return 0

    link = socket.socket(fileno=setup["link_fd"])
    sock = socket.socket(fileno=setup["listen_fd"])
    tls = None
    if setup.get("tls"):
        from appliance.ops.tls import server_context

        tls = server_context(*setup["tls"])
    appliance = SnapshotAppliance(link, first, setup["submit_timeout_s"])
    server = MgmtServer(appliance, setup["host"], setup["port"], setup["token"], tls, sock=sock,
                        channels=appliance.channels, pid=setup["pid"],
                        gc_stats=appliance.gc_stats)
    threading.Thread(target=appliance.read_answers, name="mgmt-link", daemon=True).start()
    server.start()
    link.sendall((json.dumps({"ready": server.url}) + "\n").encode())
    logging_as = setup["log"]
    try:
        while (snapshot := read_frame(feed)) is not None:
            appliance.update(snapshot)
            if snapshot.get("log", logging_as) != logging_as:  # the appliance reloaded [log]
                logging_as = snapshot["log"]
                configure(logging_as, logging_as.get("node"))
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # one line (the appliance logs that it ended and starts another)
        print(f"topicwire: mgmt: the management API's process ends: {type(exc).__name__}: "
              f"{exc}", file=sys.stderr)
        sys.exit(1)
