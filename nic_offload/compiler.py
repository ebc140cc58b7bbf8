"""The compiler from control state to table snapshots.

Control state: egresses (a name, an egress port, the entitlement class of what is behind it),
each with one subscription list per namespace (positive and negative entries, seed 000);
schemas; ACL classes; the key registry (every registered topic gets a topic_key row).

Decision of one key (namespace, topic): the egresses whose list delivers the topic.

- none -> ``drop``;
- egresses that disagree on their ACL class -> ``punt`` (one key carries one ``acl_class``
  in the tables, so the control plane decides such keys itself);
- one port -> ``forward(port, class)``; several -> ``forward_group(group, class)``, with one
  multicast group per distinct port set (reference counted, ids reused).

Incremental: a subscribe or unsubscribe of pattern p changes the decision of topics p
matches only (seed 000: the list's answer outside p is unchanged), so only the registered
topics ``TopicCatalog.matching(p)`` returns are recompiled; new registry entries are compiled
as they appear. ``build()`` turns the changes into the next immutable snapshot, rewriting the
changed rows in the other of two buffers (snapshot.py, buffers.py). Rows keep their key forever
(their order is the registry's), so per-key counters survive snapshots.

Two ways to find a key's egresses give the same answer (tests hold them to it): per topic,
the topic index of positive patterns gives candidates and each candidate's list decides;
in bulk (most rows dirty, e.g. the first build), each positive pattern's registered topics
are collected from the catalog, and lists with negative entries confirm.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from datapath.topics.index import TopicCatalog, TopicIndex
from datapath.topics.registry import KeyRegistry
from datapath.topics.sublist import SubscriptionList
from nic_offload import buffers, model
from nic_offload.acl import AclClass, Verdict, compile_class
from nic_offload.errors import CompileError
from nic_offload.model import (
    EntrySet,
    KeyAction,
    KeyRows,
    MulticastGroup,
    PipelineSpec,
    sorted_unique,
)
from nic_offload.schema import Schema
from nic_offload.snapshot import Snapshot

BULK_DIRTY_FRACTION = 0.25
"""Above this fraction of dirty rows, decisions are computed in bulk from the patterns."""

BULK_PATTERNS_PER_ROW = 4
"""Bulk decisions only when the subscriptions held, times this, are at most the dirty rows:
the bulk walk visits every subscription's matching topics (a registry lookup each)."""

SUBTRACT_MIN_ROWS = 64
"""An unsubscribe touching at least this many rows takes its egress's port out of their
decisions (``_subtract``); fewer are decided again one by one."""

INITIAL_ROWS = 1_024
"""Initial capacity of the working row arrays, in rows (they double as keys register)."""


def _uncached_index() -> TopicIndex[str]:
    return TopicIndex(cache_entries=0)


