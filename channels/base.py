"""The one channel interface: batches of frames in preallocated numpy buffers, in poll mode.

Every channel kind (UDP unicast, UDP multicast, shared-memory ring, TCP; RDMA later) moves
frames between ``FrameBatch`` objects and reports into one ``ChannelStats``::

    with UdpChannel(bind=("127.0.0.1", 0)) as ch:
        batch = FrameBatch(64)                    # once, outside the hot loop
        n = ch.receive(batch, timeout_ns=0)       # never blocks; 0 = nothing there
        decode_frames(batch.buf, batch.offsets[:n], batch.lengths[:n], ...)
        ch.send(batch, dest=("127.0.0.1", 47470)) # frames [0, batch.count) -> frames sent

A ``FrameBatch`` is one uint8 buffer cut into ``capacity`` fixed slots of ``slot_bytes``:

    buf:      | slot 0 ............ | slot 1 ............ | ... | slot capacity-1 ..... |
    offsets:    0                    slot_bytes                  (capacity-1)*slot_bytes
    lengths:    frame bytes in each slot (int64)
    peer_ids:   per slot, who sent it (receive) or where it goes (send with EACH_SLOT)
    recv_ts_ns: per slot, when it arrived (kernel timestamp where the channel has one)
    count:      slots in use, always the first ``count``

Peer ids are int64 and mean what the channel kind says (``Channel.peer_address(id)``
translates): for UDP ``(ipv4 << 16) | port`` (computed with numpy, no lookup table), for the
MPSC ring the producer's index, for TCP the connection's id. A reply goes back with
``dest=peer_id``; many replies at once with ``dest=EACH_SLOT`` and ``batch.peer_ids`` set.

Semantics every kind keeps (tests hold them to it):
- ``receive(batch, timeout_ns=0)`` overwrites the batch from slot 0, sets ``batch.count`` and
  returns it; with ``timeout_ns == 0`` it never blocks, ``> 0`` waits at most that long for the
  first frame, ``WAIT_FOREVER`` waits until one comes. A frame larger than a slot is dropped
  and counted (``stats.drops``), never split.
- ``send(frames, dest=None)`` sends frames in order and returns how many it took; fewer than
  given means backpressure (socket buffer or ring full: counted, retry the rest later). A
  frame that can never go (too large, refused by the kernel) is counted in ``stats.drops`` and
  ``stats.errors`` and taken, so one bad frame cannot wedge a sender. It
  stamps ``send_ts_ns`` (frame header bytes 24..31) with the wall clock unless the frame carries
  an auth trailer (the MAC covers the header) or the channel was made with
  ``stamp_send_ts=False``.
- ``close()`` is safe twice; a closed channel raises ``ChannelClosedError``.
"""

from __future__ import annotations

import abc
import time
from typing import Any, NamedTuple

import numba
import numpy as np

from channels.errors import ChannelClosedError, ChannelUserError
from channels.stats import ChannelStats
from datapath.config import MAX_FRAME_BYTES
from datapath.protocol import frame_layout as fl
from datapath.protocol.batch import DecodeResult, decode_frames
from datapath.protocol.batch import warm_up as warm_up_decoder

DEFAULT_SLOT_BYTES = MAX_FRAME_BYTES
"""Slot size of a FrameBatch unless told otherwise: one largest frame."""
DEFAULT_BATCH_FRAMES = 64
"""Frames per batch unless told otherwise (one recvmmsg/sendmmsg call)."""
WAIT_FOREVER = -1
"""``timeout_ns`` that waits until a frame arrives."""
EACH_SLOT = -2
"""``dest`` meaning: send each slot to ``batch.peer_ids[slot]``."""
NO_PEER = -1
"""``peer_ids`` value of a slot with no known peer."""

_TS_END = fl.SEND_TS_OFFSET + 8
_AUTH = int(fl.FrameFlags.AUTH_TRAILER)
_NAK = int(fl.FrameType.NAK)
_RETRANSMISSION = int(fl.FrameType.RETRANSMISSION)
_RELIABILITY_MIN_TYPE = min(_NAK, _RETRANSMISSION)


class FrameArrays(NamedTuple):
    """Frames in a caller's buffer: frame i is ``buf[offsets[i]:offsets[i]+lengths[i]]``."""

    buf: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    count: int


