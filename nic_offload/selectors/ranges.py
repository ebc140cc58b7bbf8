"""Selectors as per-field disjoint intervals: the form of the offload's content ACL tables.

``to_ranges(selector)`` answers, without knowing the message layout: which values of which
properties make the selector TRUE, as a conjunction over properties of unions of disjoint
intervals (numbers, or strings in code point order). ``to_raw_ranges(selector, schema)``
answers the same for schema fields as inclusive ranges of the fields' raw unsigned
big-endian integers, which is what ``TopicwireIngress.acl_<k>`` matches.

Exact under JMS semantics, or refused: a selector is expressible when it is an AND of
per-field conditions (``=``, ``<>``, ``<``, ``<=``, ``>``, ``>=``, BETWEEN, IN and their NOT
forms), where an OR joins conditions on one field only. LIKE, IS NULL, booleans, arithmetic,
property-to-property comparisons and OR across fields are refused (None, or
``NotOffloadableError`` with ``strict=True``), and the appliance evaluates such selectors in
software. Without a schema a negated condition (``NOT price > 5``) is TRUE for a string
price too, so it is expressible only beside a condition that fixes the field's type
(``price >= 0 AND NOT price > 5``); schema fields always hold their type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from nic_offload.errors import SchemaError
from nic_offload.schema import FieldType, Schema, SchemaField
from nic_offload.selectors import predicates as p
from nic_offload.selectors import values as v
from nic_offload.selectors.errors import NotOffloadableError
from nic_offload.selectors.evaluator import Selector, compile_selector

Bound = int | float | str | None
"""An interval end; None is unbounded."""


@dataclass(frozen=True, slots=True)
class Interval:
    """Values from ``low`` to ``high`` (None: unbounded), each end closed or open."""

    low: Bound
    high: Bound
    low_closed: bool = True
    high_closed: bool = True

    def contains(self, value: object) -> bool:
        if self.low is not None and (value < self.low or (  # type: ignore[operator]
                value == self.low and not self.low_closed)):
            return False
        return self.high is None or value < self.high or (  # type: ignore[operator]
            value == self.high and self.high_closed)

    @property
    def empty(self) -> bool:
        if self.low is None or self.high is None:
            return False
        return self.low > self.high or (  # type: ignore[operator]
            self.low == self.high and not (self.low_closed and self.high_closed))


@dataclass(frozen=True)
class ValueRanges:
    """Per property, the disjoint sorted intervals its value must lie in (all properties at
    once); ``domains`` says whether each holds numbers or strings. ``never``: no event
    matches (``FALSE``). No properties and not ``never``: every event matches."""

    fields: Mapping[str, tuple[Interval, ...]]
    domains: Mapping[str, str] = field(default_factory=dict)
    never: bool = False

    @property
    def matches_nothing(self) -> bool:
        return self.never or any(not ivs for ivs in self.fields.values())

    def matches(self, event: Mapping[str, object]) -> bool:
        """Does ``event`` satisfy every field's intervals (what the selector says)?"""
        if self.never:
            return False
        for name, ivs in self.fields.items():
            value = v.normalize(event.get(name))
            if value is None or _FIELD_DOMAINS.get(v.domain_of(value)) != self.domains[name]:
                return False
            if not any(iv.contains(value) for iv in ivs):
                return False
        return True


@dataclass(frozen=True)
class RawRanges:
    """Per schema field, the disjoint sorted inclusive ranges of its raw unsigned value."""

    fields: Mapping[str, tuple[tuple[int, int], ...]]
    never: bool = False

    @property
    def matches_nothing(self) -> bool:
        return self.never or any(not rs for rs in self.fields.values())

    def matches(self, raw_values: Mapping[str, int]) -> bool:
        """Do the fields' raw values (``SchemaField.read_raw``) lie in their ranges?"""
        return not self.never and all(
            any(low <= raw_values[name] <= high for low, high in ranges)
            for name, ranges in self.fields.items())


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# A set of values of one attribute: (domain, sorted disjoint intervals).
_Set = tuple[int, tuple[Interval, ...]]
_ALL = (Interval(None, None),)
_FIELD_DOMAINS = {v.NUM: "number", v.STR: "string"}


def to_ranges(selector: str | Selector, *, strict: bool = False) -> ValueRanges | None:
    """Per-property disjoint intervals equivalent to ``selector``, or None (``strict``:
    NotOffloadableError saying why) when it cannot be expressed so."""
    selector = _selector(selector)
    try:
        result = _ranges(p.to_nnf(selector.tree), {})
    except _Refused as refused:
        return _refuse(selector, refused, strict)
    if result is None:
        return ValueRanges({}, never=True)
    return ValueRanges({a: s[1] for a, s in result.items()},
                       {a: _FIELD_DOMAINS[s[0]] for a, s in result.items()})