@dataclass
class Egress:
    """An egress channel: its port in the tables, its ACL class, its subscription lists."""

    name: str
    port: int
    acl_class: int = model.NO_ACL_CLASS
    lists: dict[int, SubscriptionList] = field(default_factory=dict)

    def delivers(self, namespace: int, topic: str) -> bool:
        sublist = self.lists.get(namespace)
        return sublist is not None and sublist.decides(topic)

    def has_negatives(self, namespace: int) -> bool:
        sublist = self.lists.get(namespace)
        return sublist is not None and any(not e.positive for e in sublist.entries)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the tables do with one key."""

    action: KeyAction
    target: int = 0
    acl_class: int = model.NO_ACL_CLASS
    ports: tuple[int, ...] = ()


_GROUP_ACTION = KeyAction.FORWARD_GROUP
_DROP_VALUE, _GROUP_VALUE = int(KeyAction.DROP), int(KeyAction.FORWARD_GROUP)
"""``KeyAction.X`` costs an enum lookup (about 1 us on Python 3.11) per use, and numpy
storing an enum member looks for three array protocols on its class (three more): per new
topic of a registration of 100,000 (issue 19), ``_sync_registry`` and ``_apply`` use these
and store plain ints."""
DROP = Decision(KeyAction.DROP)
PUNT = Decision(KeyAction.PUNT)


class OffloadCompiler:
    """Owns the control state and compiles it into snapshots (see the module docstring).

    Not thread-safe: one control-plane agent owns it; the data path only sees the published
    snapshots.
    """

    def __init__(self, registry: KeyRegistry, spec: PipelineSpec = model.DEFAULT_SPEC) -> None:
        self._registry = registry
        self._spec = spec
        self._synced_version = 0
        self._egresses: dict[str, Egress] = {}
        self._class_uses: Counter[int] = Counter()
        """ACL class -> how many egresses have it (``build`` checks them without a pass
        over every egress)."""
        self._schemas: dict[str, Schema] = {}
        self._classes: dict[int, AclClass] = {}
        self._class_entries: dict[int, tuple[model.TableEntry, ...]] = {}
        self._catalogs: dict[int, TopicCatalog] = defaultdict(TopicCatalog)
        # no match cache: rows are decided once per change, and a cache costs a pass over
        # its topics at every pattern added or removed
        self._index: dict[int, TopicIndex[str]] = defaultdict(_uncached_index)
        self._rows_of: dict[int, dict[str, int]] = defaultdict(dict)
        """Namespace -> topic -> its row."""
        self._names: list[tuple[int, str]] = []
        self._keys = np.zeros(INITIAL_ROWS, np.uint64)
        self._actions = np.zeros(INITIAL_ROWS, np.uint8)
        self._targets = np.zeros(INITIAL_ROWS, np.uint32)
        self._acl_classes = np.zeros(INITIAL_ROWS, np.uint16)
        self._group_of_ports: dict[tuple[int, ...], int] = {}
        self._group_refs: dict[int, int] = {}
        self._ports_of_group: dict[int, tuple[int, ...]] = {}
        self._free_groups: list[int] = []  # a heap: the lowest free id is reused first
        self._next_group = model.NO_GROUP + 1
        self._dirty: set[int] = set()
        self._unions: list[tuple[Egress, np.ndarray]] = []
        """(egress, rows) of the subscribes not compiled yet (``_apply_unions``)."""
        self._changed: list[np.ndarray] = []
        """Rows whose decision an unsubscribe changed in place (``_subtract``) since the
        last build: part of the next snapshot's changed rows, not decided again."""
        self._acl_dirty = True
        self._snapshot: Snapshot | None = None
        self._version = 0

    # --- control state -------------------------------------------------------------------------
    @property
    def spec(self) -> PipelineSpec:
        return self._spec

    @property
    def egresses(self) -> dict[str, Egress]:
        """Egresses by name (read them; change them through the methods)."""
        return dict(self._egresses)

    def egress_of(self, name: str) -> Egress | None:
        """The egress named ``name`` (read it; change it through the methods), or None: no
        copy of the egresses, as ``egresses`` makes."""
        return self._egresses.get(name)

    @property
    def acl_classes(self) -> dict[int, AclClass]:
        return dict(self._classes)

    def add_egress(self, name: str, port: int, acl_class: int = model.NO_ACL_CLASS) -> None:
        """A new egress channel on ``port`` whose subscribers are entitled to ``acl_class``."""
        if name in self._egresses:
            raise CompileError(f"egress {name!r} exists; remove it first or pick another name")
        self._check_port_class(name, port, acl_class)
        self._egresses[name] = Egress(name, port, acl_class)
        self._class_uses[acl_class] += 1

    def set_egress(self, name: str, *, port: int | None = None,
                   acl_class: int | None = None) -> None:
        """Move an egress to another port and/or ACL class (its keys are recompiled)."""
        egress = self._egress(name)
        new_port = egress.port if port is None else port
        new_class = egress.acl_class if acl_class is None else acl_class
        self._check_port_class(name, new_port, new_class)
        self._mark_egress(egress)
        self._class_uses[egress.acl_class] -= 1
        self._class_uses[new_class] += 1
        egress.port, egress.acl_class = new_port, new_class

    def remove_egress(self, name: str) -> None:
        egress = self._egress(name)
        self._mark_egress(egress)
        for namespace, sublist in egress.lists.items():
            for pattern in sublist.positive_patterns():
                self._index[namespace].remove(pattern, name)
        del self._egresses[name]
        self._class_uses[egress.acl_class] -= 1

    def subscribe(self, egress: str, pattern: str, namespace: int = 0) -> None:
        """Apply ``+pattern`` to the egress's list. After it the egress delivers every topic
        ``pattern`` matches (the newest entry decides), so those rows are not decided again:
        the egress's port is added to their decision at the next build (``_apply_unions``:
        the cost is that of the rows, not of the appliance's subscriptions)."""
        self._change_list(egress, namespace, pattern, lambda s: s.subscribe(pattern),
                          union=True)

    def unsubscribe(self, egress: str, pattern: str, namespace: int = 0) -> None:
        """Apply ``-pattern`` (a partial unsubscribe when a broader + entry stays)."""
        self._change_list(egress, namespace, pattern, lambda s: s.unsubscribe(pattern))

    def withdraw(self, egress: str, pattern: str, namespace: int = 0) -> None:
        """Remove the positive entry ``pattern`` from the egress's list without adding a
        negative one (``SubscriptionList.withdraw``: a subscription taken back)."""
        self._change_list(egress, namespace, pattern, lambda s: s.withdraw(pattern))

    def define_schema(self, schema: Schema) -> None:
        self._schemas[schema.name] = schema

    def define_acl_class(self, class_id: int, schema: str | Schema, rules: Iterable[str],
                         default: Verdict | str = Verdict.REJECT) -> AclClass:
        """Define (or redefine) entitlement class ``class_id`` from rule texts (acl.py)."""
        if isinstance(schema, str):
            if schema not in self._schemas:
                raise CompileError(f"no schema {schema!r}; define_schema() it first (known: "
                                   f"{', '.join(self._schemas) or 'none'})")
            schema = self._schemas[schema]
        acl = AclClass.parse(class_id, schema, rules, default)
        self._class_entries[class_id] = tuple(compile_class(acl, self._spec))
        self._classes[class_id] = acl
        self._acl_dirty = True
        return acl

    def remove_acl_class(self, class_id: int) -> None:
        users = [e.name for e in self._egresses.values() if e.acl_class == class_id]
        if users:
            raise CompileError(f"ACL class {class_id} is the class of egresses {users}; move "
                               "them to another class first")
        self._classes.pop(class_id, None)
        self._class_entries.pop(class_id, None)
        self._acl_dirty = True

    # --- decisions -----------------------------------------------------------------------------
    def decide(self, namespace: int, topic: str,
               negatives: dict[tuple[str, int], bool] | None = None) -> Decision:
        """The decision of (namespace, topic) under the current control state.

        The index gives the egresses with a positive pattern matching the topic; only those
        whose list holds negative entries need their list to decide (``negatives``: a cache of
        ``has_negatives`` over one batch of rows)."""
        candidates = self._index[namespace].match(topic) if namespace in self._index else ()
        if negatives is None:
            negatives = {}
        receivers = []
        for name in candidates:
            egress = self._egresses[name]
            negative = negatives.get((name, namespace))
            if negative is None:
                negative = negatives[(name, namespace)] = egress.has_negatives(namespace)
            if not negative or egress.delivers(namespace, topic):
                receivers.append(egress)
        return self._decision(receivers)

    def _decision(self, receivers: list[Egress]) -> Decision:
        if not receivers:
            return DROP
        classes = {e.acl_class for e in receivers}
        if len(classes) > 1:
            return PUNT
        ports = tuple(sorted({e.port for e in receivers}))
        (acl_class,) = classes
        if len(ports) == 1:
            return Decision(KeyAction.FORWARD, ports[0], acl_class, ports)
        return Decision(KeyAction.FORWARD_GROUP, 0, acl_class, ports)

    # --- snapshots -----------------------------------------------------------------------------
    @property
    def snapshot(self) -> Snapshot | None:
        """The last snapshot built (None before the first ``build``)."""
        return self._snapshot

    @property
    def pending_rows(self) -> int:
        """Rows a ``build`` would recompile now (registry additions not counted yet)."""
        return len(self._dirty.union(*(rows.tolist() for _, rows in self._unions),
                                     *(rows.tolist() for rows in self._changed)))

    def build(self) -> Snapshot:
        """Compile the changes since the last build into the next snapshot: the last one
        itself (same object, same version) when nothing an executor sees changed (a
        subscription whose pattern matches no known topic, or one that leaves every
        decision as it was), so the caller can tell there is nothing to install."""
        self._sync_registry()
        for acl_class in [c for c, n in self._class_uses.items() if n and c]:
            if acl_class not in self._classes:
                raise CompileError(f"egresses use ACL class {acl_class}, which is not "
                                   "defined; define_acl_class() it")
        united = self._apply_unions()
        if self._changed:  # rows changed by unsubscribes (``_subtract``), decided already
            united = sorted_unique(np.concatenate([united, *self._changed]))
            self._changed = []
        dirty = np.fromiter(self._dirty, np.int64, len(self._dirty))
        dirty.sort()
        decisions = self._decide_rows(dirty)
        for row, decision in zip(dirty.tolist(), decisions):
            self._apply(row, decision)
        if len(united):
            dirty = sorted_unique(np.concatenate([dirty, united]))
            self._dirty.update(united.tolist())
        n = len(self._names)
        groups = tuple(MulticastGroup(g, self._ports_of_group[g])
                       for g in sorted(self._ports_of_group))
        if self._unchanged(n, groups):
            self._dirty.clear()
            assert self._snapshot is not None
            return self._snapshot
        self._version += 1
        rows = self._published_rows(n, dirty)
        acl_entries = tuple(e for c in sorted(self._class_entries) for e in self._class_entries[c])
        entries = EntrySet(self._spec, rows, acl_entries, groups, self._version)
        if self._snapshot is None:
            snapshot = Snapshot.build(entries)
        else:
            # the changed rows are checked while patching, and for their groups here
            entries.validate(keys=False, rows=dirty)
            snapshot = self._snapshot.evolve(entries, dirty, self._acl_dirty)
        self._snapshot = snapshot
        self._dirty.clear()
        self._acl_dirty = False
        return snapshot

    # --- internals -----------------------------------------------------------------------------
    def _published_rows(self, n: int, changed: np.ndarray) -> KeyRows:
        """The key rows of the next snapshot (``n`` rows, ``changed`` the rows that differ
        from the last snapshot's, new ones included): each column the other of two buffers
        patched in turn (nic_offload/buffers.py), not a copy of the whole column; a copy
        when the last snapshot was built whole, or a reader still holds the one before."""
        last = self._snapshot
        if last is None or len(last.entries.key_rows) > n:
            return KeyRows(*(_frozen_copy(a[:n]) for a in (
                self._keys, self._actions, self._targets, self._acl_classes)))
        prev = last.entries.key_rows
        at = np.asarray(changed, np.int64)
        columns, pairs = [], {}
        for name, working in (("keys", self._keys), ("actions", self._actions),
                              ("targets", self._targets), ("acl_classes", self._acl_classes)):
            values = working[at]  # (a copy: the patch is applied again, to the other buffer)

            def patch(buf: np.ndarray, at: np.ndarray = at, values: np.ndarray = values) -> None:
                buf[at] = values

            view, _, pairs[name] = buffers.advance(prev, name, getattr(prev, name), n, patch)
            columns.append(view)
        rows = KeyRows(*columns)
        buffers.remember(rows, pairs)
        return rows

    def _unchanged(self, n: int, groups: tuple[MulticastGroup, ...]) -> bool:
        """Whether the rows, groups and ACL entries are those of the last snapshot."""
        last = self._snapshot
        if last is None or self._acl_dirty or groups != last.entries.groups:
            return False
        rows = last.entries.key_rows
        if len(rows) != n:
            return False
        if not self._dirty:
            return True
        changed = np.fromiter(self._dirty, np.int64, len(self._dirty))
        return bool(np.array_equal(rows.actions[changed], self._actions[changed])
                    and np.array_equal(rows.targets[changed], self._targets[changed])
                    and np.array_equal(rows.acl_classes[changed], self._acl_classes[changed])
                    and np.array_equal(rows.keys[changed], self._keys[changed]))

    def _egress(self, name: str) -> Egress:
        try:
            return self._egresses[name]
        except KeyError:
            raise CompileError(f"no egress {name!r}; add_egress() it first (known: "
                               f"{', '.join(sorted(self._egresses)) or 'none'})") from None

    def _check_port_class(self, name: str, port: int, acl_class: int) -> None:
        if not 0 <= port <= model.MAX_EGRESS_PORT or port == model.CPU_PORT:
            raise CompileError(f"egress {name!r}: port {port} must be 0..{model.MAX_EGRESS_PORT}"
                               f" and not the CPU port {model.CPU_PORT}")
        if not 0 <= acl_class <= model.MAX_ACL_CLASS:
            raise CompileError(f"egress {name!r}: ACL class {acl_class} must be "
                               f"0..{model.MAX_ACL_CLASS} (0: no ACL)")

    def _change_list(self, name: str, namespace: int, pattern: str, change,  # noqa: ANN001
                     union: bool = False) -> None:
        egress = self._egress(name)
        sublist = egress.lists.setdefault(namespace, SubscriptionList())
        added, removed = sublist.tracked(change)
        index = self._index[namespace]
        for gone in removed:
            index.remove(gone, name)
        for new in added:
            index.add(new, name)
        if union:
            rows = self._rows_matching(namespace, pattern)
            if len(rows):
                self._unions.append((egress, rows))
        else:
            rows = self._rows_matching(namespace, pattern)
            if len(rows) >= SUBTRACT_MIN_ROWS and self._port_alone(egress):
                self._subtract(egress, namespace, rows)
            else:
                self._dirty.update(rows.tolist())

    def _rows_matching(self, namespace: int, pattern: str) -> np.ndarray:
        """The rows of the registered topics ``pattern`` matches in ``namespace``."""
        self._sync_registry()
        catalog = self._catalogs.get(namespace)
        if catalog is None:
            return np.zeros(0, np.int64)
        row_of = self._rows_of[namespace]
        get = self._registry.get
        rows = [row_of[topic] for topic in catalog.matching(pattern)  # (the catalog may
                if get(topic, namespace) is not None]  # hold topics the registry has not)
        return np.fromiter(rows, np.int64, len(rows))

    def _port_alone(self, egress: Egress) -> bool:
        """Whether no other egress has ``egress``'s port (its port in a decision is it)."""
        port = egress.port
        return not any(e.port == port and e is not egress for e in self._egresses.values())

    def _subtract(self, egress: Egress, namespace: int, rows: np.ndarray) -> None:
        """An unsubscribe (or withdrawal) of ``egress`` changed its list for ``rows``: the
        rows it no longer delivers lose its port, the others keep their decision. Exact
        without deciding the rows again: a row's receivers are the egresses of its port or
        group's ports (``egress`` holds its port alone, ``_port_alone``), all of one ACL
        class unless the row punts; punted rows are decided again at the next build. Its
        list is walked for the rows it still delivers (the patterns of one egress, at most
        ``clients.max_subscriptions``), not every subscription of the appliance as the bulk
        decision does (an unsubscribe of 100,000 keys decided them one by one: 2 s)."""
        self._changed.append(self._apply_unions())  # the subscribes before it come first
        n = len(self._names)
        inside = np.zeros(n, bool)
        inside[rows] = True
        still = np.zeros(n, bool)
        sublist = egress.lists.get(namespace)
        catalog = self._catalogs.get(namespace)
        if sublist is not None and catalog is not None:
            confirm = egress.has_negatives(namespace)
            row_of, get = self._rows_of[namespace], self._registry.get
            for positive in sublist.positive_patterns():
                for topic in catalog.matching(positive):
                    if get(topic, namespace) is None:
                        continue  # (as _rows_matching)
                    row = row_of[topic]
                    if inside[row] and not still[row] and (not confirm
                                                           or sublist.decides(topic)):
                        still[row] = True
        gone = rows[~still[rows]]
        actions, targets, classes = self._actions, self._targets, self._acl_classes
        act, tgt = actions[gone], targets[gone]
        port = egress.port
        punted = gone[act == KeyAction.PUNT]
        self._dirty.update(punted.tolist())
        alone = gone[(act == KeyAction.FORWARD) & (tgt == port)]
        actions[alone], targets[alone], classes[alone] = _DROP_VALUE, 0, model.NO_ACL_CLASS
        changed = [alone]
        for group, at in _runs(tgt, act == KeyAction.FORWARD_GROUP):
            ports = self._ports_of_group[group]
            if port not in ports:
                continue
            left = tuple(p for p in ports if p != port)
            where = gone[at]
            if len(left) == 1:
                actions[where], targets[where] = int(KeyAction.FORWARD), left[0]
            else:
                targets[where] = self._acquire_group(left, len(where))
            self._release_group(group, len(where))
            changed.append(where)
        self._changed.extend(changed)

    def _mark_pattern(self, namespace: int, pattern: str) -> None:
        self._dirty.update(self._rows_matching(namespace, pattern).tolist())

    def _apply_unions(self) -> np.ndarray:
        """Add each pending subscribe's egress to the decision of its rows (see ``subscribe``),
        in the order they came, before the dirty rows are decided again (a later change of
        the same egress, its removal included, marks its rows dirty and wins); returns the
        rows whose decision changed. Vectorized over the rows: per distinct port or group,
        not per row."""
        unions, self._unions = self._unions, []
        changed: list[np.ndarray] = []
        actions, targets, classes = self._actions, self._targets, self._acl_classes
        for egress, rows in unions:
            if self._egresses.get(egress.name) is not egress:
                continue  # removed since: its rows are dirty
            port, acl = egress.port, egress.acl_class
            act, tgt, cls = actions[rows], targets[rows], classes[rows]
            punt = (act != KeyAction.DROP) & (act != KeyAction.PUNT) & (cls != acl)
            drop = act == KeyAction.DROP
            fwd = (act == KeyAction.FORWARD) & ~punt & (tgt != port)
            grp = (act == KeyAction.FORWARD_GROUP) & ~punt
            for group, n in zip(*sorted_unique(tgt[punt & (act == KeyAction.FORWARD_GROUP)],
                                               return_counts=True)):
                self._release_group(int(group), int(n))
            new_tgt = tgt.copy()
            new_act = act.copy()
            new_cls = cls.copy()
            new_act[punt], new_tgt[punt], new_cls[punt] = KeyAction.PUNT, 0, model.NO_ACL_CLASS
            new_act[drop], new_tgt[drop], new_cls[drop] = KeyAction.FORWARD, port, acl
            for other, at in _runs(tgt, fwd):
                group = self._acquire_group(tuple(sorted((other, port))), len(at))
                new_act[at], new_tgt[at] = KeyAction.FORWARD_GROUP, group
            for group, at in _runs(tgt, grp):
                ports = self._ports_of_group[group]
                if port in ports:
                    continue
                new_tgt[at] = self._acquire_group(tuple(sorted((*ports, port))), len(at))
                self._release_group(group, len(at))
            moved = (new_act != act) | (new_tgt != tgt) | (new_cls != cls)
            if moved.any():
                actions[rows], targets[rows], classes[rows] = new_act, new_tgt, new_cls
                changed.append(rows[moved])
        if not changed:
            return np.zeros(0, np.int64)
        return sorted_unique(np.concatenate(changed))

    def _mark_egress(self, egress: Egress) -> None:
        for namespace, sublist in egress.lists.items():
            for pattern in sublist.positive_patterns():
                self._mark_pattern(namespace, pattern)

    def _sync_registry(self) -> None:
        """Give every newly registered topic a row (dirty, so it gets compiled)."""
        if self._registry.version == self._synced_version:
            return
        for record in self._registry.updates_since(self._synced_version):
            row = len(self._names)
            if row >= len(self._keys):
                self._grow()
            self._names.append((record.namespace_id, record.topic))
            self._rows_of[record.namespace_id][record.topic] = row
            self._keys[row] = record.topic_key
            self._actions[row] = _DROP_VALUE
            self._catalogs[record.namespace_id].add(record.topic)
            self._dirty.add(row)
        self._synced_version = self._registry.version

    def _grow(self) -> None:
        size = 2 * len(self._keys)
        for name in ("_keys", "_actions", "_targets", "_acl_classes"):
            old = getattr(self, name)
            new = np.zeros(size, old.dtype)
            new[:len(old)] = old
            setattr(self, name, new)

    def _decide_rows(self, rows: np.ndarray) -> list[Decision]:
        """Decisions of ``rows``: in bulk (every positive pattern of every egress walks its
        matching topics) when most rows are dirty and the patterns are fewer than the dirty
        rows, else row by row from the index; the bulk walk costs the number of
        (subscription, matching key) pairs of the whole appliance, whatever few rows changed
        (a subscribe of 100,000 keys with 25,000 subscriptions held cost 2.3 s that way)."""
        if (len(rows) > BULK_DIRTY_FRACTION * max(1, len(self._names))
                and BULK_PATTERNS_PER_ROW * sum(len(index) for index in self._index.values())
                <= len(rows)):
            return self._decide_bulk(rows)
        names = self._names
        negatives: dict[tuple[str, int], bool] = {}
        return [self.decide(*names[row], negatives) for row in rows.tolist()]

    def _decide_bulk(self, rows: np.ndarray) -> list[Decision]:
        """Decisions of ``rows`` from the patterns' matching topics (see the module doc)."""
        wanted = set(rows.tolist())
        receivers: dict[int, list[Egress]] = defaultdict(list)
        for egress in self._egresses.values():
            for namespace, sublist in egress.lists.items():
                catalog = self._catalogs.get(namespace)
                if catalog is None:
                    continue
                confirm = egress.has_negatives(namespace)
                seen: set[int] = set()
                for pattern in sublist.positive_patterns():
                    for topic in catalog.matching(pattern):
                        row = self._rows_of[namespace][topic]
                        if row in seen or row not in wanted:
                            continue
                        seen.add(row)
                        if not confirm or sublist.decides(topic):
                            receivers[row].append(egress)
        return [self._decision(receivers.get(row, [])) for row in rows.tolist()]

    def _apply(self, row: int, decision: Decision) -> None:
        old_action = self._actions[row]
        if old_action == _GROUP_VALUE:
            self._release_group(int(self._targets[row]))
        target = decision.target
        if decision.action is _GROUP_ACTION:
            target = self._acquire_group(decision.ports)
        self._actions[row] = int(decision.action)
        self._targets[row] = target
        self._acl_classes[row] = decision.acl_class

    def _acquire_group(self, ports: tuple[int, ...], count: int = 1) -> int:
        group = self._group_of_ports.get(ports)
        if group is None:
            if self._free_groups:
                group = heapq.heappop(self._free_groups)
            elif self._next_group <= model.MAX_GROUP:
                group = self._next_group
                self._next_group += 1
            else:
                raise CompileError(f"all {model.MAX_GROUP} multicast groups are in use; "
                                   "fewer distinct egress port sets are needed")
            self._group_of_ports[ports] = group
            self._ports_of_group[group] = ports
            self._group_refs[group] = 0
        self._group_refs[group] += count
        return group

    def _release_group(self, group: int, count: int = 1) -> None:
        self._group_refs[group] -= count
        if self._group_refs[group] == 0:
            del self._group_refs[group]
            del self._group_of_ports[self._ports_of_group.pop(group)]
            heapq.heappush(self._free_groups, group)


def _runs(values: np.ndarray, mask: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(value, the places where ``mask`` holds and ``values`` is it) for each distinct value
    of ``values[mask]``, ascending: one sort, not a pass over every place per value (a
    subscribe of 100,000 keys held by 400 other ports made 400 passes over them)."""
    at = np.flatnonzero(mask)
    if not len(at):
        return []
    order = at[np.argsort(values[at], kind="stable")]
    ordered = values[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    firsts = ordered[np.concatenate([[0], cuts])].tolist()
    return list(zip(firsts, np.split(order, cuts)))


def _frozen_copy(array: np.ndarray) -> np.ndarray:
    """A read-only copy of ``array``."""
    copy = array.copy()
    copy.flags.writeable = False
    return copy
