"""The sender's bounded retransmission buffer: the message bytes of its last frames.

Frames are stored whole (their message bodies, one copy per frame on the hot path) in a byte
ring; an index of (first_seq, last_seq, offset, length) per frame finds them again. A NAKed
range is answered by walking only the frames that hold it (the cold path). Writing a frame
evicts the oldest frames its bytes overlap, and frames beyond the message capacity: what is
evicted can only be answered with LOSS. So are the ranges the sender *skipped* (sequence numbers
of messages it had to refuse, never sent: ``skip``); they are kept, merged when adjacent, until
they fall below the lowest held sequence, where every sequence is answered with LOSS anyway.

    arena (bytes ring)   | frame k | frame k+1 | ... | frame n |   free   |
    index (per frame)      first_seq, last_seq, offset, length   (oldest first)

Memory grows with use, not with the bounds: the arena starts at ``INITIAL_ARENA_BYTES`` and
doubles (the held frames copied in order to the start of the new one) each time a frame
would wrap a ring smaller than ``capacity_bytes``; the per-sequence retransmission times
start at ``INITIAL_LINGER_SLOTS`` and double while more messages are held than they have
slots, up to ``capacity_messages``. An idle stream holds about 80 KiB, not its bounds
(4 MiB and 512 KiB for a guaranteed stream of the appliance: docs/reliability.md).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

import numpy as np

from datapath.protocol import message_layout as ml
from datapath.protocol.frame_layout import align8
from datapath.reliability.config import FIRST_SEQUENCE
from datapath.reliability.wire import LENGTHS_STRUCT

_NEVER_NS = -(1 << 62)
INITIAL_ARENA_BYTES = 64 * 1024
"""The arena's first size (at most ``capacity_bytes``); it doubles as frames need."""
INITIAL_LINGER_SLOTS = 1024
"""Retransmission times kept at first (at most ``capacity_messages``)."""


def _first(span: tuple[int, int]) -> int:
    return span[0]