Address = tuple[str, int]
"""(host, port) for sockets."""
Dest = Address | int | None
"""Where ``send`` goes: None = the channel's default peer, an (host, port), a peer id, or
``EACH_SLOT``."""


class FrameBatch:
    """Preallocated frames: one uint8 buffer of ``capacity`` slots of ``slot_bytes`` each."""

    __slots__ = ("buf", "capacity", "count", "io_cache", "lengths", "offsets", "peer_ids",
                 "recv_ts_ns", "slot_bytes", "__weakref__")

    def __init__(self, capacity: int = DEFAULT_BATCH_FRAMES,
                 slot_bytes: int = DEFAULT_SLOT_BYTES) -> None:
        if capacity < 1:
            raise ChannelUserError(f"a frame batch needs capacity >= 1, not {capacity}")
        if not fl.FRAME_HEADER_BYTES <= slot_bytes <= MAX_FRAME_BYTES or slot_bytes % 8:
            raise ChannelUserError(
                f"slot_bytes must be a multiple of 8 in [{fl.FRAME_HEADER_BYTES}, "
                f"{MAX_FRAME_BYTES}], not {slot_bytes}")
        self.capacity = capacity
        self.slot_bytes = slot_bytes
        self.buf = np.zeros(capacity * slot_bytes, dtype=np.uint8)
        self.offsets = np.arange(capacity, dtype=np.int64) * slot_bytes
        self.lengths = np.zeros(capacity, dtype=np.int64)
        self.peer_ids = np.full(capacity, NO_PEER, dtype=np.int64)
        self.recv_ts_ns = np.zeros(capacity, dtype=np.int64)
        self.count = 0
        self.io_cache: dict[str, Any] = {}
        """Per-channel-kind prebuilt I/O vectors (mmsghdr/iovec arrays); owned by channels."""

    def clear(self) -> None:
        self.count = 0

    def slot(self, index: int) -> np.ndarray:
        """The whole slot ``index`` (writable view), to build a frame in place."""
        start = index * self.slot_bytes
        return self.buf[start : start + self.slot_bytes]

    def frame(self, index: int) -> np.ndarray:
        """Frame ``index`` (a view of its ``lengths[index]`` bytes)."""
        start = int(self.offsets[index])
        return self.buf[start : start + int(self.lengths[index])]

    def append(self, frame: bytes | bytearray | memoryview | np.ndarray,
               peer_id: int = NO_PEER) -> int:
        """Copy one frame into the next slot (tools and tests; not the hot path)."""
        data = np.frombuffer(frame, dtype=np.uint8) if not isinstance(frame, np.ndarray) else frame
        if self.count >= self.capacity:
            raise ChannelUserError(f"the batch is full ({self.capacity} frames); send it first")
        if len(data) > self.slot_bytes:
            raise ChannelUserError(f"a frame of {len(data)} bytes does not fit a slot of "
                                   f"{self.slot_bytes}; make the batch with larger slots")
        i = self.count
        self.slot(i)[: len(data)] = data
        self.lengths[i] = len(data)
        self.peer_ids[i] = peer_id
        self.count = i + 1
        return i

    def arrays(self) -> FrameArrays:
        return FrameArrays(self.buf, self.offsets, self.lengths, self.count)

    def __len__(self) -> int:
        return self.count


def as_frame_arrays(frames: FrameBatch | FrameArrays | tuple) -> FrameArrays:
    """Normalise ``send``'s argument; checks the arrays once per call, not per frame."""
    if isinstance(frames, FrameBatch):
        return frames.arrays()
    buf, offsets, lengths, count = frames
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
        raise ChannelUserError("send takes a FrameBatch or (uint8 buffer, offsets, lengths, "
                               "count); the buffer must be a 1-D uint8 numpy array")
    count = int(count)
    if count < 0 or count > len(offsets) or count > len(lengths):
        raise ChannelUserError(f"count {count} exceeds the offsets/lengths arrays")
    if count == 1 and isinstance(offsets, np.ndarray) and isinstance(lengths, np.ndarray) \
            and offsets.dtype == np.int64 and lengths.dtype == np.int64 \
            and len(offsets) == 1 and len(lengths) == 1:
        # one frame in one-slot arrays (a client's publish): checked without numpy's
        # reductions, which cost more than the send's own work for a single frame
        offset, length = int(offsets[0]), int(lengths[0])
        if offset < 0 or length < 0 or offset + length > len(buf):
            raise ChannelUserError("a frame lies outside its buffer; check offsets and lengths")
        return FrameArrays(buf, offsets, lengths, 1)
    if count:
        offs = np.asarray(offsets[:count], dtype=np.int64)
        lens = np.asarray(lengths[:count], dtype=np.int64)
        if offs.min() < 0 or lens.min() < 0 or (offs + lens).max() > len(buf):
            raise ChannelUserError("a frame lies outside its buffer; check offsets and lengths")
        return FrameArrays(buf, offs, lens, count)
    return FrameArrays(buf, np.zeros(0, np.int64), np.zeros(0, np.int64), 0)


