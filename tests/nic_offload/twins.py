"""Slow pure-Python twins of the software NIC's kernels (CONVENTIONS.md #4).

Each twin repeats its kernel's algorithm with Python integers and lists, reading the same
table arrays, so the randomized tests can hold kernel and twin to identical tables,
decisions, descriptors, counters and digests. ``decode_twin`` + ``process_twin`` also form the
whole pipeline in pure Python (the ``python_twin`` baseline of ``topicwire bench softnic``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from datapath.protocol import codec
from datapath.protocol import frame_layout as fl
from datapath.protocol.errors import ProtocolError
from datapath.protocol.message_layout import MESSAGE_HEADER_BYTES, PAYLOAD_OFFSET
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
    return ((key * L.HASH_MULTIPLIER) & MASK64) >> shift


def build_key_table_twin(n_slots: int, shift: int, keys: list[int], values: list[int]
                         ) -> tuple[list[int], int]:
    """Twin of ``_kernels._build_key_table`` on an empty table: (words, longest probe)."""
    words = [0] * (2 * n_slots)
    longest = 0
    for key, value in zip(keys, values):
        s = home_twin(key, shift)
        probes = 1
        while words[2 * s] not in (0, key):
            s = (s + 1) % n_slots
            probes += 1
        words[2 * s] = key
        words[2 * s + 1] = value
        longest = max(longest, probes)
    return words, longest


def lookup_twin(slots: np.ndarray, shift: int, key: int) -> int:
    """Twin of ``_kernels._lookup``: the value word of ``key`` or 0."""
    if key == 0:
        return 0
    n_slots = len(slots) // 2
    s = home_twin(key, shift)
    while True:
        k = int(slots[2 * s])
        if k == key:
            return int(slots[2 * s + 1])
        if k == 0:
            return 0
        s = (s + 1) % n_slots


# --- ACL ---------------------------------------------------------------------------------------
def acl_twin(buf: bytes, payload_offset: int, result: int, tables: SoftTables) -> int:
    """Twin of ``_kernels._acl``: ACCEPT, REJECT or LOG; a plain linear scan of each group."""
    while result >= 0:
        g = result
        k = int(tables.group_field[g])
        off = payload_offset + int(tables.field_offset[k])
        value = int.from_bytes(buf[off:off + int(tables.field_width[k])], "big")
        start, end = int(tables.group_start[g]), int(tables.group_start[g + 1])
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
                 tables: SoftTables, state: TwinState) -> tuple[list[tuple], list[int]]:
    """Twin of ``_kernels._process``: (descriptors, verdicts); counters land in ``state``."""
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
        verdict = _decide(buf, msg, m, value, size, tables, state)
        verdicts.append(verdict)
        state.counters[verdict] += 1
        if verdict in (V.FORWARDED, V.LOGGED):
            action = (value >> L.ACTION_SHIFT) & L.ACTION_MASK
            kind = L.DescriptorKind.GROUP if action == KeyAction.FORWARD_GROUP \
                else L.DescriptorKind.PORT
            descriptors.append((msg.payload_offset - PAYLOAD_OFFSET, size,
                                value & L.TARGET_MASK, int(kind), m))
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
    messages, frames processed), stopping like decode_frames when ``capacity`` is reached."""
    statuses, types, messages = [], [], []
    for i, (off, length) in enumerate(zip(offsets, lengths)):
        try:
            frame = codec.decode_frame(buf, off, length)
        except ProtocolError as exc:
            statuses.append(int(exc.reason))
            types.append(buf[off + fl.TYPE_OFFSET] if length > fl.TYPE_OFFSET else 0)
            continue
        types.append(int(frame.header.frame_type))
        if frame.is_message_frame:
            if len(messages) + frame.header.msg_count > capacity:
                types.pop()
                return statuses, types, messages, i
            for view in frame.messages():
                messages.append(Msg(view.topic_key, view.sequence, view.namespace_id,
                                    view.offset + PAYLOAD_OFFSET, view.payload_len,
                                    view.topic_len))
        statuses.append(0)
    return statuses, types, messages, len(offsets)
