"""The appliance's side of the management API's own process (``mgmt.process = true``, the
default; the process itself is appliance/ops/mgmt/child.py).

``ProcessServer(appliance, config, host, port, token).start()`` binds the API's listening
socket here (a port in use is the config's error, as with the in-process API), starts the
API's process with that socket, and returns once the process serves. Then two threads of the
appliance's process do all the API costs it:

- ``mgmt-feed`` sends the process one pickled snapshot (the control agent's status document,
  ``channel_samples`` of the channels, ``gc.get_stats()``, the agents' failure, whether the
  appliance stops) every ``MGMT_FEED_PERIOD_S`` and when a new status is published: a fixed
  cost per period, whatever the scrape rate. It also watches the process: one that ended on
  its own is logged as an error and started again (at most once per
  ``MGMT_RESTART_BACKOFF_S``, longer while it keeps ending at once) on the same listening
  socket, so clients meanwhile wait in its backlog.
- ``mgmt-commands`` reads the commands the process forwards (JSON lines: only the commands
  the API has, with an object of arguments) and hands each to ``Appliance.submit``, one at a
  time, as the in-process API's request threads did; the process holds at most
  ``MGMT_MAX_FORWARDED`` of them waiting.

The process ends with the appliance: ``close()`` closes its feed (the process closes its
connections and exits) and kills it past ``MGMT_STOP_TIMEOUT_S``; if the appliance dies,
the feed's end and ``PR_SET_PDEATHSIG`` end it.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from appliance.addresses import format_host_port
from appliance.config import SUBMIT_TIMEOUT_S, ApplianceConfig, ConfigError
from appliance.ops.mgmt.config import (
    FEED_HEADER,
    MGMT_FEED_CHECK_S,
    MGMT_FEED_PERIOD_S,
    MGMT_LINK_MAX_LINE_BYTES,
    MGMT_LISTEN_BACKLOG,
    MGMT_PROCESS_NICE,
    MGMT_RESTART_BACKOFF_S,
    MGMT_START_TIMEOUT_S,
    MGMT_STOP_TIMEOUT_S,
)
from appliance.ops.mgmt.logs import JsonFormatter
from appliance.ops.mgmt.metrics import appliance_channel_samples

log = logging.getLogger("topicwire.mgmt")

FORWARDED = frozenset({"set_route", "clear_route", "disconnect_client", "move_clients",
                       "shutdown"})
"""The commands the API's process may forward (the API's POST and DELETE endpoints)."""
MAX_BACKOFF_S = 60.0
"""Longest wait between starts of an API process that keeps ending at once."""
SHORT_LIFE_S = 10.0
"""An API process that ended within this long of starting doubles the wait before the next."""
ROOT = Path(__file__).resolve().parents[3]
"""The directory that holds the ``appliance`` package (on the process's PYTHONPATH)."""


def close_at_fork(fd: int, close: bool = True) -> None:
    """appliance/dataplane/process.py's ``close_at_fork`` (imported when first needed)."""
    from appliance.dataplane.process import close_at_fork as at_fork

    at_fork(fd, close)


class ProcessServer:
    """See the module docstring; ``close()`` stops it (safe twice)."""

    def __init__(self, appliance: Any, config: ApplianceConfig, host: str, port: int,
                 token: str | None) -> None:
        self.appliance = appliance
        self.name = config.name
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                             socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(MGMT_LISTEN_BACKLOG)
        except OSError as exc:
            sock.close()
            raise ConfigError(f"mgmt.listen: cannot listen on {format_host_port(host, port)} "
                              f"({exc.strerror}); pick another port or stop its owner") from None
        self._sock = sock
        mgmt = config.mgmt
        tls = None
        if "tls_cert_file" in mgmt:
            tls = (mgmt["tls_cert_file"], mgmt["tls_key_file"], mgmt.get("tls_client_ca_file"))
        self._setup = {"pid": os.getpid(), "host": host, "port": self.address[1],
                       "token": token, "tls": tls, "log": _log_setup(config.name),
                       "submit_timeout_s": SUBMIT_TIMEOUT_S}
        self._scheme = "https" if tls else "http"
        self._proc: subprocess.Popen[bytes] | None = None
        self._link: socket.socket | None = None
        self._commands: threading.Thread | None = None
        self._feeder: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._last_status: Any = None
        self._sent_at = 0.0
        self._started_at = 0.0
        self._backoff_s = MGMT_RESTART_BACKOFF_S
        self._feed_errors = 0
        self.restarts = 0
        """How often the API's process was started again after it ended on its own."""

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        return f"{self._scheme}://{format_host_port(*self.address)}"

    @property
    def pid(self) -> int | None:
        """The API process's id (None while there is none)."""
        return self._proc.pid if self._proc is not None else None

    # --- lifecycle --------------------------------------------------------------------------------
    def launch(self) -> ProcessServer:
        """Start the API's process now, before the appliance's channels and agents: its
        interpreter starts and imports while the appliance starts (seconds at an appliance
        image's boot under TCG); ``start`` then gives it the listening socket's setup and the
        first snapshot and waits until it serves."""
        try:
            self._launch()
        except BaseException:
            self._end_process()
            self._close_sock()
            raise
        return self

    def start(self) -> ProcessServer:
        try:
            if self._proc is None:
                self._launch()
            self._handshake()
        except BaseException:
            self._end_process()
            self._close_sock()
            raise
        self._feeder = threading.Thread(target=self._feed_loop, name="mgmt-feed", daemon=True)
        self._feeder.start()
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._feeder is not None:
            self._feeder.join(MGMT_STOP_TIMEOUT_S)
            if self._feeder.is_alive() and self._proc is not None:  # stuck writing the feed
                self._proc.kill()
        self._end_process()
        self._close_sock()

    def _close_sock(self) -> None:
        close_at_fork(self._sock.fileno(), close=False)
        self._sock.close()

    def _end_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin is not None:
                    close_at_fork(proc.stdin.fileno(), close=False)
                    proc.stdin.close()  # the end of the feed: the process closes and exits
            except OSError:
                pass
            try:
                proc.wait(MGMT_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("mgmt: %s: the management API's process did not end within %s s; "
                            "killed", self.name, MGMT_STOP_TIMEOUT_S)
                proc.kill()
                proc.wait()
        link, self._link = self._link, None
        if link is not None:
            close_at_fork(link.fileno(), close=False)
            try:
                link.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            link.close()
        if self._commands is not None:
            self._commands.join(MGMT_STOP_TIMEOUT_S)
            self._commands = None

    def _spawn(self) -> None:
        """Start the API's process and wait until it serves (``MGMT_START_TIMEOUT_S``); a
        ``ConfigError`` saying why when it does not."""
        self._launch()
        self._handshake()

    def _launch(self) -> None:
        """Start the API's process (it imports, then waits for its setup on the feed)."""
        ours, theirs = socket.socketpair()
        self._link = ours
        self._their_fd = theirs.fileno()  # the same number there (pass_fds)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]]
                                                          if env.get("PYTHONPATH") else []))
        self._started_at = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "appliance.ops.mgmt.child"], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, pass_fds=(self._sock.fileno(), theirs.fileno()),
                env=env)
        except OSError as exc:
            raise ConfigError(f"mgmt.process: cannot start the management API's process "
                              f"({exc.strerror or exc}); set mgmt.process = false to serve "
                              "the API from the appliance's own process") from None
        finally:
            theirs.close()
        try:  # it yields the CPU to the data path where there are fewer cores than busy threads
            os.setpriority(os.PRIO_PROCESS, self._proc.pid,
                           min(19, os.getpriority(os.PRIO_PROCESS, 0) + MGMT_PROCESS_NICE))
        except OSError as exc:
            log.warning("mgmt.process: cannot lower the management API process's priority "
                        "(%s); it competes with the data path for the CPU", exc)
        assert self._proc.stdin is not None
        for fd in (self._sock.fileno(), ours.fileno(), self._proc.stdin.fileno()):
            close_at_fork(fd)  # a data path forked later must not hold them

    def _handshake(self) -> None:
        """Send the launched process its setup and the first snapshot; wait until it serves."""
        assert self._proc is not None and self._link is not None
        ours = self._link
        ready = None
        try:
            self._send({**self._setup, "listen_fd": self._sock.fileno(),
                        "link_fd": self._their_fd})
            self._send(self._snapshot(self.appliance.status()))
            ours.settimeout(MGMT_START_TIMEOUT_S)
            reader = ours.makefile("rb")
            line = reader.readline(MGMT_LINK_MAX_LINE_BYTES)
            ready = json.loads(line).get("ready") if line.endswith(b"\n") else None
        except (OSError, ValueError, AttributeError):
            ready = None
        if not ready:
            try:  # it closed the link: it is ending
                code = self._proc.wait(MGMT_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                code = None
            raise ConfigError(
                "mgmt.process: the management API's process did not start ("
                + (f"it exited with {code}; its error is logged above" if code is not None
                   else f"it did not answer within {MGMT_START_TIMEOUT_S:g} s")
                + "); set mgmt.process = false to serve the API from the appliance's own "
                "process")
        ours.settimeout(None)
        self._commands = threading.Thread(target=self._serve_link, args=(ours, reader),
                                          name="mgmt-commands", daemon=True)
        self._commands.start()
        log.debug("mgmt: %s: the management API's process (pid %d) serves %s", self.name,
                  self._proc.pid, ready)

    # --- the feed ---------------------------------------------------------------------------------
    def _snapshot(self, status: dict[str, Any]) -> dict[str, Any]:
        app = self.appliance
        failure = app.failure() if hasattr(app, "failure") else None
        return {"status": status, "channels": appliance_channel_samples(app),
                "gc": gc.get_stats(),
                "failure": (type(failure).__name__, str(failure)) if failure else None,
                "stopped": bool(getattr(app, "_stopped", False)),
                "log": _log_setup(self.name)}  # a reload may change [log]

    def _published(self) -> Any:
        """The control agent's latest status object (a new one at each rebuild), whose change
        makes the feed send at once; ``status()`` itself where there is none (an appliance
        whose ``status()`` adds live sections makes a new dict at each call: the edge)."""
        control = getattr(self.appliance, "control", None)
        published = getattr(control, "status_snapshot", None)
        return published if published is not None else self.appliance.status()

    def _send(self, doc: dict[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise BrokenPipeError("no management API process")
        data = pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL)
        proc.stdin.write(FEED_HEADER.pack(len(data)) + data)
        proc.stdin.flush()

    def _feed_loop(self) -> None:
        while not self._stop.wait(MGMT_FEED_CHECK_S):
            proc = self._proc
            if proc is None or proc.poll() is not None:
                self._restart(None if proc is None else proc.returncode)
                continue
            try:
                published = self._published()
                now = time.monotonic()
                if published is self._last_status and now - self._sent_at < MGMT_FEED_PERIOD_S:
                    continue
                self._send(self._snapshot(self.appliance.status()))
                self._last_status, self._sent_at = published, now
            except OSError:
                continue  # the process ended: the next round sees it and starts another
            except Exception as exc:  # a fault of this side: the API keeps its last snapshot
                self._feed_errors += 1
                if self._feed_errors in (1, 10, 100) or self._feed_errors % 1000 == 0:
                    log.error("mgmt: %s: could not send the management API its snapshot "
                              "(%d times so far): %s: %s", self.name, self._feed_errors,
                              type(exc).__name__, exc)

    def _restart(self, code: int | None) -> None:
        """Start the API's process again after it ended on its own (logged as an error)."""
        lived = time.monotonic() - self._started_at
        self._backoff_s = (min(self._backoff_s * 2, MAX_BACKOFF_S) if lived < SHORT_LIFE_S
                           else MGMT_RESTART_BACKOFF_S)
        if self._proc is not None:
            log.error("mgmt: %s: the management API's process ended on its own (exit code %s) "
                      "after %.1f s; starting it again in %.0f s", self.name, code, lived,
                      self._backoff_s)
        self._end_process()
        if self._stop.wait(max(0.0, self._started_at + self._backoff_s - time.monotonic())):
            return
        try:
            self._spawn()
            self.restarts += 1
            self._last_status = None
        except ConfigError as exc:
            log.error("mgmt: %s: %s", self.name, exc)

    # --- commands ---------------------------------------------------------------------------------
    def _serve_link(self, link: socket.socket, reader: Any) -> None:
        try:
            while True:
                line = reader.readline(MGMT_LINK_MAX_LINE_BYTES)
                if not line or not line.endswith(b"\n"):
                    break
                ident, result = self._apply(line)
                answer = json.dumps({"id": ident, "result": result}, separators=(",", ":"))
                link.sendall(answer.encode() + b"\n")
        except OSError:
            pass

    def _apply(self, line: bytes) -> tuple[Any, dict[str, Any]]:
        """(id, result) of one forwarded command: checked, then ``Appliance.submit``."""
        try:
            doc = json.loads(line)
            ident, command, args = doc["id"], doc["command"], doc["args"]
        except (ValueError, KeyError, TypeError):
            return None, {"ok": False, "error": "mgmt: a malformed forwarded command"}
        if command not in FORWARDED or not isinstance(args, dict):
            return ident, {"ok": False, "error": f"mgmt: {str(command)[:40]!r} is not a "
                           "command the management API forwards"}
        try:
            return ident, self.appliance.submit(command, args)
        except Exception as exc:  # the appliance's fault, not the client's: one line
            log.error("mgmt: %s: %s failed in the appliance: %s: %s", self.name, command,
                      type(exc).__name__, exc)
            return ident, {"ok": False, "internal": type(exc).__name__,
                           "error": f"mgmt: internal error ({type(exc).__name__}); see the "
                                    "appliance's log"}


def _log_setup(node: str) -> dict[str, Any]:
    """The API process's ``[log]``: the format and level this process logs with."""
    root = logging.getLogger()
    fmt = "json" if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers) else "text"
    level = root.getEffectiveLevel()
    name = ("debug" if level <= logging.DEBUG else "info" if level <= logging.INFO
            else "warning" if level <= logging.WARNING else "error")
    return {"format": fmt, "level": name, "node": node}
