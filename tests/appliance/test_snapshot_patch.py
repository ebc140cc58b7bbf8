"""A snapshot crosses the data-path process's link as a patch of the last one sent: what the
child rebuilds from it equals what the parent compiled, array for array, for a subscribe
that changes a few rows, a registration that appends rows, and a change of most rows."""

from __future__ import annotations

import pickle

import numpy as np

from appliance.dataplane.snapshot_patch import ArrayPatch, EntriesPatch, diff, resolve
from datapath.topics.registry import KeyRegistry
from nic_offload.compiler import OffloadCompiler


def _same(a, b) -> bool:
    return a.dtype == b.dtype and np.array_equal(a, b)


def test_an_array_is_sent_as_what_changed_unless_most_of_it_did():
    old = np.arange(1_000, dtype=np.uint64)
    assert diff(old, old) is None and diff(old.copy(), old) is None
    new = old.copy()
    new[[3, 500]] = 7
    patch = diff(new, old)
    assert isinstance(patch, ArrayPatch) and patch.indexes.tolist() == [3, 500]
    assert _same(resolve(patch, old), new)
    grown = np.concatenate([new, np.array([5, 6], np.uint64)])  # rows appended
    assert _same(resolve(diff(grown, old), old), grown)
    assert diff(old[::-1].copy(), old).shape == old.shape  # most changed: whole
    assert diff(old[:10].copy(), old).shape == (10,)  # shrunk: whole
    assert diff(old.astype(np.int64), old).dtype == np.int64  # another type: whole


def _compiled(n_topics: int):
    registry = KeyRegistry()
    for i in range(n_topics):
        registry.key_for(f"t/{i // 100}/{i % 100}")
    compiler = OffloadCompiler(registry)
    compiler.add_egress("a", 3)
    compiler.add_egress("b", 40_000)
    compiler.subscribe("a", "t/1/#")
    return registry, compiler, compiler.build()


def _child_view(parent_new, parent_old):
    """What the child makes of the parent's message (through pickle, as on the link)."""
    entries = pickle.loads(pickle.dumps(EntriesPatch.of(parent_new.entries,
                                                        parent_old.entries)))
    return entries, (entries.apply(parent_old.entries) if isinstance(entries, EntriesPatch)
                     else entries)


def test_a_subscribe_and_a_registration_travel_as_patches_that_rebuild_the_same_rows():
    registry, compiler, first = _compiled(5_000)
    compiler.subscribe("b", "t/7/+")  # 100 of 5,000 rows change
    second = compiler.build()
    sent, rebuilt = _child_view(second, first)
    assert isinstance(sent, EntriesPatch)
    assert len(pickle.dumps(sent)) < len(pickle.dumps(second.entries)) // 10
    for name in ("keys", "actions", "targets", "acl_classes"):
        assert _same(getattr(rebuilt.key_rows, name), getattr(second.entries.key_rows, name))
    assert (rebuilt.groups, rebuilt.version) == (second.entries.groups, second.entries.version)
    slots = diff(second.tables.slots, first.tables.slots)
    assert isinstance(slots, ArrayPatch)
    assert _same(resolve(slots, first.tables.slots), second.tables.slots)
    for i in range(50):  # registered topics: rows appended
        registry.key_for(f"t/7/new{i}")
    third = compiler.build()
    sent, rebuilt = _child_view(third, second)
    assert isinstance(sent, EntriesPatch) and len(rebuilt.key_rows) == 5_050
    assert _same(rebuilt.key_rows.targets, third.entries.key_rows.targets)


def test_a_change_of_most_rows_travels_whole():
    _, compiler, first = _compiled(2_000)
    compiler.subscribe("b", "#")
    second = compiler.build()
    sent, rebuilt = _child_view(second, first)
    assert not isinstance(sent, EntriesPatch)
    assert _same(rebuilt.key_rows.targets, second.entries.key_rows.targets)


def test_the_child_makes_the_parents_arrays_from_the_changed_rows_alone():
    """``publish_snapshot_rows``: the compiler's changed rows (``Snapshot.delta``) travel, not
    compared arrays; the child's ``evolve`` of its current snapshot gives the parent's arrays
    exactly, for a subscribe, an unsubscribe and a registration that appends rows."""
    from dataclasses import fields

    registry, compiler, held = _compiled(5_000)
    changes = [lambda: compiler.subscribe("b", "t/7/+"),
               lambda: compiler.unsubscribe("a", "t/1/#"),
               lambda: [registry.key_for(f"t/new/{i}") for i in range(300)],
               lambda: compiler.subscribe("a", "t/#")]
    for change in changes:
        change()
        new = compiler.build()
        base, rows, acl = new.delta
        assert base == held.version
        sent = pickle.loads(pickle.dumps(EntriesPatch.rows(new.entries, held.entries, rows)))
        assert len(pickle.dumps(sent)) < len(pickle.dumps(new.entries)) // 2 or len(rows) > 2_000
        child = held.evolve(sent.apply(held.entries), rows, acl)
        for f in fields(new.entries.key_rows):
            assert _same(getattr(child.entries.key_rows, f.name),
                         getattr(new.entries.key_rows, f.name)), f.name
        for f in fields(new.tables):
            mine, theirs = getattr(child.tables, f.name), getattr(new.tables, f.name)
            if isinstance(theirs, np.ndarray):
                assert _same(mine, theirs), f.name
            else:
                assert mine == theirs, f.name
        assert child.entries.groups == new.entries.groups and child.version == new.version
        held = child
