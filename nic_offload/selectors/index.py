"""``SelectorIndex``: many subscribers' selectors matched at once with shared predicate lists.

The improved JMS filtering algorithm of seed 003, in four steps:

1. Every selector is reduced to shared predicates under an AND/OR structure
   (``predicates.to_nnf``); identical predicates of different subscribers are one entry
   (the seed's ``Pro_list``), identical selectors are one entry with many subscribers
   (``Subs_list``), and each selector keeps its structure over predicate ids
   (``Double_list``), AND-connected predicates first (cheap shared lookups before nested
   groups, residual conditions last).
2. Predicates are grouped per attribute, value type and operator (``=``, ``<``, ``<=``,
   ``>``, ``>=``, IN, LIKE, type and NULL tests) in lists sorted by constant, and numbered so
   that each list is a run of consecutive ids in constant order.
3. For an event, each of its attributes is looked up by binary search once per list: the
   predicates it makes TRUE form one slice of ids (one hit for ``=``), written into a truth
   table in one slice assignment. Attributes the event lacks leave their predicates UNKNOWN.
4. Each candidate selector's structure is evaluated over the truth table with
   short-circuit (AND stops at the first FALSE, OR at the first TRUE). Candidates: a
   selector that can only be TRUE when one of a few predicates (an ``=``/IN/range predicate
   in its top-level AND, or one per branch of an OR) is TRUE is *anchored* on them and
   visited only for events that make one of them TRUE; the others are visited always.
   An AND anchors on the predicate least often TRUE, estimated from the constants all
   subscribers use for that attribute (subscribers ask about values that occur: ``symbol =
   'IBM'`` among 2,000 symbols is rarer than ``side = 'S'`` among 2 sides; ``price > 130``
   rarer than ``price > 90`` when the constants spread over 80..140).

Subscriptions change rarely compared with events: ``add``/``remove`` only record the change,
and the next ``match`` rebuilds the lists (an immutable snapshot, swapped whole).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field

from nic_offload.selectors import predicates as p
from nic_offload.selectors import values as v
from nic_offload.selectors.errors import SelectorError
from nic_offload.selectors.evaluator import Event, Selector, compile_selector

MAX_ANCHOR_SHARE = 1.0
"""An OR whose branches' anchors together are estimated TRUE for more than this share of
events is visited for every event instead (a fraction, 0..1)."""

# compiled structure node kinds
_LEAF, _NLEAF, _AND, _OR, _CONST, _RESID, _NRESID = range(7)


@dataclass(slots=True)
class _Entry:
    """One distinct selector and the subscribers who hold it."""

    selector: Selector
    nnf: p.NnfNode
    subscribers: set[Hashable] = field(default_factory=set)


@dataclass(slots=True)
class _RangeList:
    kind: str
    constants: list
    base: int
    anchor_positions: list[int] = field(default_factory=list)
    anchor_selectors: list[tuple[int, ...]] = field(default_factory=list)


@dataclass(slots=True)
class _DomainLists:
    dom_pid: int = -1
    eq_values: list = field(default_factory=list)
    eq_pids: list[int] = field(default_factory=list)
    eq_in_pids: list[tuple[int, ...]] = field(default_factory=list)
    eq_anchors: list[tuple[int, ...]] = field(default_factory=list)
    ranges: list[_RangeList] = field(default_factory=list)
    likes: list[tuple[int, object]] = field(default_factory=list)


@dataclass(slots=True)
class _AttrLists:
    start: int
    end: int
    zeros: bytes
    domains: dict[int, _DomainLists]


@dataclass(slots=True)
class _Compiled:
    template: bytes
    attrs: dict[str, _AttrLists]
    roots: list[tuple]
    subscribers: list[frozenset]
    always: list[int]
    predicates: int
    anchored: int


class SelectorIndex:
    """Subscribers' JMS selectors, matched against events through shared predicate lists.

    ``add(subscriber, selector_text)`` (replaces the subscriber's previous selector),
    ``remove(subscriber)``, ``match(event) -> set of subscribers``. Equivalent to
    ``{s for s in subscribers if compile_selector(text_of(s)).evaluate(event)}``.
    """

    def __init__(self) -> None:
        self._by_subscriber: dict[Hashable, _Entry] = {}
        self._entries: dict[object, _Entry] = {}
        self._compiled: _Compiled | None = None

    def add(self, subscriber_id: Hashable, selector_text: str) -> Selector:
        """Give ``subscriber_id`` the selector ``selector_text`` (an empty text matches every
        event); raises SelectorSyntaxError and leaves the index unchanged if it is invalid."""
        selector = compile_selector(selector_text)
        if subscriber_id in self._by_subscriber:
            self.remove(subscriber_id)
        entry = self._entries.get(selector.tree)
        if entry is None:
            entry = _Entry(selector, p.to_nnf(selector.tree))
            self._entries[selector.tree] = entry
        entry.subscribers.add(subscriber_id)
        self._by_subscriber[subscriber_id] = entry
        self._compiled = None
        return selector

    def remove(self, subscriber_id: Hashable) -> None:
        """Withdraw ``subscriber_id``'s selector; raises SelectorError if it has none."""
        entry = self._by_subscriber.pop(subscriber_id, None)
        if entry is None:
            raise SelectorError(f"subscriber {subscriber_id!r} has no selector in this index; "
                                "add it before removing it")
        entry.subscribers.discard(subscriber_id)
        if not entry.subscribers:
            del self._entries[entry.selector.tree]
        self._compiled = None

    def __len__(self) -> int:
        return len(self._by_subscriber)

    def __contains__(self, subscriber_id: object) -> bool:
        return subscriber_id in self._by_subscriber

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._by_subscriber)

    def selector(self, subscriber_id: Hashable) -> Selector:
        """The compiled selector of ``subscriber_id``."""
        try:
            return self._by_subscriber[subscriber_id].selector
        except KeyError:
            raise SelectorError(f"subscriber {subscriber_id!r} has no selector in this "
                                "index") from None

    def stats(self) -> dict[str, int]:
        """Sizes of the shared lists: subscribers, distinct selectors, shared predicates,
        attributes, selectors anchored on predicates and selectors visited always."""
        compiled = self._compile()
        return {"subscribers": len(self), "selectors": len(compiled.roots),
                "predicates": compiled.predicates, "attributes": len(compiled.attrs),
                "anchored": compiled.anchored, "always": len(compiled.always)}

    def match(self, event: Mapping[str, object]) -> set[Hashable]:
        """Subscribers whose selector is TRUE for ``event`` (attribute name -> value)."""
        compiled = self._compiled or self._compile()
        truth = bytearray(compiled.template)
        candidates: set[int] = set()
        attrs = compiled.attrs
        normalize, domain_of = v.normalize, v.domain_of
        for name, raw in event.items():
            lists = attrs.get(name)
            if lists is None:
                continue
            value = normalize(raw)
            if value is None:
                continue
            truth[lists.start:lists.end] = lists.zeros
            dom = lists.domains.get(domain_of(value))
            if dom is not None:
                _mark(dom, value, truth, candidates)
        roots, subscribers, evaluate = compiled.roots, compiled.subscribers, _evaluate
        matched: set[Hashable] = set()
        for group in (candidates, compiled.always):
            for sel in group:
                if evaluate(roots[sel], truth, event) == 2:  # TRUE
                    matched |= subscribers[sel]
        return matched

    # --- building the shared lists -------------------------------------------------------------
    def _compile(self) -> _Compiled:
        if self._compiled is None:
            self._compiled = _build(list(self._entries.values()))
        return self._compiled


