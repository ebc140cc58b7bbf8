"""recvmmsg/sendmmsg through cffi (ABI mode on libc) with I/O vectors prebuilt in numpy arrays.

An ``MmsgVector`` owns, for up to ``capacity`` datagrams, the ``struct mmsghdr`` array, one
``struct iovec`` per datagram, one ``sockaddr_in`` per datagram and one control buffer per
datagram (room for an ``SCM_TIMESTAMPNS``), all as numpy structured arrays whose dtypes come
from cffi's own layout of the declarations below. The pointers inside them are plain integers
(``ffi.from_buffer`` addresses), so pointing the vector at a batch's slots, setting lengths,
filling destination addresses, the system call itself and copying out what the kernel wrote
are one numba kernel call per batch over the same memory viewed as 64-bit words
(``receive_datagrams``, ``send_datagrams``; the appliance's express kernel calls them inside
its own): no Python per datagram. Only a send's retry after an error goes through cffi
(``sendmmsg``).

Layout of one datagram's entries (x86-64 glibc; cffi computes the offsets)::

    mmsghdr[i]: msg_name ---------> names[i]    sockaddr_in (16 bytes)
                msg_iov ----------> iovs[i]     iov_base -> slot i of the batch buffer
                msg_control ------> controls[i] cmsghdr + timespec (32 bytes)
                msg_len <- bytes received / sent by the kernel
"""

from __future__ import annotations

import socket
from typing import Any

import cffi
import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from channels.base import _stamp

ffi = cffi.FFI()
ffi.cdef("""
typedef unsigned int socklen_t;
struct iovec { void *iov_base; size_t iov_len; };
struct msghdr {
    void *msg_name; socklen_t msg_namelen;
    struct iovec *msg_iov; size_t msg_iovlen;
    void *msg_control; size_t msg_controllen;
    int msg_flags;
};
struct mmsghdr { struct msghdr msg_hdr; unsigned int msg_len; };
struct timespec { long tv_sec; long tv_nsec; };
struct cmsghdr { size_t cmsg_len; int cmsg_level; int cmsg_type; };
int recvmmsg(int sockfd, struct mmsghdr *msgvec, unsigned int vlen, int flags,
             struct timespec *timeout);
int sendmmsg(int sockfd, struct mmsghdr *msgvec, unsigned int vlen, int flags);
int *__errno_location(void);
int clock_gettime(int clockid, struct timespec *tp);
""")
libc = ffi.dlopen(None)
RECVMMSG_ADDRESS = int(ffi.cast("uintptr_t", libc.recvmmsg))
SENDMMSG_ADDRESS = int(ffi.cast("uintptr_t", libc.sendmmsg))
ERRNO_LOCATION_ADDRESS = int(ffi.cast("uintptr_t", libc.__errno_location))
CLOCK_GETTIME_ADDRESS = int(ffi.cast("uintptr_t", libc.clock_gettime))
"""libc's entry points, for the kernels that make the system calls themselves (``_ccall``):
passed in as integers, so the kernels stay in numba's cache (a function pointer baked into
the code would not)."""

MSG_DONTWAIT = int(socket.MSG_DONTWAIT)
MSG_TRUNC = int(socket.MSG_TRUNC)
AF_INET = int(socket.AF_INET)
SOL_SOCKET = int(socket.SOL_SOCKET)
SO_TIMESTAMPNS = int(getattr(socket, "SO_TIMESTAMPNS", 35))
"""SO_TIMESTAMPNS(_OLD) on x86-64 Linux: the kernel's receive time as a timespec."""
SCM_TIMESTAMPNS = SO_TIMESTAMPNS

SOCKADDR_IN_BYTES = 16
_CMSG_HDR = ffi.sizeof("struct cmsghdr")
CONTROL_BYTES = _CMSG_HDR + ffi.sizeof("struct timespec")
"""CMSG_SPACE(sizeof(struct timespec)): room for one receive timestamp per datagram."""


def _off(field: str) -> int:
    return ffi.offsetof("struct mmsghdr", "msg_hdr") + ffi.offsetof("struct msghdr", field)


