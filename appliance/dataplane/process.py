"""The data path in a process of its own (``appliance.dataplane = "process"``, the default).

The control plane cannot stall a data path it does not share an interpreter with: table
rebuilds, status rebuilds, P&M documents, the MQTT edge and the cache all run in the
appliance's process, and the data path runs alone in a child forked from it at start, as
Aeron's media driver runs apart from its clients.

    appliance process                                 data-path process (forked at start)
    ControlAgent --> DataPathProcess (this port)      ChildLink --+
                       command(name, *args)   --link-->  commands |  DataPlaneAgent
                       offer_admin(...)       --link-->  outbox   +  channels, SoftNic,
                       publish_snapshot(...)  --link-->  switch   |  guaranteed plane,
                       inbox  <--link-- admin frames received     |  telemetry
                       published <--link-- counters every 250 ms -+
                       cycle_ns, commands applied: shared memory (read any time)

The *link* is a Unix stream socket pair carrying length-prefixed pickles, in order: a command
the control plane offers before a reply frame is applied before the reply leaves, and a
snapshot after the commands before it, as on a thread. The parent's sends block (a data path
that reads nothing is stalled anyway); the child's never do: what it sends waits in a bounded
buffer, and admin frames beyond it are dropped and counted (``link_inbox_dropped``). The
child looks at the link only when the parent's message count in shared memory says there is
something to read (no system call per duty cycle), or when its fd ends a park.

The child opens the channels (a port in use is the parent's ``ConfigError``, with the same
message), builds the data-path agent on the table snapshot the parent compiled before the
fork, and runs it on its main thread. It ignores SIGINT, SIGTERM and SIGHUP (the parent
drains and stops it: ``stop``), and ends when the link closes (the parent died) or the
parent is no longer its parent. Its failure is the appliance's (``error``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import mmap
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any, NoReturn

import numpy as np

from appliance.config import INBOX_FRAMES, OUTBOX_FRAMES, ApplianceConfig, ConfigError
from appliance.dataplane import snapshot_patch
from datapath.errors import TopicwireError
from nic_offload.model import sorted_unique

log = logging.getLogger("topicwire.appliance")

ROWS_PATCH_ALWAYS = 1_024
"""Up to this many changed rows a snapshot crosses as its rows (``publish_snapshot``),
whatever the share of the table (the child's ``evolve`` of them takes about a millisecond)."""

_LEN = struct.Struct("<I")
_CYCLE, _APPLIED, _SENT = 0, 1, 2
"""Words of the shared page: the child's current duty cycle start (monotonic ns), the
commands it has applied, the messages the parent has sent."""
CHILD_SEND_BUFFER_BYTES = 16 << 20
"""What the child's sends may hold while the parent does not read (then admin frames are
dropped and counted; counters wait for the next publish)."""
LINK_BUFFER_BYTES = 4 << 20
"""Socket buffers of the link, each way (a table snapshot usually fits in one send)."""
READY_TIMEOUT_S = 600.0
"""How long ``start`` waits for the child to open its channels and load its kernels (a cold
numba cache compiles for minutes; ``topicwire warm`` makes it seconds)."""
STOP_MARGIN_S = 5.0
"""How long ``stop`` waits beyond the drain time before it kills the child."""
PR_SET_PDEATHSIG = 1
_PARENT_ENDS: set[int] = set()
"""The parent ends of every link this process holds: a child forked later closes them, so
that each child sees end of file when its own parent goes."""


def close_at_fork(fd: int, close: bool = True) -> None:
    """``fd`` (the management API's feed, link and listening socket, opened before the data
    path forks) is closed in every data path forked from now on, so that the API's process
    sees end of file when the appliance lets go of it; ``close=False`` forgets it again (the
    caller closed it: the number may be reused)."""
    if close:
        _PARENT_ENDS.add(fd)
    else:
        _PARENT_ENDS.discard(fd)


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=5)
    return _LEN.pack(len(data)) + data


