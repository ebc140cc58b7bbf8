"""The key hash table and the ACL arrays: kernel vs twin, patching vs building."""

from __future__ import annotations

import random

import numpy as np
import pytest

from nic_offload import model
from nic_offload.errors import ModelError
from nic_offload.model import EntrySet, KeyRows, Range, TableEntry
from nic_offload.softnic import layout as L
from nic_offload.softnic.tables import (
    build_tables,
    key_table_slots,
    pack_values,
    patch_tables,
)
from tests.nic_offload.helpers import random_entry_set, random_keys
from tests.nic_offload.twins import build_key_table_twin, lookup_twin


@pytest.mark.parametrize("seed", range(4))
def test_key_table_build_matches_its_twin_slot_for_slot(seed):
    rng = random.Random(seed)
    entries, _ = random_entry_set(rng, rng.choice([1, 7, 300, 2000]))
    tables = build_tables(entries)
    rows = entries.key_rows
    words, longest = build_key_table_twin(
        tables.n_slots, tables.shift, rows.keys.tolist(), pack_values(rows).tolist())
    assert tables.slots.tolist() == words
    assert tables.longest_probe == longest


def test_clustered_keys_still_spread_over_the_table():
    rows = KeyRows(np.arange(1, 1001, dtype=np.uint64), np.full(1000, 1, np.uint8),
                   np.zeros(1000, np.uint32), np.zeros(1000, np.uint16))
    tables = build_tables(EntrySet(model.DEFAULT_SPEC, rows))
    assert tables.longest_probe < 16


def test_the_table_keeps_its_load_factor_bound():
    for keys in (0, 1, 8, 9, 1000, 1025):
        slots = key_table_slots(keys)
        assert slots & (slots - 1) == 0 and slots >= L.MIN_KEY_TABLE_SLOTS
        assert keys <= L.KEY_TABLE_MAX_LOAD * slots
        assert slots == L.MIN_KEY_TABLE_SLOTS or keys > L.KEY_TABLE_MAX_LOAD * slots / 2


def test_lookup_finds_every_key_and_misses_absent_ones():
    rng = random.Random(5)
    entries, _ = random_entry_set(rng, 3000)
    tables = build_tables(entries)
    rows = entries.key_rows
    found = tables.lookup(rows.keys)
    assert (found == pack_values(rows)).all()
    absent = np.array([k for k in random_keys(rng, 500) if k not in set(
        rows.keys.tolist())] + [0], np.uint64)
    assert not tables.lookup(absent).any()
    for key in absent[:50].tolist() + rows.keys[:50].tolist():
        assert lookup_twin(tables.slots, tables.shift, key) == int(tables.lookup(
            np.array([key], np.uint64))[0])


def _with_rows(entries: EntrySet, rows: KeyRows, version: int) -> EntrySet:
    return EntrySet(entries.spec, rows, entries.acl_entries, entries.groups, version)


def test_patched_tables_equal_tables_built_from_scratch():
    rng = random.Random(9)
    entries, _ = random_entry_set(rng, 1500)
    base = build_tables(entries)
    rows = entries.key_rows
    changed = np.array(sorted(rng.sample(range(len(rows)), 200)), np.int64)
    actions = rows.actions.copy()
    actions[changed] = model.KeyAction.DROP
    new_keys = np.array(random_keys(rng, 100, 2**63), np.uint64)
    grown = KeyRows(np.concatenate([rows.keys, new_keys]),
                    np.concatenate([actions, np.full(100, 4, np.uint8)]),
                    np.concatenate([rows.targets, np.zeros(100, np.uint32)]),
                    np.concatenate([rows.acl_classes, np.zeros(100, np.uint16)]))
    touched = np.concatenate([changed, np.arange(len(rows), len(rows) + 100)])
    patched = patch_tables(base, _with_rows(entries, grown, 2), touched, acl_changed=False)
    fresh = build_tables(_with_rows(entries, grown, 2))
    probe = np.concatenate([grown.keys, np.array(random_keys(rng, 300, 1, 2**62), np.uint64)])
    assert (patched.lookup(probe) == fresh.lookup(probe)).all()
    assert patched.slots is not base.slots and not patched.slots.flags.writeable
    assert (base.lookup(rows.keys) == pack_values(rows)).all()  # the old version is untouched


