"""Shared-memory ring channel between processes on one host: SPSC rings, MPSC as a ring set.

One mmap'd file (under /dev/shm) holds ``producers`` single-producer single-consumer rings,
all read by one consumer. A producer claims a ring with an open-file-description lock
(``F_OFD_SETLK`` on one byte per ring): the kernel makes the claim atomic and releases it
when the producer dies, so its ring can be claimed again. Why a ring set instead of one
shared ring with an atomic tail: CPython offers no compare-and-swap on shared memory without
a C extension, and a set of SPSC rings needs none (each counter has exactly one writer);
the consumer pays one tail read per ring per poll, done for all rings in one numpy gather.

File layout (native byte order: both ends are on this host)::

    0     file header (256 bytes): magic "TWSHMRNG", version u32, producers u32,
          ring_bytes u64, max_frame_bytes u32
          +64  parked u32  written only by the consumer (own cache line): 1 while it is
               about to block, or blocked, on the doorbell
    256   ring 0: header (256 bytes), then ring_bytes of data
                  +0   tail u64  written only by the ring's producer   (own cache line)
                  +64  head u64  written only by the consumer          (own cache line)
                  +128 producer pid u32 (informational)
    256 + (256 + ring_bytes) * i: ring i

    data: records back to back at positions tail, wrapping at ring_bytes (a power of two):
          | length u32 | kind u32 (1 frame, 2 padding) | frame bytes, zero-padded to 8 |
          a record never wraps: a padding record fills the end of the data area instead.

Memory ordering (x86-64, total store order): the producer copies a record, then stores the
new ``tail`` (one aligned 8-byte store, atomic on x86-64); stores become visible in program
order, so a consumer that loads ``tail`` sees complete records below it. The consumer loads
``tail`` before reading the records (loads are not reordered with older loads) and stores
``head`` after it has copied them out (stores are not reordered with older loads), so the
producer never overwrites unread bytes. Counter loads and stores are numpy scalar accesses
made from Python, outside the numba copy kernels, so no compiler can move them across the
copies. Other architectures need explicit fences here.

The doorbell: a FIFO beside the file (``PATH.bell``, made by the consumer before the file
appears, open for reading and writing on its side so it never sees end-of-file). A
consumer with nothing to read sets ``parked``, then looks at the tails once more, then
blocks in poll(2) on the FIFO (``wait_fds``; ``receive`` with a timeout does the same after
it spun, ``SHM_SPINS``); a producer stores its ``tail``, then reads ``parked`` and, when it
is set, writes one byte to the FIFO. Each side puts a full fence between its store and its
load (x86-64 may otherwise order a load before an older store: both would miss the other,
and the consumer would sleep on a published record), so either the producer sees
``parked`` or the consumer sees the new tail. A producer writes nothing while the consumer
is busy: the bell costs a system call only to wake a consumer that sleeps.

Hostile or torn data: a record with an impossible length or kind (longer than
``max_frame_bytes`` or than the published bytes, or padding that does not end at the wrap)
is counted (``drops``, reason ``torn_record``) and the consumer resyncs by skipping to the
published ``tail`` (a record boundary the producer wrote last). Counters that cannot be
right (``tail`` behind ``head``, or more than ``ring_bytes`` ahead) fail closed: the channel
raises ``ChannelDeviceError`` (EBADMSG) and must be recreated. A frame larger than the
receiving batch's slot is dropped and counted (reason ``oversized``).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import select
import struct
import time

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from channels.base import (
    WAIT_FOREVER,
    Channel,
    Dest,
    FrameArrays,
    FrameBatch,
    as_frame_arrays,
    stamp_send_ts,
)
from channels.errors import ChannelDeviceError, ChannelUserError, os_error
from datapath.agent import BACKOFF_MAX_SPINS, BACKOFF_MAX_YIELDS, yield_cpu
from datapath.config import MAX_FRAME_BYTES

SHM_DIR = "/dev/shm"
"""Where ring names without a slash live."""
SHM_RING_BYTES = 1 << 20
"""Data bytes of each ring by default (a power of two; at least twice the largest record)."""
SHM_MAX_PRODUCERS = 64
"""Most producer rings one file may hold."""
SHM_FILE_MAGIC = b"TWSHMRNG"
SHM_FILE_VERSION = 2
"""2: the doorbell (``parked`` and ``PATH.bell``)."""

FILE_HEADER_BYTES = 256
RING_HEADER_BYTES = 256
TAIL_OFFSET = 0
HEAD_OFFSET = 64
PID_OFFSET = 128
PARKED_OFFSET = 64
"""The consumer's ``parked`` word in the file header."""
BELL_SUFFIX = ".bell"
SHM_SPINS = BACKOFF_MAX_SPINS
SHM_YIELDS = BACKOFF_MAX_YIELDS
"""``receive`` with a timeout looks at the rings ``SHM_SPINS`` times, then as often again
yielding the CPU in between (a few hundred microseconds in all, as ``BackoffIdle`` does),
then blocks on the doorbell, where ``BackoffIdle`` would sleep in growing steps."""
RECORD_HEADER_BYTES = 8
RECORD_FRAME = 1
RECORD_PADDING = 2
_FILE_HEADER = struct.Struct("=8sIIQI")
_CLAIM_LOCK_BASE = 1 << 40
"""Byte offset of producer i's claim lock (past any real data: locks need no bytes)."""
_CONSUMER_LOCK = _CLAIM_LOCK_BASE - 1
_FLOCK = struct.Struct("hhqqi4x")


