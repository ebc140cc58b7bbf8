"""Content-based ACLs (seed 002): rules over schema fields -> ACCEPT, REJECT or LOG.

A rule is the seed's triple ``(CONDITION, ON_MATCH, ON_MISS)``, e.g.
``(FIELD(0) < 50, ACCEPT, REJECT)`` or ``(symbol == 'IBM' and price >= 5000, ACCEPT)``.
A class (an entitlement class; ``acl_class`` in the tables) is an ordered list of rules and a
default: rules are tried in order; a rule whose condition holds decides ON_MATCH; one whose
condition fails decides ON_MISS, or passes on to the next rule when ON_MISS is ``CONTINUE``
(the default when omitted); after the last rule the class default decides (REJECT unless
said otherwise). ``LOG`` accepts and logs. The seed writes ``REJECT|LOG`` for "REJECT or LOG":
write the one you mean.

Conditions: comparisons ``< <= > >= == != <>`` of a field with a constant, ``f in {a, b}``,
``f between a and b``, combined with ``and``, ``or``, ``not`` and parentheses. Fields are
named by the schema, or ``FIELD(n)`` (the n-th schema field). Constants are integers
(decimal or 0x hex) or quoted ASCII text for ascii fields.

``AclClass.evaluate`` is the reference: it reads values through the schema and compares them
in Python. ``compile_class`` turns a class into entries of the ACL stage tables the way Camus
compiles subscriptions: stage k splits the range of ACL field k into disjoint intervals, each
leading to a terminal action or to the *residual* rule list (a state) for stage k+1; equal
residuals share a state. Intervals of one (class, state) never overlap and cover the whole
field, so the decision never depends on entry order.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from lark import Lark, Transformer, v_args
from lark.exceptions import LarkError, VisitError

from nic_offload import model
from nic_offload.errors import AclError, SchemaError
from nic_offload.model import AclAction, PipelineSpec, Range, TableEntry
from nic_offload.schema import FieldType, Schema, SchemaField


class Verdict(Enum):
    ACCEPT = "ACCEPT"
    REJECT = "REJECT"
    LOG = "LOG"
    CONTINUE = "CONTINUE"
    """Only as ON_MISS: go on to the next rule."""


VERDICT_ACTION = {Verdict.ACCEPT: AclAction.ACCEPT, Verdict.REJECT: AclAction.REJECT,
                  Verdict.LOG: AclAction.LOG}
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
OP_ALIASES = {"=": "==", "<>": "!="}

Interval = tuple[int, int]
Value = int | bytes

_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
            "==": operator.eq, "!=": operator.ne}
_SPAN = {  # (lowest value, constant, highest value) -> the values a comparison keeps
    "<": lambda low, c, high: (low, c - 1),
    "<=": lambda low, c, high: (low, c),
    ">": lambda low, c, high: (c + 1, high),
    ">=": lambda low, c, high: (c, high),
    "==": lambda low, c, high: (c, c),
}


# --- condition trees ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Predicate:
    """``field op values``: op is a comparison (one value), ``in`` (a set) or ``between``."""

    field: SchemaField
    op: str
    values: tuple[Value, ...]

    def test(self, value: int | float | str | bytes) -> bool:
        """Reference semantics in the value domain (ascii: NUL-padded bytes)."""
        if self.field.type is FieldType.ASCII:
            raw = value.encode("ascii") if isinstance(value, str) else value
            value = raw.ljust(self.field.width, b"\x00")  # type: ignore[union-attr]
        v = self.values
        if self.op == "in":
            return value in v
        if self.op == "between":
            return v[0] <= value <= v[1]
        return _COMPARE[self.op](value, v[0])

    def raw_intervals(self) -> list[Interval]:
        """The raw unsigned values of the field that satisfy the predicate."""
        f = self.field
        low, high = f.value_bounds()
        raw = [_as_int(f, x) for x in self.values]
        if self.op == "in":
            spans = [(x, x) for x in raw]
        elif self.op == "between":
            spans = [(raw[0], raw[1])]
        elif self.op == "!=":
            spans = [(low, raw[0] - 1), (raw[0] + 1, high)]
        else:
            spans = [_SPAN[self.op](low, raw[0], high)]
        return _union([iv for lo, hi in spans for iv in f.raw_intervals(lo, hi)])


def _as_int(f: SchemaField, value: Value) -> int:
    """A constant in the field's ordering domain (ascii: its raw integer)."""
    return int.from_bytes(value, "big") if isinstance(value, bytes) else value


