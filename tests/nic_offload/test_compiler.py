"""The compiler: control state -> key decisions, incremental builds, groups, ACL classes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from datapath.topics.index import TopicCatalog
from datapath.topics.registry import KeyRegistry
from datapath.topics.sublist import naive_decision
from nic_offload import model
from nic_offload.compiler import OffloadCompiler
from nic_offload.errors import CompileError
from nic_offload.model import KeyAction
from tests.nic_offload.helpers import QUOTE

LEVELS = ("a", "b", "c")
TOPICS = [f"{x}/{y}/{z}" for x in LEVELS for y in LEVELS for z in LEVELS] + list(LEVELS) + [
    f"{x}/{y}" for x in LEVELS for y in LEVELS]
PATTERNS = ["#", "a/#", "+/b/#", "#/c", "a/+", "b/b/b", "+/+/+", "c/#/a", "+", "a/b/#", "#/b/+"]


class Oracle:
    """Reference decisions: every request ever made, replayed naively (seed 000)."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], list[str]] = {}
        self.ports: dict[str, int] = {}
        self.classes: dict[str, int] = {}

    def decision(self, namespace: int, topic: str) -> tuple[KeyAction, tuple[int, ...], int]:
        receivers = [name for (name, ns), reqs in self.requests.items()
                     if ns == namespace and name in self.ports and naive_decision(reqs, topic)]
        if not receivers:
            return KeyAction.DROP, (), 0
        classes = {self.classes[n] for n in receivers}
        if len(classes) > 1:
            return KeyAction.PUNT, (), 0
        ports = tuple(sorted({self.ports[n] for n in receivers}))
        action = KeyAction.FORWARD if len(ports) == 1 else KeyAction.FORWARD_GROUP
        return action, ports, classes.pop()


def table_decisions(compiler: OffloadCompiler, registry: KeyRegistry
                    ) -> dict[tuple[int, str], tuple[KeyAction, tuple[int, ...], int]]:
    snap = compiler.snapshot
    rows = snap.entries.key_rows
    out = {}
    for key, action, target, acl_class in zip(rows.keys.tolist(), rows.actions.tolist(),
                                              rows.targets.tolist(), rows.acl_classes.tolist()):
        action = KeyAction(action)
        ports = (target,) if action is KeyAction.FORWARD else snap.group_ports(target) \
            if action is KeyAction.FORWARD_GROUP else ()
        out[registry.lookup(key)] = (action, ports, acl_class)
    return out


def _setup(rng: random.Random) -> tuple[KeyRegistry, OffloadCompiler, Oracle]:
    registry = KeyRegistry()
    for topic in TOPICS[:30]:
        registry.key_for(topic, rng.choice([0, 0, 1]))
    compiler = OffloadCompiler(registry)
    compiler.define_schema(QUOTE)
    compiler.define_acl_class(1, "quote", ["(price < 10, ACCEPT, REJECT)"])
    compiler.define_acl_class(2, "quote", ["(symbol == 'IBM', LOG, ACCEPT)"])
    oracle = Oracle()
    for name, port, acl_class in (("e1", 1, 0), ("e2", 2, 0), ("e3", 3, 1), ("e4", 1, 0),
                                  ("e5", 5, 2)):
        compiler.add_egress(name, port, acl_class)
        oracle.ports[name], oracle.classes[name] = port, acl_class
    return registry, compiler, oracle


@pytest.mark.parametrize("seed", range(8))
def test_incremental_builds_decide_like_the_naive_lists_after_random_requests(seed):
    rng = random.Random(seed)
    registry, compiler, oracle = _setup(rng)
    for step in range(40):
        roll = rng.random()
        name, ns = rng.choice(sorted(oracle.ports)), rng.choice([0, 1])
        if roll < 0.8:
            sign = rng.choice("+-")
            pattern = rng.choice(PATTERNS)
            (compiler.subscribe if sign == "+" else compiler.unsubscribe)(name, pattern, ns)
            oracle.requests.setdefault((name, ns), []).append(sign + pattern)
        elif roll < 0.9:
            registry.key_for(rng.choice(TOPICS), rng.choice([0, 1]))
        else:
            new_class = rng.choice([0, 1, 2])
            compiler.set_egress(name, acl_class=new_class)
            oracle.classes[name] = new_class
        if step % 5 == 4:
            compiler.build()
            got = table_decisions(compiler, registry)
            assert got == {name: oracle.decision(*name) for name in got}
            assert len(got) == len(registry)