def test_a_table_that_must_grow_is_rebuilt():
    rng = random.Random(2)
    entries, _ = random_entry_set(rng, 8)
    base = build_tables(entries)
    rows = entries.key_rows
    extra = np.array(random_keys(rng, 40, 2**63), np.uint64)
    grown = KeyRows(np.concatenate([rows.keys, extra]),
                    np.concatenate([rows.actions, np.ones(40, np.uint8)]),
                    np.concatenate([rows.targets, np.zeros(40, np.uint32)]),
                    np.concatenate([rows.acl_classes, np.zeros(40, np.uint16)]))
    patched = patch_tables(base, _with_rows(entries, grown, 2), np.arange(8, 48), False)
    assert patched.n_slots > base.n_slots
    assert (patched.lookup(grown.keys) == pack_values(grown)).all()


def _acl_entry(stage: int, acl_class: int, state: int, low: int, high: int,
               action: str = model.ACTION_ACL_ACCEPT, params: dict | None = None) -> TableEntry:
    return TableEntry.make(model.acl_table(stage), {
        model.ACL_CLASS_FIELD: model.Exact(acl_class), model.ACL_STATE_FIELD: model.Exact(state),
        model.acl_field(stage): Range(low, high)}, action, params, model.ACL_ENTRY_PRIORITY)


def _verdict(action: model.AclAction) -> int:
    return L.terminal_result(int(action))


def _group(t, result: int) -> tuple[list[int], list[int]]:
    return t.group(int(result))


def test_acl_gaps_reject_like_a_table_miss():
    entries = EntrySet(model.DEFAULT_SPEC, KeyRows.empty(),
                       (_acl_entry(0, 1, 0, 10, 20), _acl_entry(0, 1, 0, 30, 2**32 - 1,
                                                                model.ACTION_ACL_LOG)))
    t = build_tables(entries)
    assert _group(t, t.class_root[1]) == ([0, 10, 21, 30], [
        _verdict(model.AclAction.REJECT), _verdict(model.AclAction.ACCEPT),
        _verdict(model.AclAction.REJECT), _verdict(model.AclAction.LOG)])
    assert t.class_root[2] == _verdict(model.AclAction.REJECT)


def test_stages_that_test_nothing_are_skipped():
    whole = (0, 2**32 - 1)
    entries = EntrySet(model.DEFAULT_SPEC, KeyRows.empty(), (
        _acl_entry(0, 1, 0, *whole, model.ACTION_ACL_NEXT, {model.PARAM_STATE: 4}),
        _acl_entry(1, 1, 4, *whole, model.ACTION_ACL_NEXT, {model.PARAM_STATE: 0}),
        _acl_entry(2, 1, 0, 0, 99, model.ACTION_ACL_NEXT, {model.PARAM_STATE: 1}),
        _acl_entry(2, 1, 0, 100, 2**32 - 1, model.ACTION_ACL_ACCEPT),
        _acl_entry(3, 1, 1, *whole, model.ACTION_ACL_LOG),
        _acl_entry(0, 2, 0, *whole, model.ACTION_ACL_ACCEPT)))
    t = build_tables(entries)
    root = t.class_root[1]
    assert root >= 0 and t.group_field[root] == 2  # straight to the stage that tests
    assert _group(t, root) == ([0, 100], [_verdict(model.AclAction.LOG),
                                          _verdict(model.AclAction.ACCEPT)])
    assert t.class_root[2] == _verdict(model.AclAction.ACCEPT)


def test_overlapping_acl_ranges_are_refused():
    entries = EntrySet(model.DEFAULT_SPEC, KeyRows.empty(),
                       (_acl_entry(0, 1, 0, 0, 20), _acl_entry(0, 1, 0, 15, 30)))
    with pytest.raises(ModelError, match="overlap"):
        build_tables(entries)


def test_going_on_to_a_state_without_entries_rejects_like_a_miss():
    entries = EntrySet(model.DEFAULT_SPEC, KeyRows.empty(), (
        _acl_entry(0, 1, 0, 0, 9, model.ACTION_ACL_NEXT, {model.PARAM_STATE: 5}),
        _acl_entry(0, 1, 0, 10, 2**32 - 1, model.ACTION_ACL_ACCEPT)))
    t = build_tables(entries)
    assert _group(t, t.class_root[1]) == ([0, 10], [_verdict(model.AclAction.REJECT),
                                                    _verdict(model.AclAction.ACCEPT)])
