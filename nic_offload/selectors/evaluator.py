"""The reference evaluator: one selector, one event, JMS semantics with three-valued logic.

``compile_selector(text)`` parses once and turns the tree into nested closures (the way JMS
providers build an expression-object tree); ``Selector.evaluate(event)`` is true only when
the selector is TRUE for the event; FALSE and UNKNOWN (a NULL reached a comparison) both
mean no match. ``evaluate3`` returns the three-valued result (``None`` is UNKNOWN).

Truth tables (SQL/JMS, Kleene): ``AND`` is FALSE if any side is FALSE, else UNKNOWN if any
side is UNKNOWN; ``OR`` is TRUE if any side is TRUE, else UNKNOWN if any side is UNKNOWN;
``NOT UNKNOWN`` is UNKNOWN. A predicate over values of a type it does not apply to (a string
compared with a number, LIKE on a number, ``x IN ('a')`` when x is 3) is FALSE, in its
``NOT`` form too (``NOT BETWEEN``, ``NOT IN``, ``NOT LIKE``, ``<>``); the ``NOT`` operator
applied to it then gives TRUE. Value semantics: ``nic_offload.selectors.values``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from nic_offload.selectors import nodes as n
from nic_offload.selectors import values as v
from nic_offload.selectors.grammar import parse

Event = Mapping[str, object]
ValueFn = Callable[[Event], object]
CondFn = Callable[[Event], bool | None]

SELECTOR_CACHE_ENTRIES = 1_024
"""Compiled selectors kept by ``compile_selector`` (by text), in selectors."""


@dataclass(frozen=True, eq=False)
class Selector:
    """A compiled selector: its text, syntax tree and evaluation closure."""

    text: str
    tree: n.Node
    _fn: CondFn = field(repr=False)

    def evaluate(self, event: Event) -> bool:
        """True when the selector is TRUE for ``event`` (property name -> value)."""
        return self._fn(event) is True

    def evaluate3(self, event: Event) -> bool | None:
        """TRUE, FALSE or UNKNOWN (None) for ``event``."""
        return self._fn(event)

    @property
    def identifiers(self) -> frozenset[str]:
        """Property and field names the selector reads."""
        return frozenset(n.identifiers(self.tree))


def compile_selector(text: str) -> Selector:
    """Parse and compile ``text``; raises SelectorSyntaxError (with the position)."""
    return _compile_cached(text) if isinstance(text, str) else _compile(text)


@lru_cache(maxsize=SELECTOR_CACHE_ENTRIES)
def _compile_cached(text: str) -> Selector:
    return _compile(text)


def _compile(text: str) -> Selector:
    tree = parse(text)
    return Selector(text, tree, condition_fn(tree))


def selector_of_tree(tree: n.Node, text: str = "") -> Selector:
    """A Selector for an already parsed tree."""
    return Selector(text, tree, condition_fn(tree))


# --- conditions ----------------------------------------------------------------------------------
def condition_fn(node: n.Node) -> CondFn:
    """A closure computing the three-valued truth of condition ``node`` for an event."""
    if isinstance(node, n.Literal):
        truth = bool(node.value)
        return lambda event: truth
    if isinstance(node, n.Identifier):
        name = node.name

        def boolean_property(event: Event) -> bool | None:
            value = v.normalize(event.get(name))
            if value is None:
                return None
            return value if type(value) is bool else False

        return boolean_property
    if isinstance(node, n.Not):
        inner = condition_fn(node.operand)

        def not_(event: Event) -> bool | None:
            truth = inner(event)
            return None if truth is None else not truth

        return not_
    if isinstance(node, n.And):
        return _and(tuple(condition_fn(item) for item in node.items))
    if isinstance(node, n.Or):
        return _or(tuple(condition_fn(item) for item in node.items))
    if isinstance(node, n.Comparison):
        return _comparison(node.op, value_fn(node.left), value_fn(node.right))
    if isinstance(node, n.Between):
        operand, low, high = value_fn(node.operand), value_fn(node.low), value_fn(node.high)
        if node.negated:  # JMS: a < low OR a > high
            return _or((_comparison("<", operand, low), _comparison(">", operand, high)))
        return _and((_comparison(">=", operand, low), _comparison("<=", operand, high)))
    if isinstance(node, n.InList):
        return _in_list(node)
    if isinstance(node, n.Like):
        return _like(node)
    if isinstance(node, n.IsNull):
        operand = value_fn(node.operand)
        if node.negated:
            return lambda event: operand(event) is not None
        return lambda event: operand(event) is None
    raise TypeError(f"not a condition node: {node!r}")


def _and(items: tuple[CondFn, ...]) -> CondFn:
    def and_(event: Event) -> bool | None:
        result: bool | None = True
        for item in items:
            truth = item(event)
            if truth is False:
                return False
            if truth is None:
                result = None
        return result

    return and_


def _or(items: tuple[CondFn, ...]) -> CondFn:
    def or_(event: Event) -> bool | None:
        result: bool | None = False
        for item in items:
            truth = item(event)
            if truth is True:
                return True
            if truth is None:
                result = None
        return result

    return or_


def _comparison(op: str, left: ValueFn, right: ValueFn) -> CondFn:
    compare = v.compare
    return lambda event: compare(op, left(event), right(event))


def _in_list(node: n.InList) -> CondFn:
    operand = value_fn(node.operand)
    domain = v.STR if node.values[0].kind == n.STR else v.NUM
    members = frozenset(item.value for item in node.values)
    negated = node.negated

    def in_list(event: Event) -> bool | None:
        value = operand(event)
        if value is None:
            return None
        if v.domain_of(value) != domain:
            return False
        return (value in members) != negated

    return in_list


def _like(node: n.Like) -> CondFn:
    operand = value_fn(node.operand)
    fullmatch = v.like_regex(node.pattern, node.escape).fullmatch
    negated = node.negated

    def like(event: Event) -> bool | None:
        value = operand(event)
        if value is None:
            return None
        if type(value) is not str:
            return False
        return (fullmatch(value) is not None) != negated

    return like


# --- values ---------------------------------------------------------------------------------
def value_fn(node: n.Node) -> ValueFn:
    """A closure computing the normalized value of ``node`` (None: NULL) for an event."""
    if isinstance(node, n.Literal):
        constant = node.value
        return lambda event: constant
    if isinstance(node, n.Identifier):
        name, normalize = node.name, v.normalize
        return lambda event: normalize(event.get(name))
    if isinstance(node, n.Arith):
        op, left, right, arith = node.op, value_fn(node.left), value_fn(node.right), v.arith
        return lambda event: arith(op, left(event), right(event))
    if isinstance(node, n.Negate):
        operand, negate = value_fn(node.operand), v.negate
        return lambda event: negate(operand(event))
    raise TypeError(f"not a value node: {node!r}")