def test_a_full_compile_agrees_with_the_incremental_one():
    rng = random.Random(3)
    registry, compiler, oracle = _setup(rng)
    fresh = OffloadCompiler(registry)
    fresh.define_schema(QUOTE)
    for class_id, rules in ((1, ["(price < 10, ACCEPT, REJECT)"]),
                            (2, ["(symbol == 'IBM', LOG, ACCEPT)"])):
        fresh.define_acl_class(class_id, "quote", rules)
    for name, port in oracle.ports.items():
        fresh.add_egress(name, port, oracle.classes[name])
    compiler.build()
    for _ in range(30):
        name, pattern, ns = rng.choice(sorted(oracle.ports)), rng.choice(PATTERNS), rng.choice(
            [0, 1])
        op = rng.choice(["subscribe", "unsubscribe"])
        getattr(compiler, op)(name, pattern, ns)
        getattr(fresh, op)(name, pattern, ns)
        compiler.build()  # one small change at a time: the per-topic path
    fresh.build()  # everything at once: the bulk path
    assert table_decisions(compiler, registry) == table_decisions(fresh, registry)


def _every_topic_compiler(**subscriptions: tuple[int, str]
                          ) -> tuple[KeyRegistry, OffloadCompiler]:
    """Every topic of TOPICS registered; egress NAME on port P subscribed to PATTERN for
    each ``NAME=(P, PATTERN)``."""
    registry = KeyRegistry()
    for topic in TOPICS:
        registry.key_for(topic)
    compiler = OffloadCompiler(registry)
    for name, (port, pattern) in subscriptions.items():
        compiler.add_egress(name, port)
        compiler.subscribe(name, pattern)
    return registry, compiler


def test_a_subscribe_recompiles_only_the_keys_its_pattern_matches():
    registry, compiler = _every_topic_compiler(e1=(1, "a/#"))
    before = compiler.build()
    compiler.subscribe("e1", "+/b/+")
    expected = TopicCatalog(TOPICS).matching("+/b/+")
    assert compiler.pending_rows == len(expected)
    after = compiler.build()
    changed = np.flatnonzero(before.entries.key_rows.actions != after.entries.key_rows.actions)
    changed_topics = {registry.lookup(int(after.entries.key_rows.keys[r]))[1] for r in changed}
    assert changed_topics == {t for t in expected if not t.startswith("a/")}
    assert after.version == before.version + 1


def test_a_change_that_leaves_every_decision_as_it_was_builds_no_new_snapshot():
    registry, compiler = _every_topic_compiler(e1=(1, "a/#"))
    before = compiler.build()
    compiler.subscribe("e1", "nowhere/#")  # matches no known topic
    assert compiler.build() is before
    compiler.subscribe("e1", "a/b/+")  # inside a/#: its rows recompile to what they were
    assert compiler.pending_rows > 0
    assert compiler.build() is before and compiler.pending_rows == 0
    compiler.subscribe("e1", "b/+")  # a real change: a new snapshot, the next version
    after = compiler.build()
    assert after is not before and after.version == before.version + 1
    assert table_decisions(compiler, registry)[(0, "b/c")] == (KeyAction.FORWARD, (1,), 0)


def test_a_withdrawn_subscription_stops_its_topics_and_leaves_the_rest():
    registry, compiler = _every_topic_compiler(e1=(1, "a/#"))
    compiler.subscribe("e1", "b/+")
    compiler.build()
    compiler.withdraw("e1", "a/#")
    assert compiler.pending_rows == len(TopicCatalog(TOPICS).matching("a/#"))
    compiler.build()
    rows = table_decisions(compiler, registry)
    assert rows[(0, "a/b/c")][0] is KeyAction.DROP
    assert rows[(0, "b/c")] == (KeyAction.FORWARD, (1,), 0)
    assert [str(e) for e in compiler.egresses["e1"].lists[0].entries] == ["+b/+"]


def test_keys_registered_after_a_build_get_rows_in_the_next_one():
    registry = KeyRegistry()
    compiler = OffloadCompiler(registry)
    compiler.add_egress("e1", 4)
    compiler.subscribe("e1", "x/#")
    assert len(compiler.build().entries.key_rows) == 0
    key = registry.key_for("x/y")
    other = registry.key_for("z")
    rows = compiler.build().entries.key_rows
    assert dict(zip(rows.keys.tolist(), rows.actions.tolist())) == {
        key: KeyAction.FORWARD, other: KeyAction.DROP}


def test_port_sets_share_one_multicast_group_that_is_released_when_unused():
    registry = KeyRegistry()
    keys = [registry.key_for(t) for t in ("a/1", "a/2", "b/1")]
    compiler = OffloadCompiler(registry)
    for name, port in (("e1", 1), ("e2", 2), ("e3", 3)):
        compiler.add_egress(name, port)
    compiler.subscribe("e1", "#")
    compiler.subscribe("e2", "a/#")
    snap = compiler.build()
    rows = dict(zip(snap.entries.key_rows.keys.tolist(), snap.entries.key_rows.targets.tolist()))
    assert rows[keys[0]] == rows[keys[1]] and snap.group_ports(rows[keys[0]]) == (1, 2)
    assert [g.ports for g in snap.entries.groups] == [(1, 2)]
    compiler.unsubscribe("e2", "a/#")
    assert compiler.build().entries.groups == ()
    compiler.subscribe("e3", "b/#")
    snap = compiler.build()
    assert [(g.group_id, g.ports) for g in snap.entries.groups] == [(1, (1, 3))]