class _Reader:
    """Length-prefixed messages read from a stream socket into one buffer that is reused
    (a ``recv`` of a fresh buffer per read cost the data path more than the messages)."""

    def __init__(self, size: int = 1 << 18) -> None:
        self.buf = bytearray(size)
        self.n = 0

    def fill(self, sock: socket.socket) -> bool:
        """Read what is there (``BlockingIOError`` when nothing is, on a non-blocking
        socket); False at the end of the stream."""
        if self.n == len(self.buf):
            self.buf.extend(bytes(len(self.buf)))  # a message larger than the buffer
        got = sock.recv_into(memoryview(self.buf)[self.n:])
        self.n += got
        return got > 0

    def messages(self) -> list[Any]:
        """Take every complete message off the front of the buffer."""
        out = []
        pos, n, buf = 0, self.n, self.buf
        need = 0
        with memoryview(buf) as view:
            while n - pos >= 4:
                (length,) = _LEN.unpack_from(buf, pos)
                if n - pos - 4 < length:
                    need = length + 4
                    break
                out.append(pickle.loads(view[pos + 4 : pos + 4 + length]))
                pos += 4 + length
        if pos:
            rest = n - pos
            buf[:rest] = buf[pos:n]
            self.n = rest
        if need > len(buf):  # room for the message whose start is here
            buf.extend(bytes(need - len(buf)))
        return out


