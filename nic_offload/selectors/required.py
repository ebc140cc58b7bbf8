"""The attributes a selector requires: every event it selects carries them (not NULL).

Content routing by rendezvous (docs/routing.md, "Content routing") registers a subscription
at the core responsible for one attribute the subscription *constrains*, and sends an event
to the cores of the attributes it carries. That meets every matching pair only when the
chosen attribute is one that every event the selector is TRUE for carries. In three-valued
logic a predicate of one attribute against constants is UNKNOWN when the attribute is NULL,
and so is its negation, so such a predicate is TRUE only for events carrying the attribute:

- a shared predicate (``=``, ranges, IN, LIKE, "holds a number", negated or not) requires
  its attribute; ``IS NULL`` requires nothing, ``IS NOT NULL`` requires its attribute;
- AND requires what any of its children requires (the union), OR what all of its branches
  require (the intersection);
- constants and residual conditions (``a = b``, arithmetic) are taken to require nothing
  (sound, if not always the tightest answer).
"""

from __future__ import annotations

from nic_offload.selectors import predicates as p
from nic_offload.selectors.evaluator import Selector, compile_selector


def required_attributes(selector: Selector | str) -> frozenset[str]:
    """Attributes every event that ``selector`` (compiled or text) selects carries non-NULL.

    An empty set means the selector may select an event whatever attributes it lacks (an
    empty selector, an OR over different attributes, ``x IS NULL``, only residuals)."""
    compiled = compile_selector(selector) if isinstance(selector, str) else selector
    return _required(p.to_nnf(compiled.tree))


def _required(node: p.NnfNode) -> frozenset[str]:
    kind = node[0]
    if kind == "leaf":
        pred: p.Pred = node[1]
        if pred.kind == p.NULL and not node[2]:
            return frozenset()  # IS NULL holds for an event without the attribute
        return frozenset((pred.attr,))
    if kind == "and":
        out: frozenset[str] = frozenset()
        for child in node[1]:
            out |= _required(child)
        return out
    if kind == "or":
        branches = [_required(child) for child in node[1]]
        common = branches[0]
        for branch in branches[1:]:
            common &= branch
        return common
    return frozenset()  # const, residual
