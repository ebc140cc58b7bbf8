"""Selector trees -> shared predicates under an AND/OR structure (negation normal form).

The shared-list index (seed 003) splits every selector into *predicates* of one attribute
against constants (``price > 20``, ``symbol = 'IBM'``, ``region IN ('eu', 'us')``), which
all subscribers share, and a boolean structure over them. Pushing ``NOT`` down to the
predicates (De Morgan holds in three-valued Kleene logic) leaves structures made only of
AND, OR, predicates and negated predicates.

Each predicate is three-valued for an event: UNKNOWN when its attribute is NULL (absent),
otherwise TRUE or FALSE. Forms whose ``NOT`` must stay FALSE for values of another type
(``<>``, ``NOT IN``, ``NOT LIKE``) become a *domain* predicate ("the attribute holds a
number") AND the negated positive predicate. ``BETWEEN`` is expanded as JMS defines it;
LIKE patterns that are a literal prefix (``'IB%'``) become string ranges.
What does not fit (``a = b``, arithmetic over attributes) stays a *residual* condition that
the reference evaluator computes per selector; literal-only conditions fold to constants.

Truth values are small integers so that AND is ``min``, OR is ``max`` and NOT is ``2 - t``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nic_offload.selectors import nodes as n
from nic_offload.selectors import values as v
from nic_offload.selectors.evaluator import Event, condition_fn

FALSE, UNKNOWN, TRUE = 0, 1, 2

EQ, LT, LE, GT, GE, IN, DOM, NULL, LIKE = "=", "<", "<=", ">", ">=", "in", "dom", "null", "like"
RANGE_KINDS = (LT, LE, GT, GE)
_OP_KIND = {"=": EQ, "<": LT, "<=": LE, ">": GT, ">=": GE}
_LITERAL_DOMAIN = {n.INT: v.NUM, n.FLOAT: v.NUM, n.STR: v.STR, n.BOOL: v.BOOL}
NO_DOMAIN = -1
MAX_CHAR = chr(0x10FFFF)


@dataclass(frozen=True, slots=True)
class Pred:
    """``attr kind arg`` over values of ``domain``; equal predicates are shared.

    ``arg``: the constant (EQ and ranges), a frozenset (IN), ``(pattern, escape)`` (LIKE),
    None (DOM, NULL).
    """

    attr: str
    kind: str
    domain: int
    arg: object = None


# NNF nodes (tuples): ("leaf", Pred, negated) | ("and", [nodes]) | ("or", [nodes])
# | ("const", truth) | ("residual", condition closure, negated)
NnfNode = tuple


def to_nnf(tree: n.Node, negated: bool = False) -> NnfNode:
    """The negation normal form of condition ``tree`` (``NOT tree`` when ``negated``)."""
    if not n.identifiers(tree):
        truth = condition_fn(tree)({})
        value = UNKNOWN if truth is None else (TRUE if truth else FALSE)
        return ("const", TRUE - value if negated else value)
    if isinstance(tree, n.Not):
        return to_nnf(tree.operand, not negated)
    if isinstance(tree, (n.And, n.Or)):
        is_and = isinstance(tree, n.And) != negated
        return _combine("and" if is_and else "or", [to_nnf(i, negated) for i in tree.items])
    positive = _positive(tree)
    return negate(positive) if negated else positive


def negate(node: NnfNode) -> NnfNode:
    """``NOT node`` in negation normal form."""
    kind = node[0]
    if kind in ("leaf", "residual"):
        return (kind, node[1], not node[2])
    if kind == "const":
        return ("const", TRUE - node[1])
    return _combine("or" if kind == "and" else "and", [negate(c) for c in node[1]])


def _combine(kind: str, items: list[NnfNode]) -> NnfNode:
    """Flatten, fold constants: AND drops TRUE and is FALSE with any FALSE (OR dually)."""
    unit, zero = (TRUE, FALSE) if kind == "and" else (FALSE, TRUE)
    flat: list[NnfNode] = []
    unknown = False
    for item in items:
        if item[0] == kind:
            flat.extend(item[1])
        elif item[0] == "const":
            if item[1] == zero:
                return item
            unknown |= item[1] == UNKNOWN
        else:
            flat.append(item)
    if unknown:
        flat.append(("const", UNKNOWN))
    if not flat:
        return ("const", unit)
    return flat[0] if len(flat) == 1 else (kind, flat)


def _positive(tree: n.Node) -> NnfNode:
    if isinstance(tree, n.Identifier):  # a bare boolean property: TRUE iff it holds TRUE
        return _leaf(tree.name, EQ, v.BOOL, True)
    if isinstance(tree, n.Comparison):
        return _comparison(tree) or _residual(tree)
    if isinstance(tree, n.Between):
        low, high = (n.Comparison("<", tree.operand, tree.low), n.Comparison(
            ">", tree.operand, tree.high)) if tree.negated else (n.Comparison(
                ">=", tree.operand, tree.low), n.Comparison("<=", tree.operand, tree.high))
        return _combine("or" if tree.negated else "and", [to_nnf(low), to_nnf(high)])
    if isinstance(tree, n.InList) and isinstance(tree.operand, n.Identifier):
        name = tree.operand.name
        domain = _LITERAL_DOMAIN[tree.values[0].kind]
        members = frozenset(item.value for item in tree.values)
        member = (_leaf(name, EQ, domain, next(iter(members))) if len(members) == 1
                  else _leaf(name, IN, domain, members))
        return _guarded(name, domain, member) if tree.negated else member
    if isinstance(tree, n.Like) and isinstance(tree.operand, n.Identifier):
        name = tree.operand.name
        like = _like(name, tree.pattern, tree.escape)
        return _guarded(name, v.STR, like) if tree.negated else like
    if isinstance(tree, n.IsNull) and isinstance(tree.operand, n.Identifier):
        return ("leaf", Pred(tree.operand.name, NULL, NO_DOMAIN), tree.negated)
    return _residual(tree)


def _comparison(tree: n.Comparison) -> NnfNode | None:
    left, right, op = tree.left, tree.right, tree.op
    if isinstance(left, n.Literal) and isinstance(right, n.Identifier):
        left, right, op = right, left, n.FLIPPED[op]
    if not (isinstance(left, n.Identifier) and isinstance(right, n.Literal)):
        return None
    domain = _LITERAL_DOMAIN[right.kind]
    if op == "<>":
        return _guarded(left.name, domain, _leaf(left.name, EQ, domain, right.value))
    return _leaf(left.name, _OP_KIND[op], domain, right.value)


def _like(attr: str, pattern: str, escape: str | None) -> NnfNode:
    """LIKE as shared predicates: literal text is ``=``; ``'text%'`` is the string range
    ``'text' <= attr < 'texu'`` (the last character incremented: exactly the strings that
    start with 'text'); ``'%'`` is "holds a string"; other patterns stay LIKE predicates."""
    prefix = v.like_prefix(pattern, escape)
    if prefix is not None:
        text, any_suffix = prefix
        if not any_suffix:
            return _leaf(attr, EQ, v.STR, text)
        if not text:
            return _leaf(attr, DOM, v.STR, None)
        if text[-1] != MAX_CHAR:
            successor = text[:-1] + chr(ord(text[-1]) + 1)
            return ("and", [_leaf(attr, GE, v.STR, text), _leaf(attr, LT, v.STR, successor)])
    return _leaf(attr, LIKE, v.STR, (pattern, escape))


def _leaf(attr: str, kind: str, domain: int, arg: object) -> NnfNode:
    return ("leaf", Pred(attr, kind, domain, arg), False)


def _guarded(attr: str, domain: int, positive: NnfNode) -> NnfNode:
    """``attr`` holds a ``domain`` value AND NOT ``positive``: a NOT form that stays FALSE
    for values of another type, UNKNOWN for NULL."""
    return ("and", [("leaf", Pred(attr, DOM, domain), False), negate(positive)])


def _residual(tree: n.Node) -> NnfNode:
    return ("residual", condition_fn(tree), False)


def residual_truth(fn: Callable[[Event], bool | None], event: Event) -> int:
    """A residual condition's truth as a small integer."""
    truth = fn(event)
    return UNKNOWN if truth is None else (TRUE if truth else FALSE)
