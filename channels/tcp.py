"""TCP channel: native frames back to back on a byte stream, delimited by their own ``frame_len``.

``TcpChannel(listen=("127.0.0.1", 0))`` accepts any number of connections (edges,
management); ``TcpChannel(connect=(host, port))`` makes one. Everything is non-blocking:
``receive`` accepts new connections, reads what each socket has into its connection's buffer
and cuts complete frames out of it into the batch (``_split_frames``, numba); a frame that
has only partly arrived stays in the buffer until the rest comes. ``send`` copies frames
into the connection's send buffer (``_gather``) and writes as much as the socket takes; the
rest goes out on later ``send``/``receive`` calls. A full send buffer takes fewer frames
(``backpressure``).

Peer ids are connection numbers (1, 2, ...; ``peers()`` lists the open ones). A stream cannot
be resynchronised, so a frame header that is not ``TW`` or declares an impossible
``frame_len`` closes that connection (fail closed, ``drops`` reason ``bad_stream``); a peer
that closes mid-frame leaves a ``truncated_stream`` drop. A frame larger than the batch's
slot is dropped whole (``oversized``). Frame contents are the decoder's business.
"""

from __future__ import annotations

import errno
import math
import select
import socket
import time

import numba
import numpy as np

from channels.base import (
    EACH_SLOT,
    WAIT_FOREVER,
    Address,
    Channel,
    Dest,
    FrameArrays,
    FrameBatch,
    as_frame_arrays,
    stamp_send_ts,
)
from channels.errors import ChannelUserError, os_error
from channels.udp import check_port, parse_ipv4
from datapath.config import MAX_FRAME_BYTES

TCP_RECV_BUFFER_BYTES = 4 * MAX_FRAME_BYTES
"""Per-connection receive buffer (holds at least one largest frame plus what follows)."""
TCP_SEND_BUFFER_BYTES = 4 * MAX_FRAME_BYTES
"""Per-connection send buffer; when full, ``send`` takes fewer frames."""
TCP_CONNECT_TIMEOUT_NS = 5_000_000_000
TCP_LISTEN_BACKLOG = 128
TCP_ACCEPTS_PER_POLL = 16
"""New connections accepted per ``receive`` call at most."""

_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ETIMEDOUT})


@numba.njit(cache=True, nogil=True)
def _split_frames(src: np.ndarray, start: int, end: int, max_frame: int, dst: np.ndarray,
                  slot_bytes: int, lengths: np.ndarray, first: int, capacity: int,
                  out: np.ndarray) -> None:
    """Cut complete frames out of ``src[start:end]``; ``out`` = [frames, new start,
    bad header (0/1), oversized]."""
    n = 0
    bad = 0
    oversized = 0
    while end - start >= 32 and first + n < capacity:
        if src[start] != 0x54 or src[start + 1] != 0x57:
            bad = 1
            break
        frame_len = (np.int64(src[start + 8]) << 24) | (np.int64(src[start + 9]) << 16) | (
            np.int64(src[start + 10]) << 8) | np.int64(src[start + 11])
        if frame_len < 32 or frame_len > max_frame or frame_len & 7:
            bad = 1
            break
        if end - start < frame_len:
            break
        if frame_len > slot_bytes:
            oversized += 1
        else:
            d = (first + n) * slot_bytes
            dst[d : d + frame_len] = src[start : start + frame_len]
            lengths[first + n] = frame_len
            n += 1
        start += frame_len
    out[0] = n
    out[1] = start
    out[2] = bad
    out[3] = oversized


@numba.njit(cache=True, nogil=True)
def _gather(src: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, index: np.ndarray,
            dst: np.ndarray, end: int, out: np.ndarray) -> None:
    """Append frames ``index[...]`` to ``dst[end:]`` while they fit; ``out`` = [taken, end]."""
    taken = 0
    for k in range(len(index)):
        i = index[k]
        length = lengths[i]
        if end + length > len(dst):
            break
        s = offsets[i]
        dst[end : end + length] = src[s : s + length]
        end += length
        taken += 1
    out[0] = taken
    out[1] = end