def to_raw_ranges(selector: str | Selector, schema: Schema, *, strict: bool = False,
                  ) -> RawRanges | None:
    """Per-field inclusive raw ranges equivalent to ``selector`` over payloads of
    ``schema``, or None (``strict``: NotOffloadableError) when not expressible."""
    selector = _selector(selector)
    try:
        guards = {}
        for name in selector.identifiers:
            guards[name] = _offloadable_domain(schema, name)
        result = _ranges(p.to_nnf(selector.tree), guards)
        if result is None:
            return RawRanges({}, never=True)
        return RawRanges({name: _raw(schema.field(name), s) for name, s in result.items()})
    except _Refused as refused:
        return _refuse(selector, refused, strict)


def _selector(selector: str | Selector) -> Selector:
    return selector if isinstance(selector, Selector) else compile_selector(selector)


def _refuse(selector: Selector, refused: _Refused, strict: bool) -> None:
    if strict:
        raise NotOffloadableError(f"selector {selector.text!r} cannot become ACL ranges: "
                                  f"{refused.reason}; the appliance evaluates it in software")
    return None


def _offloadable_domain(schema: Schema, name: str) -> int:
    try:
        f = schema.field(name)
    except SchemaError:
        raise _Refused(f"{name!r} is not a field of schema {schema.name!r} (a message "
                       "property, not a payload field)") from None
    if not f.offloadable:
        raise _Refused(f"field {name!r} ({f.type.name.lower()}, {f.width} bytes) cannot be "
                       "compared by an offload table")
    return v.STR if f.type is FieldType.ASCII else v.NUM


# --- NNF -> per-attribute sets -----------------------------------------------------------------
def _ranges(node: p.NnfNode, guards: dict[str, int]) -> dict[str, _Set] | None:
    """The per-attribute sets whose conjunction is ``node`` (given that every attribute in
    ``guards`` holds a value of its domain); None: never TRUE; {}: always TRUE."""
    kind = node[0]
    if kind == "const":
        return {} if node[1] == p.TRUE else None
    if kind == "residual":
        raise _Refused("it compares properties with each other or computes arithmetic")
    if kind == "leaf":
        return _leaf(node[1], node[2], guards)
    if kind == "and":
        inner = dict(guards)
        for child in node[1]:
            if child[0] == "leaf" and not child[2] and child[1].kind in (
                    p.EQ, p.IN, p.DOM, *p.RANGE_KINDS) and child[1].domain in _FIELD_DOMAINS:
                inner.setdefault(child[1].attr, child[1].domain)
        result: dict[str, _Set] = {}
        for child in node[1]:
            sets = _ranges(child, inner)
            if sets is None:
                return None
            for attr, s in sets.items():
                result[attr] = _intersect(result[attr], s) if attr in result else s
        return result
    attrs: set[str] = set()
    union: _Set | None = None
    for child in node[1]:
        sets = _ranges(child, guards)
        if sets == {}:
            return {}
        if sets is None:
            continue
        attrs |= set(sets)
        if len(attrs) > 1:
            names = ", ".join(sorted(attrs))
            raise _Refused(f"an OR joins conditions on different fields ({names})")
        (s,) = sets.values()
        union = s if union is None else _union(union, s)
    if union is None:
        return None
    return {attrs.pop(): union}


def _leaf(pred: p.Pred, negated: bool, guards: dict[str, int]) -> dict[str, _Set]:
    if pred.kind == p.LIKE:
        raise _Refused(f"LIKE on {pred.attr!r} matches text patterns, not ranges")
    if pred.kind == p.NULL:
        raise _Refused(f"IS {'NOT ' if negated else ''}NULL on {pred.attr!r} tests presence, "
                       "not a range")
    if pred.domain == v.BOOL:
        raise _Refused(f"{pred.attr!r} is compared with a boolean; ACL fields are numbers or "
                       "text")
    positive = _positive_set(pred)
    if not negated:
        return {pred.attr: positive}
    guard = guards.get(pred.attr)
    if guard is None:
        raise _Refused(f"a negated condition on {pred.attr!r} is TRUE for values of any other "
                       "type too; add a condition fixing its type (e.g. "
                       f"{pred.attr} >= 0 AND ...)")
    if positive[0] != guard:
        return {pred.attr: (guard, _ALL)}
    return {pred.attr: (guard, _complement(positive[1]))}


def _positive_set(pred: p.Pred) -> _Set:
    c = pred.arg
    if pred.kind == p.EQ:
        ivs: tuple[Interval, ...] = (Interval(c, c),)  # type: ignore[arg-type]
    elif pred.kind == p.IN:
        ivs = _normalize([Interval(m, m) for m in pred.arg])  # type: ignore[attr-defined]
    elif pred.kind == p.LT:
        ivs = (Interval(None, c, True, False),)  # type: ignore[arg-type]
    elif pred.kind == p.LE:
        ivs = (Interval(None, c),)  # type: ignore[arg-type]
    elif pred.kind == p.GT:
        ivs = (Interval(c, None, False, True),)  # type: ignore[arg-type]
    elif pred.kind == p.GE:
        ivs = (Interval(c, None),)  # type: ignore[arg-type]
    else:  # DOM
        ivs = _ALL
    return pred.domain, ivs


