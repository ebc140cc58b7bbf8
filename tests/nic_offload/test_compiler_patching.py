"""The compiler's in-place changes (a subscribe's union, an unsubscribe's subtraction of its
port, ``_subtract``) against a compile from scratch: after a random sequence of subscribes,
unsubscribes, withdrawals, registrations and egresses moved, the patched snapshot decides
every topic as a fresh compiler fed the same lists does, its tables look every key up as
tables built whole from its entries do, and its multicast groups are those in use."""

from __future__ import annotations

import random

import numpy as np
import pytest

from datapath.topics.registry import KeyRegistry
from nic_offload import compiler as compiler_mod
from nic_offload.compiler import OffloadCompiler
from nic_offload.model import KeyAction, sorted_unique
from nic_offload.softnic.tables import build_tables
from tests.nic_offload.helpers import QUOTE
from tests.nic_offload.test_compiler import PATTERNS, TOPICS, table_decisions

CLASSES = {1: ["(price < 10, ACCEPT, REJECT)"], 2: ["(symbol == 'IBM', LOG, ACCEPT)"]}
# e1 and e4 share port 1 (the subtraction must not take a port another egress holds)
EGRESSES = (("e1", 1, 0), ("e2", 2, 0), ("e3", 3, 1), ("e4", 1, 0), ("e5", 5, 0),
            ("e6", 6, 0))


def _compiler(registry: KeyRegistry) -> OffloadCompiler:
    compiler = OffloadCompiler(registry)
    compiler.define_schema(QUOTE)
    for class_id, rules in CLASSES.items():
        compiler.define_acl_class(class_id, "quote", rules)
    return compiler


def _fresh(registry: KeyRegistry, compiler: OffloadCompiler) -> OffloadCompiler:
    fresh = _compiler(registry)
    for name, egress in compiler.egresses.items():
        fresh.add_egress(name, egress.port, egress.acl_class)
        for ns, sublist in egress.lists.items():
            for entry in sublist.entries:
                (fresh.subscribe if entry.positive else fresh.unsubscribe)(
                    name, entry.pattern, ns)
    fresh.build()
    return fresh


@pytest.mark.parametrize("seed", range(6))
def test_patched_tables_equal_a_fresh_compile_after_random_changes(seed, monkeypatch):
    monkeypatch.setattr(compiler_mod, "SUBTRACT_MIN_ROWS", 0)  # every unsubscribe subtracts
    rng = random.Random(seed)
    registry = KeyRegistry()
    for topic in TOPICS[:25]:
        registry.key_for(topic, rng.choice([0, 0, 1]))
    compiler = _compiler(registry)
    for name, port, acl_class in EGRESSES:
        compiler.add_egress(name, port, acl_class)
    compiler.build()
    subtracted = 0
    for _ in range(25):
        for _ in range(rng.randint(1, 6)):
            name, ns = rng.choice([e[0] for e in EGRESSES]), rng.choice([0, 0, 1])
            pattern = rng.choice(PATTERNS)
            roll = rng.random()
            if roll < 0.45:
                compiler.subscribe(name, pattern, ns)
            elif roll < 0.75:
                before = len(compiler._changed)
                compiler.unsubscribe(name, pattern, ns)
                subtracted += len(compiler._changed) > before
            elif roll < 0.85:
                compiler.withdraw(name, pattern, ns)
            elif roll < 0.93:
                registry.key_for(rng.choice(TOPICS), rng.choice([0, 1]))
            else:
                egress = compiler.egress_of(name)
                lists = egress.lists
                compiler.remove_egress(name)
                compiler.add_egress(name, rng.choice([1, 2, 3, 5, 6, 7]), egress.acl_class)
                for lns, sublist in lists.items():
                    for entry in sublist.entries:
                        (compiler.subscribe if entry.positive else compiler.unsubscribe)(
                            name, entry.pattern, lns)
        snapshot = compiler.build()
        assert table_decisions(compiler, registry) == table_decisions(
            _fresh(registry, compiler), registry)
        rows = snapshot.entries.key_rows
        whole = build_tables(snapshot.entries)
        assert (snapshot.tables.lookup(rows.keys) == whole.lookup(rows.keys)).all()
        groups = {g.group_id for g in snapshot.entries.groups}
        used = rows.targets[rows.actions == KeyAction.FORWARD_GROUP]
        assert groups == set(sorted_unique(used).tolist())  # none leaked, none missing
    assert subtracted >= 5  # the subtraction ran (not only decisions row by row)


def test_sorted_unique_is_numpys_unique():
    rng = np.random.default_rng(5)
    for values in (np.zeros(0, np.int64), rng.integers(0, 50, 1_000),
                   rng.integers(1, 2**63, 300, dtype=np.uint64), np.arange(7, dtype=np.uint32)):
        distinct, counts = sorted_unique(values, return_counts=True)
        want, want_counts = np.unique(values, return_counts=True)
        assert np.array_equal(distinct, want) and np.array_equal(counts, want_counts)
        assert np.array_equal(sorted_unique(values), want)
        assert sorted_unique(values).dtype == want.dtype