@dataclass(frozen=True, slots=True)
class Not:
    child: Predicate


@dataclass(frozen=True, slots=True)
class And:
    children: tuple[Condition, ...]


@dataclass(frozen=True, slots=True)
class Or:
    children: tuple[Condition, ...]


Condition = Predicate | Not | And | Or


def holds(cond: Condition, payload: bytes | memoryview) -> bool:
    """Reference: does ``cond`` hold for ``payload``?"""
    if isinstance(cond, Predicate):
        f = cond.field
        value = bytes(payload[f.offset:f.end]) if f.type is FieldType.ASCII else f.read(payload)
        return cond.test(value)
    if isinstance(cond, Not):
        return not holds(cond.child, payload)
    if isinstance(cond, And):
        return all(holds(c, payload) for c in cond.children)
    return any(holds(c, payload) for c in cond.children)


@dataclass(frozen=True, slots=True)
class AclRule:
    condition: Condition
    on_match: Verdict
    on_miss: Verdict = Verdict.CONTINUE
    text: str = ""

    def __post_init__(self) -> None:
        if self.on_match is Verdict.CONTINUE:
            raise AclError("ON_MATCH must be ACCEPT, REJECT or LOG (CONTINUE is for ON_MISS)")


@dataclass(frozen=True)
class AclClass:
    """An entitlement class: ``class_id`` (1..65535), its schema, rules and default verdict."""

    class_id: int
    schema: Schema
    rules: tuple[AclRule, ...]
    default: Verdict = Verdict.REJECT

    def __post_init__(self) -> None:
        if not 1 <= self.class_id <= model.MAX_ACL_CLASS:
            raise AclError(f"ACL class ids are 1..{model.MAX_ACL_CLASS} (0 means no ACL), "
                           f"not {self.class_id}")
        if self.default is Verdict.CONTINUE:
            raise AclError(f"class {self.class_id}: the default must be ACCEPT, REJECT or LOG")

    @classmethod
    def parse(cls, class_id: int, schema: Schema, rules: Iterable[str],
              default: Verdict | str = Verdict.REJECT) -> AclClass:
        """A class from rule texts (see the module docstring)."""
        verdict = default if isinstance(default, Verdict) else _verdict(str(default))
        return cls(class_id, schema, tuple(parse_rule(text, schema) for text in rules), verdict)

    def evaluate(self, payload: bytes | memoryview) -> Verdict:
        """Reference decision for one payload (every field the rules use must be present)."""
        return self.decide(payload)[0]

    def decide(self, payload: bytes | memoryview) -> tuple[Verdict, AclRule | None]:
        """``evaluate`` and the rule that decided (None: the class default did)."""
        for rule in self.rules:
            if holds(rule.condition, payload):
                return rule.on_match, rule
            if rule.on_miss is not Verdict.CONTINUE:
                return rule.on_miss, rule
        return self.default, None