class DataPathProcess:
    """The control plane's port to a data path in a child process (see the module
    docstring); the same calls as ``DataPlaneAgent``'s port."""

    def __init__(self, config: ApplianceConfig, snapshot: Any) -> None:
        self.config = config
        self._snapshot = snapshot
        self._sent_tables = snapshot.tables
        """The software NIC's arrays of the last snapshot the child was given ..."""
        self._sent_entries = snapshot.entries
        """... and its entries (what the patches of the next one are made against)."""
        self._chain: tuple | None = None
        """(version the child holds, version of the last snapshot built, the changed rows
        of each snapshot built since, whether the ACL entries changed) (``built_snapshot``)."""
        self.inbox: deque[tuple[str, int, bytes]] = deque()
        self.control_wakeup = threading.Event()
        """Set after frames are put in ``inbox`` (the control agent replaces it)."""
        self.published: dict[str, Any] = {"channels": [], "counters": {}, "offload": {}}
        self.jit_late: dict[str, list[str]] = {}
        """Kernels the child compiled after it started (``JitWatch.check`` there)."""
        self.error: BaseException | None = None
        """What ended the child when nobody asked it to stop."""
        self.pid = 0
        self.dropped_inbox = 0
        self._page = mmap.mmap(-1, mmap.PAGESIZE)
        self._words = np.frombuffer(self._page, np.int64, 8)
        self._lock = threading.Lock()
        self._commands_sent = 0
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._stopping = False
        self._exit_status: int | None = None

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> DataPathProcess:
        """Fork the child and wait until it runs; raise its ``ConfigError`` (a channel that
        does not open) or a ``TopicwireError`` when it fails to start.

        The fork is made by the link's reader thread, which lives exactly as long as the
        link: the child asks the kernel for SIGKILL when the thread that forked it ends
        (``PR_SET_PDEATHSIG``), so a killed appliance takes its data path with it at once
        (a data path left behind would acknowledge guaranteed messages nobody keeps)."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in (parent, child):
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                end.setsockopt(socket.SOL_SOCKET, option, LINK_BUFFER_BYTES)
        self._words[_CYCLE] = time.monotonic_ns()
        self._sock = parent
        _PARENT_ENDS.add(parent.fileno())
        forked = threading.Event()
        self._reader = threading.Thread(target=self._fork_and_read, args=(child, forked),
                                        name=f"{self.config.name}-dp-link", daemon=True)
        self._reader.start()
        forked.wait()
        if not self._ready.wait(READY_TIMEOUT_S):
            self._kill()
            self._close()
            raise TopicwireError(f"{self.config.name}: the data-path process did not start "
                                 f"within {READY_TIMEOUT_S:.0f} s")
        if self._start_error is not None:
            self._reap(STOP_MARGIN_S)
            self._close()
            raise self._start_error
        return self

    def _fork_and_read(self, child: socket.socket, forked: threading.Event) -> None:
        parent_pid = os.getpid()
        pid = fork_safely()
        if pid == 0:  # the child: never returns
            _child_main(self.config, self._snapshot, child, self._words, parent_pid)
        child.close()
        self.pid = pid
        self._snapshot = None  # the child has its copy
        forked.set()
        self._read()

    def stop(self, drain_timeout_s: float) -> None:
        """Let the child send what it was given (in order), close its channels and exit;
        kill it when it has not within the drain time and ``STOP_MARGIN_S``. Raises the
        error that had ended it, if one had."""
        if self._sock is None:
            return
        self._stopping = True
        try:
            self._send(("stop",))
        except OSError:
            pass  # it is gone: reaped below
        if not self._reap(drain_timeout_s + STOP_MARGIN_S):
            log.error("%s: the data-path process did not stop within %.1f s; killed",
                      self.config.name, drain_timeout_s + STOP_MARGIN_S)
            self._kill()
        self._close()
        if self.error is not None:
            raise self.error

    def _reap(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid:
                self._exit_status = os.waitstatus_to_exitcode(status)
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def _kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._reap(STOP_MARGIN_S)

    def _close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            _PARENT_ENDS.discard(sock.fileno())
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(5.0)

    # --- the port -----------------------------------------------------------------------------
    def command(self, name: str, *args: Any) -> None:
        """Run ``DataPlaneAgent.name(*args)`` in the child, in the order offered."""
        self._send(("c", name, args))
        self._commands_sent += 1

    def commands_pending(self) -> int:
        return self._commands_sent - int(self._words[_APPLIED])

    def pending(self) -> int:
        """Commands not applied yet (admin frames leave in order after them)."""
        return self.commands_pending()

    def publish_snapshot(self, snapshot: Any) -> None:
        """Send the child ``snapshot`` as a patch of the last one sent: of the software
        NIC's arrays only those that differ (a class table alone is 512 KiB), each as the
        places that changed when they are few (``snapshot_patch``: a subscription changes a
        few rows of a slot array of 33 MB at 1,000,000 topics), and the entries' key rows
        likewise; the child takes the rest from its current snapshot
        (``DataPlaneAgent.publish_snapshot_delta``)."""
        chain, self._chain = self._chain, None
        rows = None
        if (chain is not None and chain[0] == self._sent_entries.version
                and chain[1] == snapshot.version):
            rows = (chain[2][0] if len(chain[2]) == 1
                    else sorted_unique(np.concatenate(chain[2])))
        if rows is not None and (len(rows) <= ROWS_PATCH_ALWAYS or len(rows) * snapshot_patch.
                                 PATCH_MAX_SHARE <= len(snapshot.entries.key_rows)):
            # made from the one the child holds (through snapshots built and not sent), a
            # few rows changed: those rows alone, and the child makes the same arrays from
            # them (no comparison of whole arrays here). Many rows: the child's own evolve
            # (0.1 s for 100,000 rows) costs more than comparing and sending arrays.
            entries = snapshot_patch.EntriesPatch.rows(snapshot.entries, self._sent_entries,
                                                       rows)
            self.command("publish_snapshot_rows", entries, rows, chain[3])
            self._sent_tables = snapshot.tables
            self._sent_entries = snapshot.entries
            return
        tables, sent = snapshot.tables, self._sent_tables
        changed: dict[str, Any] = {}
        same: list[str] = []
        for field in dataclasses.fields(tables):
            got = snapshot_patch.diff(getattr(tables, field.name), getattr(sent, field.name))
            if got is None:
                same.append(field.name)
            else:
                changed[field.name] = got
        entries = snapshot_patch.EntriesPatch.of(snapshot.entries, self._sent_entries)
        self.command("publish_snapshot_delta", entries, changed, same)
        self._sent_tables = tables
        self._sent_entries = snapshot.entries

    def built_snapshot(self, snapshot: Any) -> None:
        """The control plane built ``snapshot`` (it may publish a later one instead): the
        changed rows of the snapshots built since the one the child holds are kept, so the
        one published crosses as their union (``publish_snapshot``)."""
        delta = snapshot.delta
        chain = self._chain
        if chain is not None and chain[1] == snapshot.version:
            return  # the same one again
        if delta is None:
            self._chain = None
        elif chain is not None and chain[1] == delta[0]:
            self._chain = (chain[0], snapshot.version, [*chain[2], delta[1]],
                           chain[3] or delta[2])
        elif delta[0] == self._sent_entries.version:
            self._chain = (delta[0], snapshot.version, [delta[1]], delta[2])
        else:
            self._chain = None

    def offer_admin(self, channel: str, dest: int, frame: bytes | bytearray) -> bool:
        """Queue an admin frame to send; False when the child is gone."""
        try:
            self._send(("a", channel, dest, bytes(frame)))
        except OSError:
            return False
        return True

    @property
    def cycle_ns(self) -> int:
        """When the child's current (or last) duty cycle started (the stall check)."""
        return int(self._words[_CYCLE])

    def _send(self, message: tuple) -> None:
        data = _frame(message)
        with self._lock:
            sock = self._sock
            if sock is None:
                raise OSError("the data-path process is stopped")
            self._words[_SENT] += 1  # first: the child reads a large message as it arrives
            sock.sendall(data)

    # --- the parent's reader thread -----------------------------------------------------------
    def _read(self) -> None:
        sock = self._sock
        if sock is None:
            return
        reader = _Reader()
        try:
            while True:
                try:
                    if not reader.fill(sock):
                        break
                except OSError:
                    break
                for message in reader.messages():
                    self._on_message(message)
        finally:
            self._ready.set()
            if not self._stopping and self.error is None and self._start_error is None:
                self._reap(1.0)
                self.error = TopicwireError(
                    f"{self.config.name}: the data-path process (pid {self.pid}) ended "
                    f"unexpectedly (exit status {self._exit_status}); the appliance stops")
                log.error("%s", self.error)

    def _on_message(self, message: tuple) -> None:
        kind = message[0]
        if kind == "i":
            frames = message[1]
            room = INBOX_FRAMES - len(self.inbox)
            if len(frames) > room:
                self.dropped_inbox += len(frames) - max(room, 0)
                frames = frames[:max(room, 0)]
            self.inbox.extend(frames)
            self.control_wakeup.set()
        elif kind == "p":
            published = message[1]
            if self.dropped_inbox:
                published["counters"]["inbox_full"] = (
                    published["counters"].get("inbox_full", 0) + self.dropped_inbox)
            self.published, self.jit_late = published, message[2]
        elif kind == "ready":
            self._ready.set()
        elif kind == "error":
            self._start_error = ConfigError(message[1], component=message[2])
            self._ready.set()
        elif kind == "failed":
            self.error = TopicwireError(f"{self.config.name}: the data path failed: "
                                        f"{message[1]}")
            log.error("%s", self.error)


