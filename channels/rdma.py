"""RDMA channel: frames over an RC queue pair (pyverbs), many frames to an RDMA SEND.

One ``RdmaChannel`` is one reliable connection between two ends::

    with RdmaListener(("192.168.200.1", 0)) as listener:     # end A: TCP for the set-up
        ...                                                  # end B starts:
        # RdmaChannel(connect=("192.168.200.1", port), bind="192.168.200.2")
        with listener.accept() as ch:                        # -> an RdmaChannel
            n = ch.receive(batch, timeout_ns=0)

Set-up goes over an out-of-band TCP connection: each end tells the other its queue pair
number, PSN, GID, MTU, receive depth and where its credit word is (``_rdma_verbs.QpInfo``),
both move their queue pairs to RTS and say READY. The device, port and GID are those of the
TCP connection's local IPv4 address (its IPv4-mapped RoCE v2 GID), unless ``device``/
``gid_index`` say otherwise. The TCP connection stays open: it is how an end learns that its
peer closed (``BYE <packets>``, sent once every packet it posted was acknowledged) or died
(end of stream without it); ``_PeerControl`` parses it.

Data path, all in preallocated registered memory (``_rdma_verbs.Endpoint``):

- ``send`` packs frames into send-ring slots (``_rdma_kernels._pack``, numba: many frames to
  a packet, a frame longer than a packet cut into segments) and posts each packet with the
  slot's prebuilt work request. A frame is taken whole or not at all.
- Credits instead of receiver-not-ready retries: an end may have at most as many packets in
  flight as the peer has receives posted. The receiver reposts each receive slot once its
  packet is unpacked and RDMA-writes its running total of posted receives into the sender's
  credit word (no receive needed on the other side, so credits cannot deadlock). A sender
  out of credits or free slots takes fewer frames (``stats.backpressure``): the same
  backpressure as a full socket buffer or ring.
- ``receive`` polls the receive completion queue and unpacks packets into the batch
  (``_rdma_kernels._unpack``); a packet the batch cannot hold whole waits for the next call.
  With ``timeout_ns > 0`` it busy-polls under an idle strategy (spin, yield, then park).

Failure is reported, never hidden: a send completion in error (the peer stopped answering:
``RETRY_EXC_ERR``; the peer's receive queue stayed empty: ``RNR_RETRY_EXC_ERR``) or the
TCP connection ending raises ``RdmaPeerGoneError``/``RdmaReceiverNotReadyError`` once every
frame that did arrive has been delivered (after a goodbye: every packet the peer counted in
it); the channel is then unusable except for ``close()``. Once the peer has said goodbye or
its end of the TCP connection is gone, that is what is reported: the verbs errors its queue
pair's end leaves behind (a credit write never acknowledged, flushed receives) are expected,
not a second failure. Peer ids are the peer's queue pair number; ``peer_address`` gives its TCP
address.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
import time
from collections import deque
from typing import Any

import numpy as np

from channels import _rdma_kernels as kernels
from channels._rdma_errors import (
    RdmaDeviceError,
    RdmaGidError,
    RdmaNoDeviceError,
    RdmaPeerGoneError,
    RdmaPortDownError,
    RdmaReceiverNotReadyError,
)
from channels._rdma_layout import MIN_PACKET_BYTES, packets_for_frame
from channels.base import (
    EACH_SLOT,
    NO_PEER,
    WAIT_FOREVER,
    Channel,
    Dest,
    FrameArrays,
    FrameBatch,
    as_frame_arrays,
    stamp_send_ts,
)
from channels.errors import ChannelUserError
from datapath.agent import BackoffIdle
from datapath.config import MAX_FRAME_BYTES

__all__ = [
    "RdmaChannel",
    "RdmaDeviceError",
    "RdmaGidError",
    "RdmaListener",
    "RdmaNoDeviceError",
    "RdmaPeerGoneError",
    "RdmaPortDownError",
    "RdmaReceiverNotReadyError",
    "rdma_available",
]

RDMA_PACKET_BYTES = 16_384
"""Bytes of one RDMA SEND (a ring slot): frames are packed up to this, larger ones cut."""
RDMA_SEND_PACKETS = 64
"""Send-ring slots: packets in flight at most (also bounded by the peer's credits)."""
RDMA_RECV_PACKETS = 64
"""Receive-ring slots: receives kept posted, the credits the peer gets."""
RDMA_PORT_NUM = 1
"""Device port used unless told otherwise."""
RDMA_ACK_TIMEOUT_EXP = 16
"""Local ACK timeout, 4.096 us * 2**exp (16: ~268 ms; times ``RDMA_RETRY_COUNT`` + 1 is how
long a vanished peer takes to show as a failed send)."""
RDMA_RETRY_COUNT = 7
"""Transport retries before a send fails with RETRY_EXC_ERR (the peer is gone)."""
RDMA_RNR_RETRY = 6
"""Receiver-not-ready retries before RNR_RETRY_EXC_ERR (7 would retry forever; credits keep
this from happening with a well-behaved peer)."""
RDMA_MIN_RNR_TIMER = 14
"""The RNR NAK delay this end asks for (14: 1.28 ms)."""
RDMA_CONNECT_TIMEOUT_NS = 60_000_000_000
"""Longest wait for the TCP exchange and the peer's READY (a VM under emulation is slow)."""
RDMA_CLOSE_LINGER_NS = 2_000_000_000
"""``close()`` waits this long at most for packets in flight to be acknowledged; with some
still unacknowledged it closes without a goodbye (the peer then reports it gone, not closed:
those frames may be lost)."""
RDMA_PEER_CHECK_NS = 10_000_000
"""An idle ``receive`` looks at the TCP connection (goodbye, end of stream) this often."""
RDMA_CREDIT_BATCH_FRACTION = 2
"""Credits go back when 1/this of the receive ring has been reposted since the last report
(or sooner when the peer is running low)."""

_HELLO_VERSION = 2
"""2: the goodbye carries the count of packets sent (``BYE <packets>``)."""
_READY = b"READY\n"
_BYE = b"BYE"
_CONTROL_LINE_MAX_BYTES = 64
_CREDIT_WR_ID = 1 << 40


def rdma_available() -> tuple[bool, str]:
    """(True, devices) when pyverbs loads and sees a device; else (False, why not)."""
    from channels import _rdma_verbs

    try:
        return True, ", ".join(_rdma_verbs.device_names())
    except RdmaNoDeviceError as exc:
        return False, str(exc)


def _ipv4(text: str, what: str) -> str:
    try:
        return str(ipaddress.IPv4Address(text))
    except (ipaddress.AddressValueError, ValueError, TypeError):
        raise ChannelUserError(f"rdma: {what} {text!r} is not a numeric IPv4 address "
                               "(names are not resolved)") from None


def _address(address: object, what: str) -> tuple[str, int]:
    try:
        host, port = address  # type: ignore[misc]
    except (TypeError, ValueError):
        raise ChannelUserError(f"rdma: {what} {address!r} is not a (host, port) pair") from None
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ChannelUserError(f"rdma: {what} port {port!r} is not in [0, 65535]")
    return _ipv4(host, what), port


class _PeerControl:
    """What the peer says on the set-up TCP connection once both ends are READY.

    One message may come, ``BYE <packets>\n``: the peer closed the channel in order, after
    every one of the ``packets`` RDMA sends it made in all had been acknowledged; end of
    stream follows. End of stream without it is a peer that died (or closed with packets
    unacknowledged). TCP may cut those bytes anywhere or join them, so they are parsed as a
    stream: ``feed`` each ``recv``'s bytes, ``b""`` at end of stream.
    """

    def __init__(self, peer: object) -> None:
        self.peer = peer
        self.said_bye = False
        self.packets_sent = 0
        """The packets the peer sent in all (from its goodbye; 0 without one)."""
        self.ended = False
        self._pending = b""

    @property
    def gone(self) -> bool:
        """The peer said goodbye or its end of the connection is gone."""
        return self.said_bye or self.ended

    def feed(self, data: bytes) -> None:
        """Take the bytes of one ``recv`` (``b""``: end of stream); bad bytes raise
        ``RdmaDeviceError`` (EPROTO)."""
        if not data:
            self.ended = True
            return
        if self.said_bye:
            raise self._error(data, " after its goodbye")
        self._pending += data
        line, newline, rest = self._pending.partition(b"\n")
        if not newline:
            if len(self._pending) > _CONTROL_LINE_MAX_BYTES:
                raise self._error(self._pending, "")
            return
        word, _, count = line.partition(b" ")
        if word != _BYE or not count.isdigit() or rest:
            raise self._error(self._pending, "")
        self.said_bye, self.packets_sent = True, int(count)
        self._pending = b""

    def _error(self, data: bytes, when: str) -> RdmaDeviceError:
        return RdmaDeviceError(
            f"rdma: the peer at {self.peer} sent {data[:80]!r} on the set-up connection{when}; "
            f"only 'BYE <packets>' belongs there: is it a topicwire RDMA channel of set-up "
            f"version {_HELLO_VERSION}?", errno=errno.EPROTO)


class RdmaListener:
    """Accepts RDMA channels: a TCP listening socket for the set-up exchange.

    ``accept()`` returns a connected ``RdmaChannel``; channel options given here apply to
    every accepted channel. ``close()`` is safe twice.
    """

    def __init__(self, bind: tuple[str, int] = ("127.0.0.1", 0), **options: Any) -> None:
        host, port = _address(bind, "listen address")
        self.options = options
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            self._sock.listen(8)
        except OSError as exc:
            self._sock.close()
            raise RdmaDeviceError(f"rdma: listening on {host}:{port} failed: {exc}",
                                  errno=exc.errno) from None

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) peers connect to."""
        return self._sock.getsockname()

    def accept(self, timeout_ns: int = WAIT_FOREVER, **options: Any) -> RdmaChannel:
        """Wait for one peer and set up the channel with it."""
        if self._sock.fileno() < 0:
            raise ChannelUserError("rdma: the listener is closed")
        self._sock.settimeout(None if timeout_ns == WAIT_FOREVER else timeout_ns / 1e9)
        try:
            conn, _ = self._sock.accept()
        except TimeoutError:
            raise RdmaDeviceError("rdma: no peer connected in time; start the peer or wait "
                                  "longer", errno=errno.ETIMEDOUT) from None
        except OSError as exc:
            raise RdmaDeviceError(f"rdma: accepting failed: {exc} (listener closed?)",
                                  errno=exc.errno) from None
        return RdmaChannel(_sock=conn, **{**self.options, **options})

    def close(self) -> None:
        """Stop listening (an ``accept`` waiting in another thread returns with an error)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def __enter__(self) -> RdmaListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RdmaChannel(Channel):
    """Frames over one RDMA reliable connection (module doc).

    ``RdmaChannel(connect=(host, port), bind=LOCAL_IPV4)`` connects to an ``RdmaListener``;
    ``bind`` picks this end's address, hence its RDMA device and GID (without it, the
    kernel's choice of source address for ``host``).
    """

    kind = "rdma"

    def __init__(self, connect: tuple[str, int] | None = None, *, bind: str | None = None,
                 device: str | None = None, port_num: int = RDMA_PORT_NUM,
                 gid_index: int | None = None, packet_bytes: int = RDMA_PACKET_BYTES,
                 send_packets: int = RDMA_SEND_PACKETS, recv_packets: int = RDMA_RECV_PACKETS,
                 max_frame_bytes: int = MAX_FRAME_BYTES,
                 connect_timeout_ns: int = RDMA_CONNECT_TIMEOUT_NS,
                 name: str | None = None, stamp_send_ts: bool = True,
                 _sock: socket.socket | None = None) -> None:
        super().__init__(name=name or "rdma", stamp_send_ts=stamp_send_ts)
        self._sock: socket.socket | None = None
        self._ep = None
        self._failure: Exception | None = None
        if (connect is None) == (_sock is None):
            raise ChannelUserError("rdma: give connect=(host, port) (or accept from an "
                                   "RdmaListener)")
        if packet_bytes % 8 or packet_bytes < MIN_PACKET_BYTES:
            raise ChannelUserError(f"rdma: packet_bytes must be a multiple of 8, at least "
                                   f"{MIN_PACKET_BYTES}, not {packet_bytes}")
        if not 32 <= max_frame_bytes <= MAX_FRAME_BYTES:
            raise ChannelUserError(f"rdma: max_frame_bytes must be in [32, {MAX_FRAME_BYTES}]")
        need = packets_for_frame(max_frame_bytes, packet_bytes)
        if min(send_packets, recv_packets) < need:
            raise ChannelUserError(
                f"rdma: a {max_frame_bytes}-byte frame takes {need} packets of {packet_bytes} "
                f"bytes; send_packets and recv_packets must be at least that")
        self._max_frame = max_frame_bytes
        try:
            self._sock = _sock if _sock is not None else self._dial(connect, bind,
                                                                    connect_timeout_ns)
            self._setup(device, port_num, gid_index, packet_bytes, send_packets, recv_packets,
                        connect_timeout_ns)
        except BaseException:
            self.close()
            raise

    # --- set-up --------------------------------------------------------------------------
    @staticmethod
    def _dial(connect: tuple[str, int], bind: str | None, timeout_ns: int) -> socket.socket:
        host, port = _address(connect, "peer address")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_ns / 1e9)
            if bind is not None:
                sock.bind((_ipv4(bind, "local address"), 0))
            sock.connect((host, port))
        except OSError as exc:
            sock.close()
            raise RdmaDeviceError(f"rdma: connecting to {host}:{port} for the set-up failed: "
                                  f"{exc}; is the peer's RdmaListener up?",
                                  errno=exc.errno) from None
        return sock

    def _setup(self, device: str | None, port_num: int, gid_index: int | None,
               packet_bytes: int, send_packets: int, recv_packets: int,
               timeout_ns: int) -> None:
        from channels import _rdma_verbs as verbs

        sock = self._sock
        sock.settimeout(timeout_ns / 1e9)
        local = sock.getsockname()[0]
        self._peer_tcp = sock.getpeername()
        where = verbs.choose_port_gid(local, device=device, port=port_num, gid_index=gid_index)
        self._ep = ep = verbs.Endpoint(where, packet_bytes=packet_bytes,
                                       send_packets=send_packets, recv_packets=recv_packets)
        try:
            ep.post_all_receives()
        except ep.v.pyverbs_error.PyverbsError as exc:
            raise verbs.verbs_error("posting the receive ring", exc) from None
        mine = ep.info()
        peer = self._exchange({"version": _HELLO_VERSION, **mine.as_dict()})
        if peer.get("version") != _HELLO_VERSION:
            raise RdmaDeviceError(f"rdma: the peer at {self._peer_tcp} speaks set-up version "
                                  f"{peer.get('version')}, not {_HELLO_VERSION}",
                                  errno=errno.EPROTO)
        peer.pop("version")
        try:
            self.peer = verbs.QpInfo(**peer)
        except TypeError:
            raise RdmaDeviceError(f"rdma: the peer at {self._peer_tcp} sent a set-up this "
                                  f"end does not understand: {peer}", errno=errno.EPROTO) from None
        if packets_for_frame(self._max_frame, packet_bytes) > self.peer.recv_packets:
            raise ChannelUserError(f"rdma: the peer posts {self.peer.recv_packets} receives, "
                                   "fewer than one largest frame needs; make it with more "
                                   "recv_packets or this end with larger packet_bytes")
        if self.peer.packet_bytes < packet_bytes:
            raise ChannelUserError(f"rdma: the peer's packets are {self.peer.packet_bytes} "
                                   f"bytes, this end's {packet_bytes}: make both the same")
        ep.connect(self.peer, verbs.QpTimers(RDMA_ACK_TIMEOUT_EXP, RDMA_RETRY_COUNT,
                                             RDMA_RNR_RETRY, RDMA_MIN_RNR_TIMER))
        sock.sendall(_READY)
        if self._read_line() != _READY:
            raise RdmaPeerGoneError(f"rdma: the peer at {self._peer_tcp} did not get ready")
        sock.setblocking(False)
        self.name = f"rdma:{where.device}:{mine.qpn}>{self.peer.qpn}"
        self.device = where.device
        self.gid_index = where.gid_index
        self.peer_id = self.peer.qpn
        # data-path state
        ep.credit[0] = self.peer.recv_packets
        self._packet_bytes = packet_bytes
        self._send_slot = 0
        self._in_flight = 0
        self._packets_sent = 0
        self._packets_received = 0
        self._posted_total = recv_packets
        self._credit_reported = recv_packets
        self._credit_pending = False
        self._ready: deque[tuple[int, int]] = deque()
        self._current: tuple[int, int] | None = None
        self._cursor = 0
        self._reassembly = np.zeros(self._max_frame, np.uint8)
        self._state = np.zeros(2, np.int64)
        self._out = np.zeros(5, np.int64)
        self._packet_lengths = np.zeros(send_packets, np.int64)
        self._control = _PeerControl(self._peer_tcp)
        self._next_peer_check = 0
        self._idle = BackoffIdle()
        self._credit_low = max(1, recv_packets // 4)
        self._credit_step = max(1, recv_packets // RDMA_CREDIT_BATCH_FRACTION)

    def _exchange(self, mine: dict) -> dict:
        try:
            self._sock.sendall(json.dumps(mine).encode() + b"\n")
            line = self._read_line()
        except OSError as exc:
            raise RdmaPeerGoneError(f"rdma: the set-up exchange with {self._peer_tcp} failed: "
                                    f"{exc}") from None
        try:
            return json.loads(line)
        except ValueError:
            raise RdmaDeviceError(f"rdma: the peer at {self._peer_tcp} sent {line[:80]!r}, "
                                  "not a set-up message; is it a topicwire RDMA channel?",
                                  errno=errno.EPROTO) from None

    def _read_line(self) -> bytes:
        data = b""
        while not data.endswith(b"\n"):
            try:
                chunk = self._sock.recv(1)
            except TimeoutError:
                raise RdmaDeviceError(f"rdma: the peer at {self._peer_tcp} did not answer "
                                      "the set-up in time", errno=errno.ETIMEDOUT) from None
            if not chunk:
                raise RdmaPeerGoneError(f"rdma: the peer at {self._peer_tcp} hung up during "
                                        "the set-up")
            data += chunk
            if len(data) > 65_536:
                raise RdmaDeviceError("rdma: the set-up message is too long",
                                      errno=errno.EPROTO)
        return data

    # --- the interface -------------------------------------------------------------------
    @property
    def max_frame_bytes(self) -> int:
        return self._max_frame

    def peer_address(self, peer_id: int) -> tuple[str, int]:
        """The peer's TCP (host, port) for its peer id (its queue pair number)."""
        return self._peer_tcp

    def _check_usable(self) -> None:
        self._check_open()
        if self._failure is not None:
            raise self._failure

    def send(self, frames: FrameBatch | FrameArrays | tuple, dest: Dest = None) -> int:
        self._check_usable()
        if isinstance(frames, FrameBatch):
            arrays = FrameArrays(frames.buf, frames.offsets, frames.lengths, frames.count)
        else:
            arrays = as_frame_arrays(frames)
        n = arrays.count
        if n == 0:
            return 0
        if dest is not None and dest != self.peer_id:
            if dest != EACH_SLOT or not isinstance(frames, FrameBatch) or np.any(
                    (frames.peer_ids[:n] != self.peer_id) & (frames.peer_ids[:n] != NO_PEER)):
                raise ChannelUserError(f"{self.name}: an RDMA channel has one peer "
                                       f"(id {self.peer_id}); send with dest=None")
        if self.stamp_send_ts:
            stamp_send_ts(arrays, n)
        ep = self._ep
        self._reap_sends()
        if self._control.gone:  # it said goodbye or went away: nothing more reaches it
            self._check_peer(deliver_first=False)
        credits = int(ep.credit[0]) - self._packets_sent
        max_packets = min(ep.send_packets - self._in_flight, credits)
        if max_packets <= 0:
            self.stats.on_backpressure(n)
            if credits <= 0:  # a peer that stopped taking packets may be gone: look
                self._check_peer(deliver_first=False)
            return 0
        out = self._out
        kernels._pack(arrays.buf, arrays.offsets, arrays.lengths, n, ep.send_buf,
                      self._send_slot, ep.send_packets, self._packet_bytes, max_packets,
                      self._packets_sent + 1, self._max_frame, self._packet_lengths, out)
        taken, packets, refused, nbytes = int(out[0]), int(out[1]), int(out[2]), int(out[3])
        slot = self._send_slot
        lengths = self._packet_lengths
        try:
            for k in range(packets):
                ep.post_send((slot + k) % ep.send_packets, int(lengths[k]))
                self._in_flight += 1
                self._packets_sent += 1
        except ep.v.pyverbs_error.PyverbsError as exc:
            self._fail(RdmaPeerGoneError(f"{self.name}: posting a send failed ({exc}); the "
                                         "queue pair is in error: the peer is gone or "
                                         "the device went away; reconnect"))
        self._send_slot = (slot + packets) % ep.send_packets
        if refused:
            self.stats.on_drop("oversized", refused)
            self.stats.on_error("oversized", refused)
        if taken < n:
            self.stats.on_backpressure(n - taken)
        if taken > refused:
            self.stats.on_send(taken - refused, nbytes)
        return taken

    def receive(self, batch: FrameBatch, timeout_ns: int = 0) -> int:
        self._check_open()
        if self._failure is not None:  # deliver what arrived before the failure, then say so
            if self._current is None and not self._ready:
                raise self._failure
            return self._poll(batch)
        n = self._poll(batch)
        if n or timeout_ns == 0:
            return n
        idle = self._idle
        idle.reset()
        deadline = None if timeout_ns == WAIT_FOREVER else time.monotonic_ns() + timeout_ns
        while not n:
            if deadline is not None and time.monotonic_ns() >= deadline:
                break
            idle.idle(0)
            n = self._poll(batch)
        return n

    # --- data path -----------------------------------------------------------------------
    def _poll(self, batch: FrameBatch) -> int:
        ep = self._ep
        out, cap, packet_bytes = self._out, batch.capacity, self._packet_bytes
        n = 0
        while n < cap:
            if self._current is None:
                if not self._ready and not self._poll_receives():
                    break
                self._current = self._ready.popleft()
                self._cursor = 0
            slot, nbytes = self._current
            kernels._unpack(ep.recv_buf, slot * packet_bytes, nbytes, self._cursor,
                            self._packets_received + 1, self._max_frame, batch.buf,
                            batch.slot_bytes, batch.lengths, n, cap, self._reassembly,
                            self._state, out)
            n += int(out[0])
            self._cursor = int(out[1])
            if out[2]:
                self.stats.on_drop("torn_record", int(out[2]))
            if out[3]:
                self.stats.on_drop("oversized", int(out[3]))
            if out[4]:
                self.stats.on_drop("bad_packet")
                self.stats.on_error("bad_packet")
            if self._cursor < nbytes:
                break  # the batch is full; the rest of this packet waits
            self._current = None
            self._packets_received += 1
            if self._control.gone or self._failure is not None:
                continue  # a peer that left, or a dead queue pair, takes no more reposts
            try:
                ep.post_recv(slot)
            except ep.v.pyverbs_error.PyverbsError as exc:
                if not self._peer_left():
                    self._fail(RdmaPeerGoneError(f"{self.name}: reposting a receive failed "
                                                 f"({exc}); the queue pair is in error"))
            self._posted_total += 1
        batch.count = n
        if n:
            batch.peer_ids[:n] = self.peer_id
            batch.recv_ts_ns[:n] = time.time_ns()
            self.stats.on_batch_received(batch)
        if self._failure is None:
            self._return_credits()
            if not n and self._current is None and not self._ready:
                self._check_peer()
        return n

    def _poll_receives(self) -> int:
        """Move receive completions to the ready queue; how many packets arrived."""
        ep = self._ep
        if self._failure is not None:
            return 0
        _, wcs = ep.recv_cq.poll(ep.recv_packets)
        success = ep.v.enums.IBV_WC_SUCCESS
        arrived = 0
        for wc in wcs:
            if wc.status != success:
                self._completion_failed(wc, "receive")  # returns for a flush after a peer left
                continue
            self._ready.append((int(wc.wr_id), int(wc.byte_len)))
            arrived += 1
        return arrived

    def _reap_sends(self) -> None:
        ep = self._ep
        if not self._in_flight and not self._credit_pending:
            return
        _, wcs = ep.send_cq.poll(ep.send_packets + 1)
        success = ep.v.enums.IBV_WC_SUCCESS
        for wc in wcs:
            if wc.status != success:
                self._completion_failed(wc, "send")
            if wc.wr_id == _CREDIT_WR_ID:
                self._credit_pending = False
            else:
                self._in_flight -= 1

    def _return_credits(self) -> None:
        """Tell the peer about reposted receives, in batches (module doc)."""
        if self._credit_pending:
            self._reap_sends()
        if self._credit_pending or self._control.gone:  # a peer that left takes no credits
            return
        unreported = self._posted_total - self._credit_reported
        if unreported <= 0:
            return
        peer_left = self._credit_reported - self._packets_received
        if unreported >= self._credit_step or peer_left <= self._credit_low:
            ep = self._ep
            try:
                ep.post_credit(self._posted_total)
            except ep.v.pyverbs_error.PyverbsError as exc:
                if not self._peer_left():
                    self._fail(RdmaPeerGoneError(f"{self.name}: returning credits failed "
                                                 f"({exc}); the queue pair is in error"))
            self._credit_reported = self._posted_total
            self._credit_pending = True

    def _completion_failed(self, wc: Any, what: str) -> None:
        from channels._rdma_verbs import wc_status_name

        e = self._ep.v.enums
        if wc.status in (e.IBV_WC_RETRY_EXC_ERR, e.IBV_WC_WR_FLUSH_ERR) and self._peer_left():
            return
        status = wc_status_name(wc.status)
        counts = (f"{self._packets_sent} packets sent, {self._packets_received} received")
        if wc.status == e.IBV_WC_RNR_RETRY_EXC_ERR:
            error: Exception = RdmaReceiverNotReadyError(
                f"{self.name}: the peer had no receive posted for our packets, "
                f"{RDMA_RNR_RETRY} retries running ({status}; {counts}); it stopped "
                "reposting receives (a peer that ignores credits): reconnect")
        elif wc.status == e.IBV_WC_RETRY_EXC_ERR:
            error = RdmaPeerGoneError(
                f"{self.name}: the peer stopped acknowledging ({status} after "
                f"{RDMA_RETRY_COUNT} retries; {counts}); it is gone: reconnect")
        elif wc.status == e.IBV_WC_WR_FLUSH_ERR:
            error = self._failure or RdmaPeerGoneError(
                f"{self.name}: the queue pair went into error and flushed a {what} "
                f"({status}; {counts}); the peer is gone or the device failed: reconnect")
        else:
            error = RdmaDeviceError(f"{self.name}: a {what} completed with {status} "
                                    f"(vendor error {wc.vendor_err}; {counts})",
                                    errno=errno.EIO)
        self.stats.on_error(f"{what}_{status.lower()}")
        self._fail(error)

    def _peer_left(self) -> bool:
        """Has the peer said goodbye or ended the TCP connection (read now)? Then a verbs error
        that says it cannot be reached is what its vanished queue pair leaves behind (a credit
        write never acknowledged, the error state that follows, flushed receives): expected,
        not a failure of its own; ``_check_peer`` reports the peer's leaving."""
        if self._failure is not None:
            return False
        self._read_control()
        return self._control.gone

    @property
    def failure(self) -> Exception | None:
        return self._failure

    def _fail(self, error: Exception) -> None:
        if self._failure is None:
            self._failure = error
        raise self._failure

    def _check_peer(self, deliver_first: bool = True) -> None:
        """Has the peer said goodbye or gone (TCP end of stream)? Then fail the channel with
        that: with ``deliver_first`` (the caller has nothing left to deliver) once every
        packet it sent has been delivered, else at once (what arrived is still delivered)."""
        control = self._control
        if not control.gone:
            now = time.monotonic_ns()
            if now < self._next_peer_check:
                return
            self._next_peer_check = now + RDMA_PEER_CHECK_NS
            self._read_control()
            if not control.gone:
                return
        arrived = self._poll_receives()  # frames that beat the goodbye go first
        if deliver_first and (arrived or self._packets_received < control.packets_sent):
            return
        counts = f"{self._packets_received} packets received, {self._packets_sent} sent"
        if control.said_bye:
            error = RdmaPeerGoneError(f"{self.name}: the peer closed the channel ({counts})",
                                      orderly=True)
        else:
            error = RdmaPeerGoneError(f"{self.name}: the peer went away without closing "
                                      f"(its process ended, or it closed with packets "
                                      f"unacknowledged; {counts}); frames it had not yet "
                                      "sent are lost: reconnect")
        self.stats.on_error("peer_gone")
        self._fail(error)

    def _read_control(self) -> None:
        """Hand what the TCP connection holds to the peer's control parser (not blocking)."""
        control = self._control
        while not control.ended:
            try:
                data = self._sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # reset: the peer is as gone as at end of stream
                data = b""
            try:
                control.feed(data)
            except RdmaDeviceError as exc:
                self.stats.on_error("control_protocol")
                self._fail(exc)

    # --- teardown ------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Packets posted and not yet acknowledged by the peer."""
        return self._in_flight if self._ep is not None else 0

    def _linger(self) -> bool:
        """Wait up to ``RDMA_CLOSE_LINGER_NS`` for every packet posted to be acknowledged;
        True when all were (and the peer is still there), so a goodbye may count them."""
        if self._failure is not None or self._control.gone:
            return False
        deadline = time.monotonic_ns() + RDMA_CLOSE_LINGER_NS
        try:
            while self._in_flight and time.monotonic_ns() < deadline:
                self._reap_sends()
                time.sleep(0)
        except Exception:  # the peer is gone already: no goodbye
            return False
        return not self._in_flight and self._failure is None and not self._control.gone

    def _close(self) -> None:
        ep = getattr(self, "_ep", None)
        sock = getattr(self, "_sock", None)
        # only a channel past its set-up says goodbye, and only for packets all acknowledged
        said_bye = ep is not None and hasattr(self, "_control") and self._linger()
        if sock is not None:
            try:
                if said_bye:
                    sock.setblocking(True)
                    sock.settimeout(1.0)
                    sock.sendall(b"%s %d\n" % (_BYE, self._packets_sent))
                    sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            sock.close()
            self._sock = None
        if ep is not None:
            ep.close()
            self._ep = None


def warm_up() -> None:
    """Compile/load the RDMA kernels (no device needed)."""
    kernels.warm_up()