# --- parsing -----------------------------------------------------------------------------------
_GRAMMAR = r"""
start: "(" or_expr "," VERDICT ("," VERDICT)? ")"
or_expr: and_expr (_OR and_expr)*
and_expr: not_expr (_AND not_expr)*
?not_expr: _NOT not_expr -> negate
         | atom
?atom: field OP value                                -> compare
     | field _IN "{" value ("," value)* "}"         -> member
     | field _BETWEEN value _AND value               -> between
     | "(" or_expr ")"
field: _FIELD "(" INT ")" -> indexed
     | NAME               -> named
value: INT -> integer
     | SIGNED -> integer
     | HEX -> hexadecimal
     | STRING -> text
_OR.2: /or\b/i
_AND.2: /and\b/i
_NOT.2: /not\b/i
_IN.2: /in\b/i
_BETWEEN.2: /between\b/i
_FIELD.2: /FIELD(?=\s*\()/
VERDICT.2: /(accept|reject|log|continue)\b/i
OP: "<=" | ">=" | "==" | "!=" | "<>" | "<" | ">" | "="
HEX.2: /0x[0-9a-fA-F]+/
SIGNED: /[+-][0-9]+/
STRING: /'[^']*'/ | /"[^"]*"/
%import common.INT
%import common.CNAME -> NAME
%import common.WS
%ignore WS
"""


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(_GRAMMAR, parser="lalr")


def _verdict(text: str) -> Verdict:
    try:
        return Verdict(text.upper())
    except ValueError:
        raise AclError(f"unknown verdict {text!r}; use ACCEPT, REJECT, LOG or CONTINUE") from None


@v_args(inline=True)
class _Build(Transformer):
    def __init__(self, schema: Schema) -> None:
        super().__init__()
        self.schema = schema

    def start(self, cond: Condition, on_match: str, on_miss: str | None = None) -> AclRule:
        return AclRule(cond, _verdict(on_match),
                       _verdict(on_miss) if on_miss is not None else Verdict.CONTINUE)

    def or_expr(self, *children: Condition) -> Condition:
        return children[0] if len(children) == 1 else Or(children)

    def and_expr(self, *children: Condition) -> Condition:
        return children[0] if len(children) == 1 else And(children)

    def negate(self, child: Condition) -> Condition:
        return _negate(child)

    def indexed(self, index: str) -> SchemaField:
        return self.schema.field_at(int(index))

    def named(self, name: str) -> SchemaField:
        return self.schema.field(str(name))

    def integer(self, token: str) -> int:
        return int(token)

    def hexadecimal(self, token: str) -> int:
        return int(token, 16)

    def text(self, token: str) -> bytes:
        return str(token)[1:-1].encode("ascii")

    def compare(self, f: SchemaField, op: str, value: Value) -> Predicate:
        return _predicate(f, OP_ALIASES.get(str(op), str(op)), (value,))

    def member(self, f: SchemaField, *values: Value) -> Predicate:
        return _predicate(f, "in", values)

    def between(self, f: SchemaField, low: Value, high: Value) -> Predicate:
        return _predicate(f, "between", (low, high))


def _negate(cond: Condition) -> Condition:
    """De Morgan down to predicates, so only single predicates are ever negated."""
    if isinstance(cond, Predicate):
        return Not(cond)
    if isinstance(cond, Not):
        return cond.child
    if isinstance(cond, And):
        return Or(tuple(_negate(c) for c in cond.children))
    return And(tuple(_negate(c) for c in cond.children))


def _predicate(f: SchemaField, op: str, values: tuple[Value, ...]) -> Predicate:
    if f.type.is_float:
        raise AclError(f"field {f.name!r} is a float; ACLs compare integers and ascii text")
    for value in values:
        if f.type is FieldType.ASCII:
            if not isinstance(value, bytes):
                raise AclError(f"field {f.name!r} is ascii text: quote the constant "
                               f"('{value}')")
            try:
                f.raw_of(value)
            except SchemaError as exc:
                raise AclError(str(exc).removeprefix("offload: ")) from None
        elif isinstance(value, bytes):
            raise AclError(f"field {f.name!r} is an integer, not text ({value!r})")
    if f.type is FieldType.ASCII:
        values = tuple(v.ljust(f.width, b"\x00") for v in values)  # type: ignore[union-attr]
    return Predicate(f, op, values)


