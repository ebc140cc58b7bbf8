"""Slow pure-Python twins of the software NIC's kernels (CONVENTIONS.md #4).

Each twin repeats its kernel's algorithm with Python integers and lists, reading the same
table arrays, so the randomized tests (tests/nic_offload) can hold kernel and twin to
identical tables, decisions, descriptors, counters and digests. ``run_twin`` is the whole
pipeline in pure Python, burst by burst (the reference codec, then ``process_twin``): the
``python_twin`` baseline of ``topicwire bench softnic``, which is why the twins ship with the
package instead of living in the tests (tests/nic_offload/twins.py re-exports them).
Nothing on a data path uses them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from datapath.protocol import codec
from datapath.protocol import frame_layout as fl
from datapath.protocol.errors import ProtocolError
from datapath.protocol.message_layout import (
    MAX_MESSAGES_PER_FRAME,
    MESSAGE_HEADER_BYTES,
    PAYLOAD_OFFSET,
)
from nic_offload.model import AclAction, DigestReason, KeyAction
from nic_offload.softnic import layout as L
from nic_offload.softnic.tables import SoftTables

MASK64 = (1 << 64) - 1
V = L.MessageVerdict
C = L.Counter


@dataclass
class Msg:
    """A decoded message as the twins see it."""

    topic_key: int
    sequence: int
    namespace_id: int
    payload_offset: int
    payload_len: int
    topic_len: int


def messages_from_batch(batch: np.ndarray, count: int) -> list[Msg]:
    return [Msg(int(r["topic_key"]), int(r["sequence"]), int(r["namespace_id"]),
                int(r["payload_offset"]), int(r["payload_len"]), int(r["topic_len"]))
            for r in batch[:count]]


# --- key table ---------------------------------------------------------------------------------
def home_twin(key: int, shift: int) -> int:
    """The home bucket of ``key``."""
    return ((key * L.HASH_MULTIPLIER) & MASK64) >> shift


def build_key_table_twin(n_slots: int, shift: int, keys: list[int], values: list[int]
                         ) -> tuple[list[int], int]:
    """Twin of ``_kernels._build_key_table`` on an empty table: (words, longest probe)."""
    words = [0] * (2 * n_slots)
    buckets = n_slots // L.SLOTS_PER_BUCKET
    longest = 0
    for key, value in zip(keys, values):
        b = home_twin(key, shift)
        probes = 1
        while True:
            free = [w for w in range(L.WORDS_PER_BUCKET * b, L.WORDS_PER_BUCKET * (b + 1), 2)
                    if words[w] in (0, key)]
            if free:
                break
            b = (b + 1) % buckets
            probes += 1
        words[free[0]] = key
        words[free[0] + 1] = value
        longest = max(longest, probes)
    return words, longest


def lookup_twin(slots: np.ndarray, shift: int, key: int) -> int:
    """Twin of ``_kernels._lookup``: the value word of ``key`` or 0, slot by slot."""
    if key == 0:
        return 0
    buckets = len(slots) // L.WORDS_PER_BUCKET
    b = home_twin(key, shift)
    while True:
        for w in range(L.WORDS_PER_BUCKET * b, L.WORDS_PER_BUCKET * (b + 1), 2):
            k = int(slots[w])
            if k == key:
                return int(slots[w + 1])
            if k == 0:
                return 0
        b = (b + 1) % buckets


# --- ACL ---------------------------------------------------------------------------------------
def acl_twin(buf: bytes, payload_offset: int, result: int, tables: SoftTables) -> int:
    """Twin of ``_kernels._acl``: ACCEPT, REJECT or LOG; a plain linear scan of each group."""
    while result >= 0:
        start, end, offset, width = (int(x) for x in tables.groups[
            L.GROUP_WORDS * result:L.GROUP_WORDS * (result + 1)])
        off = payload_offset + offset
        value = int.from_bytes(buf[off:off + width], "big")
        chosen = start
        for i in range(start, end):
            if int(tables.bound_lo[i]) <= value:
                chosen = i
        result = int(tables.bound_result[chosen])
    return -result


# --- the pipeline ------------------------------------------------------------------------------
@dataclass
class TwinState:
    """What the kernel keeps in arrays, as Python values."""

    digest_capacity: int
    counters: list[int] = field(default_factory=lambda: [0] * L.COUNTER_SLOTS)
    malformed: list[int] = field(default_factory=lambda: [0] * L.MALFORMED_SLOTS)
    key_counts: dict[int, list[int]] = field(default_factory=dict)
    digests: deque = field(default_factory=deque)

    def digest(self, reason: int, msg: Msg, acl_class: int, index: int) -> None:
        if len(self.digests) >= self.digest_capacity:
            self.counters[C.DIGEST_DROPS] += 1
            return
        self.digests.append((reason, acl_class, msg.namespace_id, msg.topic_key, msg.sequence,
                             index))
        self.counters[C.DIGESTS] += 1


def process_twin(buf: bytes, messages: list[Msg], statuses: list[int], frame_types: list[int],
                 tables: SoftTables, state: TwinState, first_index: int = 0
                 ) -> tuple[list[tuple], list[int]]:
    """Twin of one burst of ``_kernels._run`` after its decode: (descriptors, verdicts);
    counters land in ``state``. Messages are numbered from ``first_index`` (descriptor and
    digest ``index``)."""
    for status, ftype in zip(statuses, frame_types):
        state.counters[C.FRAMES] += 1
        if status:
            state.counters[C.MALFORMED_FRAMES] += 1
            state.malformed[status] += 1
        elif ftype not in (fl.FrameType.DATA, fl.FrameType.RETRANSMISSION):
            state.counters[C.ADMIN_FRAMES] += 1
    descriptors: list[tuple] = []
    verdicts: list[int] = []
    for m, msg in enumerate(messages):
        size = MESSAGE_HEADER_BYTES + ((msg.payload_len + msg.topic_len + 7) & ~7)
        state.counters[C.MESSAGES] += 1
        value = lookup_twin(tables.slots, tables.shift, msg.topic_key)
        verdict = _decide(buf, msg, first_index + m, value, size, tables, state)
        verdicts.append(verdict)
        state.counters[verdict] += 1
        if verdict in (V.FORWARDED, V.LOGGED):
            action = (value >> L.ACTION_SHIFT) & L.ACTION_MASK
            kind = L.DescriptorKind.GROUP if action == KeyAction.FORWARD_GROUP \
                else L.DescriptorKind.PORT
            descriptors.append((msg.payload_offset - PAYLOAD_OFFSET, size,
                                value & L.TARGET_MASK, int(kind), first_index + m))
    return descriptors, verdicts


def _decide(buf: bytes, msg: Msg, m: int, value: int, size: int, tables: SoftTables,
            state: TwinState) -> int:
    if value == 0:
        state.digest(DigestReason.UNKNOWN_KEY, msg, 0, m)
        return V.UNKNOWN_KEY
    counts = state.key_counts.setdefault(value >> L.ROW_SHIFT, [0, 0])
    counts[0] += 1
    counts[1] += size
    action = (value >> L.ACTION_SHIFT) & L.ACTION_MASK
    if action == KeyAction.DROP:
        return V.DROPPED
    if action == KeyAction.PUNT:
        state.digest(DigestReason.PUNT, msg, 0, m)
        return V.PUNTED
    acl_class = (value >> L.CLASS_SHIFT) & L.CLASS_MASK
    if acl_class == 0:
        return V.FORWARDED
    if msg.payload_len < tables.fields_end:
        return V.ACL_SHORT_PAYLOAD
    outcome = acl_twin(buf, msg.payload_offset, int(tables.class_root[acl_class]), tables)
    if outcome == AclAction.REJECT:
        return V.ACL_REJECTED
    if outcome == AclAction.LOG:
        state.digest(DigestReason.ACL_LOG, msg, acl_class, m)
        return V.LOGGED
    return V.FORWARDED


def decode_twin(buf: bytes, offsets: list[int], lengths: list[int], capacity: int
                ) -> tuple[list[int], list[int], list[Msg], int]:
    """The first pass in pure Python (the reference codec): (statuses, frame types,
    messages, frames processed). Like the kernel it stops before a message frame whose
    header is valid and whose ``msg_count`` (within the protocol's bound) does not fit in
    what is left of ``capacity``, before walking its messages."""
    statuses, types, messages = [], [], []
    for i, (off, length) in enumerate(zip(offsets, lengths)):
        try:
            header = codec.decode_header(buf, off, length)
            count = header.msg_count
            if header.frame_type in fl.MESSAGE_FRAME_TYPES and 0 < count <= \
                    MAX_MESSAGES_PER_FRAME and len(messages) + count > capacity:
                return statuses, types, messages, i
            frame = codec.decode_frame(buf, off, length)
        except ProtocolError as exc:
            statuses.append(int(exc.reason))
            types.append(buf[off + fl.TYPE_OFFSET] if 0 <= off and length > fl.TYPE_OFFSET
                         and off + length <= len(buf) else 0)
            continue
        types.append(int(frame.header.frame_type))
        if frame.is_message_frame:
            for view in frame.messages():
                messages.append(Msg(view.topic_key, view.sequence, view.namespace_id,
                                    view.offset + PAYLOAD_OFFSET, view.payload_len,
                                    view.topic_len))
        statuses.append(0)
    return statuses, types, messages, len(offsets)


def run_twin(buf: bytes, offsets: list[int], lengths: list[int], tables: SoftTables,
             state: TwinState, burst_frames: int, capacity: int
             ) -> tuple[list[tuple], list[int], int]:
    """Twin of ``_kernels._run`` over a ring of frames in bursts of ``burst_frames`` (each
    burst's messages decoded into at most ``capacity``): (descriptors, verdicts, frames
    processed). Admin frames are validated in full by the reference codec (the kernels stop
    at their header), so feed it message frames, or compare admin counts separately."""
    descriptors: list[tuple] = []
    verdicts: list[int] = []
    frame = 0
    while frame < len(offsets):
        end = min(frame + burst_frames, len(offsets))
        statuses, types, messages, done = decode_twin(buf, offsets[frame:end],
                                                      lengths[frame:end], capacity)
        if done == 0:
            break
        descs, decided = process_twin(buf, messages, statuses, types, tables, state,
                                      len(verdicts))
        descriptors += descs
        verdicts += decided
        frame += done
    return descriptors, verdicts, frame
