"""Frames of the RDMA hardware tests: many, of mixed sizes, checked without a loop per frame.

Each frame has a native header (``TW`` v1 DATA, so the channel stamps and times it) with its
index in bytes 12..19, then seeded random bytes. The frames lie back to back in one buffer,
which is also what the checker compares received batches against, in order (all but the
``send_ts_ns`` field, which the sending channel stamps).
"""

from __future__ import annotations

import numpy as np

from datapath.protocol import frame_layout as fl

INDEX_OFFSET = fl.SOURCE_SESSION_OFFSET
"""The frame's index, big-endian u64 over source_session and dest_session."""


class Frames:
    """``count`` frames back to back: ``buf[offsets[i] : offsets[i] + lengths[i]]``."""

    def __init__(self, count: int, *, seed: int, min_bytes: int = 32, max_bytes: int = 2_048,
                 big_every: int = 0, big_max_bytes: int = 65_504,
                 exact: list[int] | None = None) -> None:
        rng = np.random.default_rng(seed)
        sizes = np.exp(rng.uniform(np.log(min_bytes), np.log(max_bytes + 1), count))
        lengths = sizes.astype(np.int64).clip(min_bytes, max_bytes)
        if exact is not None:  # these lengths, not random ones
            lengths = np.asarray(exact, np.int64)
        if big_every:
            big = np.arange(big_every - 1, count, big_every)
            lengths[big] = rng.integers(max(8_192, max_bytes), big_max_bytes + 1, big.size)
        self.count = count
        self.lengths = lengths
        self.offsets = np.zeros(count, np.int64)
        self.offsets[1:] = np.cumsum(lengths)[:-1]
        self.buf = rng.integers(0, 256, int(lengths.sum()), dtype=np.uint8)
        o = self.offsets
        header = np.frombuffer(fl.FRAME_HEADER_STRUCT.pack(
            fl.FRAME_MAGIC, fl.PROTOCOL_VERSION, fl.FrameType.DATA, 0, 0, 0, 0, 0, 1, 0),
            np.uint8)
        for b in range(fl.FRAME_HEADER_BYTES):
            self.buf[o + b] = header[b]
        index = np.arange(count, dtype=np.uint64)
        for b in range(8):
            self.buf[o + INDEX_OFFSET + b] = (index >> np.uint64(56 - 8 * b)) & np.uint64(0xFF)

    def arrays(self, first: int, count: int) -> tuple:
        """Frames ``[first, first + count)`` as ``send`` takes them."""
        count = min(count, self.count - first)
        return (self.buf, self.offsets[first:first + count], self.lengths[first:first + count],
                count)

    @property
    def total_bytes(self) -> int:
        return int(self.lengths.sum())


class InOrderChecker:
    """Compares received batches with ``frames``, in order, with a few numpy calls per batch."""

    def __init__(self, frames: Frames) -> None:
        self.frames = frames
        self.next = 0

    def check(self, batch: object) -> None:
        n = batch.count
        if not n:
            return
        f = self.frames
        k = self.next
        assert k + n <= f.count, f"{k + n} frames received, only {f.count} were sent"
        lengths = batch.lengths[:n]
        expected = f.lengths[k:k + n]
        if not np.array_equal(lengths, expected):
            bad = int(np.nonzero(lengths != expected)[0][0])
            raise AssertionError(f"frame {k + bad}: {lengths[bad]} bytes, sent "
                                 f"{expected[bad]} (out of order or cut)")
        total = int(lengths.sum())
        firsts = np.cumsum(lengths) - lengths  # where each frame starts in got/sent
        starts = batch.offsets[:n] - firsts
        got = batch.buf[np.repeat(starts, lengths) + np.arange(total)]
        sent = f.buf[f.offsets[k]:f.offsets[k] + total].copy()
        # the sending channel stamps send_ts_ns into its own copy (another process's, at times)
        stamp = (firsts[:, None] + np.arange(fl.SEND_TS_OFFSET, fl.SEND_TS_OFFSET + 8)).ravel()
        got[stamp] = sent[stamp] = 0
        if not np.array_equal(got, sent):
            first_bad = int(np.nonzero(got != sent)[0][0])
            frame = int(np.searchsorted(np.cumsum(lengths), first_bad, side="right"))
            raise AssertionError(f"frame {k + frame} differs from what was sent "
                                 f"(byte {first_bad} of the batch)")
        self.next = k + n