def parse_rule(text: str, schema: Schema) -> AclRule:
    """Parse ``(CONDITION, ON_MATCH[, ON_MISS])`` against ``schema``; AclError says why not."""
    if "|" in text:
        raise AclError(f"rule {text!r}: write one verdict where the seed writes REJECT|LOG "
                       "(REJECT drops; LOG forwards and logs)")
    try:
        rule = _Build(schema).transform(_parser().parse(text))
    except VisitError as exc:
        cause = exc.orig_exc
        if isinstance(cause, AclError | SchemaError):
            raise AclError(f"rule {text!r}: {str(cause).removeprefix('offload: ')}") from None
        raise
    except LarkError as exc:
        first = str(exc).strip().splitlines()[0]
        raise AclError(f"rule {text!r} does not parse ({first}); write "
                       "(CONDITION, ACCEPT|REJECT|LOG[, ON_MISS])") from None
    return AclRule(rule.condition, rule.on_match, rule.on_miss, text)


# --- compiling to stages ------------------------------------------------------------------------
# A lowered condition is a conjunction: ((stage, intervals), ...) sorted by stage, intervals
# sorted and disjoint raw values; () is "true", FALSE is "false".
FALSE = None
Conj = tuple[tuple[int, tuple[Interval, ...]], ...]
Lowered = tuple[Conj, Verdict, Verdict]
Residual = tuple[tuple[Lowered, ...], Verdict]
"""A rule list still to decide, and the verdict when none decides: one ACL state."""