def ring_path(name: str) -> str:
    """``name`` as a path: bare names live under /dev/shm as ``topicwire-NAME.ring``."""
    if not name or "\0" in name:
        raise ChannelUserError(f"ring name {name!r} is empty or invalid")
    return name if "/" in name else os.path.join(SHM_DIR, f"topicwire-{name}.ring")


def _lock(fd: int, offset: int, *, test_only: bool = False) -> bool:
    """Take (or test) a write lock on one byte; False when another holder has it."""
    arg = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    if test_only:
        got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, arg)
        return _FLOCK.unpack(got)[0] == fcntl.F_UNLCK
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, arg)
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


# --- kernels (numba): the copies; counters stay outside ------------------------------------

@intrinsic
def _full_fence(typingctx):  # noqa: ANN001, ANN202 (numba's intrinsic protocol)
    """A sequentially consistent fence (mfence on x86-64)."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


@numba.njit(cache=True, nogil=True)
def _store_then_load(counters: np.ndarray, store_at: int, value: int, words: np.ndarray,
                     load_at: int) -> int:
    """``counters[store_at] = value``, a full fence, then ``words[load_at]``: a producer
    publishing its tail and reading ``parked``."""
    counters[store_at] = value
    _full_fence()
    return words[load_at]


@numba.njit(cache=True, nogil=True)
def _park_then_look(words: np.ndarray, parked_at: int, counters: np.ndarray,
                    tail_idx: np.ndarray, heads: np.ndarray) -> bool:
    """``parked = 1``, a full fence, then whether any ring holds unread records: a consumer
    about to block."""
    words[parked_at] = 1
    _full_fence()
    for i in range(len(tail_idx)):
        if counters[tail_idx[i]] != heads[i]:
            return True
    return False


@numba.njit(cache=True, nogil=True)
def _ring_write(data: np.ndarray, words: np.ndarray, base: int, ring_bytes: int, head: int,
                tail: int, src: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                count: int, max_frame: int, out: np.ndarray) -> None:
    """Append frames; ``out`` = [frames taken, new tail, frames refused as oversized, bytes
    of the frames written]."""
    mask = ring_bytes - 1
    taken = 0
    oversized = 0
    nbytes = 0
    for i in range(count):
        length = lengths[i]
        if length < 0 or length > max_frame:
            oversized += 1
            taken += 1
            continue
        rec = RECORD_HEADER_BYTES + ((length + 7) & ~7)
        idx = tail & mask
        to_end = ring_bytes - idx
        need = rec if rec <= to_end else to_end + rec
        if need > ring_bytes - (tail - head):
            break
        if rec > to_end:
            w = (base + idx) >> 2
            words[w] = to_end - RECORD_HEADER_BYTES
            words[w + 1] = RECORD_PADDING
            tail += to_end
            idx = 0
        w = (base + idx) >> 2
        words[w] = length
        words[w + 1] = RECORD_FRAME
        d = base + idx + RECORD_HEADER_BYTES
        s = offsets[i]
        data[d : d + length] = src[s : s + length]
        tail += rec
        taken += 1
        nbytes += length
    out[0] = taken
    out[1] = tail
    out[2] = oversized
    out[3] = nbytes


@numba.njit(cache=True, nogil=True)
def _ring_read(data: np.ndarray, words: np.ndarray, base: int, ring_bytes: int, head: int,
               tail: int, max_frame: int, dst: np.ndarray, slot_bytes: int,
               lengths: np.ndarray, first: int, capacity: int, out: np.ndarray) -> None:
    """Copy records into slots ``first..``; ``out`` = [frames, new head, torn, oversized]."""
    mask = ring_bytes - 1
    n = 0
    torn = 0
    oversized = 0
    while head < tail and first + n < capacity:
        idx = head & mask
        avail = tail - head
        w = (base + idx) >> 2
        length = np.int64(words[w])
        kind = words[w + 1]
        if kind == RECORD_PADDING:
            if length + RECORD_HEADER_BYTES != ring_bytes - idx or \
                    length + RECORD_HEADER_BYTES > avail:
                torn += 1
                head = tail
                break
            head += length + RECORD_HEADER_BYTES
            continue
        rec = RECORD_HEADER_BYTES + ((length + 7) & ~7)
        if kind != RECORD_FRAME or length > max_frame or rec > avail or idx + rec > ring_bytes:
            torn += 1
            head = tail
            break
        if length > slot_bytes:
            oversized += 1
        else:
            d = (first + n) * slot_bytes
            s = base + idx + RECORD_HEADER_BYTES
            dst[d : d + length] = data[s : s + length]
            lengths[first + n] = length
            n += 1
        head += rec
    out[0] = n
    out[1] = head
    out[2] = torn
    out[3] = oversized


# --- the mapped file ----------------------------------------------------------------------

class _RingFile:
    """The mmap'd file and numpy views of it; ``close()`` is safe twice."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self.mm: mmap.mmap | None = None
        try:
            size = os.fstat(fd).st_size
            if size < FILE_HEADER_BYTES:
                raise ChannelUserError(f"{path} is not a topicwire ring (too small)")
            self.mm = mmap.mmap(fd, size)
        except OSError as exc:
            raise os_error(f"mapping ring {path}", exc) from None
        magic, version, producers, ring_bytes, max_frame = _FILE_HEADER.unpack_from(self.mm, 0)
        stride = RING_HEADER_BYTES + ring_bytes
        if magic != SHM_FILE_MAGIC or version != SHM_FILE_VERSION or not (
                1 <= producers <= SHM_MAX_PRODUCERS) or size != FILE_HEADER_BYTES + \
                producers * stride or ring_bytes & (ring_bytes - 1):
            raise ChannelUserError(f"{path} is not a topicwire ring v{SHM_FILE_VERSION} "
                                   "(bad header); remove it and restart its consumer")
        self.producers = producers
        self.ring_bytes = ring_bytes
        self.max_frame_bytes = max_frame
        self.data = np.frombuffer(self.mm, dtype=np.uint8)
        self.words = self.data.view(np.uint32)
        self.counters = self.data.view(np.uint64)
        self.bases = FILE_HEADER_BYTES + np.arange(producers, dtype=np.int64) * stride
        self.tail_idx = (self.bases + TAIL_OFFSET) // 8
        self.head_idx = (self.bases + HEAD_OFFSET) // 8
        self.data_bases = self.bases + RING_HEADER_BYTES

    def close(self) -> None:
        if self.fd < 0:
            return
        self.data = self.words = self.counters = None  # type: ignore[assignment]
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # a caller still holds a view; the OS unmaps at exit
                pass
        os.close(self.fd)
        self.fd = -1


