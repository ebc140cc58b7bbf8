"""The software NIC's compiled form of an entry set: the key hash table and the ACL arrays.

``build_tables`` turns a ``model.EntrySet`` into read-only numpy arrays (layout.py);
``patch_tables`` makes the next version from the previous one by rewriting only the rows
that changed (a subscribe touches the keys its pattern overlaps, not all of them) in the
other of two slot buffers patched in turn (``nic_offload.buffers``), not in a copy of the
whole table. Kernel: ``_kernels._build_key_table`` (inserts and updates).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from nic_offload import buffers, model
from nic_offload.errors import ModelError
from nic_offload.model import (
    AclAction,
    EntrySet,
    KeyRows,
    PipelineSpec,
    TableEntry,
    sorted_unique,
)
from nic_offload.softnic import _kernels
from nic_offload.softnic import layout as L

_U64 = np.uint64


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _line_aligned_words(words: int, zeroed: bool = True) -> np.ndarray:
    """A zeroed (else uninitialized) uint64 array of ``words`` words starting on a
    cache-line boundary (a key table bucket must be one line)."""
    per_line = L.CACHE_LINE_BYTES // _U64().itemsize
    raw = (np.zeros if zeroed else np.empty)(words + per_line, dtype=_U64)
    skip = (-raw.ctypes.data % L.CACHE_LINE_BYTES) // _U64().itemsize
    return raw[skip:skip + words]


def key_table_shift(n_slots: int) -> int:
    """The hash shift of a table of ``n_slots`` slots: 64 - log2(buckets)."""
    return 64 - ((n_slots // L.SLOTS_PER_BUCKET).bit_length() - 1)


def key_table_slots(keys: int) -> int:
    """Slots (a power of two) for ``keys`` keys within ``KEY_TABLE_MAX_LOAD``."""
    need = max(L.MIN_KEY_TABLE_SLOTS, int(np.ceil(keys / L.KEY_TABLE_MAX_LOAD)))
    return 1 << (need - 1).bit_length()


def pack_values(rows: KeyRows, which: np.ndarray | None = None) -> np.ndarray:
    """Value words (layout.py) of rows ``which`` (all rows when None)."""
    index = np.arange(len(rows), dtype=np.int64) if which is None else which
    if len(rows) > L.MAX_ROWS:
        raise ModelError(f"{len(rows)} keys exceed the software NIC's {L.MAX_ROWS} rows")
    return ((index.astype(_U64) << _U64(L.ROW_SHIFT))
            | (rows.actions[index].astype(_U64) << _U64(L.ACTION_SHIFT))
            | (rows.acl_classes[index].astype(_U64) << _U64(L.CLASS_SHIFT))
            | rows.targets[index].astype(_U64))


@dataclass(frozen=True, eq=False)
class SoftTables:
    """Read-only arrays the ``_run`` kernel reads (layout.py describes each)."""

    slots: np.ndarray
    shift: int
    longest_probe: int
    rows: int
    class_root: np.ndarray
    groups: np.ndarray
    group_field: np.ndarray
    bound_lo: np.ndarray
    bound_result: np.ndarray
    fields_end: int

    @property
    def n_groups(self) -> int:
        return len(self.group_field)

    def group(self, g: int) -> tuple[list[int], list[int]]:
        """Group ``g``'s interval starts and result words (for tests and tools)."""
        start, end = (int(x) for x in self.groups[L.GROUP_WORDS * g:][:2])
        return self.bound_lo[start:end].tolist(), self.bound_result[start:end].tolist()

    @property
    def n_slots(self) -> int:
        return len(self.slots) // L.WORDS_PER_SLOT

    @property
    def n_buckets(self) -> int:
        return len(self.slots) // L.WORDS_PER_BUCKET

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Value words of ``keys`` (0: absent). Kernel: ``_kernels._lookup_many``."""
        keys = np.ascontiguousarray(keys, dtype=_U64)
        out = np.zeros(len(keys), dtype=_U64)
        _kernels._lookup_many(self.slots, self.shift, keys, out)
        return out


@dataclass(frozen=True, eq=False)
class _AclArrays:
    class_root: np.ndarray
    groups: np.ndarray
    group_field: np.ndarray
    bound_lo: np.ndarray
    bound_result: np.ndarray
    fields_end: int


def _build_key_table(rows: KeyRows) -> tuple[np.ndarray, int, int]:
    n_slots = key_table_slots(len(rows))
    slots = _line_aligned_words(n_slots * L.WORDS_PER_SLOT)
    shift = key_table_shift(n_slots)
    longest = _kernels._build_key_table(slots, shift, rows.keys, pack_values(rows))
    return _frozen(slots), shift, int(longest)


def _acl_groups(spec: PipelineSpec, entries: tuple[TableEntry, ...]
                ) -> dict[tuple[int, int, int], list[tuple[int, int, AclAction, int]]]:
    groups: dict[tuple[int, int, int], list[tuple[int, int, AclAction, int]]] = defaultdict(list)
    stage_of = {model.acl_table(k): k for k in range(spec.stages)}
    for entry in entries:
        if entry.table not in stage_of:
            raise ModelError(f"{entry.table} is not an ACL stage of this pipeline "
                             f"({spec.stages} stages)")
        stage = stage_of[entry.table]
        match = entry.match_dict
        acl_class = match[model.ACL_CLASS_FIELD].value  # type: ignore[union-attr]
        state = match[model.ACL_STATE_FIELD].value  # type: ignore[union-attr]
        span = match[model.acl_field(stage)]
        assert isinstance(span, model.Range)
        action = model.ACL_ACTION_OF_NAME[entry.action]
        groups[(stage, acl_class, state)].append(
            (span.low, span.high, action, entry.params_dict.get(model.PARAM_STATE, -1)))
    return groups


def _terminal(action: AclAction) -> int:
    return L.terminal_result(int(action))


def _build_acl(spec: PipelineSpec, entries: tuple[TableEntry, ...]) -> _AclArrays:
    """Groups of disjoint intervals (layout.py). Gaps are filled with REJECT (the tables'
    miss action); a group with one interval does not depend on its field, so whatever leads
    to it leads straight to its result (path compression: stages that test nothing cost
    nothing)."""
    groups = _acl_groups(spec, entries)
    spans: dict[tuple[int, int, int], list[tuple[int, AclAction, int]]] = {}
    for (stage, acl_class, state), items in groups.items():
        top = (1 << spec.acl_fields[stage].bits) - 1
        expected = 0
        filled: list[tuple[int, AclAction, int]] = []
        for lo, hi, action, next_state in sorted(items):
            if lo < expected:
                raise ModelError(f"{model.acl_table(stage)}: ranges of class {acl_class} "
                                 f"state {state} overlap at {lo}; the software NIC needs "
                                 "disjoint ranges (compile ACLs with nic_offload.acl)")
            if lo > expected:
                filled.append((expected, AclAction.REJECT, 0))
            filled.append((lo, action, next_state))
            expected = hi + 1
        if expected <= top:
            filled.append((expected, AclAction.REJECT, 0))
        spans[(stage, acl_class, state)] = filled

    results: dict[tuple[int, int, int], int] = {}
    gid: dict[tuple[int, int, int], int] = {}

    def result_of(stage: int, acl_class: int, state: int) -> int:
        """The result word of arriving at (stage, class, state): a group, or a verdict."""
        if stage >= spec.stages or (stage, acl_class, state) not in spans:
            return _terminal(AclAction.REJECT)  # undecided after the last stage, or a miss
        where = (stage, acl_class, state)
        if where not in results:
            items = spans[where]
            if len(items) == 1:
                results[where] = _follow(stage, acl_class, items[0])
            else:
                gid[where] = len(gid)
                results[where] = gid[where]
        return results[where]

    def _follow(stage: int, acl_class: int, item: tuple[int, AclAction, int]) -> int:
        _, action, next_state = item
        if action is AclAction.NEXT:
            return result_of(stage + 1, acl_class, next_state)
        return _terminal(action)

    class_root = np.full(model.MAX_ACL_CLASS + 1, _terminal(AclAction.REJECT), dtype=np.int64)
    for stage, acl_class, state in sorted(spans):
        if stage == 0 and state == 0:
            class_root[acl_class] = result_of(0, acl_class, 0)
    words, fields, lows, outs = [], [], [], []
    done = 0
    while done < len(gid):  # groups get ids as they are reached; lay them out in id order
        order = sorted(gid, key=gid.__getitem__)[done:]
        for where in order:
            stage, acl_class, _ = where
            start = len(lows)
            for lo, action, next_state in spans[where]:
                lows.append(lo)
                outs.append(_follow(stage, acl_class, (lo, action, next_state)))
            field = spec.acl_fields[stage]
            words += [start, len(lows), field.offset, field.width]
            fields.append(stage)
        done += len(order)
    return _AclArrays(
        _frozen(class_root), _frozen(np.array(words, dtype=np.int64)),
        _frozen(np.array(fields, dtype=np.int64)), _frozen(np.array(lows, dtype=_U64)),
        _frozen(np.array(outs, dtype=np.int64)), spec.acl_fields_end)


def _tables(slots: np.ndarray, shift: int, longest: int, rows: int,
            acl: _AclArrays) -> SoftTables:
    return SoftTables(slots, shift, longest, rows, acl.class_root, acl.groups,
                      acl.group_field, acl.bound_lo, acl.bound_result, acl.fields_end)


def build_tables(entries: EntrySet) -> SoftTables:
    """Compile ``entries`` (validated first) for the software NIC."""
    entries.validate()
    slots, shift, longest = _build_key_table(entries.key_rows)
    return _tables(slots, shift, longest, len(entries.key_rows),
                   _build_acl(entries.spec, entries.acl_entries))


def patch_tables(prev: SoftTables, entries: EntrySet, changed_rows: np.ndarray,
                 acl_changed: bool) -> SoftTables:
    """The tables of ``entries`` made from ``prev`` (which held the same rows, except
    ``changed_rows``, possibly new ones at the end). Rebuilds when the table must grow."""
    rows = entries.key_rows
    if key_table_slots(len(rows)) != prev.n_slots or len(rows) < prev.rows:
        return build_tables(entries)
    changed = sorted_unique(np.asarray(changed_rows, dtype=np.int64))
    if len(changed) and (changed[0] < 0 or changed[-1] >= len(rows)):
        raise ModelError("changed rows lie outside the topic_key rows")
    KeyRows(rows.keys[changed], rows.actions[changed], rows.targets[changed],
            rows.acl_classes[changed]).validate(entries.spec)
    keys, values, shift = rows.keys[changed], pack_values(rows, changed), prev.shift

    def patch(slots: np.ndarray) -> int:
        # keys are only ever added, in row order (here and in the other buffer's turn), so
        # both buffers lay the keys out as a build in row order does
        return int(_kernels._build_key_table(slots, shift, keys, values))

    # the other buffer of the pair (buffers.py), not a copy of the whole slot array, when no
    # one can still read it
    slots, longest, pair = buffers.advance(prev, "slots", prev.slots, len(prev.slots), patch,
                                           _unzeroed_words)
    acl = (_build_acl(entries.spec, entries.acl_entries) if acl_changed
           else _AclArrays(prev.class_root, prev.groups, prev.group_field, prev.bound_lo,
                           prev.bound_result, prev.fields_end))
    tables = _tables(slots, prev.shift, max(prev.longest_probe, longest), len(rows), acl)
    buffers.remember(tables, {"slots": pair})
    return tables


def _unzeroed_words(words: int) -> np.ndarray:
    return _line_aligned_words(words, zeroed=False)