def _union(spans: Iterable[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for lo, hi in sorted(spans):
        if lo > hi:
            continue
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _complement(spans: Sequence[Interval], top: int) -> list[Interval]:
    out, start = [], 0
    for lo, hi in spans:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= top:
        out.append((start, top))
    return out


def stage_of(f: SchemaField, spec: PipelineSpec) -> int:
    """The ACL stage that reads ``f``'s bytes; AclError when the pipeline reads none."""
    if not f.offloadable:
        raise AclError(f"field {f.name!r} ({f.type.name.lower()}, {f.width} bytes) cannot be "
                       "compared by the offload tables; use an integer or ascii field of "
                       "1, 2, 4 or 8 bytes")
    for k, acl_field in enumerate(spec.acl_fields):
        if acl_field.offset == f.offset and acl_field.width == f.width:
            return k
    fields = ", ".join(f"{a.name}@{a.offset}/{a.width}" for a in spec.acl_fields)
    raise AclError(f"field {f.name!r} (payload offset {f.offset}, {f.width} bytes) is not an "
                   f"ACL field of the pipeline ({fields}); move it in the schema or add it "
                   "to PipelineSpec.acl_fields")


def _dnf(cond: Condition, spec: PipelineSpec) -> list[Conj | None]:
    """``cond`` as a disjunction of conjunctions over stages."""
    if isinstance(cond, Predicate | Not):
        pred = cond if isinstance(cond, Predicate) else cond.child
        spans = pred.raw_intervals()
        if isinstance(cond, Not):
            spans = _complement(spans, pred.field.raw_max)
        return [((stage_of(pred.field, spec), tuple(spans)),) if spans else FALSE]
    if isinstance(cond, Or):
        return [c for child in cond.children for c in _dnf(child, spec)]
    result: list[Conj | None] = [()]
    for child in cond.children:
        result = [_conjoin(a, b) for a in result for b in _dnf(child, spec)]
    return result


def _conjoin(a: Conj | None, b: Conj | None) -> Conj | None:
    if a is FALSE or b is FALSE:
        return FALSE
    stages = dict(a)
    for stage, spans in b:
        if stage in stages:
            both = _intersect(stages[stage], spans)
            if not both:
                return FALSE
            stages[stage] = tuple(both)
        else:
            stages[stage] = spans
    return tuple(sorted(stages.items()))


def lower(acl: AclClass, spec: PipelineSpec) -> list[Lowered | tuple[None, Verdict, Verdict]]:
    """Rules as conjunctions over stages; ``(A or B, X, Y)`` becomes ``(A, X, CONTINUE),
    (B, X, Y)``, which decides the same."""
    lowered: list = []
    for rule in acl.rules:
        terms = _dnf(rule.condition, spec)
        for i, conj in enumerate(terms):
            last = i == len(terms) - 1
            lowered.append((conj, rule.on_match, rule.on_miss if last else Verdict.CONTINUE))
    return lowered


def _simplify(rules: Iterable[tuple[Conj | None, Verdict, Verdict]],
              default: Verdict) -> Verdict | Residual:
    """Drop rules that cannot decide, stop at one that always decides; a constant when no
    condition is left. Equal rule lists give equal residuals (states are shared)."""
    kept: list[Lowered] = []
    result = default
    for conj, on_match, on_miss in rules:
        if conj is FALSE:
            if on_miss is Verdict.CONTINUE:
                continue
            result = on_miss
            break
        if not conj or on_match is on_miss:
            result = on_match
            break
        if on_miss is not Verdict.CONTINUE:  # always decides: what follows is dead
            kept.append((conj, on_match, Verdict.CONTINUE))
            result = on_miss
            break
        kept.append((conj, on_match, on_miss))
    while kept and kept[-1][1] is result:  # (c, R, CONTINUE) then R: redundant
        kept.pop()
    return (tuple(kept), result) if kept else result


def _restrict(conj: Conj, stage: int, lo: int, hi: int) -> Conj | None:
    for i, (s, spans) in enumerate(conj):
        if s == stage:
            inside = any(a <= lo and hi <= b for a, b in spans)
            return conj[:i] + conj[i + 1:] if inside else FALSE
    return conj


def _split(residual: Residual, stage: int, top: int) -> list[tuple[int, int, Verdict | Residual]]:
    """Disjoint intervals covering 0..top, each with the residual left for the next stage."""
    rules, default = residual
    cuts = {0}
    for conj, _, _ in rules:
        for s, spans in conj:
            if s == stage:
                for lo, hi in spans:
                    cuts.add(lo)
                    if hi < top:
                        cuts.add(hi + 1)
    points = sorted(cuts)
    pieces: list[tuple[int, int, Verdict | Residual]] = []
    for i, lo in enumerate(points):
        hi = points[i + 1] - 1 if i + 1 < len(points) else top
        nxt = _simplify(((_restrict(c, stage, lo, hi), m, o) for c, m, o in rules), default)
        if pieces and pieces[-1][2] == nxt:
            pieces[-1] = (pieces[-1][0], hi, nxt)
        else:
            pieces.append((lo, hi, nxt))
    return pieces


def compile_class(acl: AclClass, spec: PipelineSpec) -> list[TableEntry]:
    """ACL stage entries of one class: (class, state, field_k range) -> action."""
    start = _simplify(lower(acl, spec), acl.default)
    frontier: dict[Verdict | Residual, int] = {start: 0}
    entries: list[TableEntry] = []
    for stage, acl_field in enumerate(spec.acl_fields):
        top = (1 << acl_field.bits) - 1
        states: dict[Residual, int] = {}
        for residual, state in frontier.items():
            pieces = ([(0, top, residual)] if isinstance(residual, Verdict)
                      else _split(residual, stage, top))
            for lo, hi, nxt in pieces:
                if isinstance(nxt, Verdict):
                    action, params = model.ACL_ACTION_NAMES[VERDICT_ACTION[nxt]], {}
                else:
                    if nxt not in states:
                        if len(states) > model.MAX_ACL_STATE:
                            raise AclError(f"class {acl.class_id} needs more than "
                                           f"{model.MAX_ACL_STATE + 1} states at stage "
                                           f"{stage + 1}; split its rules over more classes")
                        states[nxt] = len(states)
                    action, params = model.ACTION_ACL_NEXT, {model.PARAM_STATE: states[nxt]}
                entries.append(TableEntry.make(
                    model.acl_table(stage),
                    {model.ACL_CLASS_FIELD: model.Exact(acl.class_id),
                     model.ACL_STATE_FIELD: model.Exact(state),
                     model.acl_field(stage): Range(lo, hi)},
                    action, params, model.ACL_ENTRY_PRIORITY))
        frontier = states  # type: ignore[assignment]
    if frontier:  # cannot happen: after the last stage no condition is left
        raise AclError(f"class {acl.class_id} did not reduce to verdicts; report this rule set")
    return entries