class RetransmitBuffer:
    """Message bytes of the most recent frames of one stream, bounded by bytes and messages."""

    def __init__(self, capacity_bytes: int, capacity_messages: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.capacity_messages = capacity_messages
        self._size = min(capacity_bytes, INITIAL_ARENA_BYTES)
        """The arena's current size: the ring's length, at most ``capacity_bytes``."""
        self._arena = bytearray(self._size)
        self._view = memoryview(self._arena)
        self._firsts: list[int] = []
        self._frames: list[tuple[int, int, int, int]] = []
        self._head = 0
        self._write = 0
        self.next_seq = FIRST_SEQUENCE
        """One past the highest sequence stored (or ever stored)."""
        slots = min(capacity_messages, INITIAL_LINGER_SLOTS)
        self._mask = slots - 1
        self._retransmitted_ns = np.full(slots, _NEVER_NS, dtype=np.int64)
        self.evicted_frames = 0
        self._skipped: list[tuple[int, int]] = []
        """Skipped (first, last) ranges at or above the lowest held sequence, in order."""
        self.skipped_messages = 0
        """Sequences ever skipped (messages the stream could not carry)."""

    @property
    def lowest_seq(self) -> int:
        """Lowest sequence still held (next_seq when empty)."""
        if self._head < len(self._frames):
            return self._frames[self._head][0]
        return self.next_seq

    @property
    def frames(self) -> int:
        return len(self._frames) - self._head

    def bytes_from(self, seq: int) -> int:
        """Arena bytes the held frames from the one holding ``seq`` on take (all held frames
        when ``seq`` is below them; 0 when none is at or above it)."""
        frames = self._frames
        head = self._head
        if head >= len(frames) or seq >= self.next_seq:
            return 0
        i = max(bisect_right(self._firsts, seq, head) - 1, head)
        off, write = frames[i][2], self._write
        return write - off if off < write else self._size - off + write

    @property
    def arena_bytes(self) -> int:
        """Bytes the arena takes now (it grows with use up to ``capacity_bytes``)."""
        return self._size

    def _grow(self, need: int) -> None:
        """Double the arena (at least to ``need`` bytes, at most ``capacity_bytes``) and copy
        the held frames, oldest first, to its start."""
        size = self._size
        while size < need:
            size *= 2
        size = min(size, self.capacity_bytes)
        arena = bytearray(size)
        view = memoryview(arena)
        frames = self._frames
        pos = 0
        moved = []
        for f0, f1, off, length in frames[self._head:]:
            view[pos:pos + length] = self._view[off:off + length]
            moved.append((f0, f1, pos, length))
            pos += length
        self._view.release()
        self._arena, self._view, self._size = arena, view, size
        self._frames = moved
        self._firsts = [f[0] for f in moved]
        self._head = 0
        self._write = pos

    def _evict_oldest(self) -> None:
        self._head += 1
        self.evicted_frames += 1
        if self._head > 1024 and self._head * 2 > len(self._frames):
            del self._frames[: self._head]
            del self._firsts[: self._head]
            self._head = 0

    def skip(self, first_seq: int, count: int) -> None:
        """Sequences first_seq .. first_seq + count - 1 were skipped: never sent, lost."""
        last_seq = first_seq + count - 1
        self.next_seq = last_seq + 1
        self.skipped_messages += count
        skipped = self._skipped
        if skipped and skipped[-1][1] + 1 == first_seq:
            skipped[-1] = (skipped[-1][0], last_seq)
        else:
            skipped.append((first_seq, last_seq))
        self._forget_skipped()

    def _forget_skipped(self) -> None:
        """Drop the ranges below the lowest held sequence (answered with LOSS anyway), except
        a range at the tail: the sender's tail probe still announces it."""
        skipped = self._skipped
        low = self.lowest_seq
        end = len(skipped) - (skipped[-1][1] == self.next_seq - 1)
        i = 0
        while i < end and skipped[i][1] < low:
            i += 1
        if i:
            del skipped[:i]

    def skipped_in(self, first_seq: int, last_seq: int, limit: int) -> list[tuple[int, int]]:
        """The skipped parts of [first_seq, last_seq] (at most ``limit`` ranges), in order."""
        skipped = self._skipped
        out: list[tuple[int, int]] = []
        if first_seq > last_seq or limit <= 0:
            return out
        i = max(bisect_right(skipped, first_seq, key=_first) - 1, 0)
        while i < len(skipped) and len(out) < limit:
            a, b = skipped[i]
            if a > last_seq:
                break
            if b >= first_seq:
                out.append((max(a, first_seq), min(b, last_seq)))
            i += 1
        return out

    def tail_skipped(self) -> tuple[int, int] | None:
        """The skipped range that ends the stream (the highest sequence), or None."""
        if self._skipped and self._skipped[-1][1] == self.next_seq - 1:
            return self._skipped[-1]
        return None

    def append(self, first_seq: int, count: int, body: memoryview | bytes) -> None:
        """Store a frame body holding messages first_seq .. first_seq + count - 1."""
        n = len(body)
        last_seq = first_seq + count - 1
        self.next_seq = last_seq + 1
        if n > self.capacity_bytes or count > self.capacity_messages:
            while self._head < len(self._frames):
                self._evict_oldest()
            self._skipped.clear()
            return
        pos = self._write
        if pos + n > self._size < self.capacity_bytes:  # grow rather than wrap
            self._grow(sum(f[3] for f in self._frames[self._head:]) + n)
            pos = self._write
        frames = self._frames
        if pos + n > self._size:
            # wrap: the frames left in the skipped tail [pos, end) are the oldest; drop them
            while self._head < len(frames) and frames[self._head][2] >= pos:
                self._evict_oldest()
            pos = 0
        while self._head < len(frames):
            f0, _, off, length = frames[self._head]
            overlaps = off < pos + n and off + length > pos
            if overlaps or last_seq - f0 + 1 > self.capacity_messages:
                self._evict_oldest()
            else:
                break
        self._view[pos : pos + n] = body
        frames.append((first_seq, last_seq, pos, n))
        self._firsts.append(first_seq)
        self._write = pos + n
        if self._skipped and self._skipped[0][1] < frames[self._head][0]:
            self._forget_skipped()

    def messages(self, first_seq: int, last_seq: int) -> Iterator[tuple[int, memoryview]]:
        """(sequence, message bytes) for the held sequences in [first_seq, last_seq], in order."""
        frames = self._frames
        if self._head >= len(frames):
            return
        i = max(bisect_right(self._firsts, first_seq, lo=self._head) - 1, self._head)
        view = self._view
        while i < len(frames):
            f0, f1, off, _ = frames[i]
            if f0 > last_seq:
                return
            pos = off
            for seq in range(f0, min(f1, last_seq) + 1):
                payload_len, topic_len = LENGTHS_STRUCT.unpack_from(view, pos + 32)
                size = ml.MESSAGE_HEADER_BYTES + align8(payload_len + topic_len)
                if seq >= first_seq:
                    yield seq, view[pos : pos + size]
                pos += size
            i += 1

    def last_message(self) -> tuple[int, memoryview] | None:
        """The highest held message (the tail-loss probe), or None when empty."""
        if self._head >= len(self._frames):
            return None
        f0, f1, _, _ = self._frames[-1]
        for seq, msg in self.messages(f1, f1):
            return seq, msg
        return None

    def lingering(self, seq: int, now_ns: int, linger_ns: int) -> bool:
        """True if ``seq`` was retransmitted less than ``linger_ns`` ago; else marks it now."""
        held = self.next_seq - self.lowest_seq
        if held > self._mask + 1 and self._mask + 1 < self.capacity_messages:
            slots = self._mask + 1
            while slots < held and slots < self.capacity_messages:
                slots *= 2
            # each sequence keeps the time its old slot had (the old array repeated)
            self._retransmitted_ns = np.tile(self._retransmitted_ns,
                                             slots // len(self._retransmitted_ns))
            self._mask = slots - 1
        slot = seq & self._mask
        if now_ns - int(self._retransmitted_ns[slot]) < linger_ns:
            return True
        self._retransmitted_ns[slot] = now_ns
        return False


class AnswerBudget:
    """How many bytes NAKs from one requester may still make senders resend: a token bucket
    of ``burst_bytes`` refilled at ``bytes_per_s`` (docs/reliability.md, "Bounded answers").
    The streams towards one requester share one budget, so the bound is per requester and
    per time, however many streams it NAKs."""

    __slots__ = ("burst_bytes", "bytes_per_s", "tokens", "updated_ns")

    def __init__(self, bytes_per_s: int, burst_bytes: int) -> None:
        if bytes_per_s <= 0 or burst_bytes <= 0:
            raise ValueError("an answer budget needs bytes_per_s and burst_bytes above 0")
        self.bytes_per_s = bytes_per_s
        self.burst_bytes = burst_bytes
        self.tokens = float(burst_bytes)
        self.updated_ns: int | None = None

    def take(self, nbytes: int, now_ns: int) -> bool:
        """Spend ``nbytes`` if the budget holds them now; False (nothing spent) if not."""
        last = self.updated_ns
        if last is None or now_ns > last:
            if last is not None:
                self.tokens = min(self.burst_bytes,
                                  self.tokens + (now_ns - last) * self.bytes_per_s / 1e9)
            self.updated_ns = now_ns
        if nbytes > self.tokens:
            return False
        self.tokens -= nbytes
        return True
