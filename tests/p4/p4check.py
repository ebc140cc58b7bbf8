"""A syntax and type check of p4/topicwire/topicwire.p4 for machines without p4c.

Not a P4 compiler: a lark grammar of the P4_16 subset the program is written in (constants,
headers, structs, one parser with select transitions, controls with actions, tables,
extern instances and if/else apply blocks, the V1Switch package), operator precedence as
p4c's grammar (p4parser.ypp) declares it, and a checker that does what p4c's front end does
first for this subset: resolves every name (fields, constants, actions, tables, states,
parser/control blocks, v1model's standard_metadata, errors and enums), infers the width of
every expression and refuses mixing widths without a cast, non-boolean conditions,
assignments across widths, slices out of range, and v1model calls with the wrong arguments
(extract/emit, mark_to_drop, digest, verify_checksum), and checks the signatures of the six
blocks V1Switch takes.

What it cannot tell: whether p4c's back end for BMv2 accepts every construct (it does for
these: they are the ones p4lang's tutorials use), and anything about run time.
``check(text)`` returns the problems found, each with its line; [] means none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedInput

_RESERVED = ("const", "header", "struct", "bit", "bool", "parser", "control", "transition",
             "select", "default", "action", "table", "if", "else", "true", "false", "in", "out",
             "inout")
"""Keywords that never name anything in the program (``state``, ``key``, ``apply`` and
``size`` may: p4c's ``nonTypeName``)."""

GRAMMAR = r"""
start: decl*
?decl: const_decl | header_decl | struct_decl | parser_decl | control_decl | main_decl

const_decl: "const" type NAME "=" expr ";"
header_decl: "header" NAME "{" field* "}"
struct_decl: "struct" NAME "{" field* "}"
field: type NAME ";"
type: "bit" "<" INT ">"          -> bit_type
    | "bool"                      -> bool_type
    | NAME                        -> named_type

params: [param ("," param)*]
param: [DIRECTION] type NAME
DIRECTION: "inout" | "in" | "out"

parser_decl: "parser" NAME "(" params ")" "{" state* "}"
state: "state" NAME "{" stmt* transition "}"
transition: "transition" NAME ";"                                   -> goto
          | "transition" "select" "(" expr_list ")" "{" case* "}"   -> select
case: keyset ":" NAME ";"
keyset: "default"                               -> default_key
      | "(" key_elem ("," key_elem)+ ")"        -> tuple_key
      | value_elem                              -> single_key
?key_elem: value_elem
         | "default"                            -> any_key
?value_elem: expr                               -> value_key
           | expr "&&&" expr                    -> mask_key

control_decl: "control" NAME "(" params ")" "{" local* "apply" block "}"
?local: action_decl | table_decl | instance_decl | const_decl
action_decl: "action" NAME "(" params ")" block
instance_decl: NAME "(" args ")" NAME ";"
table_decl: "table" NAME "{" prop* "}"
prop: "key" "=" "{" key_entry* "}"                     -> key_prop
    | "actions" "=" "{" (NAME ";")* "}"                  -> actions_prop
    | "default_action" "=" NAME "(" args ")" ";"         -> default_prop
    | "counters" "=" NAME ";"                            -> counters_prop
    | "size" "=" INT ";"                                 -> size_prop
key_entry: expr ":" NAME ";"

main_decl: NAME "(" args ")" NAME ";"

block: "{" stmt* "}"
?stmt: block
     | expr "=" expr ";"                                 -> assign
     | expr ";"                                          -> call_stmt
     | "if" "(" expr ")" stmt ["else" stmt]              -> if_stmt

args: [expr ("," expr)*]
expr_list: expr ("," expr)*

?expr: lor
?lor: land | lor LOR_OP land                 -> binop
?land: equality | land LAND_OP equality      -> binop
?equality: relation | equality EQ_OP relation -> binop
?relation: bor | relation REL_OP bor          -> binop
?bor: bxor | bor BOR_OP bxor                  -> binop
?bxor: band | bxor BXOR_OP band               -> binop
?band: shift | band BAND_OP shift             -> binop
?shift: sum | shift SHIFT_OP sum              -> binop
?sum: product | sum ADD_OP product            -> binop
?product: unary | product MUL_OP unary        -> binop
?unary: postfix
      | "!" unary                              -> not_
      | "~" unary                              -> complement
      | "-" unary                              -> negate
      | "(" bit_cast ")" unary                 -> cast
?postfix: atom
        | postfix "." NAME                     -> member
        | postfix "[" INT ":" INT "]"          -> slice
        | postfix "(" args ")"                 -> call
        | GENERIC_HEAD "(" args ")"            -> generic_call
?atom: NAME                                    -> name
     | NUMBER                                  -> number
     | "true"                                  -> true
     | "false"                                 -> false
     | "(" expr ")"
     | "{" expr_list "}"                       -> list_

LOR_OP: "||"
LAND_OP: "&&"
BOR_OP: "|"
BXOR_OP: "^"
BAND_OP: "&"
EQ_OP: "==" | "!="
GENERIC_HEAD.2: /[A-Za-z_]\w*\s*<\s*[A-Za-z_]\w*\s*>/
bit_cast: "bit" "<" INT ">"
REL_OP: "<=" | ">=" | "<" | ">"
SHIFT_OP: "<<" | ">>"
ADD_OP: "+" | "-"
MUL_OP: "*" | "/" | "%"
NUMBER: /\d+[ws]\d+/ | /0[xX][0-9a-fA-F]+/ | /\d+/
INT: /\d+/
NAME: /(?!(RESERVED)\b)[A-Za-z_]\w*/
%ignore /\s+/
""".replace("RESERVED", "|".join(_RESERVED))


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(GRAMMAR, parser="lalr", propagate_positions=True)


# --- types ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class T:
    """A type: ``bit`` (with ``width``), ``int`` (unsized literal), ``bool``, ``header``,
    ``struct`` (with ``name``), ``error``, ``enum`` (``name``), ``list`` (``items``),
    ``table``, ``result``, ``extern`` (``name``), ``void``."""

    kind: str
    width: int = 0
    name: str = ""
    items: tuple = ()

    def __str__(self) -> str:
        if self.kind == "bit":
            return f"bit<{self.width}>"
        return f"{self.kind} {self.name}".strip()


BOOL, INT_T, VOID, ERROR = T("bool"), T("int"), T("void"), T("error")


def bit(width: int) -> T:
    return T("bit", width)


STANDARD_METADATA = {
    "ingress_port": bit(9), "egress_spec": bit(9), "egress_port": bit(9),
    "instance_type": bit(32), "packet_length": bit(32), "enq_timestamp": bit(32),
    "enq_qdepth": bit(19), "deq_timedelta": bit(32), "deq_qdepth": bit(19),
    "ingress_global_timestamp": bit(48), "egress_global_timestamp": bit(48),
    "mcast_grp": bit(16), "egress_rid": bit(16), "checksum_error": bit(1),
    "parser_error": ERROR, "priority": bit(3),
}
"""v1model.p4's ``standard_metadata_t``."""

ERRORS = ("NoError", "PacketTooShort", "NoMatch", "StackOutOfBounds", "HeaderTooShort",
          "ParserTimeout", "ParserInvalidArgument")
"""core.p4's errors."""

ENUMS = {"CounterType": ("packets", "bytes", "packets_and_bytes"),
         "HashAlgorithm": ("crc32", "crc32_custom", "crc16", "crc16_custom", "random",
                           "identity", "csum16", "xor16")}
"""v1model.p4's enums the program may name."""

EXTERN_TYPES = {"direct_counter": ("CounterType",), "counter": ("int", "CounterType"),
                "direct_meter": ("MeterType",)}
MATCH_KINDS = ("exact", "ternary", "lpm", "range")

V1SWITCH = ("parser", "verify", "pipe", "pipe", "compute", "deparser")
"""Block kinds V1Switch takes, in order (signatures in ``_SIGNATURES``)."""

_SIGNATURES = {
    "parser": (("", "packet_in"), ("out", "H"), ("inout", "M"),
               ("inout", "standard_metadata_t")),
    "verify": (("inout", "H"), ("inout", "M")),
    "pipe": (("inout", "H"), ("inout", "M"), ("inout", "standard_metadata_t")),
    "compute": (("inout", "H"), ("inout", "M")),
    "deparser": (("", "packet_out"), ("in", "H")),
}


@dataclass
class _Scope:
    names: dict[str, T] = field(default_factory=dict)
    actions: dict[str, tuple[T, ...]] = field(default_factory=dict)
    tables: set[str] = field(default_factory=set)
    externs: dict[str, str] = field(default_factory=dict)


class _Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.consts: dict[str, T] = {}
        self.types: dict[str, tuple[str, dict[str, T]]] = {}
        self.blocks: dict[str, tuple[str, tuple[tuple[str, T], ...]]] = {}

    def fail(self, node: Tree | Token | None, what: str) -> None:
        line = getattr(node, "line", None) if isinstance(node, Token) else (
            getattr(node.meta, "line", None) if isinstance(node, Tree) and not
            node.meta.empty else None)
        self.problems.append(f"line {line}: {what}" if line else what)

    # --- declarations ------------------------------------------------------------------------
    def run(self, tree: Tree) -> None:
        for decl in tree.children:
            getattr(self, f"_{decl.data}")(decl)

    def _type(self, node: Tree) -> T:
        if node.data == "bit_type":
            width = int(node.children[0])
            if not 1 <= width <= 2048:
                self.fail(node, f"bit<{width}> is not a width p4c takes")
            return bit(width)
        if node.data == "bool_type":
            return BOOL
        name = str(node.children[0])
        if name in self.types:
            kind, _ = self.types[name]
            return T(kind, name=name)
        if name in ("packet_in", "packet_out", "standard_metadata_t"):
            return T("extern" if name != "standard_metadata_t" else "struct", name=name)
        self.fail(node, f"unknown type {name}")
        return VOID

    def _const_decl(self, node: Tree, scope: _Scope | None = None) -> None:
        type_node, name, value = node.children
        declared = self._type(type_node)
        got = self.expr(value, scope or _Scope())
        self._assignable(node, declared, got, f"constant {name}")
        number = self._literal_value(value)
        if number is not None and declared.kind == "bit" and not 0 <= number < 1 << \
                declared.width:
            self.fail(node, f"constant {name} = {number} does not fit {declared}")
        (scope.names if scope else self.consts)[str(name)] = declared

    def _literal_value(self, node: Tree) -> int | None:
        if isinstance(node, Tree) and node.data == "number":
            text = str(node.children[0])
            match = re.fullmatch(r"(\d+)[ws](\d+)", text)
            return int(match[2]) if match else int(text, 0)
        return None

    def _fields(self, node: Tree) -> dict[str, T]:
        out: dict[str, T] = {}
        for f in node.children[1:]:
            type_node, name = f.children
            if str(name) in out:
                self.fail(f, f"field {name} declared twice")
            out[str(name)] = self._type(type_node)
        return out

    def _header_decl(self, node: Tree) -> None:
        fields = self._fields(node)
        for name, t in fields.items():
            if t.kind != "bit":
                self.fail(node, f"header field {name} must be bit<N>, is {t}")
        bits = sum(t.width for t in fields.values())
        if bits % 8:
            self.fail(node, f"header {node.children[0]} is {bits} bits, not whole bytes")
        self.types[str(node.children[0])] = ("header", fields)

    def _struct_decl(self, node: Tree) -> None:
        self.types[str(node.children[0])] = ("struct", self._fields(node))

    def _params(self, node: Tree) -> tuple[tuple[str, T, str], ...]:
        out = []
        for p in node.children:
            if p is None:
                continue
            direction, type_node, name = p.children
            out.append((str(direction or ""), self._type(type_node), str(name)))
        return tuple(out)

    def _scope_of(self, params: tuple[tuple[str, T, str], ...]) -> _Scope:
        scope = _Scope()
        scope.names.update({name: t for _, t, name in params})
        return scope

    def _parser_decl(self, node: Tree) -> None:
        name, params_node, *states = node.children
        params = self._params(params_node)
        self.blocks[str(name)] = ("parser", tuple((d, t) for d, t, _ in params))
        scope = self._scope_of(params)
        names = {str(s.children[0]) for s in states}
        if "start" not in names:
            self.fail(node, f"parser {name} has no start state")
        for state in states:
            _, *body = state.children
            for stmt in body[:-1]:
                self.stmt(stmt, scope)
            self._transition(body[-1], scope, names)

    def _transition(self, node: Tree, scope: _Scope, states: set[str]) -> None:
        targets = states | {"accept", "reject"}
        if node.data == "goto":
            if str(node.children[0]) not in targets:
                self.fail(node, f"transition to unknown state {node.children[0]}")
            return
        exprs, *cases = node.children
        types = [self.expr(e, scope) for e in exprs.children]
        for case in cases:
            keyset, target = case.children
            if str(target) not in targets:
                self.fail(case, f"select case goes to unknown state {target}")
            if keyset.data == "default_key":
                continue
            elems = keyset.children
            if len(elems) != len(types):
                self.fail(case, f"select on {len(types)} values, case gives {len(elems)}")
                continue
            for elem, want in zip(elems, types):
                for part in elem.children:
                    self._assignable(case, want, self.expr(part, scope), "select case value")

    def _control_decl(self, node: Tree) -> None:
        name, params_node, *locals_, apply_block = node.children
        params = self._params(params_node)
        self.blocks[str(name)] = ("control", tuple((d, t) for d, t, _ in params))
        scope = self._scope_of(params)
        for local in locals_:
            if local.data == "action_decl":
                aname, aparams, body = local.children
                ps = self._params(aparams)
                scope.actions[str(aname)] = tuple(t for _, t, _ in ps)
                inner = _Scope({**scope.names, **{n: t for _, t, n in ps}}, scope.actions,
                               scope.tables, scope.externs)
                self.stmt(body, inner)
            elif local.data == "instance_decl":
                kind, args, iname = local.children
                if str(kind) not in EXTERN_TYPES:
                    self.fail(local, f"unknown extern {kind}")
                else:
                    for arg, want in zip(args.children, EXTERN_TYPES[str(kind)]):
                        got = self.expr(arg, scope)
                        if want != "int" and got != T("enum", name=want):
                            self.fail(local, f"{kind} takes a {want}, got {got}")
                scope.externs[str(iname)] = str(kind)
            elif local.data == "table_decl":
                self._table(local, scope)
                scope.tables.add(str(local.children[0]))
            else:
                self._const_decl(local, scope)
        self.stmt(apply_block, scope)

    def _table(self, node: Tree, scope: _Scope) -> None:
        name, *props = node.children
        seen = {p.data for p in props}
        for required in ("key_prop", "actions_prop"):
            if required not in seen:
                self.fail(node, f"table {name} has no {required.split('_')[0]}")
        actions: list[str] = []
        for prop in props:
            if prop.data == "key_prop":
                for entry in prop.children:
                    expr, kind = entry.children
                    t = self.expr(expr, scope)
                    if t.kind != "bit":
                        self.fail(entry, f"table {name} key must be bit<N>, is {t}")
                    if str(kind) not in MATCH_KINDS:
                        self.fail(entry, f"unknown match kind {kind}")
            elif prop.data == "actions_prop":
                actions = [str(a) for a in prop.children]
                for a in actions:
                    if a not in scope.actions:
                        self.fail(prop, f"table {name} lists unknown action {a}")
            elif prop.data == "default_prop":
                action, args = prop.children
                if str(action) not in actions:
                    self.fail(prop, f"default action {action} of table {name} is not in "
                                    "its actions")
                self._call_args(prop, str(action), scope.actions.get(str(action), ()),
                                [a for a in args.children if a is not None], scope)
            elif prop.data == "counters_prop":
                counter = str(prop.children[0])
                if scope.externs.get(counter) != "direct_counter":
                    self.fail(prop, f"counters = {counter}: not a direct_counter")

    def _main_decl(self, node: Tree) -> None:
        package, args, name = node.children
        if str(package) != "V1Switch" or str(name) != "main":
            self.fail(node, "the package must be 'V1Switch(...) main;'")
        blocks = [a for a in args.children if a is not None]
        if len(blocks) != len(V1SWITCH):
            self.fail(node, f"V1Switch takes {len(V1SWITCH)} blocks, got {len(blocks)}")
            return
        h = m = None
        for arg, role in zip(blocks, V1SWITCH):
            if not (isinstance(arg, Tree) and arg.data == "call" and
                    arg.children[0].data == "name"):
                self.fail(node, f"V1Switch argument {role}: expected Block()")
                continue
            bname = str(arg.children[0].children[0])
            kind, params = self.blocks.get(bname, ("", ()))
            want_kind = "parser" if role == "parser" else "control"
            if kind != want_kind:
                self.fail(node, f"{bname} must be a {want_kind} for V1Switch's {role} block")
                continue
            want = _SIGNATURES[role]
            if len(params) != len(want):
                self.fail(node, f"{bname} takes {len(params)} parameters, V1Switch's {role} "
                                f"block takes {len(want)}")
                continue
            for (direction, t), (want_dir, want_t) in zip(params, want):
                if direction != want_dir:
                    self.fail(node, f"{bname}: parameter {t} must be '{want_dir or 'no'}' "
                                    f"direction, is '{direction or 'none'}'")
                if want_t == "H":
                    h = h or t
                    if t != h or t.kind != "struct":
                        self.fail(node, f"{bname}: headers type {t} differs from {h}")
                elif want_t == "M":
                    m = m or t
                    if t != m or t.kind != "struct":
                        self.fail(node, f"{bname}: metadata type {t} differs from {m}")
                elif t.name != want_t:
                    self.fail(node, f"{bname}: parameter is {t}, V1Switch wants {want_t}")

    # --- statements -------------------------------------------------------------------------
    def stmt(self, node: Tree, scope: _Scope) -> None:
        if node.data == "block":
            for child in node.children:
                self.stmt(child, scope)
        elif node.data == "assign":
            target, value = node.children
            if not self._is_lvalue(target):
                self.fail(node, "left of '=' is not a field or variable")
            self._assignable(node, self.expr(target, scope), self.expr(value, scope),
                             "assignment")
        elif node.data == "call_stmt":
            (expr,) = node.children
            if expr.data not in ("call", "generic_call"):
                self.fail(node, "a statement must be a call or an assignment")
            self.expr(expr, scope)
        elif node.data == "if_stmt":
            cond, then, otherwise = node.children
            if self.expr(cond, scope) != BOOL:
                self.fail(node, "an if condition must be bool")
            self.stmt(then, scope)
            if otherwise is not None:
                self.stmt(otherwise, scope)
        else:
            self.fail(node, f"unexpected statement {node.data}")

    def _is_lvalue(self, node: Tree) -> bool:
        if node.data == "name":
            return True
        if node.data in ("member", "slice"):
            return self._is_lvalue(node.children[0])
        return False

    def _assignable(self, node: Tree, want: T, got: T, what: str) -> None:
        if want == got or (want.kind == "bit" and got == INT_T):
            return
        if want.kind == "struct" and got.kind == "list":
            fields = list(self.types.get(want.name, ("", {}))[1].values())
            if len(fields) != len(got.items):
                self.fail(node, f"{what}: {want} has {len(fields)} fields, the list "
                                f"{len(got.items)}")
            for f, item in zip(fields, got.items):
                self._assignable(node, f, item, what)
            return
        self.fail(node, f"{what}: {got} where {want} is needed (cast it)")

    # --- expressions ------------------------------------------------------------------------
    def expr(self, node: Tree, scope: _Scope) -> T:
        kind = node.data
        if kind == "name":
            return self._name(node, str(node.children[0]), scope)
        if kind == "number":
            text = str(node.children[0])
            match = re.fullmatch(r"(\d+)[ws](\d+)", text)
            if match:
                if int(match[2]) >= 1 << int(match[1]):
                    self.fail(node, f"{text} does not fit {match[1]} bits")
                return bit(int(match[1]))
            return INT_T
        if kind in ("true", "false"):
            return BOOL
        if kind == "list_":
            return T("list", items=tuple(self.expr(e, scope) for e in node.children[0].children))
        if kind == "binop":
            return self._binop(node, scope)
        if kind == "not_":
            if self.expr(node.children[0], scope) != BOOL:
                self.fail(node, "'!' needs a bool")
            return BOOL
        if kind in ("complement", "negate"):
            t = self.expr(node.children[0], scope)
            if t.kind != "bit" and not (kind == "negate" and t == INT_T):
                self.fail(node, f"'{'~' if kind == 'complement' else '-'}' needs bit<N>, "
                                f"got {t}")
            return t
        if kind == "cast":
            target, operand = node.children
            t, got = bit(int(target.children[0])), self.expr(operand, scope)
            if t.kind != "bit" or got.kind not in ("bit", "int") and not (
                    got == BOOL and t.width == 1):
                self.fail(node, f"cannot cast {got} to {t}")
            return t
        if kind == "slice":
            base, high, low = node.children
            t = self.expr(base, scope)
            h, lo = int(high), int(low)
            if t.kind != "bit" or not t.width > h >= lo >= 0:
                self.fail(node, f"slice [{h}:{lo}] out of {t}")
            return bit(h - lo + 1)
        if kind == "member":
            return self._member(node, scope)
        if kind == "call":
            return self._call(node, scope)
        if kind == "generic_call":
            return self._generic_call(node, scope)
        self.fail(node, f"unexpected expression {kind}")
        return VOID

    def _name(self, node: Tree, name: str, scope: _Scope) -> T:
        if name in scope.names:
            return scope.names[name]
        if name in self.consts:
            return self.consts[name]
        if name in scope.tables:
            return T("table", name=name)
        if name in scope.externs:
            return T("extern", name=scope.externs[name])
        if name in ENUMS:
            return T("enum_type", name=name)
        if name == "error":
            return T("error_type")
        if name in scope.actions or name in self.blocks or name in (
                "mark_to_drop", "verify_checksum"):
            return T("callable", name=name)
        self.fail(node, f"unknown name {name}")
        return VOID

    def _member(self, node: Tree, scope: _Scope) -> T:
        base, name = node.children
        name = str(name)
        t = self.expr(base, scope)
        if t.kind in ("header", "struct"):
            fields = (STANDARD_METADATA if t.name == "standard_metadata_t"
                      else self.types.get(t.name, ("", {}))[1])
            if t.kind == "header" and name in ("isValid", "setValid", "setInvalid"):
                return T("method", name=name)
            if name not in fields:
                self.fail(node, f"{t.kind} {t.name} has no field {name}")
                return VOID
            return fields[name]
        if t.kind == "enum_type":
            if name not in ENUMS[t.name]:
                self.fail(node, f"{t.name} has no member {name}")
            return T("enum", name=t.name)
        if t.kind == "error_type":
            if name not in ERRORS:
                self.fail(node, f"no error.{name} in core.p4")
            return ERROR
        if t.kind == "table" and name == "apply":
            return T("method", name="apply")
        if t.kind == "result":
            if name not in ("hit", "miss"):
                self.fail(node, f"a table's apply() result has no {name}")
            return BOOL
        if t.kind == "extern" and t.name in ("packet_in", "packet_out"):
            method = "extract" if t.name == "packet_in" else "emit"
            if name != method:
                self.fail(node, f"{t.name} has no method {name} in this check")
            return T("method", name=method)
        self.fail(node, f"{t} has no member {name}")
        return VOID

    def _call(self, node: Tree, scope: _Scope) -> T:
        target, args = node.children
        argv = [a for a in args.children if a is not None]
        if target.data == "member":
            method = self.expr(target, scope)
            if method.kind != "method":
                self.fail(node, f"{method} is not callable")
                return VOID
            if method.name == "isValid":
                return BOOL
            if method.name in ("setValid", "setInvalid"):
                return VOID
            if method.name == "apply":
                return T("result")
            if len(argv) != 1 or self.expr(argv[0], scope).kind != "header":
                self.fail(node, f"{method.name} takes one header")
            return VOID
        name = str(target.children[0]) if target.data == "name" else ""
        if name == "mark_to_drop":
            if len(argv) != 1 or self.expr(argv[0], scope) != T(
                    "struct", name="standard_metadata_t"):
                self.fail(node, "mark_to_drop takes standard_metadata")
            return VOID
        if name == "verify_checksum":
            if len(argv) != 4:
                self.fail(node, "verify_checksum takes (condition, {fields}, checksum, algo)")
                return VOID
            cond, data, checksum, algo = (self.expr(a, scope) for a in argv)
            if cond != BOOL or data.kind != "list" or any(
                    i.kind != "bit" for i in data.items) or checksum.kind != "bit" or \
                    algo != T("enum", name="HashAlgorithm"):
                self.fail(node, "verify_checksum takes (bool, {bit fields}, bit<N> checksum, "
                                "HashAlgorithm.x)")
            elif algo == T("enum", name="HashAlgorithm") and checksum.width != 16:
                self.fail(node, "csum16 checks a bit<16> checksum")
            return VOID
        if name in scope.actions:
            self._call_args(node, name, scope.actions[name], argv, scope)
            return VOID
        if name in self.blocks:
            return T("block", name=name)
        self.fail(node, f"call of unknown {name or target.data}")
        return VOID

    def _call_args(self, node: Tree, name: str, params: tuple[T, ...], argv: list,
                   scope: _Scope) -> None:
        if len(argv) != len(params):
            self.fail(node, f"{name} takes {len(params)} arguments, got {len(argv)}")
        for arg, want in zip(argv, params):
            self._assignable(node, want, self.expr(arg, scope), f"argument of {name}")

    def _generic_call(self, node: Tree, scope: _Scope) -> T:
        head, args = node.children
        name, type_name = re.fullmatch(r"(\w+)\s*<\s*(\w+)\s*>", str(head)).groups()
        argv = [a for a in args.children if a is not None]
        t = self._type(Tree("named_type", [Token("NAME", type_name)], node.meta))
        if name != "digest":
            self.fail(node, f"unknown generic call {name}")
            return VOID
        if t.kind != "struct" or len(argv) != 2:
            self.fail(node, "digest<T>(receiver, data) takes a struct type and two arguments")
            return VOID
        self._assignable(node, bit(32), self.expr(argv[0], scope), "digest receiver")
        self._assignable(node, t, self.expr(argv[1], scope), "digest data")
        return VOID

    def _binop(self, node: Tree, scope: _Scope) -> T:
        left, op, right = node.children
        op = str(op) if isinstance(op, Token) else str(op)
        a, b = self.expr(left, scope), self.expr(right, scope)
        if op in ("&&", "||"):
            if a != BOOL or b != BOOL:
                self.fail(node, f"'{op}' needs bools, got {a} and {b}")
            return BOOL
        if op in ("==", "!="):
            if not (a == b or {a.kind, b.kind} == {"bit", "int"}):
                self.fail(node, f"'{op}' compares {a} with {b} (cast one)")
            return BOOL
        if op in ("<<", ">>"):
            if a.kind != "bit" or b.kind not in ("bit", "int"):
                self.fail(node, f"'{op}' shifts bit<N> by a number, got {a} and {b}")
            return a
        numeric = {"bit", "int"}
        if a.kind not in numeric or b.kind not in numeric or (
                a.kind == b.kind == "bit" and a.width != b.width):
            self.fail(node, f"'{op}' mixes {a} and {b} (cast one)")
        result = a if a.kind == "bit" else b
        return BOOL if op in ("<", ">", "<=", ">=") else result


def _prepare(text: str) -> str:
    """Comments and preprocessor lines blanked (newlines kept, so line numbers stay right).
    Names P4_16 also uses as keywords (``state``, ``key``, ``apply``, ``size``: p4c's
    ``nonTypeName``) stay names for the grammar, as in p4c."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m[0]), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"^[ \t]*#[^\n]*", "", text, flags=re.M)


def check(text: str) -> list[str]:
    """Problems found in P4 program ``text``, each with its line; [] means none."""
    try:
        tree = _parser().parse(_prepare(text))
    except UnexpectedInput as exc:
        return [f"line {exc.line}, column {exc.column}: syntax error: "
                f"{str(exc).splitlines()[0]}"]
    checker = _Checker()
    checker.run(tree)
    return checker.problems