# --- interval algebra ----------------------------------------------------------------------------
def _low_key(iv: Interval) -> tuple:
    return (0,) if iv.low is None else (1, iv.low, 0 if iv.low_closed else 1)


def _normalize(ivs: list[Interval]) -> tuple[Interval, ...]:
    """Sorted, disjoint, merged; empty intervals dropped."""
    out: list[Interval] = []
    for iv in sorted((iv for iv in ivs if not iv.empty), key=_low_key):
        if out and _touches(out[-1], iv):
            last = out[-1]
            if last.high is None or (iv.high is not None and (iv.high < last.high or (
                    iv.high == last.high and (last.high_closed or not iv.high_closed)))):
                continue  # contained
            out[-1] = Interval(last.low, iv.high, last.low_closed, iv.high_closed)
        else:
            out.append(iv)
    return tuple(out)


def _touches(a: Interval, b: Interval) -> bool:
    """Do ``a`` and ``b`` (``a`` starting no later) overlap or meet without a gap?"""
    if a.high is None or b.low is None:
        return True
    return b.low < a.high or (b.low == a.high and (a.high_closed or b.low_closed))


def _intersect(a: _Set, b: _Set) -> _Set:
    if a[0] != b[0]:
        return a[0], ()  # a value cannot be a number and a string at once
    out = []
    for x in a[1]:
        for y in b[1]:
            low, low_closed = _max_low(x, y)
            high, high_closed = _min_high(x, y)
            out.append(Interval(low, high, low_closed, high_closed))
    return a[0], _normalize(out)


def _union(a: _Set, b: _Set) -> _Set:
    if a[0] != b[0]:
        raise _Refused("an OR accepts numbers and strings for one field")
    return a[0], _normalize([*a[1], *b[1]])


def _complement(ivs: tuple[Interval, ...]) -> tuple[Interval, ...]:
    out: list[Interval] = []
    low: Bound = None
    low_closed = True
    for iv in ivs:
        if iv.low is not None:
            out.append(Interval(low, iv.low, low_closed, not iv.low_closed))
        if iv.high is None:
            return _normalize(out)
        low, low_closed = iv.high, not iv.high_closed
    out.append(Interval(low, None, low_closed, True))
    return _normalize(out)


def _max_low(x: Interval, y: Interval) -> tuple[Bound, bool]:
    if x.low is None:
        return y.low, y.low_closed
    if y.low is None or x.low > y.low:  # type: ignore[operator]
        return x.low, x.low_closed
    if y.low > x.low:  # type: ignore[operator]
        return y.low, y.low_closed
    return x.low, x.low_closed and y.low_closed


def _min_high(x: Interval, y: Interval) -> tuple[Bound, bool]:
    if x.high is None:
        return y.high, y.high_closed
    if y.high is None or x.high < y.high:  # type: ignore[operator]
        return x.high, x.high_closed
    if y.high < x.high:  # type: ignore[operator]
        return y.high, y.high_closed
    return x.high, x.high_closed and y.high_closed


# --- raw ranges of schema fields ---------------------------------------------------------------
def _raw(f: SchemaField, s: _Set) -> tuple[tuple[int, int], ...]:
    domain, ivs = s
    if domain != (v.STR if f.type is FieldType.ASCII else v.NUM):
        return ()
    out: list[tuple[int, int]] = []
    for iv in ivs:
        if domain == v.STR:
            low = 0 if iv.low is None else _raw_text(f, iv.low) + (0 if iv.low_closed else 1)
            high = (f.raw_max if iv.high is None
                    else _raw_text(f, iv.high) - (0 if iv.high_closed else 1))
            if low <= high:
                out.append((low, high))
        else:
            vmin, vmax = f.value_bounds()
            low = vmin if iv.low is None else _int_low(iv.low, iv.low_closed, vmin, vmax)
            high = vmax if iv.high is None else _int_high(iv.high, iv.high_closed, vmin, vmax)
            out.extend(f.raw_intervals(low, high))
    merged: list[tuple[int, int]] = []
    for low, high in sorted(out):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(high, merged[-1][1]))
        else:
            merged.append((low, high))
    return tuple(merged)


def _raw_text(f: SchemaField, text: object) -> int:
    if not isinstance(text, str) or not text.isascii() or len(text) > f.width:
        raise _Refused(f"{text!r} is not ASCII text of at most {f.width} bytes, the width of "
                       f"field {f.name!r}")
    return f.raw_of(text)


def _clamp(bound: int | float, vmin: int, vmax: int) -> int | float:
    return min(max(bound, vmin - 1), vmax + 1)


def _int_low(bound: object, closed: bool, vmin: int, vmax: int) -> int:
    b = _clamp(bound, vmin, vmax)  # type: ignore[arg-type]
    return math.ceil(b) if closed else math.floor(b) + 1


def _int_high(bound: object, closed: bool, vmin: int, vmax: int) -> int:
    b = _clamp(bound, vmin, vmax)  # type: ignore[arg-type]
    return math.floor(b) if closed else math.ceil(b) - 1