@numba.njit(cache=True, nogil=True)
def _stamp(buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, count: int,
           ts: int) -> None:
    for i in range(count):
        o = offsets[i]
        if lengths[i] < fl.FRAME_HEADER_BYTES or buf[o + fl.FLAGS_OFFSET + 1] & _AUTH:
            continue
        for b in range(8):
            buf[o + _TS_END - 1 - b] = (ts >> (8 * b)) & 0xFF


def stamp_send_ts(frames: FrameArrays, count: int, now_ns: int | None = None) -> None:
    """Write ``now_ns`` (default: the wall clock) big-endian into each frame's ``send_ts_ns``.

    Frames shorter than a header, or with an auth trailer (the MAC covers the header), are
    left alone. Kernel: ``_stamp``.
    """
    if count > 0:
        _stamp(frames.buf, frames.offsets, frames.lengths, count,
               time.time_ns() if now_ns is None else now_ns)


def warm_up() -> None:
    """Compile/load this module's kernel and the batch decoder ``decode_batch`` runs."""
    warm_up_decoder()
    batch = FrameBatch(1, 64)
    batch.append(bytes(64))
    stamp_send_ts(batch.arrays(), 1)


def decode_batch(batch: FrameBatch, messages: np.ndarray, status: np.ndarray,
                 frame_types: np.ndarray, stats: ChannelStats | None = None) -> DecodeResult:
    """``decode_frames`` over a received batch (one frame per slot, ``exact``), counting the
    frames it rejects, per reason, in ``stats`` (``on_malformed``).

    ``status``/``frame_types`` need ``batch.capacity`` entries; ``messages`` is a
    ``new_message_batch``. When ``messages`` fills up, fewer frames are processed (see the
    result): decode the rest with offsets from ``result.frames``.
    """
    result = decode_frames(batch.buf, batch.offsets[: batch.count],
                           batch.lengths[: batch.count], messages, status, frame_types,
                           exact=True)
    if stats is not None and result.frames:
        stats.on_malformed(status, result.frames)
        types = frame_types[: result.frames]
        if types.max() >= _RELIABILITY_MIN_TYPE:  # cheap test: data-only batches skip the rest
            count_reliability_frames(batch.buf, batch.offsets, types,
                                     status[: result.frames] == 0, stats)
    return result


def count_reliability_frames(buf: np.ndarray, offsets: np.ndarray, frame_types: np.ndarray,
                             valid: np.ndarray, stats: ChannelStats) -> None:
    """Count NAK frames and the messages of RETRANSMISSION frames among valid received
    frames (``stats.naks``/``stats.retransmissions``); the sending side counts in
    ``ChannelSink``."""
    naks = int(np.count_nonzero(valid & (frame_types == _NAK)))
    if naks:
        stats.on_nak(naks)
    retransmitted = np.nonzero(valid & (frame_types == _RETRANSMISSION))[0]
    if retransmitted.size:
        at = offsets[retransmitted] + fl.MSG_COUNT_OFFSET
        stats.on_retransmission(int((buf[at].astype(np.int64) << 8 | buf[at + 1]).sum()))