def _mark(dom: _DomainLists, value: object, truth: bytearray, candidates: set[int]) -> None:
    """Step 3 for one present attribute: binary searches, TRUE slices, anchored candidates."""
    if dom.dom_pid >= 0:
        truth[dom.dom_pid] = p.TRUE
    values = dom.eq_values
    if values:
        i = bisect_left(values, value)
        if i < len(values) and values[i] == value:
            if dom.eq_pids[i] >= 0:
                truth[dom.eq_pids[i]] = p.TRUE
            for pid in dom.eq_in_pids[i]:
                truth[pid] = p.TRUE
            candidates.update(dom.eq_anchors[i])
    for lst in dom.ranges:
        constants, kind = lst.constants, lst.kind
        if kind == p.LT:  # attr < c: c > value
            lo, hi = bisect_right(constants, value), len(constants)
        elif kind == p.LE:
            lo, hi = bisect_left(constants, value), len(constants)
        elif kind == p.GT:  # attr > c: c < value
            lo, hi = 0, bisect_left(constants, value)
        else:
            lo, hi = 0, bisect_right(constants, value)
        if lo < hi:
            truth[lst.base + lo:lst.base + hi] = _TRUES[:hi - lo] if hi - lo <= len(
                _TRUES) else bytes([p.TRUE]) * (hi - lo)
            positions = lst.anchor_positions
            if positions:
                selectors = lst.anchor_selectors
                for k in range(bisect_left(positions, lo), bisect_left(positions, hi)):
                    candidates.update(selectors[k])
    for pid, fullmatch in dom.likes:
        if fullmatch(value) is not None:  # type: ignore[operator]
            truth[pid] = p.TRUE