class _Connection:
    __slots__ = ("fd", "peer", "peer_id", "rbuf", "rend", "rstart", "sock", "wbuf", "wend",
                 "wstart")

    def __init__(self, sock: socket.socket, peer_id: int, peer: Address) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.fd = sock.fileno()
        self.peer_id = peer_id
        self.peer = peer
        self.rbuf = np.zeros(TCP_RECV_BUFFER_BYTES, dtype=np.uint8)
        self.rstart = self.rend = 0
        self.wbuf = np.zeros(TCP_SEND_BUFFER_BYTES, dtype=np.uint8)
        self.wstart = self.wend = 0


class TcpChannel(Channel):
    """Length-delimited native frames over TCP; ``listen=`` or ``connect=`` (one of them)."""

    kind = "tcp"

    def __init__(self, *, listen: Address | None = None, connect: Address | None = None,
                 connect_timeout_ns: int = TCP_CONNECT_TIMEOUT_NS, name: str | None = None,
                 stamp_send_ts: bool = True) -> None:
        if (listen is None) == (connect is None):
            raise ChannelUserError("a TCP channel needs exactly one of listen=(host, port) "
                                   "or connect=(host, port)")
        host, port = listen or connect  # type: ignore[misc]
        parse_ipv4(host, "listen address" if listen else "connect address")
        check_port(port, allow_zero=listen is not None)
        super().__init__(name=name or f"tcp:{'listen' if listen else 'connect'}:{host}:{port}",
                         stamp_send_ts=stamp_send_ts)
        self._conns: dict[int, _Connection] = {}
        self._by_fd: dict[int, _Connection] = {}
        self._listener: socket.socket | None = None
        self._next_id = 1
        self._next_conn = 0
        self._out = np.zeros(4, dtype=np.int64)
        self._poller = select.poll()
        if listen is not None:
            self._listen(host, port)
        else:
            self._connect(host, port, connect_timeout_ns)

    def _listen(self, host: str, port: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(TCP_LISTEN_BACKLOG)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise os_error(f"listening on TCP {host}:{port}", exc) from None
        self._listener = sock
        self._poller.register(sock.fileno(), select.POLLIN)

    def _connect(self, host: str, port: int, timeout_ns: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_ns / 1e9)
            sock.connect((host, port))
        except OSError as exc:
            sock.close()
            if isinstance(exc, TimeoutError) and not exc.errno:
                exc = OSError(errno.ETIMEDOUT, "timed out")
            raise os_error(f"connecting TCP to {host}:{port}", exc) from None
        self._add(sock, (host, port))

    def _add(self, sock: socket.socket, peer: Address) -> _Connection:
        conn = _Connection(sock, self._next_id, peer)
        self._next_id += 1
        self._conns[conn.peer_id] = conn
        self._by_fd[conn.fd] = conn
        self._poller.register(conn.fd, select.POLLIN)
        return conn

    def _drop(self, conn: _Connection, reason: str | None) -> None:
        if reason:
            self.stats.on_drop(reason)
        self._conns.pop(conn.peer_id, None)
        self._by_fd.pop(conn.fd, None)
        try:
            self._poller.unregister(conn.fd)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    # --- addresses ---------------------------------------------------------------------------
    @property
    def local_address(self) -> Address:
        self._check_open()
        if self._listener is not None:
            return self._listener.getsockname()
        return next(iter(self._conns.values())).sock.getsockname()

    def peers(self) -> list[int]:
        """Ids of the open connections."""
        return list(self._conns)

    def peer_address(self, peer_id: int) -> Address | None:
        conn = self._conns.get(peer_id)
        return conn.peer if conn else None

    def fileno(self) -> int:
        if self._listener is not None and not self.closed:
            return self._listener.fileno()
        return -1

    def wait_fds(self) -> tuple[int, ...] | None:
        """The listener and every connection (``fileno`` is the listener only)."""
        if self.closed:
            return None
        listener = (self._listener.fileno(),) if self._listener is not None else ()
        return listener + tuple(conn.fd for conn in self._conns.values())

    # --- receive -----------------------------------------------------------------------------
    def _accept(self) -> None:
        if self._listener is None:
            return
        for _ in range(TCP_ACCEPTS_PER_POLL):
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.stats.on_error(f"accept_{errno.errorcode.get(exc.errno, 'os')}".lower())
                return
            self._add(sock, peer)

    def _read(self, conn: _Connection) -> None:
        """Read what the socket has into the connection's buffer (compacting it first)."""
        if conn.rstart and conn.rend == len(conn.rbuf) or conn.rstart > len(conn.rbuf) // 2:
            pending = conn.rend - conn.rstart
            conn.rbuf[:pending] = conn.rbuf[conn.rstart : conn.rend]
            conn.rstart, conn.rend = 0, pending
        if conn.rend == len(conn.rbuf):
            return
        try:
            got = conn.sock.recv_into(memoryview(conn.rbuf)[conn.rend :])
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.stats.on_error(f"recv_{errno.errorcode.get(exc.errno, 'os')}".lower())
            self._drop(conn, "truncated_stream" if conn.rend > conn.rstart else None)
            return
        if got == 0:
            self._drop(conn, "truncated_stream" if conn.rend > conn.rstart else None)
            return
        conn.rend += got

    def _cut(self, conn: _Connection, batch: FrameBatch, first: int) -> int:
        out = self._out
        _split_frames(conn.rbuf, conn.rstart, conn.rend, MAX_FRAME_BYTES, batch.buf,
                      batch.slot_bytes, batch.lengths, first, batch.capacity, out)
        got = int(out[0])
        conn.rstart = int(out[1])
        if out[3]:
            self.stats.on_drop("oversized", int(out[3]))
        batch.peer_ids[first : first + got] = conn.peer_id
        if out[2]:
            self._drop(conn, "bad_stream")
        return got

    def receive(self, batch: FrameBatch, timeout_ns: int = 0) -> int:
        self._check_open()
        deadline = None if timeout_ns <= 0 else time.monotonic_ns() + timeout_ns
        while True:
            n = self._poll(batch)
            if n or timeout_ns == 0:
                return n
            if timeout_ns == WAIT_FOREVER:
                wait_ms = -1
            else:
                left_ns = deadline - time.monotonic_ns()
                if left_ns <= 0:
                    return 0
                wait_ms = math.ceil(left_ns / 1e6)
            self._poller.poll(wait_ms)

    def _poll(self, batch: FrameBatch) -> int:
        self._accept()
        self._flush_all()
        n = 0
        conns = list(self._conns.values())
        if conns:
            start = self._next_conn % len(conns)
            for conn in conns[start:] + conns[:start]:
                if n >= batch.capacity:
                    break
                n += self._cut(conn, batch, n)  # frames already buffered first
                if n < batch.capacity and conn.peer_id in self._conns:
                    self._read(conn)
                    if conn.peer_id in self._conns:
                        n += self._cut(conn, batch, n)
            self._next_conn = start + 1
        batch.count = n
        if n:
            batch.recv_ts_ns[:n] = time.time_ns()
            self.stats.on_batch_received(batch)
        return n

    # --- send --------------------------------------------------------------------------------
    def _flush(self, conn: _Connection) -> None:
        if conn.wend == conn.wstart:
            return
        try:
            sent = conn.sock.send(memoryview(conn.wbuf)[conn.wstart : conn.wend])
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno in _GONE:
                self.stats.on_error(f"send_{errno.errorcode.get(exc.errno)}".lower())
                self._drop(conn, None)
                return
            raise os_error(f"sending on TCP connection {conn.peer_id}", exc) from None
        conn.wstart += sent
        if conn.wstart == conn.wend:
            conn.wstart = conn.wend = 0

    def _flush_all(self) -> None:
        for conn in list(self._conns.values()):
            self._flush(conn)

    def _enqueue(self, conn: _Connection, arrays: FrameArrays, index: np.ndarray) -> int:
        self._flush(conn)
        if conn.wstart and conn.wend:  # move the unsent rest to the front
            rest = conn.wend - conn.wstart
            conn.wbuf[:rest] = conn.wbuf[conn.wstart : conn.wend]
            conn.wstart, conn.wend = 0, rest
        out = self._out
        _gather(arrays.buf, arrays.offsets, arrays.lengths, index, conn.wbuf, conn.wend, out)
        taken = int(out[0])
        conn.wend = int(out[1])
        if taken:
            self.stats.on_send(taken, int(arrays.lengths[index[:taken]].sum()))
        self._flush(conn)
        return taken

    def send(self, frames: FrameBatch | FrameArrays | tuple, dest: Dest = None) -> int:
        self._check_open()
        arrays = as_frame_arrays(frames)
        n = arrays.count
        if n == 0:
            return 0
        too_big = arrays.lengths[:n] > MAX_FRAME_BYTES
        if too_big.any():
            raise ChannelUserError(f"a frame above {MAX_FRAME_BYTES} bytes cannot be sent; "
                                   "split it")
        if self.stamp_send_ts:
            stamp_send_ts(arrays, n)
        if dest == EACH_SLOT:
            if not isinstance(frames, FrameBatch):
                raise ChannelUserError("dest=EACH_SLOT needs a FrameBatch (its peer_ids)")
            ids = frames.peer_ids[:n]
            cuts = np.concatenate(([0], np.flatnonzero(np.diff(ids)) + 1, [n]))
            taken = 0
            for a, b in zip(cuts[:-1], cuts[1:]):
                got = self._send_run(int(ids[a]), arrays, np.arange(a, b, dtype=np.int64))
                taken += got
                if got < b - a:
                    break
        else:
            taken = self._send_run(self._default_peer() if dest is None else dest, arrays,
                                   np.arange(n, dtype=np.int64))
        if taken < n:
            self.stats.on_backpressure(n - taken)
        return taken

    def _send_run(self, peer_id: object, arrays: FrameArrays, index: np.ndarray) -> int:
        if not isinstance(peer_id, int):
            raise ChannelUserError(f"TCP destinations are connection ids (peers()), not "
                                   f"{peer_id!r}")
        conn = self._conns.get(peer_id)
        if conn is None:  # the peer went away: its frames are dropped and counted
            self.stats.on_drop("peer_gone", len(index))
            return len(index)
        return self._enqueue(conn, arrays, index)

    def _default_peer(self) -> int:
        if len(self._conns) == 1:
            return next(iter(self._conns))
        raise ChannelUserError(f"{self.name} has {len(self._conns)} connections; pass "
                               "dest=connection id (see peers())")

    def pending_bytes(self, peer_id: int | None = None) -> int:
        """Bytes taken by ``send`` but not yet written to the socket(s)."""
        conns = self._conns.values() if peer_id is None else [self._conns[peer_id]]
        return sum(c.wend - c.wstart for c in conns)

    def _close(self) -> None:
        for conn in list(getattr(self, "_conns", {}).values()):
            conn.sock.close()
        listener = getattr(self, "_listener", None)
        if listener is not None:
            listener.close()


def warm_up() -> None:
    """Compile/load the stream kernels."""
    out = np.zeros(4, np.int64)
    buf = np.zeros(64, np.uint8)
    one = np.zeros(1, np.int64)
    _split_frames(buf, 0, 0, MAX_FRAME_BYTES, buf, 64, one, 0, 1, out)
    _gather(buf, one, one, one, buf, 0, out)
