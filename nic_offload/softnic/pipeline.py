"""The software NIC: runs bursts of received frames through the current table snapshot.

One ``SoftNic`` belongs to one data-path agent (no locks on the hot path). A burst is many
frames in one numpy buffer; one kernel call (``_kernels._run``) validates them (malformed
frames are counted per reason and skipped, the rest go on), parses their messages into
``batch`` and runs every message through the key table and the ACL stages, writing
preallocated arrays only:

- ``descriptors[:n]``: one (offset, length, port or group, message index) per forwarded
  message, in message order: what the per-egress batchers send;
- ``verdicts[:messages]``: what happened to each message (layout.MessageVerdict);
- counters: per verdict, frames, admin frames, malformed frames per reason; per key
  (topic_key table row) packets and bytes;
- a bounded digest queue of punts and ACL logs (full: the digest is dropped and counted),
  drained by the control path through ``drain_digests``.

``process`` runs one burst and leaves its decoded messages in ``batch`` (the appliance reads
them); ``process_ring`` runs a whole ring of frames in bursts of ``burst_frames`` in the same
single call, as a NIC works through its receive ring, writing descriptors and verdicts for
every message into arrays the caller provides (``ring_outputs``): the Python call is paid
once per ring instead of once per burst.

The snapshot is read once per call (snapshot.py): a burst, or a ring, never sees two
versions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datapath.protocol.batch import new_message_batch
from datapath.protocol.errors import MalformedReason
from nic_offload import snapshot as snapshots  # a module: snapshot.py imports softnic too
from nic_offload.errors import OffloadUserError
from nic_offload.softnic import _kernels
from nic_offload.softnic import layout as L

SOFTNIC_BURST_FRAMES = 1_024
"""Most frames one ``process`` call takes (status arrays are sized by it), in frames."""

SOFTNIC_RING_BURST_FRAMES = 64
"""Frames per burst of ``process_ring`` by default (a NIC's receive burst), in frames."""

SOFTNIC_BURST_MESSAGES = 16_384
"""Decoded messages one burst can hold, in messages; a burst with more stops early and
says how many frames it processed (hand the rest to the next call)."""


@dataclass(frozen=True, slots=True)
class BurstResult:
    """What one ``process`` call did."""

    version: int
    """The snapshot version every message of the burst was decided with."""
    frames: int
    """Frames processed: all of them, unless the message batch filled up (process the rest
    in another call)."""
    messages: int
    """Messages decoded (``verdicts[:messages]``)."""
    descriptors: int
    """Messages forwarded (``descriptors[:descriptors]``)."""


@dataclass(frozen=True, slots=True)
class RingResult:
    """What one ``process_ring`` call did."""

    version: int
    """The snapshot version every message of the ring was decided with."""
    frames: int
    """Frames processed: all of them, unless the outputs filled up (or a frame holds more
    messages than ``batch``); hand the rest to the next call."""
    messages: int
    """Messages decoded (``verdicts[:messages]``)."""
    descriptors: int
    """Messages forwarded (``descriptors[:descriptors]``)."""
    bursts: int
    """Bursts the frames were processed in."""


@dataclass(frozen=True, slots=True)
class KeyCounters:
    """Per-key packets and bytes, one row per topic key."""

    keys: np.ndarray
    packets: np.ndarray
    bytes: np.ndarray

    def as_dict(self) -> dict[int, tuple[int, int]]:
        return {int(k): (int(p), int(b))
                for k, p, b in zip(self.keys, self.packets, self.bytes) if p}


class SoftNic:
    """Software executor of the offload tables; see the module docstring."""

    def __init__(self, source: snapshots.SnapshotSwitch | snapshots.Snapshot, *,
                 burst_frames: int = SOFTNIC_BURST_FRAMES,
                 burst_messages: int = SOFTNIC_BURST_MESSAGES,
                 digest_entries: int | None = None) -> None:
        if burst_frames < 1 or burst_messages < 1:
            raise OffloadUserError("a software NIC needs burst_frames and burst_messages >= 1")
        self._switch = (source if isinstance(source, snapshots.SnapshotSwitch)
                        else snapshots.SnapshotSwitch(source))
        first = self._switch.current
        cap = digest_entries if digest_entries is not None else first.spec.digest_queue_entries
        if cap < 1:
            raise OffloadUserError("the digest queue needs at least 1 entry")
        self.batch = new_message_batch(burst_messages)
        self.status = np.zeros(burst_frames, dtype=np.uint8)
        self.frame_types = np.zeros(burst_frames, dtype=np.uint8)
        self.descriptors = np.zeros(burst_messages, dtype=L.DESCRIPTOR_DTYPE)
        self.verdicts = np.zeros(burst_messages, dtype=np.uint8)
        self._digests = np.zeros(1 << (cap - 1).bit_length(), dtype=L.DIGEST_DTYPE)
        self._digest_state = np.zeros(L.DIGEST_STATE_WORDS, dtype=np.int64)
        self._counters = np.zeros(L.COUNTER_SLOTS, dtype=np.int64)
        self._malformed = np.zeros(L.MALFORMED_SLOTS, dtype=np.int64)
        self._values = np.zeros(burst_messages, dtype=np.uint64)
        self._homes = np.zeros(burst_messages, dtype=np.uint64)
        self._acl_results = np.zeros(burst_messages, dtype=np.int64)
        self._payloads = np.zeros(burst_messages, dtype=np.uint64)
        self._pending = np.zeros(burst_messages, dtype=np.uint64)
        self._result = np.zeros(_kernels.RUN_RESULT_WORDS, dtype=np.int64)
        self._key_counts = np.zeros(0, dtype=np.int64)
        self._burst_state: tuple | None = None
        self._retired: dict[int, list[int]] = {}
        self._snapshot: snapshots.Snapshot | None = None
        self._adopt(first)

    @property
    def switch(self) -> snapshots.SnapshotSwitch:
        return self._switch

    @property
    def snapshot(self) -> snapshots.Snapshot:
        """The snapshot the last burst ran on."""
        assert self._snapshot is not None
        return self._snapshot

    def process(self, buf: np.ndarray, frame_offsets: np.ndarray, frame_lengths: np.ndarray,
                *, exact: bool = True) -> BurstResult:
        """Run the frames ``buf[off:off+len]`` through the current snapshot as one burst.

        ``buf`` is a 1-D uint8 array; offsets and lengths are int64 arrays (``exact``: each
        length is a datagram holding one frame). Results land in ``batch``, ``descriptors``,
        ``verdicts`` and the counters. Kernel: ``_kernels._run`` (one burst).
        """
        frames = len(frame_offsets)
        if frames > len(self.status):
            raise OffloadUserError(f"a burst holds at most {len(self.status)} frames, got "
                                   f"{frames}; split it or raise burst_frames")
        snap = self._current()
        self._run(snap, buf, frame_offsets, frame_lengths, exact, max(frames, 1), 1,
                  self.descriptors, self.verdicts)
        r = self._result
        return BurstResult(snap.version, int(r[_kernels._R_FRAMES]),
                           int(r[_kernels._R_MESSAGES]), int(r[_kernels._R_DESCRIPTORS]))

    def process_ring(self, buf: np.ndarray, frame_offsets: np.ndarray,
                     frame_lengths: np.ndarray, descriptors: np.ndarray, verdicts: np.ndarray,
                     *, burst_frames: int = SOFTNIC_RING_BURST_FRAMES, exact: bool = True
                     ) -> RingResult:
        """Run a ring of frames through the current snapshot, ``burst_frames`` at a time,
        in one call.

        Like ``process``, but every burst's descriptors and verdicts go on in the caller's
        ``descriptors`` (DESCRIPTOR_DTYPE) and ``verdicts`` (uint8) arrays, numbered from the
        ring's first message; ``batch`` keeps only the last burst's messages. The call stops
        before a burst whose messages do not fit in them (see ``RingResult.frames``).
        Kernel: ``_kernels._run``.
        """
        if not 1 <= burst_frames <= len(self.status):
            raise OffloadUserError(f"burst_frames must be 1..{len(self.status)} (the NIC's "
                                   f"burst_frames), got {burst_frames}")
        if descriptors.dtype != L.DESCRIPTOR_DTYPE or verdicts.dtype != np.uint8 \
                or descriptors.ndim != 1 or verdicts.ndim != 1:
            raise OffloadUserError("process_ring writes into arrays made by ring_outputs(); "
                                   "got other dtypes or shapes")
        snap = self._current()
        self._run(snap, buf, frame_offsets, frame_lengths, exact, burst_frames,
                  len(frame_offsets), descriptors, verdicts)
        r = self._result
        return RingResult(snap.version, int(r[_kernels._R_FRAMES]),
                          int(r[_kernels._R_MESSAGES]), int(r[_kernels._R_DESCRIPTORS]),
                          int(r[_kernels._R_BURSTS]))

    @staticmethod
    def ring_outputs(messages: int) -> tuple[np.ndarray, np.ndarray]:
        """Zeroed (descriptors, verdicts) arrays for a ring of up to ``messages`` messages."""
        if messages < 1:
            raise OffloadUserError("ring outputs need room for at least 1 message")
        return (np.zeros(messages, dtype=L.DESCRIPTOR_DTYPE),
                np.zeros(messages, dtype=np.uint8))

    def burst_state(self) -> tuple[snapshots.Snapshot, tuple]:
        """(the current snapshot, this NIC's state with its tables): the arguments that
        ``run_burst`` (``_kernels._run``) takes after its first six (buffer, offsets,
        lengths, exact, burst_frames, max_bursts), for a kernel that runs the NIC inside its
        own compiled code (appliance/dataplane/express.py) instead of through ``process``. Adopts a
        new snapshot first, as ``process`` does; the tuple is made once per snapshot."""
        snap = self._current()
        cached = self._burst_state
        if cached is None or cached[0] is not snap:
            cached = self._burst_state = (snap, self._state(snap, self.descriptors,
                                                            self.verdicts))
        return cached

    def _state(self, snap: snapshots.Snapshot, descriptors: np.ndarray,
               verdicts: np.ndarray) -> tuple:
        """``_kernels._run``'s arguments after its first six, on ``snap``'s tables."""
        t = snap.tables
        return (self.batch, self.status, self.frame_types, self._homes, self._values,
                self._acl_results, self._payloads, self._pending, t.slots, t.shift,
                t.class_root, t.groups, t.bound_lo, t.bound_result, t.fields_end,
                self._key_counts, self._counters, self._malformed, descriptors, verdicts,
                self._digests, self._digest_state, self._result)

    def _current(self) -> snapshots.Snapshot:
        snap = self._switch.current  # read once: the whole call runs on this version
        if snap is not self._snapshot:
            self._adopt(snap)
        return snap

    def _run(self, snap: snapshots.Snapshot, buf: np.ndarray, frame_offsets: np.ndarray,
             frame_lengths: np.ndarray, exact: bool, burst_frames: int, max_bursts: int,
             descriptors: np.ndarray, verdicts: np.ndarray) -> None:
        if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
            buf = _as_u8(buf)
        if len(frame_offsets) != len(frame_lengths):
            raise OffloadUserError("frame_offsets and frame_lengths differ in length")
        _kernels._run(buf, _as_i64(frame_offsets), _as_i64(frame_lengths), bool(exact),
                      burst_frames, max_bursts, *self._state(snap, descriptors, verdicts))

    # --- counters ------------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        """Global counters by name (verdicts, frames, digests)."""
        names = {int(v): v.name.lower() for v in L.MessageVerdict
                 if v is not L.MessageVerdict.NOT_PROCESSED}
        names.update({int(c): c.name.lower() for c in L.Counter})
        return {name: int(self._counters[index]) for index, name in names.items()}

    def malformed(self) -> dict[str, int]:
        """Malformed frames per reason (MalformedReason names), reasons seen only."""
        known = {int(r) for r in MalformedReason}
        return {MalformedReason(i).name.lower(): int(n)
                for i, n in enumerate(self._malformed) if n and i in known}

    def key_counters(self) -> KeyCounters:
        """Packets and bytes per topic key since this NIC started (copies)."""
        rows = self.snapshot.entries.key_rows
        n = len(rows)
        keys = rows.keys.copy()
        packets = self._key_counts[0:2 * n:2].copy()
        octets = self._key_counts[1:2 * n:2].copy()
        if self._retired:
            row_of = {int(k): i for i, k in enumerate(keys)}
            extra = []
            for key, (p, b) in self._retired.items():
                if key in row_of:
                    packets[row_of[key]] += p
                    octets[row_of[key]] += b
                else:
                    extra.append((key, p, b))
            if extra:
                keys = np.concatenate([keys, np.array([e[0] for e in extra], np.uint64)])
                packets = np.concatenate([packets, np.array([e[1] for e in extra], np.int64)])
                octets = np.concatenate([octets, np.array([e[2] for e in extra], np.int64)])
        return KeyCounters(keys, packets, octets)

    # --- digests -------------------------------------------------------------------------------
    def pending_digests(self) -> int:
        return int(self._digest_state[L.DIGEST_TAIL] - self._digest_state[L.DIGEST_HEAD])

    def drain_digests(self, limit: int | None = None) -> np.ndarray:
        """Take up to ``limit`` queued digests (all when None), oldest first (a copy)."""
        head = int(self._digest_state[L.DIGEST_HEAD])
        count = self.pending_digests() if limit is None else min(limit, self.pending_digests())
        cap = len(self._digests)
        index = (head + np.arange(count)) & (cap - 1)
        out = self._digests[index].copy()
        self._digest_state[L.DIGEST_HEAD] = head + count
        return out

    # --- snapshots -----------------------------------------------------------------------------
    def _adopt(self, snap: snapshots.Snapshot) -> None:
        """Switch to ``snap``: keep per-key counters when rows keep their keys, else retire
        them by key; grow the counter arrays to the snapshot's rows."""
        old = self._snapshot
        new_keys = snap.entries.key_rows.keys
        if old is not None:
            old_keys = old.entries.key_rows.keys
            n = min(len(old_keys), len(new_keys))
            delta = snap.delta
            if delta is not None and delta[0] == old.version:
                # evolved from it: the rows differ only where the delta says (no comparison
                # of every key)
                at = np.asarray(delta[1], np.int64)
                at = at[at < n]
                same = np.array_equal(old_keys[at], new_keys[at])
            else:
                same = old_keys is new_keys or np.array_equal(old_keys[:n], new_keys[:n])
            if not same:
                self._retire(old_keys)
        words = 2 * len(new_keys)  # packets, bytes per row
        if len(self._key_counts) < words:
            grown = np.zeros(max(words, 2 * len(self._key_counts)), np.int64)
            grown[:len(self._key_counts)] = self._key_counts
            self._key_counts = grown
        self._snapshot = snap

    def _retire(self, old_keys: np.ndarray) -> None:
        packets = self._key_counts[0:2 * len(old_keys):2]
        for row in np.flatnonzero(packets):
            counts = self._retired.setdefault(int(old_keys[row]), [0, 0])
            counts[0] += int(packets[row])
            counts[1] += int(self._key_counts[2 * row + 1])
        self._key_counts[:] = 0


def _as_u8(buf: object) -> np.ndarray:
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise OffloadUserError("frame buffers are 1-D uint8 arrays")
        return buf
    return np.frombuffer(buf, dtype=np.uint8)  # type: ignore[call-overload]


def _as_i64(array: np.ndarray) -> np.ndarray:
    if isinstance(array, np.ndarray) and array.dtype == np.int64:
        return array
    return np.asarray(array, dtype=np.int64)