_TRUES = bytes([p.TRUE]) * 65_536


def _evaluate(node: tuple, truth: bytearray, event: Event) -> int:
    """Step 4: a selector's structure over the truth table, with short-circuit: an AND
    stops at its first FALSE child, an OR at its first TRUE child (0 FALSE, 1 UNKNOWN,
    2 TRUE; a negated predicate reads ``2 - t``)."""
    kind = node[0]
    if kind == _AND:
        result = 2
        for child in node[1]:
            ck = child[0]
            if ck == _LEAF:
                t = truth[child[1]]
            elif ck == _NLEAF:
                t = 2 - truth[child[1]]
            else:
                t = _evaluate(child, truth, event)
            if t == 0:
                return 0
            if t == 1:
                result = 1
        return result
    if kind == _OR:
        result = 0
        for child in node[1]:
            ck = child[0]
            if ck == _LEAF:
                t = truth[child[1]]
            elif ck == _NLEAF:
                t = 2 - truth[child[1]]
            else:
                t = _evaluate(child, truth, event)
            if t == 2:
                return 2
            if t == 1:
                result = 1
        return result
    if kind == _LEAF:
        return truth[node[1]]
    if kind == _NLEAF:
        return 2 - truth[node[1]]
    if kind == _CONST:
        return node[1]
    truth_of = p.residual_truth(node[1], event)
    return truth_of if kind == _RESID else 2 - truth_of