def fork_safely() -> int:
    """``os.fork`` with numba's compiler lock held by the forking thread: a lock another
    thread holds at the fork stays held in the child for ever, and the child compiles when
    the cache is cold (a guest's first start hung so); the child's copy of the lock is its
    own, released before it goes on."""
    from numba.core.compiler_lock import global_compiler_lock

    global_compiler_lock.acquire()
    try:
        pid = os.fork()
    except BaseException:
        global_compiler_lock.release()
        raise
    global_compiler_lock.release()  # in the parent, and the child's copy in the child
    return pid


# --- the child ------------------------------------------------------------------------------
class ChildLink:
    """The child's end of the link, run as an agent after the data-path agent in each duty
    cycle: it takes what the parent sent (when the shared count says there is some), hands
    admin frames received to the parent, and publishes the counters and the cycle start."""

    name = "dataplane-link"

    def __init__(self, sock: socket.socket, words: np.ndarray, dp: Any, jit: Any,
                 parent_pid: int) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.words = words
        self.dp = dp
        self.jit = jit
        self.parent_pid = parent_pid
        self.received = 0
        self.stopping = False
        self.closed = False
        self._in = _Reader()
        self._out = bytearray()
        self._published: Any = None

    def do_work(self, now_ns: int) -> int:
        words = self.words
        words[_CYCLE] = now_ns
        dp = self.dp
        words[_APPLIED] = dp.commands.applied
        work = 0
        if words[_SENT] != self.received:
            work += self._receive()
        if dp.inbox:
            frames = list(dp.inbox)
            dp.inbox.clear()
            if not self._send(("i", frames)):
                dp.counters["link_inbox_dropped"] += len(frames)
            work += 1
        if dp.published is not self._published:
            self._published = dp.published
            if os.getppid() != self.parent_pid or self._link_ended():
                self.closed = True  # the parent is gone (and the link with it)
            from appliance.ops.mgmt.metrics import channel_samples, channel_stats

            published = {**dp.published, "channel_samples": channel_samples(channel_stats(dp))}
            self._send(("p", published, self.jit.check() if self.jit is not None else {}))
        if self._out:
            self._flush()
        return work

    def finished(self) -> bool:
        """Whether the runner should stop: the parent said stop and everything before it
        was taken, or the parent is gone."""
        dp = self.dp
        return self.closed or (self.stopping and not dp.outbox and not len(dp.commands))

    def _link_ended(self) -> bool:
        """Whether the parent's end is closed (a look, at each publish)."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def _receive(self) -> int:
        n = 0
        reader = self._in
        while True:
            try:
                if not reader.fill(self.sock):
                    self.closed = True
                    break
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.closed = True
                break
        dp = self.dp
        for message in reader.messages():
            n += 1
            kind = message[0]
            if kind == "c":
                dp.commands.put((message[1], message[2]))
            elif kind == "a":
                if len(dp.outbox) >= OUTBOX_FRAMES:
                    dp.counters["outbox_full"] += 1
                else:
                    dp.outbox.append(message[1:])
            elif kind == "stop":
                self.stopping = True
        self.received += n
        return n

    def _send(self, message: tuple) -> bool:
        if len(self._out) >= CHILD_SEND_BUFFER_BYTES:
            return False
        self._out += _frame(message)
        self._flush()
        return True

    def _flush(self) -> None:
        try:
            sent = self.sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.closed = True
            self._out.clear()
            return
        del self._out[:sent]

    def send_now(self, message: tuple) -> None:
        """Send ``message`` and wait until it left (start and end of the child's life)."""
        self._out += _frame(message)
        self.sock.setblocking(True)
        try:
            self.sock.sendall(self._out)
        except OSError:
            pass
        self._out.clear()
        self.sock.setblocking(False)

    def on_close(self) -> None:
        return None


def _child_main(cfg: ApplianceConfig, snapshot: Any, sock: socket.socket,
                words: np.ndarray, parent_pid: int) -> NoReturn:
    """The child's whole life; it leaves only through ``os._exit`` (nothing of the parent's,
    a test runner's included, runs here after the fork)."""
    status = 1
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the link's end of file and the parent check still end it
        if os.getppid() != parent_pid:  # it died before the request was made
            os._exit(1)
        for fd in _PARENT_ENDS:  # other appliances' links: their children must see EOF
            try:
                os.close(fd)
            except OSError:
                pass
        _PARENT_ENDS.clear()
        status = _run_child(cfg, snapshot, sock, words, parent_pid)
    except BaseException:
        try:
            _send_blocking(sock, ("failed", traceback.format_exc(limit=8)))
        except BaseException:
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(status)


def _report(sock: socket.socket, exc: ConfigError) -> None:
    """Send the parent the ``ConfigError`` that stopped the start."""
    text = str(exc)
    prefix = f"{exc.component}: "
    _send_blocking(sock, ("error", text[len(prefix):] if text.startswith(prefix) else text,
                          exc.component))


def _send_blocking(sock: socket.socket, message: tuple) -> None:
    sock.setblocking(True)
    sock.sendall(_frame(message))


def _run_child(cfg: ApplianceConfig, snapshot: Any, sock: socket.socket,
               words: np.ndarray, parent_pid: int) -> int:
    from appliance.dataplane.open import (
        build_dataplane,
        close_channels,
        idle_strategy,
        placement_hook,
    )
    from datapath.agent import AgentRunner
    from datapath.jit import JitWatch
    from nic_offload.snapshot import SnapshotSwitch

    threading.current_thread().name = f"{cfg.name}-dataplane"
    try:
        channels = _open_or_report(cfg, sock)
    except _Reported:
        return 2
    dp = None
    try:
        try:
            dp = build_dataplane(cfg, channels, SnapshotSwitch(snapshot))
        except ConfigError as exc:
            _report(sock, exc)
            return 2
        jit = JitWatch().start(warn=False)  # the parent says whether the cache was warmed
        link = ChildLink(sock, words, dp, jit, parent_pid)
        hook = placement_hook(cfg)
        if hook is not None:
            try:
                hook()
            except ConfigError as exc:
                _report(sock, exc)
                return 2
        link.send_now(("ready",))
        # the link after the data path: what a cycle received for the control plane leaves
        # in the same cycle, and the count of applied commands is current
        runner = AgentRunner([dp, link], idle_strategy(cfg, dp, (sock.fileno(),)),
                             name=f"{cfg.name}-dataplane")
        runner.run(until=link.finished)  # closes the agents: dp drains what is queued
        dp._publish(time.monotonic_ns())  # the last counters, for a status after stop
        link.do_work(time.monotonic_ns())
        link.send_now(("stopped",))
        return 0
    finally:
        if dp is not None and dp.telemetry is not None:
            dp.telemetry.close()
        close_channels(channels)


class _Reported(Exception):
    """The start error went to the parent."""


def _open_or_report(cfg: ApplianceConfig, sock: socket.socket) -> dict[str, Any]:
    from appliance.dataplane.open import open_channels

    try:
        return open_channels(cfg)
    except ConfigError as exc:
        _report(sock, exc)
        raise _Reported from None
