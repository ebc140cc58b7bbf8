"""The selector syntax tree: immutable, hashable nodes (equal trees mean equal selectors).

Every node keeps ``pos``, the character offset of its first token in the selector text, for
error messages; ``pos`` takes no part in equality or hashing, so two subscribers who wrote
the same selector with different spacing share one compiled selector.

Value nodes: ``Literal``, ``Identifier``, ``Arith``, ``Negate``. Condition nodes:
``Comparison``, ``Between``, ``InList``, ``Like``, ``IsNull``, ``Not``, ``And``, ``Or``; a
boolean ``Literal`` or a bare ``Identifier`` is also a condition (JMS: ``TRUE``, ``isVip``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

INT, FLOAT, STR, BOOL = "int", "float", "str", "bool"
"""Kinds of literal: JMS exact numeric, approximate numeric, string, boolean."""

COMPARISON_OPS = ("=", "<>", "<", ">", "<=", ">=")
ORDERING_OPS = ("<", ">", "<=", ">=")
ARITH_OPS = ("+", "-", "*", "/")
FLIPPED = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
"""``c < a`` is ``a > c``: the operator seen from the other side."""


@dataclass(frozen=True, slots=True)
class Literal:
    kind: str
    value: int | float | str | bool
    pos: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Identifier:
    name: str
    pos: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Arith:
    op: str
    left: Node
    right: Node
    pos: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Negate:
    operand: Node
    pos: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Comparison:
    op: str
    left: Node
    right: Node
    pos: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Between:
    """``operand [NOT] BETWEEN low AND high``: JMS defines it as ``operand >= low AND operand
    <= high`` (``NOT``: ``operand < low OR operand > high``)."""

    operand: Node
    low: Node
    high: Node
    negated: bool = False
    pos: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class InList:
    """``operand [NOT] IN (v, ...)``: literals of one kind (strings, or numbers)."""

    operand: Node
    values: tuple[Literal, ...]
    negated: bool = False
    pos: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Like:
    """``operand [NOT] LIKE 'pattern' [ESCAPE 'c']``: ``_`` one character, ``%`` any run."""

    operand: Node
    pattern: str
    escape: str | None = None
    negated: bool = False
    pos: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    negated: bool = False
    pos: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node
    pos: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class And:
    items: tuple[Node, ...]
    pos: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Or:
    items: tuple[Node, ...]
    pos: int = field(default=0, compare=False)


Node = (Literal | Identifier | Arith | Negate | Comparison | Between | InList | Like | IsNull
        | Not | And | Or)
VALUE_NODES = (Literal, Identifier, Arith, Negate)
PREDICATE_NODES = (Comparison, Between, InList, Like, IsNull, Not, And, Or)

TRUE = Literal(BOOL, True)
"""The empty selector: JMS treats an empty selector as no selector, which matches all."""


def is_condition(node: Node) -> bool:
    """Can ``node`` stand where a truth value is needed?"""
    if isinstance(node, Literal):
        return node.kind == BOOL
    return isinstance(node, (Identifier, *PREDICATE_NODES))


def is_value(node: Node) -> bool:
    """Can ``node`` stand where a value is needed (an operand)?"""
    return isinstance(node, VALUE_NODES)


def identifiers(node: Node) -> set[str]:
    """Names of the identifiers ``node`` reads."""
    if isinstance(node, Identifier):
        return {node.name}
    names: set[str] = set()
    for child in children(node):
        names |= identifiers(child)
    return names


def children(node: Node) -> tuple[Node, ...]:
    """Direct sub-nodes of ``node`` (literals of IN lists excluded)."""
    if isinstance(node, (Arith, Comparison)):
        return (node.left, node.right)
    if isinstance(node, (Negate, Not, InList, Like, IsNull)):
        return (node.operand,)
    if isinstance(node, Between):
        return (node.operand, node.low, node.high)
    if isinstance(node, (And, Or)):
        return node.items
    return ()
