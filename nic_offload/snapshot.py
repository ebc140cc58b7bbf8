"""Immutable table snapshots and the switch that swaps them under a running data path.

A ``Snapshot`` is one version of everything the offload executes: the entry set (the model;
what the P4 program is programmed with) and the software NIC's compiled arrays of it, all
read-only. The control plane never edits a snapshot: it compiles the next one (rewriting
only what changed, in the other of two buffers no burst holds: nic_offload/buffers.py) and
publishes it.

``SnapshotSwitch`` is the double buffer between them (DESIGN.md, "The control path"):

    control plane                       SnapshotSwitch                data path (SoftNic)
    compile v+1 (off to the side) --->  publish(v+1): one reference   burst: take .current
                                        store; v stays alive while    once, run the whole
                                        a burst still holds it        burst on that version

A burst reads ``current`` once and passes that snapshot's arrays to the kernel, so every
message of a burst sees exactly one version, never a mix; the previous version is freed when
the last burst holding it ends (reference counting). Publishing is a single attribute store,
atomic under the interpreter; writers serialize on a lock, readers take none.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from nic_offload.errors import OffloadUserError
from nic_offload.model import EntrySet, PipelineSpec
from nic_offload.softnic.tables import SoftTables, build_tables, patch_tables


@dataclass(frozen=True, eq=False)
class Snapshot:
    """One immutable version of the tables: ``entries`` (the model) and ``tables`` (the
    software NIC's arrays of the same entries)."""

    entries: EntrySet
    tables: SoftTables
    delta: tuple[int, np.ndarray, bool] | None = None
    """How ``evolve`` made it: (the version it came from, the changed topic_key rows, whether
    the ACL entries changed); None for a snapshot built whole. A data path holding that
    version makes this one from the rows alone (appliance/dataplane/process.py)."""

    @classmethod
    def build(cls, entries: EntrySet) -> Snapshot:
        """Validate and compile ``entries`` from scratch."""
        return cls(entries, build_tables(entries))

    def evolve(self, entries: EntrySet, changed_rows: np.ndarray, acl_changed: bool
               ) -> Snapshot:
        """The next version: ``entries`` equal this one's except the topic_key rows
        ``changed_rows`` (new rows are appended) and, when ``acl_changed``, the ACL entries."""
        if entries.version <= self.version:
            raise OffloadUserError(f"snapshot versions increase: {entries.version} after "
                                   f"{self.version}")
        if entries.spec != self.spec:
            return Snapshot.build(entries)
        return Snapshot(entries, patch_tables(self.tables, entries, changed_rows, acl_changed),
                        (self.version, changed_rows, acl_changed))

    @property
    def version(self) -> int:
        return self.entries.version

    @property
    def spec(self) -> PipelineSpec:
        return self.entries.spec

    def group_ports(self, group_id: int) -> tuple[int, ...]:
        """Egress ports of multicast group ``group_id`` (empty when undefined)."""
        for group in self.entries.groups:
            if group.group_id == group_id:
                return group.ports
        return ()


class SnapshotSwitch:
    """The current snapshot, swapped atomically (see the module docstring)."""

    def __init__(self, initial: Snapshot) -> None:
        self._current = initial
        self._lock = threading.Lock()
        self._swaps = 0

    @property
    def current(self) -> Snapshot:
        """The snapshot to run the next burst on (read it once per burst)."""
        return self._current

    @property
    def swaps(self) -> int:
        return self._swaps

    def publish(self, snapshot: Snapshot) -> Snapshot:
        """Make ``snapshot`` current; return the one it replaces. Versions must increase."""
        with self._lock:
            previous = self._current
            if snapshot.version <= previous.version:
                raise OffloadUserError(
                    f"snapshot version {snapshot.version} is not newer than the current "
                    f"{previous.version}; compile a new version instead of republishing")
            self._current = snapshot
            self._swaps += 1
            return previous