def _build(entries: list[_Entry]) -> _Compiled:
    # step 2: collect predicates, group per attribute / domain / kind, number them in order
    preds: set[p.Pred] = set()
    for entry in entries:
        _collect(entry.nnf, preds)
    by_attr: dict[str, list[p.Pred]] = {}
    for pred in preds:
        by_attr.setdefault(pred.attr, []).append(pred)
    pid_of: dict[p.Pred, int] = {}
    attrs: dict[str, _AttrLists] = {}
    null_pids: list[int] = []
    for name in sorted(by_attr):
        start = len(pid_of)
        domains: dict[int, _DomainLists] = {}
        groups: dict[tuple[int, str], list[p.Pred]] = {}
        for pred in by_attr[name]:
            if pred.kind == p.NULL:
                null_pids.append(len(pid_of))
                pid_of[pred] = len(pid_of)
            else:
                groups.setdefault((pred.domain, pred.kind), []).append(pred)
        for (domain, kind), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            dom = domains.setdefault(domain, _DomainLists())
            if kind in (p.EQ, *p.RANGE_KINDS):
                group.sort(key=lambda pr: pr.arg)
            base = len(pid_of)
            for pred in group:
                pid_of[pred] = len(pid_of)
            if kind == p.DOM:
                dom.dom_pid = base
            elif kind in p.RANGE_KINDS:
                dom.ranges.append(_RangeList(kind, [pr.arg for pr in group], base))
            elif kind == p.LIKE:
                dom.likes.extend((pid_of[pr], v.like_regex(*pr.arg).fullmatch)  # type: ignore
                                 for pr in group)
        for domain, dom in domains.items():
            _equality_lists(dom, [pr for pr in by_attr[name]
                                  if pr.domain == domain and pr.kind in (p.EQ, p.IN)], pid_of)
        end = len(pid_of)
        attrs[name] = _AttrLists(start, end, bytes(end - start), domains)
    template = bytearray([p.UNKNOWN]) * len(pid_of)
    for pid in null_pids:
        template[pid] = p.TRUE

    # step 1 (numbered): structures over predicate ids; anchors for the candidate lists
    by_pid = sorted(pid_of, key=pid_of.__getitem__)
    roots: list[tuple] = []
    always: list[int] = []
    anchored_on: dict[int, list[int]] = {}
    selectivity = _Selectivity(by_pid)
    for sel, entry in enumerate(entries):
        root = _structure(entry.nnf, pid_of)
        roots.append(root)
        anchors = _anchors(root, by_pid, selectivity)
        if anchors is None:
            always.append(sel)
        else:
            for pid in anchors[1]:
                anchored_on.setdefault(pid, []).append(sel)
    _register_anchors(attrs, by_pid, anchored_on)
    return _Compiled(bytes(template), attrs, roots,
                     [frozenset(e.subscribers) for e in entries], always, len(pid_of),
                     len(entries) - len(always))


def _collect(node: p.NnfNode, preds: set[p.Pred]) -> None:
    if node[0] == "leaf":
        preds.add(node[1])
    elif node[0] in ("and", "or"):
        for child in node[1]:
            _collect(child, preds)


def _equality_lists(dom: _DomainLists, preds: list[p.Pred], pid_of: dict[p.Pred, int]) -> None:
    """The sorted ``=`` list of one attribute and domain; IN predicates hang off its values."""
    eq_pid = {pr.arg: pid_of[pr] for pr in preds if pr.kind == p.EQ}
    in_pids: dict[object, list[int]] = {}
    for pr in preds:
        if pr.kind == p.IN:
            for member in pr.arg:  # type: ignore[attr-defined]
                in_pids.setdefault(member, []).append(pid_of[pr])
    dom.eq_values = sorted(set(eq_pid) | set(in_pids))
    dom.eq_pids = [eq_pid.get(value, -1) for value in dom.eq_values]
    dom.eq_in_pids = [tuple(in_pids.get(value, ())) for value in dom.eq_values]
    dom.eq_anchors = [() for _ in dom.eq_values]


_ORDER = {_LEAF: 0, _NLEAF: 0, _CONST: 0, _AND: 1, _OR: 1, _RESID: 2, _NRESID: 2}


def _structure(node: p.NnfNode, pid_of: dict[p.Pred, int]) -> tuple:
    """NNF with predicate ids; children ordered cheap first (shared lookups, then nested
    groups, then residual conditions), so short-circuit skips the costly ones."""
    kind = node[0]
    if kind == "leaf":
        return (_NLEAF if node[2] else _LEAF, pid_of[node[1]])
    if kind == "const":
        return (_CONST, node[1])
    if kind == "residual":
        return (_NRESID if node[2] else _RESID, node[1])
    children = sorted((_structure(c, pid_of) for c in node[1]), key=lambda c: _ORDER[c[0]])
    return (_AND if kind == "and" else _OR, tuple(children))