MMSGHDR_DTYPE = np.dtype({
    "names": ["name", "namelen", "iov", "iovlen", "control", "controllen", "flags", "len"],
    "formats": ["u8", "u4", "u8", "u8", "u8", "u8", "i4", "u4"],
    "offsets": [_off("msg_name"), _off("msg_namelen"), _off("msg_iov"), _off("msg_iovlen"),
                _off("msg_control"), _off("msg_controllen"), _off("msg_flags"),
                ffi.offsetof("struct mmsghdr", "msg_len")],
    "itemsize": ffi.sizeof("struct mmsghdr"),
})
IOVEC_DTYPE = np.dtype({
    "names": ["base", "len"], "formats": ["u8", "u8"],
    "offsets": [ffi.offsetof("struct iovec", "iov_base"), ffi.offsetof("struct iovec", "iov_len")],
    "itemsize": ffi.sizeof("struct iovec"),
})
SOCKADDR_IN_DTYPE = np.dtype({
    "names": ["family", "port", "addr"], "formats": ["<u2", ">u2", ">u4"],
    "offsets": [0, 2, 4], "itemsize": SOCKADDR_IN_BYTES,
})
"""sockaddr_in: family in host order, port and address in network order."""
CONTROL_DTYPE = np.dtype({
    "names": ["len", "level", "type", "sec", "nsec"],
    "formats": ["u8", "i4", "i4", "i8", "i8"],
    "offsets": [ffi.offsetof("struct cmsghdr", "cmsg_len"),
                ffi.offsetof("struct cmsghdr", "cmsg_level"),
                ffi.offsetof("struct cmsghdr", "cmsg_type"),
                _CMSG_HDR, _CMSG_HDR + ffi.sizeof("long")],
    "itemsize": CONTROL_BYTES,
})

# The kernels below address these structs as 64-bit words (x86-64 glibc); check that here.
assert MMSGHDR_DTYPE.itemsize == 64 and IOVEC_DTYPE.itemsize == 16 and CONTROL_BYTES == 32
assert [MMSGHDR_DTYPE.fields[f][1] for f in MMSGHDR_DTYPE.names] == [0, 8, 16, 24, 32, 40, 48, 56]
assert [CONTROL_DTYPE.fields[f][1] for f in CONTROL_DTYPE.names] == [0, 8, 12, 16, 24]
H_NAME, H_NAMELEN, H_IOV, H_IOVLEN, H_CONTROL, H_CONTROLLEN, H_FLAGS, H_LEN = range(8)
"""Word index of each mmsghdr field in a (capacity, 8) uint64 view (32-bit fields: low half)."""
_LOW32 = 0xFFFF_FFFF


def address_of(array: np.ndarray) -> tuple[int, object]:
    """The address of a numpy array's first byte, and the cffi object that keeps it pinned."""
    keep = ffi.from_buffer(array)
    return int(ffi.cast("uintptr_t", keep)), keep


@numba.njit(cache=True, nogil=True)
def _bswap16(v: int) -> int:
    return ((v & 0xFF) << 8) | ((v >> 8) & 0xFF)


@numba.njit(cache=True, nogil=True)
def _bswap32(v: int) -> int:
    return (((v & 0xFF) << 24) | ((v & 0xFF00) << 8) | ((v >> 8) & 0xFF00)
            | ((v >> 24) & 0xFF))


@numba.njit(cache=True, nogil=True)
def _prepare_send(h: np.ndarray, iov: np.ndarray, names: np.ndarray, names_addr: int,
                  buf_addr: int, offsets: np.ndarray, lengths: np.ndarray, count: int,
                  mode: int, ipv4: int, port: int, peer_ids: np.ndarray,
                  allow_multicast: bool) -> int:
    """iovecs at ``buf_addr + offsets``; destinations: mode 0 none (connected socket),
    1 one (ipv4, port) for all, 2 ``peer_ids[i]`` = (ipv4 << 16) | port per datagram.
    Returns the bytes of the ``count`` frames, or -1 - i when datagram i would go to a
    multicast group and ``allow_multicast`` is false (nothing may be sent then)."""
    total = 0
    for i in range(count):
        total += lengths[i]
        iov[i, 0] = np.uint64(buf_addr + offsets[i])
        iov[i, 1] = np.uint64(lengths[i])
        if mode == 0:
            h[i, H_NAME] = 0
            h[i, H_NAMELEN] = 0
        else:
            if mode == 2:
                ipv4 = peer_ids[i] >> 16
                port = peer_ids[i] & 0xFFFF
            if not allow_multicast and (ipv4 >> 28) == 0xE:
                return -1 - i
            h[i, H_NAME] = np.uint64(names_addr + 16 * i)
            h[i, H_NAMELEN] = 16
            names[i, 0] = np.uint64(AF_INET | (_bswap16(port) << 16)
                                    | (_bswap32(ipv4) << 32))
            names[i, 1] = 0
        h[i, H_CONTROL] = 0
        h[i, H_CONTROLLEN] = 0
        h[i, H_FLAGS] = 0
    return total