class Channel(abc.ABC):
    """A bidirectional frame channel in poll mode; a context manager; ``close()`` twice is safe."""

    kind: str = "channel"
    """``udp``, ``mcast``, ``shm``, ``tcp``, ``rdma``."""

    def __init__(self, *, name: str | None = None, stamp_send_ts: bool = True) -> None:
        self.name = name or self.kind
        self.stats = ChannelStats(self.name)
        self.stamp_send_ts = stamp_send_ts
        self._closed = False

    # --- the interface ---------------------------------------------------------------------
    @abc.abstractmethod
    def send(self, frames: FrameBatch | FrameArrays | tuple, dest: Dest = None) -> int:
        """Send frames ``[0, count)`` in order; return how many the channel took (sent, or
        refused for good and counted in ``stats``); fewer than ``count`` = backpressure."""

    @abc.abstractmethod
    def receive(self, batch: FrameBatch, timeout_ns: int = 0) -> int:
        """Fill ``batch`` from slot 0; return ``batch.count`` (0 = nothing; never blocks at 0)."""

    def fileno(self) -> int:
        """A descriptor that polls readable when frames may be waiting (-1: none, spin)."""
        return -1

    def wait_fds(self) -> tuple[int, ...] | None:
        """Descriptors of which one polls readable whenever ``receive`` may return frames
        (an idle agent blocks in poll(2) on them); None when frames can arrive with none
        becoming readable (an RDMA link): then nobody may block on this channel. A
        shared-memory ring returns its doorbell, armed by the call (channels/shm.py)."""
        fd = self.fileno()
        return (fd,) if fd >= 0 else None

    def peer_address(self, peer_id: int) -> Any:
        """What a peer id stands for (an (host, port) for sockets)."""
        return peer_id

    @property
    def max_frame_bytes(self) -> int:
        """Largest frame this channel carries."""
        return MAX_FRAME_BYTES

    # --- lifecycle --------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failure(self) -> Exception | None:
        """The error that ended this channel for good, else None: a connected channel whose
        connection failed or whose peer left raises it from every call from then on (close
        it; a datagram channel never fails this way)."""
        return None

    def close(self) -> None:
        """Release the channel's OS resources; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._close()

    def _close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Kind-specific release; runs once."""

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"{self.name} channel is closed; open a new one")

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # never raise from a finalizer
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self.name} {state}>"


class ChannelSink:
    """A ``datapath.reliability.sink.FrameSink`` over a channel: frames collect in a batch.

    ``send_frame`` copies the frame into the next slot (the caller's buffer is only valid
    during the call) and sends the batch when it is full or the destination changes;
    ``flush()`` sends what is left (call it once per duty cycle). Frames the channel could not
    take stay queued for the next flush (``pending``); a frame that finds the queue still
    blocked is dropped and counted (``drops``, reason ``sink_backpressure``) as a lossy link
    would, never raised: the reliability timers recover it. NAK frames and retransmitted
    messages queued here are counted in the channel's ``stats.naks``/``retransmissions``
    (``decode_batch`` counts the ones received).
    """

    def __init__(self, channel: Channel, capacity: int = DEFAULT_BATCH_FRAMES,
                 slot_bytes: int = DEFAULT_SLOT_BYTES) -> None:
        self.channel = channel
        self.batch = FrameBatch(capacity, slot_bytes)
        self._dest: Dest = None

    @property
    def pending(self) -> int:
        return self.batch.count

    def send_frame(self, frame: memoryview | bytes | np.ndarray, dest: object = None) -> None:
        if self.batch.count and (dest != self._dest or self.batch.count == self.batch.capacity):
            self.flush()
            if self.batch.count == self.batch.capacity or (self.batch.count and
                                                           dest != self._dest):
                # still backpressured: drop this frame like a lossy link would (counted);
                # NAK/retransmission timers recover it
                self.channel.stats.on_drop("sink_backpressure")
                return
        self._dest = dest  # type: ignore[assignment]
        self.batch.append(frame)
        if len(frame) >= fl.FRAME_HEADER_BYTES:  # reliability counters of the channel
            frame_type = frame[fl.TYPE_OFFSET]
            if frame_type == _NAK:
                self.channel.stats.on_nak()
            elif frame_type == _RETRANSMISSION:
                at = fl.MSG_COUNT_OFFSET
                self.channel.stats.on_retransmission(int(frame[at]) << 8 | int(frame[at + 1]))

    def flush(self) -> int:
        """Send the queued frames; return how many went."""
        batch = self.batch
        if not batch.count:
            return 0
        sent = self.channel.send(batch, self._dest)
        rest = batch.count - sent
        if rest and sent:  # keep the unsent frames at the front, in order
            for j in range(rest):
                length = int(batch.lengths[sent + j])
                batch.slot(j)[:length] = batch.slot(sent + j)[:length]
                batch.lengths[j] = length
        batch.count = rest
        return sent