def test_egresses_with_different_acl_classes_make_the_key_punt():
    registry = KeyRegistry()
    key = registry.key_for("t")
    compiler = OffloadCompiler(registry)
    compiler.define_acl_class(1, QUOTE, ["(price < 1, ACCEPT)"])
    compiler.add_egress("plain", 1)
    compiler.add_egress("filtered", 2, acl_class=1)
    compiler.subscribe("filtered", "t")
    rows = compiler.build().entries.key_rows
    assert (rows.actions[0], rows.targets[0], rows.acl_classes[0]) == (KeyAction.FORWARD, 2, 1)
    compiler.subscribe("plain", "#")
    rows = compiler.build().entries.key_rows
    assert rows.keys[0] == key and rows.actions[0] == KeyAction.PUNT


def test_refusals_say_what_to_do():
    compiler = OffloadCompiler(KeyRegistry())
    with pytest.raises(CompileError, match="not the CPU port"):
        compiler.add_egress("cpu", model.CPU_PORT)
    with pytest.raises(CompileError, match="add_egress"):
        compiler.subscribe("nobody", "a")
    with pytest.raises(CompileError, match="define_schema"):
        compiler.define_acl_class(1, "nope", ["(x < 1, ACCEPT)"])
    compiler.add_egress("e", 1, acl_class=7)
    with pytest.raises(CompileError, match="define_acl_class"):
        compiler.build()


def test_an_unsubscribe_touches_only_the_key_table_words_of_the_keys_its_pattern_matches():
    registry, compiler = _every_topic_compiler(e1=(1, "#"), e2=(2, "a/#"))
    before = compiler.build()
    compiler.unsubscribe("e1", "+/b/#")  # a partial unsubscribe: "#" stays
    overlapping = set(TopicCatalog(TOPICS).matching("+/b/#"))
    assert compiler.pending_rows == len(overlapping)
    after = compiler.build()
    old, new = before.tables.slots, after.tables.slots
    changed = np.flatnonzero(old != new)
    assert (changed % 2 == 1).all()  # values only: keys keep their slots
    changed_keys = {registry.lookup(int(new[w - 1]))[1] for w in changed}
    # every overlapping key changes here (e1 leaves it: group -> e2's port, or forward -> drop)
    assert changed_keys == overlapping
    decisions = table_decisions(compiler, registry)
    for topic in TOPICS:
        ports = (2,) if topic.startswith("a/") or topic == "a" else ()
        if topic not in overlapping:
            ports = tuple(sorted({1, *ports}))
        action = (KeyAction.DROP if not ports else KeyAction.FORWARD if len(ports) == 1
                  else KeyAction.FORWARD_GROUP)
        assert decisions[(0, topic)][:2] == (action, ports), topic


@pytest.mark.parametrize("seed", range(6))
def test_subscribes_between_builds_with_egresses_removed_and_added_agree_with_a_fresh_compile(
        seed):
    """Subscribes add their egress to their rows' decisions at the next build (no decision
    from the lists); removing and re-adding an egress before that build must still win."""
    rng = random.Random(100 + seed)
    registry, compiler, oracle = _setup(rng)
    compiler.build()
    for _ in range(12):
        for _ in range(rng.randint(1, 6)):
            name, ns = rng.choice(sorted(oracle.ports)), rng.choice([0, 1])
            roll = rng.random()
            if roll < 0.6:
                compiler.subscribe(name, rng.choice(PATTERNS), ns)
            elif roll < 0.8:
                compiler.unsubscribe(name, rng.choice(PATTERNS), ns)
            else:
                compiler.remove_egress(name)
                compiler.add_egress(name, rng.choice([1, 2, 3, 5, 6]), oracle.classes[name])
        compiler.build()
        fresh = OffloadCompiler(registry)
        fresh.define_schema(QUOTE)
        fresh.define_acl_class(1, "quote", ["(price < 10, ACCEPT, REJECT)"])
        fresh.define_acl_class(2, "quote", ["(symbol == 'IBM', LOG, ACCEPT)"])
        for name, egress in compiler.egresses.items():
            fresh.add_egress(name, egress.port, egress.acl_class)
            for ns, sublist in egress.lists.items():
                for entry in sublist.entries:
                    (fresh.subscribe if entry.positive else fresh.unsubscribe)(
                        name, entry.pattern, ns)
        fresh.build()
        assert table_decisions(compiler, registry) == table_decisions(fresh, registry)