@numba.njit(cache=True, nogil=True)
def _prepare_receive(h: np.ndarray, iov: np.ndarray, names_addr: int, controls_addr: int,
                     buf_addr: int, offsets: np.ndarray, slot_bytes: int, count: int) -> None:
    """iovecs at the slots; reset what the kernel overwrites: name/control sizes, flags."""
    for i in range(count):
        iov[i, 0] = np.uint64(buf_addr + offsets[i])
        iov[i, 1] = slot_bytes
        h[i, H_NAME] = np.uint64(names_addr + 16 * i)
        h[i, H_NAMELEN] = 16
        h[i, H_CONTROL] = np.uint64(controls_addr + CONTROL_BYTES * i)
        h[i, H_CONTROLLEN] = CONTROL_BYTES
        h[i, H_FLAGS] = 0


@numba.njit(cache=True, nogil=True)
def _deliver(h: np.ndarray, names: np.ndarray, controls: np.ndarray, count: int,
             lengths: np.ndarray, peer_ids: np.ndarray, recv_ts_ns: np.ndarray,
             now_ns: int) -> int:
    """Lengths, peer ids and kernel receive times of ``count`` datagrams; a truncated one gets
    length -1. Returns how many were truncated."""
    truncated = 0
    for i in range(count):
        flags = h[i, H_FLAGS] & _LOW32
        lengths[i] = -1 if flags & MSG_TRUNC else np.int64(h[i, H_LEN] & _LOW32)
        truncated += 1 if flags & MSG_TRUNC else 0
        word = names[i, 0]
        port = _bswap16(np.int64((word >> 16) & 0xFFFF))
        ipv4 = _bswap32(np.int64((word >> 32) & _LOW32))
        peer_ids[i] = (ipv4 << 16) | port
        c = controls[i]
        level = np.int64(c[1] & _LOW32)
        kind = np.int64(c[1] >> 32)
        if (h[i, H_CONTROLLEN] >= CONTROL_BYTES and c[0] >= CONTROL_BYTES
                and level == SOL_SOCKET and kind == SCM_TIMESTAMPNS):
            recv_ts_ns[i] = np.int64(c[2]) * 1_000_000_000 + np.int64(c[3])
        else:
            recv_ts_ns[i] = now_ns
    return truncated


_I64 = ir.IntType(64)
_I32 = ir.IntType(32)


