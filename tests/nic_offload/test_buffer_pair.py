"""Two buffers patched in turn (nic_offload/buffers.py): a sequence of changes applied to
the buffers of a pair in turn leaves every version, and both buffers, equal to a build from
scratch, without a copy of the whole array once the pair has its two buffers; a version a
reader still holds is never written (a copy is made instead)."""

from __future__ import annotations

import gc
import random

import numpy as np
import pytest

from datapath.topics.registry import KeyRegistry
from nic_offload import buffers
from nic_offload.buffers import BufferPair
from nic_offload.compiler import OffloadCompiler
from nic_offload.snapshot import Snapshot
from nic_offload.softnic.tables import build_tables


def _writer(at: list[int], values: list[int]):
    at_a, values_a = np.array(at, np.int64), np.array(values, np.int64)

    def patch(buf: np.ndarray) -> None:
        buf[at_a] = values_a
    return patch


def _changes(seed: int, steps: int, size: int):
    """(size, places, values) per step; arrays grow now and then (new places written)."""
    rng = random.Random(seed)
    for _ in range(steps):
        grown = size + rng.choice([0, 0, 0, 3, 17])
        at = sorted(set(rng.sample(range(size), rng.randint(0, 5))) | set(range(size, grown)))
        size = grown
        yield size, at, [rng.randint(1, 10**9) for _ in at]


@pytest.mark.parametrize("seed", range(4))
def test_both_buffers_equal_the_array_written_whole_after_each_change(seed):
    truth = np.arange(40, dtype=np.int64)
    pair = BufferPair(truth, len(truth), lambda buf: None)
    view = pair.view()
    for size, at, values in _changes(seed, 60, len(truth)):
        grown = np.zeros(size, np.int64)
        grown[:len(truth)] = truth
        grown[at] = values
        truth = grown
        del view  # no reader holds the version before: its buffer is patched, not copied
        view, _ = pair.advance(size, _writer(at, values))
        assert np.array_equal(view, truth)
        assert not view.flags.writeable
        # the other buffer, once it has the change it is behind by, is the same array
        other = pair._bufs[1 - pair._side]
        if other is not None and pair._behind is not None and len(other) >= size:
            caught_up = other.copy()
            pair._behind(caught_up)
            assert np.array_equal(caught_up[:size], truth)
    assert pair.patched > 50  # the buffers took turns; copies only when the array grew


def test_a_change_written_to_one_buffer_only_is_caught():
    """The test above fails when the other buffer does not get the change it missed: a pair
    that forgets its ``behind`` patch makes a wrong version at its next turn."""
    pair = BufferPair(np.zeros(8, np.int64), 8, lambda buf: None)
    pair.view()
    pair.advance(8, _writer([1], [5]))
    pair._behind = None  # the bug: the change reaches one buffer only
    view, _ = pair.advance(8, _writer([2], [7]))
    assert not np.array_equal(view, [0, 5, 7, 0, 0, 0, 0, 0])


def test_a_version_a_reader_still_holds_is_never_written():
    pair = BufferPair(np.zeros(8, np.int64), 8, lambda buf: None)
    v1 = pair.view()
    v2, _ = pair.advance(8, _writer([0], [1]))  # v1 held: a copy, v1 untouched
    v3, _ = pair.advance(8, _writer([1], [2]))  # v1's buffer is still v1's: a copy again
    assert v1.tolist() == [0] * 8
    assert v2.tolist() == [1, 0, 0, 0, 0, 0, 0, 0]
    assert v3.tolist() == [1, 2, 0, 0, 0, 0, 0, 0]
    assert pair.copies == 3 and pair.patched == 0
    del v1, v2
    gc.collect()
    v4, _ = pair.advance(8, _writer([2], [3]))  # no one holds v2: its buffer is patched
    assert v4.tolist() == [1, 2, 3, 0, 0, 0, 0, 0] and pair.patched == 1
    assert v3.tolist() == [1, 2, 0, 0, 0, 0, 0, 0]  # the head before is not written


def _registry(n: int) -> KeyRegistry:
    registry = KeyRegistry()
    for i in range(n):
        registry.key_for(f"t/{i // 100}/{i % 100}")
    return registry


@pytest.mark.parametrize("seed", range(3))
def test_snapshots_patched_in_turn_equal_fresh_builds(seed):
    """The compiler's row columns and the software NIC's slot array, made by patching the two
    buffers in turn through a random run of subscribes, unsubscribes and registrations, equal
    (array for array, word for word) the tables built whole from the same entries; so do the
    arrays of a data path's own ``evolve`` of the rows alone (appliance/dataplane/process.py)."""
    from appliance.dataplane.snapshot_patch import EntriesPatch

    rng = random.Random(seed)
    registry = _registry(3_000)
    compiler = OffloadCompiler(registry)
    for name, port in (("a", 3), ("b", 40_000), ("c", 7)):
        compiler.add_egress(name, port)
    compiler.subscribe("a", "t/1/#")
    child = compiler.build()
    for step in range(40):
        what = rng.random()
        if what < 0.15:
            for i in range(rng.randint(1, 40)):
                registry.key_for(f"t/n{step}/{i}")
        elif what < 0.6:
            compiler.subscribe(rng.choice("abc"), f"t/{rng.randint(0, 35)}/+")
        else:
            compiler.unsubscribe(rng.choice("abc"), f"t/{rng.randint(0, 35)}/+")
        held = compiler.snapshot
        new = compiler.build()
        if new is held:
            continue
        whole = build_tables(new.entries)
        assert np.array_equal(new.tables.slots, whole.slots)
        assert new.tables.longest_probe == whole.longest_probe
        rows = new.delta[1]
        child = child.evolve(EntriesPatch.rows(new.entries, child.entries, rows).apply(
            child.entries), rows, new.delta[2])
        assert np.array_equal(child.tables.slots, whole.slots)
        for name in ("keys", "actions", "targets", "acl_classes"):
            assert np.array_equal(getattr(child.entries.key_rows, name),
                                  getattr(new.entries.key_rows, name))
        del held, whole
    pairs = buffers._PAIRS[compiler.snapshot.tables]
    assert pairs["slots"].patched > 5  # turns taken, not copies
    assert buffers._PAIRS[child.tables]["slots"].patched > 5
    rows = buffers._PAIRS[compiler.snapshot.entries.key_rows]
    assert rows["actions"].patched > 5


def test_a_snapshot_still_held_keeps_its_arrays():
    """A burst (or the process link) holding version v-1 while v+1 is made: v-1's arrays are
    not the buffer v+1 is written into; they keep their values."""
    registry = _registry(2_000)
    compiler = OffloadCompiler(registry)
    compiler.add_egress("a", 3)
    compiler.add_egress("b", 4)
    compiler.build()
    compiler.subscribe("a", "t/1/#")
    held = compiler.build()  # v: held by the "reader"
    slots, targets = held.tables.slots.copy(), held.entries.key_rows.targets.copy()
    for pattern in ("t/2/#", "t/3/#", "t/1/+"):
        compiler.subscribe("b", pattern)
        compiler.build()
        assert np.array_equal(held.tables.slots, slots)
        assert np.array_equal(held.entries.key_rows.targets, targets)
    assert isinstance(held, Snapshot)
