"""UDP unicast channel: one frame per datagram, a batch per recvmmsg/sendmmsg system call.

``DatagramChannel`` holds the batched I/O shared with the multicast channel (``_mmsg``):
the socket is non-blocking, each receive is one ``recvmmsg`` into the batch's slots (source
``sockaddr_in`` and the kernel's ``SO_TIMESTAMPNS`` receive time recorded per datagram), each
send one ``sendmmsg`` (more only after an error). Peer ids are ``(ipv4 << 16) | port``.

A datagram larger than the batch's slot arrives truncated (``MSG_TRUNC``): it is dropped and
counted (``drops``, reason ``oversized``), never delivered cut. A frame the kernel refuses for
good (``EMSGSIZE``, no route, ...) is counted (``errors`` and ``drops``) and skipped; a full
socket buffer (``EAGAIN``/``ENOBUFS``) stops the send there (``backpressure``).

Multicast safety: only ``MulticastChannel`` (whose socket always has ``IP_MULTICAST_IF``) may
send to 224.0.0.0/4. A unicast channel refuses a multicast destination before anything is
sent (``ChannelUserError``), whether it comes as an address, a peer id or per slot.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import math
import select
import socket
import time

import numpy as np

from channels import _mmsg
from channels.base import (
    EACH_SLOT,
    WAIT_FOREVER,
    Address,
    Channel,
    Dest,
    FrameArrays,
    FrameBatch,
    as_frame_arrays,
)
from channels.errors import ChannelUserError, os_error

UDP_RCVBUF_BYTES = 4 * 1024 * 1024
"""Socket receive buffer asked for (the kernel caps it at net.core.rmem_max, and the channel
logs a warning when it did)."""
UDP_SNDBUF_BYTES = 4 * 1024 * 1024
"""Socket send buffer asked for (the kernel caps it at net.core.wmem_max)."""
UDP_MAX_DATAGRAM_BYTES = 65_507
"""Largest IPv4 UDP payload; MAX_FRAME_BYTES (65,504) fits."""

_RETRY_LATER = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS})
_VECTOR_KEY = "mmsg"

log = logging.getLogger("topicwire.channels")


def parse_ipv4(host: str, what: str = "address") -> int:
    """A dotted IPv4 address as an int; no name resolution (it would send DNS queries)."""
    try:
        return int(ipaddress.IPv4Address(host))
    except (ipaddress.AddressValueError, ValueError, TypeError):
        raise ChannelUserError(
            f"{what} {host!r} is not a numeric IPv4 address; give one such as 127.0.0.1 "
            "(names are not resolved)") from None


def check_port(port: object, *, allow_zero: bool = True) -> int:
    if not isinstance(port, int) or not (0 if allow_zero else 1) <= port <= 65535:
        raise ChannelUserError(f"port {port!r} is not an integer in "
                               f"[{0 if allow_zero else 1}, 65535]")
    return port


def peer_id_of(host: str, port: int) -> int:
    """The peer id a datagram from ``host:port`` carries: ``(ipv4 << 16) | port``."""
    return (parse_ipv4(host) << 16) | check_port(port)


def address_of_peer(peer_id: int) -> Address:
    """``(host, port)`` of a UDP peer id."""
    return socket.inet_ntoa(int(peer_id >> 16).to_bytes(4, "big")), int(peer_id & 0xFFFF)


def socket_error(what: str, exc: OSError) -> Exception:
    return os_error(what, exc)


class DatagramChannel(Channel):
    """Batched datagram I/O over an AF_INET socket the subclass made."""

    kind = "udp"

    def __init__(self, sock: socket.socket, *, default_dest: Address | None = None,
                 connected: bool = False, kernel_timestamps: bool = True,
                 name: str | None = None, stamp_send_ts: bool = True,
                 rcvbuf_bytes: int | None = None) -> None:
        """``rcvbuf_bytes``: the receive buffer the socket was asked for (``SO_RCVBUF``);
        a warning is logged when the kernel gave less."""
        super().__init__(name=name, stamp_send_ts=stamp_send_ts)
        self._sock = sock
        self._fd = sock.fileno()
        self._connected = connected
        self._dest_cache: dict[object, tuple[int, int]] = {}
        self._default = self._resolve(default_dest) if default_dest else None
        self._scratch: _mmsg.MmsgVector | None = None
        self._poller = select.poll()
        self._poller.register(self._fd, select.POLLIN)
        sock.setblocking(False)
        if kernel_timestamps:
            sock.setsockopt(socket.SOL_SOCKET, _mmsg.SO_TIMESTAMPNS, 1)
        if rcvbuf_bytes is not None:
            warn_if_rcvbuf_capped(self.name, sock, rcvbuf_bytes)

    # --- addresses ---------------------------------------------------------------------------
    multicast_sender = False
    """Only a MulticastChannel (interface set) may send to 224.0.0.0/4 (module doc)."""

    def _refuse_multicast(self, ipv4: int) -> None:
        group = socket.inet_ntoa(ipv4.to_bytes(4, "big"))
        raise ChannelUserError(
            f"{self.name} refuses to send to multicast group {group}: without an explicit "
            "interface it would leave through the default route (eth0); use "
            "MulticastChannel(group, port, interface='127.0.0.1')")

    def _unicast(self, key: tuple[int, int]) -> tuple[int, int]:
        if not self.multicast_sender and key[0] >> 28 == 0xE:
            self._refuse_multicast(key[0])
        return key

    def _dest_key(self, dest: Address) -> tuple[int, int]:
        try:
            host, port = dest
        except (TypeError, ValueError):
            raise ChannelUserError(f"destination {dest!r} is not a (host, port) pair") from None
        return parse_ipv4(host, "destination"), check_port(port, allow_zero=False)

    def _resolve(self, dest: Address) -> tuple[int, int]:
        try:
            key = self._dest_cache.get(dest)
        except TypeError:  # unhashable: not an (host, port) tuple
            key = None
        if key is None:
            key = self._unicast(self._dest_key(dest))
            if len(self._dest_cache) > 1024:
                self._dest_cache.clear()
            self._dest_cache[tuple(dest)] = key
        return key

    def peer_address(self, peer_id: int) -> Address:
        return address_of_peer(peer_id)

    @property
    def local_address(self) -> Address:
        """The (host, port) the socket is bound to."""
        self._check_open()
        return self._sock.getsockname()

    def fileno(self) -> int:
        return self._fd if not self.closed else -1

    @property
    def max_frame_bytes(self) -> int:
        return min(super().max_frame_bytes, UDP_MAX_DATAGRAM_BYTES)

    # --- vectors -----------------------------------------------------------------------------
    @staticmethod
    def _batch_vector(batch: FrameBatch) -> _mmsg.MmsgVector:
        vec = batch.io_cache.get(_VECTOR_KEY)
        if vec is None:
            vec = batch.io_cache[_VECTOR_KEY] = _mmsg.MmsgVector(batch.capacity)
        return vec

    def _scratch_vector(self, n: int) -> _mmsg.MmsgVector:
        if self._scratch is None or self._scratch.capacity < n:
            self._scratch = _mmsg.MmsgVector(max(n, 64))
        return self._scratch

    def _destination(self, frames: object, dest: Dest, n: int) -> tuple[int, int, int]:
        """(mode, ipv4, port) for ``_mmsg.prepare_send``: 0 connected, 1 one address, 2 per
        slot from ``peer_ids``."""
        if dest is None:
            if self._default is not None:
                return 1, *self._default
            if self._connected:
                return 0, 0, 0
            raise ChannelUserError(f"{self.name}: send needs a destination: pass dest=(host, "
                                   "port) or make the channel with a default destination")
        if isinstance(dest, int):
            if dest == EACH_SLOT:
                if not isinstance(frames, FrameBatch):
                    raise ChannelUserError("dest=EACH_SLOT needs a FrameBatch (its peer_ids)")
                ids = frames.peer_ids[:n]
                if n <= 16:  # a few ids: a list beats two numpy reductions
                    listed = ids.tolist()
                    low, high = min(listed), max(listed)
                else:
                    low, high = int(ids.min()), int(ids.max())
                if low < 0 or high >> 48:
                    raise ChannelUserError("dest=EACH_SLOT: a slot's peer id is not a UDP peer")
                return 2, 0, 0
            if dest < 0 or dest >> 48:
                raise ChannelUserError(f"peer id {dest} is not a UDP peer")
            return 1, *self._unicast((dest >> 16, dest & 0xFFFF))
        return 1, *self._resolve(dest)

    # --- the interface -----------------------------------------------------------------------
    def send(self, frames: FrameBatch | FrameArrays | tuple, dest: Dest = None) -> int:
        self._check_open()
        if isinstance(frames, FrameBatch):
            arrays = FrameArrays(frames.buf, frames.offsets, frames.lengths, frames.count)
            vec = self._batch_vector(frames)
            peer_ids = frames.peer_ids
        else:
            arrays = as_frame_arrays(frames)
            vec = self._scratch_vector(arrays.count)
            peer_ids = None
        n = arrays.count
        if n == 0:
            return 0
        mode, ipv4, port = self._destination(frames, dest, n)
        # the first sendmmsg, the destinations and the send-time stamp: one kernel call
        total_bytes, k, err = vec.send(self._fd, arrays.buf, arrays.offsets, arrays.lengths, n,
                                       mode, ipv4, port, peer_ids, self.multicast_sender,
                                       time.time_ns() if self.stamp_send_ts else 0).tolist()
        if total_bytes < 0:
            self._refuse_multicast(int(frames.peer_ids[-1 - total_bytes]) >> 16)
        return self.finish_send(arrays, vec, total_bytes, k, err)

    def finish_send(self, arrays: FrameArrays, vec: _mmsg.MmsgVector, total_bytes: int, k: int,
                    err: int) -> int:
        """The rest of a send whose first ``sendmmsg`` (of ``arrays.count`` frames, ``vec``
        pointed at them) returned ``k`` with ``err``: retries, frames that can never go
        skipped and counted, statistics. Returns the frames taken (sent or skipped)."""
        n = arrays.count
        if k == n:
            self.stats.on_send(n, total_bytes)
            return n
        taken = 0
        skipped = 0
        skipped_bytes = 0
        while True:
            if k > 0:
                taken += k
            elif err == errno.EINTR:
                pass
            elif err in _RETRY_LATER:
                self.stats.on_backpressure(n - taken)
                break
            else:  # this frame can never go: count it and go on with the next
                reason = errno.errorcode.get(err, str(err)).lower()
                self.stats.on_error(f"send_{reason}")
                self.stats.on_drop(f"send_{reason}")
                skipped += 1
                skipped_bytes += int(arrays.lengths[taken])
                taken += 1
            if taken >= n:
                break
            k, err = vec.sendmmsg(self._fd, taken, n - taken)
        if taken > skipped:
            taken_bytes = total_bytes if taken == n else int(arrays.lengths[:taken].sum())
            self.stats.on_send(taken - skipped, taken_bytes - skipped_bytes)
        return taken

    def receive(self, batch: FrameBatch, timeout_ns: int = 0) -> int:
        self._check_open()
        vec = self._batch_vector(batch)
        cap = batch.capacity
        deadline = time.monotonic_ns() + timeout_ns if timeout_ns > 0 else 0
        while True:
            n, err = vec.receive(self._fd, batch.buf, batch.offsets, batch.slot_bytes, cap,
                                 batch.lengths, batch.peer_ids, batch.recv_ts_ns, time.time_ns())
            if self.finish_receive(batch, n, err):
                return batch.count
            if timeout_ns == 0:
                return 0
            if timeout_ns == WAIT_FOREVER:
                wait_ms = -1
            else:
                left_ns = deadline - time.monotonic_ns()
                if left_ns <= 0:
                    return 0
                wait_ms = math.ceil(left_ns / 1e6)
            self._poller.poll(wait_ms)
            if self.closed:
                return 0

    def finish_receive(self, batch: FrameBatch, n: int, err: int) -> int:
        """What a ``recvmmsg`` into ``batch`` returned (``n`` datagrams with ``err`` truncated,
        or -1 with errno ``err``): truncated datagrams dropped and counted, ``batch.count``
        set, statistics. Returns the frames now in the batch."""
        if n > 0:
            if err:  # truncated datagrams: dropped, counted
                n = self._compact(batch, batch.lengths[:n] >= 0, n)
            batch.count = n
            if n:
                self.stats.on_batch_received(batch)
            return n
        if n < 0 and err not in _RETRY_LATER and err != errno.EINTR:
            # e.g. ECONNREFUSED left by an earlier send on a connected socket
            self.stats.on_error(f"recv_{errno.errorcode.get(err, str(err)).lower()}")
        batch.count = 0
        return 0

    def io_vector(self, batch: FrameBatch) -> _mmsg.MmsgVector:
        """The I/O vector this channel receives into and sends from ``batch`` with (for a
        kernel that makes the system calls itself: appliance/dataplane/express.py)."""
        self._check_open()
        return self._batch_vector(batch)

    def _compact(self, batch: FrameBatch, keep: np.ndarray, n: int) -> int:
        """Drop truncated datagrams, moving later frames down (rare: only hostile/oversize)."""
        kept = np.nonzero(keep)[0]
        self.stats.on_drop("oversized", n - len(kept))
        for j, i in enumerate(kept):
            if i != j:
                length = int(batch.lengths[i])
                batch.slot(j)[:length] = batch.slot(i)[:length]
        for arr in (batch.lengths, batch.peer_ids, batch.recv_ts_ns):
            arr[: len(kept)] = arr[kept]
        return len(kept)

    def _close(self) -> None:
        sock = getattr(self, "_sock", None)
        if sock is not None:
            try:
                self._poller.unregister(self._fd)
            except (KeyError, ValueError, AttributeError):
                pass
            sock.close()


class UdpChannel(DatagramChannel):
    """UDP unicast: ``UdpChannel(bind=("127.0.0.1", 0), dest=("127.0.0.1", port))``.

    ``dest`` is the default destination of ``send`` (else pass one per call); ``connect=True``
    connects the socket to ``dest`` (the kernel then filters other sources and reports
    ``ECONNREFUSED``, counted in ``errors``).
    """

    kind = "udp"

    def __init__(self, bind: Address = ("127.0.0.1", 0), *, dest: Address | None = None,
                 connect: bool = False, rcvbuf_bytes: int = UDP_RCVBUF_BYTES,
                 sndbuf_bytes: int = UDP_SNDBUF_BYTES, reuse_address: bool = False,
                 kernel_timestamps: bool = True, name: str | None = None,
                 stamp_send_ts: bool = True) -> None:
        host, port = _split(bind, "bind address")
        parse_ipv4(host, "bind address")
        check_port(port)
        if connect and dest is None:
            raise ChannelUserError("connect=True needs dest=(host, port)")
        sock = make_udp_socket(rcvbuf_bytes, sndbuf_bytes, reuse_address)
        try:
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise os_error(f"binding UDP {host}:{port}", exc) from None
            if connect:
                dhost, dport = _split(dest, "destination")
                if parse_ipv4(dhost, "destination") >> 28 == 0xE:
                    raise ChannelUserError(f"cannot connect a unicast channel to multicast "
                                           f"group {dhost}; use MulticastChannel")
                check_port(dport, allow_zero=False)
                try:
                    sock.connect((dhost, dport))
                except OSError as exc:
                    raise os_error(f"connecting UDP to {dhost}:{dport}", exc) from None
            super().__init__(sock, default_dest=None if connect else dest, connected=connect,
                             kernel_timestamps=kernel_timestamps,
                             name=name or f"udp:{host}:{sock.getsockname()[1]}",
                             stamp_send_ts=stamp_send_ts, rcvbuf_bytes=rcvbuf_bytes)
        except BaseException:
            sock.close()
            raise


def _split(address: object, what: str) -> Address:
    try:
        host, port = address  # type: ignore[misc]
    except (TypeError, ValueError):
        raise ChannelUserError(f"{what} {address!r} is not a (host, port) pair") from None
    return host, port


def rcvbuf_granted(sock: socket.socket) -> int:
    """The receive buffer the kernel gave ``sock``, in the units ``SO_RCVBUF`` is asked in
    (``getsockopt`` reports twice that: the kernel doubles it for its bookkeeping)."""
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2


def warn_if_rcvbuf_capped(name: str, sock: socket.socket, asked: int) -> None:
    """Log a warning when the kernel capped the receive buffer ``asked`` for (at
    ``net.core.rmem_max``): bursts larger than what it got are dropped by the kernel."""
    got = rcvbuf_granted(sock)
    if got < asked:
        log.warning("channels: %s: the kernel capped the socket receive buffer at %d bytes "
                    "(asked for %d; net.core.rmem_max limits it): bursts beyond it are "
                    "dropped; raise the limit with `sysctl -w net.core.rmem_max=%d`",
                    name, got, asked, asked)


def make_udp_socket(rcvbuf_bytes: int, sndbuf_bytes: int, reuse_address: bool) -> socket.socket:
    """An AF_INET datagram socket with the buffers asked for."""
    if rcvbuf_bytes <= 0 or sndbuf_bytes <= 0:
        raise ChannelUserError("socket buffer sizes must be positive")
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError as exc:
        raise os_error("creating a UDP socket", exc) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf_bytes)
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    except OSError as exc:
        sock.close()
        raise os_error("setting UDP socket options", exc) from None
    return sock