@intrinsic
def _ccall(typingctx: Any, function: Any, a0: Any, a1: Any, a2: Any, a3: Any,
           a4: Any) -> Any:
    """Call the C function at address ``function`` as ``int f(a0, a1, a2, a3, a4)`` with five
    64-bit integer arguments (x86-64 System V: integer arguments go in registers, so a callee
    that takes ``int``/``unsigned``/pointers reads the low or whole register and one that takes
    fewer arguments ignores the rest); the ``int`` result sign-extended."""
    sig = types.int64(types.int64, types.int64, types.int64, types.int64, types.int64,
                      types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fnty = ir.FunctionType(_I32, [_I64] * 5)
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.sext(builder.call(fn, list(args[1:])), _I64)
    return sig, codegen


@intrinsic
def _errno(typingctx: Any, location: Any) -> Any:
    """``errno`` of this thread, through ``__errno_location`` at address ``location``."""
    sig = types.int64(types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fnty = ir.FunctionType(_I32.as_pointer(), [])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.sext(builder.load(builder.call(fn, [])), _I64)
    return sig, codegen


@numba.njit(cache=True, nogil=True)
def wall_clock_ns(clock_fn: int, timespec: np.ndarray, timespec_addr: int) -> int:
    """``time.time_ns()`` inside a kernel: ``clock_gettime(CLOCK_REALTIME)`` at address
    ``clock_fn`` into ``timespec`` (two int64 words at ``timespec_addr``)."""
    _ccall(clock_fn, 0, timespec_addr, 0, 0, 0)
    return timespec[0] * 1_000_000_000 + timespec[1]


@numba.njit(cache=True, nogil=True)
def receive_datagrams(h: np.ndarray, iov: np.ndarray, names: np.ndarray,
                      controls: np.ndarray, h_addr: int, names_addr: int, controls_addr: int,
                      buf_addr: int, offsets: np.ndarray, slot_bytes: int, prepare: int,
                      count: int, fd: int, lengths: np.ndarray, peer_ids: np.ndarray,
                      recv_ts_ns: np.ndarray, now_ns: int, recv_fn: int,
                      errno_fn: int) -> tuple[int, int]:
    """One non-blocking ``recvmmsg`` of up to ``count`` datagrams: re-point the first
    ``prepare`` headers at the slots (``_prepare_receive``), receive, copy out lengths, peers
    and receive times (``_deliver``). Returns the datagrams received (>= 0) with the number
    truncated, or -1 with errno."""
    if prepare > 0:
        _prepare_receive(h, iov, names_addr, controls_addr, buf_addr, offsets, slot_bytes,
                         prepare)
    n = _ccall(recv_fn, fd, h_addr, count, MSG_DONTWAIT, 0)
    if n < 0:
        return -1, _errno(errno_fn)
    return n, _deliver(h, names, controls, n, lengths, peer_ids, recv_ts_ns, now_ns)


@numba.njit(cache=True, nogil=True)
def send_datagrams(h: np.ndarray, iov: np.ndarray, names: np.ndarray, h_addr: int,
                   names_addr: int, buf: np.ndarray, buf_addr: int, offsets: np.ndarray,
                   lengths: np.ndarray, count: int, mode: int, ipv4: int, port: int,
                   peer_ids: np.ndarray, allow_multicast: bool, stamp_ns: int, fd: int,
                   send_fn: int, errno_fn: int, out: np.ndarray) -> None:
    """Point ``count`` datagrams at their frames and destinations (``_prepare_send``), write
    ``stamp_ns`` into their headers' send time unless it is 0 (``channels.base._stamp``) and
    make one ``sendmmsg``; ``out`` = [bytes of the frames (or -1 - i: datagram i would go to
    a multicast group unasked, nothing sent or stamped), datagrams sent (or -1), errno]."""
    total = _prepare_send(h, iov, names, names_addr, buf_addr, offsets, lengths, count, mode,
                          ipv4, port, peer_ids, allow_multicast)
    out[0] = total
    out[1] = 0
    out[2] = 0
    if total < 0:
        return
    if stamp_ns:
        _stamp(buf, offsets, lengths, count, stamp_ns)
    n = _ccall(send_fn, fd, h_addr, count, MSG_DONTWAIT, 0)
    out[1] = n
    if n < 0:
        out[2] = _errno(errno_fn)


class MmsgVector:
    """Prebuilt mmsghdr/iovec/sockaddr/control arrays for up to ``capacity`` datagrams."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.hdrs = np.zeros(capacity, dtype=MMSGHDR_DTYPE)
        self.iovs = np.zeros(capacity, dtype=IOVEC_DTYPE)
        self.names = np.zeros(capacity, dtype=SOCKADDR_IN_DTYPE)
        self.controls = np.zeros(capacity, dtype=CONTROL_DTYPE)
        # the same memory as 64-bit words, for the kernels
        self.h64 = self.hdrs.view(np.uint64).reshape(capacity, 8)
        self.iov64 = self.iovs.view(np.uint64).reshape(capacity, 2)
        self.names64 = self.names.view(np.uint64).reshape(capacity, 2)
        self.controls64 = self.controls.view(np.uint64).reshape(capacity, 4)
        self.hdr_addr, self._keep_hdrs = address_of(self.hdrs)
        iov_addr, self._keep_iovs = address_of(self.iovs)
        self.names_addr, self._keep_names = address_of(self.names)
        self.controls_addr, self._keep_controls = address_of(self.controls)
        index = np.arange(capacity, dtype=np.uint64)
        self.hdrs["iov"] = iov_addr + index * np.uint64(IOVEC_DTYPE.itemsize)
        self.send_result = np.zeros(3, np.int64)
        """``send_datagrams``'s [bytes, datagrams sent, errno] of the last ``send``."""
        self.hdrs["iovlen"] = 1
        self.ptr = ffi.cast("struct mmsghdr *", self._keep_hdrs)
        self._buf_keep: object = None
        self._buf_id = -1
        self.buf_addr = 0
        self._rx_ready: tuple | None = None
        """(buf, offsets, slot_bytes, count) the headers are ready to receive into, and
        ``_rx_used`` how many of them the last receive filled (only those need resetting)."""
        self._rx_used = 0

    def pin(self, buf: np.ndarray) -> int:
        """The address of ``buf`` (kept pinned until another buffer is pinned)."""
        if self._buf_id != id(buf) or self._buf_keep is None:
            self.buf_addr, self._buf_keep = address_of(buf)
            self._buf_id = id(buf)
        return self.buf_addr

    def receive(self, fd: int, buf: np.ndarray, offsets: np.ndarray, slot_bytes: int,
                count: int, lengths: np.ndarray, peer_ids: np.ndarray, recv_ts_ns: np.ndarray,
                now_ns: int) -> tuple[int, int]:
        """One non-blocking ``recvmmsg`` into the slots of ``buf`` with what the kernel wrote
        copied out, in one kernel call (``receive_datagrams``): (datagrams received, how many
        were truncated), or (-1, errno). Headers already pointed at these slots that no receive has
        filled since are left as they are (an idle poll re-points none). ``now_ns`` is the
        receive time of a datagram without a kernel timestamp."""
        prepare, buf_addr = self.receive_plan(buf, offsets, slot_bytes, count)
        n, extra = receive_datagrams(self.h64, self.iov64, self.names64, self.controls64,
                                     self.hdr_addr, self.names_addr, self.controls_addr,
                                     buf_addr, offsets, slot_bytes, prepare, count, fd, lengths,
                                     peer_ids, recv_ts_ns, now_ns, RECVMMSG_ADDRESS,
                                     ERRNO_LOCATION_ADDRESS)
        self.received(n)
        return n, extra

    def receive_plan(self, buf: np.ndarray, offsets: np.ndarray, slot_bytes: int,
                     count: int) -> tuple[int, int]:
        """(how many headers ``receive_datagrams`` must re-point, the address of ``buf``) for a
        receive of up to ``count`` datagrams into these slots; tell ``received`` after."""
        ready = self._rx_ready
        if (ready is not None and ready[0] is buf and ready[1] is offsets
                and ready[2] == slot_bytes and ready[3] == count):
            return min(self._rx_used, count), self.buf_addr
        self._rx_ready = (buf, offsets, slot_bytes, count)
        return count, self.pin(buf)

    def received(self, n: int) -> None:
        """What ``receive_datagrams`` returned (the headers it filled need re-pointing next
        time)."""
        self._rx_used = max(n, 0)

    def sending(self) -> None:
        """A send is about to use the headers (a later receive re-points them all)."""
        self._rx_ready = None

    def send(self, fd: int, buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
             count: int, mode: int, ipv4: int, port: int, peer_ids: np.ndarray | None,
             allow_multicast: bool, stamp_ns: int) -> np.ndarray:
        """Point ``count`` datagrams at frames of ``buf`` with their destinations, stamp their
        send time (``stamp_ns``; 0: none) and make one ``sendmmsg``, in one kernel call
        (``send_datagrams``); returns ``send_result``: [bytes (negative: see ``_prepare_send``),
        datagrams sent or -1, errno]."""
        self.sending()
        out = self.send_result
        send_datagrams(self.h64, self.iov64, self.names64, self.hdr_addr, self.names_addr, buf,
                       self.pin(buf), offsets, lengths, count, mode, ipv4, port,
                       offsets if peer_ids is None else peer_ids, allow_multicast, stamp_ns, fd,
                       SENDMMSG_ADDRESS, ERRNO_LOCATION_ADDRESS, out)
        return out

    def sendmmsg(self, fd: int, first: int, count: int,
                 flags: int = MSG_DONTWAIT) -> tuple[int, int]:
        """(datagrams sent from ``first``, errno when -1)."""
        n = libc.sendmmsg(fd, self.ptr + first, count, flags)
        return (n, ffi.errno) if n < 0 else (n, 0)


def warm_up() -> None:
    """Compile/load this module's kernels (their only system calls are on descriptor -1,
    which fail at once)."""
    vec = MmsgVector(1)
    buf = np.zeros(64, np.uint8)
    offsets = np.zeros(1, np.int64)
    lengths = np.full(1, 64, np.int64)
    vec.receive(-1, buf, offsets, 64, 1, lengths.copy(), offsets.copy(), offsets.copy(), 0)
    vec.send(-1, buf, offsets, lengths, 1, 1, 0x7F000001, 1, None, False, 0)
    vec.send(-1, buf, offsets, lengths, 1, 2, 0, 0, offsets, True, 1)