class _Selectivity:
    """Estimated share of events for which a predicate is TRUE: the share of the distinct
    constants all subscribers compare that attribute with which the predicate accepts."""

    def __init__(self, preds: list[p.Pred]) -> None:
        constants: dict[tuple[str, int], set] = {}
        for pred in preds:
            if pred.kind in (p.EQ, *p.RANGE_KINDS):
                constants.setdefault((pred.attr, pred.domain), set()).add(pred.arg)
            elif pred.kind == p.IN:
                constants.setdefault((pred.attr, pred.domain), set()).update(pred.arg)
        self.universe = {key: sorted(values) for key, values in constants.items()}

    def share(self, pred: p.Pred) -> float:
        universe = self.universe[(pred.attr, pred.domain)]
        size, c = len(universe), pred.arg
        one = 1 / size
        if pred.kind == p.EQ:
            return one
        if pred.kind == p.IN:
            return min(1.0, len(c) * one)  # type: ignore[arg-type]
        if pred.kind == p.LT:
            accepted = bisect_left(universe, c)
        elif pred.kind == p.LE:
            accepted = bisect_right(universe, c)
        elif pred.kind == p.GT:
            accepted = size - bisect_right(universe, c)
        else:
            accepted = size - bisect_left(universe, c)
        return max(one, accepted / size)


def _anchors(node: tuple, by_pid: list[p.Pred], selectivity: _Selectivity,
             ) -> tuple[float, frozenset[int]] | None:
    """(estimated share, predicate ids) such that ``node`` is TRUE only if one of them is
    TRUE, or None when there is no such set worth using (visit the selector always)."""
    kind = node[0]
    if kind == _LEAF:
        pred = by_pid[node[1]]
        if pred.kind in (p.EQ, p.IN, *p.RANGE_KINDS):
            return selectivity.share(pred), frozenset((node[1],))
        return None
    if kind == _CONST:
        return None if node[1] == p.TRUE else (0.0, frozenset())
    if kind == _AND:
        options = [a for a in (_anchors(c, by_pid, selectivity) for c in node[1])
                   if a is not None]
        return min(options, key=lambda a: a[0]) if options else None
    if kind == _OR:
        total, pids = 0.0, set()
        for child in node[1]:
            anchor = _anchors(child, by_pid, selectivity)
            if anchor is None:
                return None
            total += anchor[0]
            pids |= anchor[1]
        return (total, frozenset(pids)) if total <= MAX_ANCHOR_SHARE else None
    return None


def _register_anchors(attrs: dict[str, _AttrLists], by_pid: list[p.Pred],
                      anchored_on: dict[int, list[int]]) -> None:
    """Hang each anchored selector off the list position of its anchor predicate."""
    eq_anchor: dict[tuple[str, int, object], set[int]] = {}
    range_anchor: dict[int, list[int]] = {}
    for pid, selectors in anchored_on.items():
        pred = by_pid[pid]
        if pred.kind in p.RANGE_KINDS:
            range_anchor[pid] = selectors
            continue
        members = pred.arg if pred.kind == p.IN else (pred.arg,)
        for member in members:  # type: ignore[union-attr]
            eq_anchor.setdefault((pred.attr, pred.domain, member), set()).update(selectors)
    for (attr, domain, member), selectors in eq_anchor.items():
        dom = attrs[attr].domains[domain]
        i = bisect_left(dom.eq_values, member)
        dom.eq_anchors[i] = tuple(sorted(selectors))
    for pid in sorted(range_anchor):
        pred = by_pid[pid]
        for lst in attrs[pred.attr].domains[pred.domain].ranges:
            if lst.base <= pid < lst.base + len(lst.constants):
                lst.anchor_positions.append(pid - lst.base)
                lst.anchor_selectors.append(tuple(range_anchor[pid]))
                break