def _create_file(path: str, producers: int, ring_bytes: int, max_frame_bytes: int
                 ) -> tuple[int, int]:
    """Create and initialise the ring file (atomically, via rename) and its doorbell, open
    before the ring appears (a producer that finds the ring finds its bell with a reader);
    return an fd on each."""
    if not 1 <= producers <= SHM_MAX_PRODUCERS:
        raise ChannelUserError(f"producers must be in [1, {SHM_MAX_PRODUCERS}], not {producers}")
    if ring_bytes < 4096 or ring_bytes & (ring_bytes - 1):
        raise ChannelUserError(f"ring_bytes must be a power of two >= 4096, not {ring_bytes}")
    if not 32 <= max_frame_bytes <= min(MAX_FRAME_BYTES, ring_bytes // 2 - RECORD_HEADER_BYTES):
        raise ChannelUserError(
            f"max_frame_bytes {max_frame_bytes} must be in [32, min({MAX_FRAME_BYTES}, "
            f"ring_bytes/2 - 8)]; make the ring larger")
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        fd = -1
    except OSError as exc:
        raise os_error(f"opening ring {path}", exc) from None
    if fd >= 0:
        try:
            stale = _lock(fd, _CONSUMER_LOCK, test_only=True)
        finally:
            os.close(fd)
        if not stale:
            raise ChannelDeviceError(f"ring {path} has a live consumer; one consumer per ring: "
                                     "pick another name or stop it", errno=errno.EBUSY)
        os.unlink(path)
    size = FILE_HEADER_BYTES + producers * (RING_HEADER_BYTES + ring_bytes)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise os_error(f"creating ring {path}", exc) from None
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
        os.pwrite(fd, _FILE_HEADER.pack(SHM_FILE_MAGIC, SHM_FILE_VERSION, producers,
                                        ring_bytes, max_frame_bytes), 0)
        if not _lock(fd, _CONSUMER_LOCK):
            raise ChannelDeviceError(f"could not lock new ring {path}", errno=errno.EBUSY)
        _make_bell(path)
        bell = _open_bell(path, consumer=True)
        try:
            os.rename(tmp, path)
        except BaseException:
            os.close(bell)
            raise
    except OSError as exc:
        os.close(fd)
        os.unlink(tmp)
        raise os_error(f"creating ring {path} ({size} bytes)", exc) from None
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, bell


def _make_bell(path: str) -> None:
    """The ring's doorbell FIFO (``PATH.bell``), made afresh."""
    bell = path + BELL_SUFFIX
    try:
        os.unlink(bell)
    except FileNotFoundError:
        pass
    os.mkfifo(bell, 0o600)


def _open_bell(path: str, *, consumer: bool) -> int:
    """The doorbell of ring ``path``: the consumer's end reads and writes (so it never sees
    end-of-file and can ring itself), a producer's only writes. Non-blocking both."""
    flags = (os.O_RDWR if consumer else os.O_WRONLY) | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        return os.open(path + BELL_SUFFIX, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a producer's open with no reader: the consumer is gone
            return -1
        raise os_error(f"opening the doorbell {path}{BELL_SUFFIX} of ring {path} (its "
                       "consumer makes it; restart the consumer)", exc) from None


# --- the channel --------------------------------------------------------------------------

class ShmChannel(Channel):
    """Frames over shared-memory rings: ``rx`` is a ring this end creates and consumes,
    ``tx`` a ring (created by its consumer) on which this end claims a producer slot.

    ``ShmChannel(rx="bus", producers=8)`` is the appliance's end of the bus;
    ``ShmChannel(tx="bus", rx="client-7")`` a client's (the appliance answers on
    ``ShmChannel(tx="client-7")``). Peer ids of received frames are producer slot numbers.
    """

    kind = "shm"

    def __init__(self, *, rx: str | None = None, tx: str | None = None, producers: int = 1,
                 ring_bytes: int = SHM_RING_BYTES, max_frame_bytes: int = MAX_FRAME_BYTES,
                 name: str | None = None, stamp_send_ts: bool = True) -> None:
        if rx is None and tx is None:
            raise ChannelUserError("a shared-memory channel needs rx=RING, tx=RING or both")
        super().__init__(name=name or f"shm:{rx or ''}>{tx or ''}", stamp_send_ts=stamp_send_ts)
        self._rx: _RingFile | None = None
        self._tx: _RingFile | None = None
        self._rx_path: str | None = None
        self._out = np.zeros(4, dtype=np.int64)
        """The receive kernel's results; the send kernel's go to ``_out_tx``: a send and a
        receive may run on two threads at once (a client's publisher and its own thread),
        and the kernels release the interpreter."""
        self._out_tx = np.zeros(4, dtype=np.int64)
        self._next_ring = 0
        self._bell = -1
        """The rx ring's doorbell (consumer's end)."""
        self._tx_bell = -1
        """The tx ring's doorbell (a producer's end; -1 when its consumer is gone)."""
        self._armed = False
        self._poller: select.poll | None = None
        self.bells_rung = 0
        """Bytes this end wrote to its tx ring's doorbell: the consumer was parked."""
        self.bell_wakes = 0
        """Parks of this consumer that its doorbell ended (not a timeout)."""
        try:
            if rx is not None:
                path = ring_path(rx)
                fd, self._bell = _create_file(
                    path, producers, ring_bytes,
                    min(max_frame_bytes, ring_bytes // 2 - RECORD_HEADER_BYTES))
                self._rx_path = path
                self._rx = _RingFile(fd, path)
                self._heads = self._rx.counters[self._rx.head_idx].tolist()
            if tx is not None:
                self._attach(ring_path(tx))
        except BaseException:
            self.close()
            raise

    def connect(self, tx: str) -> None:
        """Claim a producer slot on ring ``tx`` (a channel opened with ``rx`` only)."""
        self._check_open()
        if self._tx is not None:
            raise ChannelUserError(f"{self.name} already sends on {self._tx.path}")
        self._attach(ring_path(tx))
        self.name = f"{self.name}{tx}"

    def _attach(self, path: str) -> None:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise os_error(f"opening ring {path}", exc) from None
        try:
            ring = _RingFile(fd, path)
        except BaseException:
            os.close(fd)
            raise
        for slot in range(ring.producers):
            if _lock(fd, _CLAIM_LOCK_BASE + slot):
                break
        else:
            ring.close()
            raise ChannelDeviceError(f"all {ring.producers} producer slots of ring {path} are "
                                     "taken; make the ring with more producers",
                                     errno=errno.EBUSY)
        self._tx = ring
        self._tx_bell = _open_bell(path, consumer=False)
        self.producer_slot = slot
        self._tx_base = int(ring.data_bases[slot])
        self._tx_tail_idx = int(ring.tail_idx[slot])
        self._tx_head_idx = int(ring.head_idx[slot])
        self._tail = int(ring.counters[self._tx_tail_idx])
        ring.words[(int(ring.bases[slot]) + PID_OFFSET) // 4] = os.getpid()

    @property
    def max_frame_bytes(self) -> int:
        ring = self._tx or self._rx
        return ring.max_frame_bytes if ring else MAX_FRAME_BYTES

    def consumer_alive(self) -> bool:
        """Whether the tx ring's consumer still holds it (it may have died)."""
        self._check_open()
        if self._tx is None:
            raise ChannelUserError(f"{self.name} has no tx ring")
        return not _lock(self._tx.fd, _CONSUMER_LOCK, test_only=True)

    def live_producers(self) -> list[int]:
        """Producer slots of the rx ring whose producer holds its claim."""
        self._check_open()
        if self._rx is None:
            raise ChannelUserError(f"{self.name} has no rx ring")
        return [i for i in range(self._rx.producers)
                if not _lock(self._rx.fd, _CLAIM_LOCK_BASE + i, test_only=True)]

    def send(self, frames: FrameBatch | FrameArrays | tuple, dest: Dest = None) -> int:
        self._check_open()
        ring = self._tx
        if ring is None:
            raise ChannelUserError(f"{self.name} has no tx ring; open it with tx=RING")
        if dest is not None:
            raise ChannelUserError("a shared-memory ring has one consumer; send without dest")
        if isinstance(frames, FrameBatch):
            arrays = FrameArrays(frames.buf, frames.offsets, frames.lengths, frames.count)
        else:
            arrays = as_frame_arrays(frames)
        n = arrays.count
        if n == 0:
            return 0
        if self.stamp_send_ts:
            stamp_send_ts(arrays, n)
        head = int(ring.counters[self._tx_head_idx])
        if head > self._tail or self._tail - head > ring.ring_bytes:
            self._fail(f"tx ring {ring.path}: head {head} vs tail {self._tail}")
        out = self._out_tx
        _ring_write(ring.data, ring.words, self._tx_base, ring.ring_bytes, head, self._tail,
                    arrays.buf, arrays.offsets, arrays.lengths, n, ring.max_frame_bytes, out)
        taken, tail, oversized = int(out[0]), int(out[1]), int(out[2])
        # publish, after the copies, then look whether the consumer sleeps (see module doc)
        if _store_then_load(ring.counters, self._tx_tail_idx, tail, ring.words,
                            PARKED_OFFSET // 4) and self._tx_bell >= 0 and tail != self._tail:
            self._ring(self._tx_bell)
        self._tail = tail
        if oversized:
            self.stats.on_drop("oversized", oversized)
        if taken < n:
            self.stats.on_backpressure(n - taken)
        if taken > oversized:
            self.stats.on_send(taken - oversized, int(out[3]))
        return taken

    def receive(self, batch: FrameBatch, timeout_ns: int = 0) -> int:
        self._check_open()
        if self._rx is None:
            raise ChannelUserError(f"{self.name} has no rx ring; open it with rx=RING")
        n = self._poll(batch)
        if n or timeout_ns == 0:
            return n
        deadline = None if timeout_ns == WAIT_FOREVER else time.monotonic_ns() + timeout_ns
        looks = 0
        while not n:
            now = time.monotonic_ns()
            if deadline is not None and now >= deadline:
                break
            looks += 1
            if looks > SHM_SPINS + SHM_YIELDS:  # nothing came while it spun: the doorbell
                self._block((deadline - now) if deadline is not None else None)
            elif looks > SHM_SPINS:
                yield_cpu()
            n = self._poll(batch)
        return n

    def wait_fds(self) -> tuple[int, ...] | None:
        """The rx ring's doorbell, armed: from now until the next receive, a producer that
        publishes rings it (and when a record is already there, it is rung at once)."""
        ring = self._rx
        if ring is None or self._bell < 0 or self.closed:
            return None
        if _park_then_look(ring.words, PARKED_OFFSET // 4, ring.counters, ring.tail_idx,
                           ring.counters[ring.head_idx]):
            self._ring(self._bell)
        self._armed = True
        return (self._bell,)

    def _block(self, timeout_ns: int | None) -> None:
        """One park on the doorbell (``timeout_ns`` None: until it rings)."""
        fds = self.wait_fds()
        assert fds is not None
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(self._bell, select.POLLIN)
        if self._poller.poll(-1 if timeout_ns is None else max(1, -(-timeout_ns // 1_000_000))):
            self.bell_wakes += 1

    def _ring(self, fd: int) -> None:
        try:
            os.write(fd, b"\0")
            self.bells_rung += 1
        except (BlockingIOError, BrokenPipeError):
            pass  # full: it is ringing already; no reader: the consumer is gone

    def _disarm(self) -> None:
        """Back from a park: ``parked`` cleared, the doorbell emptied."""
        self._armed = False
        self._rx.words[PARKED_OFFSET // 4] = 0
        try:
            while os.read(self._bell, 4096):
                pass
        except BlockingIOError:
            pass

    def _poll(self, batch: FrameBatch) -> int:
        if self._armed:
            self._disarm()
        ring = self._rx
        tails = ring.counters[ring.tail_idx].tolist()  # loads before the copies (module doc)
        heads = self._heads
        producers = ring.producers
        start = self._next_ring
        out = self._out
        n = 0
        for k in range(producers):
            i = (start + k) % producers
            tail, head = tails[i], heads[i]
            if tail == head:
                continue
            if tail < head or tail - head > ring.ring_bytes or tail & 7:
                self._fail(f"rx ring {ring.path} slot {i}: head {head} vs tail {tail}")
            _ring_read(ring.data, ring.words, int(ring.data_bases[i]), ring.ring_bytes, head,
                       tail, ring.max_frame_bytes, batch.buf, batch.slot_bytes, batch.lengths,
                       n, batch.capacity, out)
            got, new_head = int(out[0]), int(out[1])
            if out[2]:
                self.stats.on_drop("torn_record", int(out[2]))
            if out[3]:
                self.stats.on_drop("oversized", int(out[3]))
            batch.peer_ids[n : n + got] = i
            n += got
            heads[i] = new_head
            ring.counters[ring.head_idx[i]] = new_head  # release: after the copies
            if n >= batch.capacity:
                self._next_ring = (i + 1) % producers  # the next poll starts after this ring
                break
        batch.count = n
        if n:
            batch.recv_ts_ns[:n] = time.time_ns()
            self.stats.on_batch_received(batch)
        return n

    def _fail(self, detail: str) -> None:
        self.stats.on_error("corrupt_counters")
        self.close()
        raise ChannelDeviceError(f"{detail}: the ring's counters are corrupt; the channel is "
                                 "closed (fail closed): recreate the ring", errno=errno.EBADMSG)

    def _close(self) -> None:
        for name in ("_bell", "_tx_bell"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)
        if getattr(self, "_rx_path", None):
            try:
                os.unlink(self._rx_path + BELL_SUFFIX)
            except FileNotFoundError:
                pass
        tx = getattr(self, "_tx", None)
        if tx is not None:
            tx.close()
        rx = getattr(self, "_rx", None)
        if rx is not None:
            if self._rx_path:
                try:
                    os.unlink(self._rx_path)
                except FileNotFoundError:
                    pass
            rx.close()


def warm_up() -> None:
    """Compile/load the ring kernels over a private buffer (no file)."""
    data = np.zeros(4096 + RING_HEADER_BYTES, np.uint8)
    words = data.view(np.uint32)
    out = np.zeros(4, np.int64)
    frame = np.zeros(64, np.uint8)
    one = np.zeros(1, np.int64)
    _ring_write(data, words, 0, 4096, 0, 0, frame, one, np.full(1, 64, np.int64), 1, 1024, out)
    _ring_read(data, words, 0, 4096, 0, int(out[1]), 1024, frame, 64, one.copy(), 0, 1, out)
    counters = data.view(np.uint64)
    _store_then_load(counters, 0, 0, words, PARKED_OFFSET // 4)
    _park_then_look(words, PARKED_OFFSET // 4, counters, one, counters[one])
