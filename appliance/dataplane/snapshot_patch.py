"""Table snapshots over the data-path process's link as patches of the last one sent.

A subscribe changes a few rows of the topic_key table, yet its snapshot holds every row:
at 1,000,000 topics the key rows are 15 MB and the software NIC's slot array 33 MB, and
pickling them for the link took 55 ms per change before the socket and the child's
unpickling. The parent (``DataPathProcess.publish_snapshot``) sends an array that changed
in a few places as an ``ArrayPatch`` (the indexes that differ and their values, and the new
tail when it grew: key rows are only ever appended), and the child
(``DataPlaneAgent.publish_snapshot_delta``) applies it to a copy of its current array, or,
for the key rows, to the other of two buffers (nic_offload/buffers.py; the current
snapshot may still be running a burst: it is never written). An array that changed
in more than 1/``PATCH_MAX_SHARE`` of its places, or whose shape or type changed, travels
whole, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

PATCH_MAX_SHARE = 8
"""An array is patched when at most 1/8 of its elements changed, else sent whole."""


@dataclass(frozen=True, slots=True)
class ArrayPatch:
    """``new`` = the base array grown to ``size`` elements with ``values`` at ``indexes``."""

    indexes: np.ndarray
    values: np.ndarray
    size: int

    def write(self, buf: np.ndarray) -> None:
        """Write the changed places into ``buf`` (which holds the base's values, and room for
        ``size``), in place."""
        buf[self.indexes] = self.values

    def apply(self, base: np.ndarray) -> np.ndarray:
        out = np.empty(self.size, base.dtype)
        kept = min(len(base), self.size)
        out[:kept] = base[:kept]
        out[self.indexes] = self.values
        out.flags.writeable = base.flags.writeable
        return out


def diff(new: Any, old: Any) -> Any:
    """What to send for ``new`` when the child holds ``old``: ``None`` (the same), an
    ``ArrayPatch``, or ``new`` itself."""
    if new is old:
        return None
    if not (isinstance(new, np.ndarray) and isinstance(old, np.ndarray)):
        return new
    if new.ndim != 1 or old.ndim != 1 or new.dtype != old.dtype or len(new) < len(old):
        return new
    kept = len(old)
    changed = np.flatnonzero(new[:kept] != old)
    if len(new) == kept and not len(changed):
        return None
    indexes = np.concatenate([changed, np.arange(kept, len(new), dtype=np.int64)])
    if len(indexes) * PATCH_MAX_SHARE > len(new):
        return new
    return ArrayPatch(indexes, new[indexes], len(new))


def resolve(sent: Any, current: Any) -> Any:
    """The child's value of what ``diff`` sent, given its ``current`` one."""
    return sent.apply(current) if isinstance(sent, ArrayPatch) else sent


@dataclass(frozen=True, slots=True)
class EntriesPatch:
    """An ``EntrySet`` as its key rows' column patches against the one the child holds
    (``None``: that column is unchanged), and the rest (small) whole."""

    columns: dict
    acl_entries: tuple
    groups: tuple
    version: int
    spec: Any

    @classmethod
    def of(cls, new: Any, old: Any) -> EntriesPatch | Any:
        """The patch from ``old`` to ``new``, or ``new`` when it is not worth one."""
        if new.spec != old.spec:
            return new
        columns = {f.name: diff(getattr(new.key_rows, f.name), getattr(old.key_rows, f.name))
                   for f in fields(new.key_rows)}
        if any(isinstance(c, np.ndarray) for c in columns.values()):
            return new  # a column sent whole: the set is as cheap whole
        return cls(columns, new.acl_entries, new.groups, new.version, new.spec)

    @classmethod
    def rows(cls, new: Any, old: Any, changed: np.ndarray) -> EntriesPatch:
        """The patch from ``old`` to ``new`` when only the key rows ``changed`` (and rows
        appended) differ, as the compiler says: no comparison of whole columns."""
        kept = len(old.key_rows)
        size = len(new.key_rows)
        at = np.asarray(changed, np.int64)
        at = at[at < kept]
        if size > kept:
            at = np.concatenate([at, np.arange(kept, size, dtype=np.int64)])
        columns = {}
        for f in fields(new.key_rows):
            column = getattr(new.key_rows, f.name)
            columns[f.name] = ArrayPatch(at, column[at], size) if len(at) else None
        return cls(columns, new.acl_entries, new.groups, new.version, new.spec)

    def apply(self, current: Any) -> Any:
        """The entry set this patch makes of ``current``: a column that comes as an
        ``ArrayPatch`` is written into the other of its two buffers (nic_offload/buffers.py;
        a copy of the column only when a reader may still hold that buffer), not into a
        copy of the whole column."""
        from nic_offload import buffers
        from nic_offload.model import EntrySet, KeyRows

        rows = current.key_rows
        columns, pairs = {}, {}
        for name, sent in self.columns.items():
            column = getattr(rows, name)
            if sent is None:
                columns[name] = column
                pair = buffers.pair_of(rows, name, column)
                if pair is not None:
                    pairs[name] = pair
            elif isinstance(sent, ArrayPatch):
                columns[name], _, pairs[name] = buffers.advance(
                    rows, name, column, sent.size, sent.write)
            else:
                columns[name] = sent
        key_rows = KeyRows(**columns)
        buffers.remember(key_rows, pairs)
        return EntrySet(self.spec, key_rows, self.acl_entries, self.groups, self.version)
