"""Selector grammar (JMS 2.0 message selectors, SQL-92 conditional subset) and its parser.

The grammar is a lark LALR(1) grammar; keywords are case-insensitive, identifiers are Java
identifiers (letters, digits, ``_``, ``$``; not starting with a digit; not a keyword) and
case-sensitive. Precedence, loosest first: ``OR``, ``AND``, ``NOT``, comparisons and the
``BETWEEN``/``IN``/``LIKE``/``IS NULL`` predicates, ``+ -``, ``* /``, unary ``+ -``.

``parse(text)`` returns a syntax tree (``nodes``) with literal arithmetic folded (``-5`` is
the literal -5), or raises ``SelectorSyntaxError`` with the position of the first problem and
what was expected there. An empty selector is ``TRUE`` (JMS: no selector).
"""

from __future__ import annotations

from functools import lru_cache

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from nic_offload.selectors import nodes as n
from nic_offload.selectors import values
from nic_offload.selectors.errors import SelectorSyntaxError

KEYWORDS = ("NOT", "AND", "OR", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "NULL", "TRUE", "FALSE")

_KEYWORD_TERMINALS = "\n".join(
    f"{kw}.3: /{kw.lower()}(?![\\w$])/i" for kw in KEYWORDS)
_NOT_KEYWORD = "|".join(kw.lower() for kw in KEYWORDS)

GRAMMAR = rf"""
?start: disjunction
      |                                      -> empty

?disjunction: conjunction
            | disjunction OR conjunction      -> or_
?conjunction: negation
            | conjunction AND negation        -> and_
?negation: predicate
         | NOT negation                       -> not_
?predicate: sum
          | sum COMP_OP sum                   -> comparison
          | sum [NOT] BETWEEN sum AND sum     -> between
          | sum [NOT] IN LPAR in_list RPAR    -> in_
          | sum [NOT] LIKE STRING [ESCAPE STRING] -> like
          | sum IS [NOT] NULL                 -> is_null

in_list: in_item (COMMA in_item)*
in_item: [ADD_OP] (INT | FLOAT) | STRING

?sum: product
    | sum ADD_OP product                      -> arith
?product: unary
        | product MUL_OP unary                -> arith
?unary: primary
      | ADD_OP unary                          -> unary
?primary: IDENT                               -> identifier
        | INT                                 -> int_
        | FLOAT                               -> float_
        | STRING                              -> string
        | TRUE                                -> true
        | FALSE                               -> false
        | LPAR disjunction RPAR               -> group

{_KEYWORD_TERMINALS}
IDENT: /(?!(?i:{_NOT_KEYWORD})(?![\w$]))(?!\d)[\w$]+/
FLOAT.2: /(\d+\.\d*|\.\d+)([eE][+-]?\d+)?|\d+[eE][+-]?\d+/
INT: /\d+/
STRING: /'(?:[^']|'')*'/
COMP_OP: /<>|<=|>=|=|<|>/
ADD_OP: /[+-]/
MUL_OP: /[*\/]/
LPAR: "("
RPAR: ")"
COMMA: ","
%ignore /\s+/
"""

VALUE_START = {"IDENT", "INT", "FLOAT", "STRING", "TRUE", "FALSE", "LPAR", "ADD_OP", "NOT"}
"""Terminals that can begin a value or a condition."""

OPERAND_START = {"IDENT", "INT", "FLOAT", "STRING", "TRUE", "FALSE", "LPAR"}
OPERATORS = {"COMP_OP", "ADD_OP", "MUL_OP", "BETWEEN", "IN", "LIKE", "IS"}

_DESCRIBE = (
    ("AND", "AND"), ("OR", "OR"), ("NOT", "NOT"), ("NULL", "NULL"), ("ESCAPE", "ESCAPE"),
    ("STRING", "a quoted string"), ("INT", "a number"), ("FLOAT", "a number"),
    ("LPAR", "'('"), ("RPAR", "')'"), ("COMMA", "','"), ("$END", "the end of the selector"),
)


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(GRAMMAR, parser="lalr", lexer="basic", maybe_placeholders=True)


def parse(text: str) -> n.Node:
    """The syntax tree of selector ``text``; raises SelectorSyntaxError."""
    if not isinstance(text, str):
        raise SelectorSyntaxError("", 0, f"a selector is text, not {type(text).__name__}")
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc) from None
    try:
        node = _Builder(text).transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, SelectorSyntaxError):
            raise exc.orig_exc from None
        raise
    if not n.is_condition(node):
        raise SelectorSyntaxError(text, node.pos, _not_a_condition(node))
    return node


# --- error messages ----------------------------------------------------------------------------
def _syntax_error(text: str, exc: UnexpectedInput) -> SelectorSyntaxError:
    if isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream
        char = text[pos]
        if char == "'":
            return SelectorSyntaxError(text, pos, "unterminated string: close it with ' "
                                       "(write '' for a quote inside a string)")
        if text.startswith("!=", pos):
            return SelectorSyntaxError(text, pos, "'!=' is not a selector operator: use <>")
        if char == '"':
            return SelectorSyntaxError(text, pos, "strings are quoted with ', not \"")
        return SelectorSyntaxError(text, pos, f"unexpected character {char!r}")
    expected = set(getattr(exc, "expected", ()) or ())
    if isinstance(exc, UnexpectedEOF) or (
            isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        pos = len(text.rstrip())
        found = None
    else:
        token = exc.token  # type: ignore[attr-defined]
        pos = token.start_pos
        found = token
    previous = _previous_token(text, pos)
    after = f" after {previous.value!r}" if previous is not None else ""
    if expected & VALUE_START and not expected - VALUE_START - {"$END"}:
        wanted = ("a condition" if previous is None or previous.type in ("AND", "OR", "NOT")
                  else "a value")
        what = f"expected {wanted}{after}"
        return SelectorSyntaxError(text, pos, what if found is None
                                   else f"unexpected {found.value!r}: {what}")
    if found is None:
        return SelectorSyntaxError(text, pos, f"the selector ends too early{after}: expected "
                                              f"{_describe(expected)}")
    return SelectorSyntaxError(text, pos, f"unexpected {found.value!r}{after}: expected "
                                          f"{_describe(expected)}")


def _previous_token(text: str, pos: int) -> Token | None:
    previous = None
    try:
        for token in _parser().lex(text):
            if token.start_pos >= pos:
                break
            previous = token
    except UnexpectedInput:
        pass
    return previous


def _describe(expected: set[str]) -> str:
    names: list[str] = []
    if expected & OPERAND_START - {"STRING", "INT", "FLOAT", "LPAR"} or {
            "STRING", "INT"} <= expected:
        names.append("a value")
    if expected & OPERATORS:
        names.append("an operator")
    for terminal, name in _DESCRIBE:
        if terminal in expected and name not in names and not (
                names and names[0] == "a value" and terminal in VALUE_START):
            names.append(name)
    if not names:
        return "something else"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _not_a_condition(node: n.Node) -> str:
    return (f"expected a condition (a comparison, BETWEEN, IN, LIKE, IS NULL, TRUE/FALSE or a "
            f"boolean property), found {_kind_of(node)}")


def _kind_of(node: n.Node) -> str:
    if isinstance(node, n.Literal):
        return {n.STR: "a string", n.BOOL: "a boolean"}.get(node.kind, "a number")
    if isinstance(node, (n.Arith, n.Negate)):
        return "an arithmetic expression"
    return "a condition"


# --- tree building -------------------------------------------------------------------------------
@v_args(inline=True)
class _Builder(Transformer):
    """lark tree -> ``nodes``, checking what the grammar cannot (operand kinds, IN lists)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def _fail(self, pos: int, what: str) -> SelectorSyntaxError:
        return SelectorSyntaxError(self.text, pos, what)

    def _condition(self, node: n.Node) -> n.Node:
        if not n.is_condition(node):
            raise self._fail(node.pos, _not_a_condition(node))
        return node

    def _value(self, node: n.Node, role: str) -> n.Node:
        if not n.is_value(node):
            raise self._fail(node.pos, f"{role} needs a value, found a condition; compare "
                                       "values, then combine conditions with AND/OR")
        return node

    def _number(self, node: n.Node, op: str) -> n.Node:
        self._value(node, f"'{op}'")
        if isinstance(node, n.Literal) and node.kind not in (n.INT, n.FLOAT):
            raise self._fail(node.pos, f"'{op}' needs numbers, found {_kind_of(node)}")
        return node

    # conditions
    def empty(self) -> n.Node:
        return n.TRUE

    def or_(self, left: n.Node, _op: Token, right: n.Node) -> n.Node:
        items = left.items if isinstance(left, n.Or) else (self._condition(left),)
        return n.Or((*items, self._condition(right)), left.pos)

    def and_(self, left: n.Node, _op: Token, right: n.Node) -> n.Node:
        items = left.items if isinstance(left, n.And) else (self._condition(left),)
        return n.And((*items, self._condition(right)), left.pos)

    def not_(self, op: Token, operand: n.Node) -> n.Node:
        return n.Not(self._condition(operand), op.start_pos)

    def comparison(self, left: n.Node, op: Token, right: n.Node) -> n.Node:
        role = f"'{op.value}'"
        self._value(left, role)
        self._value(right, role)
        if op.value in n.ORDERING_OPS:
            for side in (left, right):
                if isinstance(side, n.Literal) and side.kind == n.BOOL:
                    raise self._fail(side.pos, f"booleans compare only with = and <>, not "
                                               f"{op.value}")
        return n.Comparison(op.value, left, right, left.pos)

    def between(self, operand: n.Node, negated: Token | None, _kw: Token, low: n.Node,
                _and: Token, high: n.Node) -> n.Node:
        for node in (operand, low, high):
            self._value(node, "BETWEEN")
            if isinstance(node, n.Literal) and node.kind == n.BOOL:
                raise self._fail(node.pos, "BETWEEN orders values; booleans have no order")
        return n.Between(operand, low, high, negated is not None, operand.pos)

    def in_(self, operand: n.Node, negated: Token | None, _kw: Token, _lpar: Token,
            items: list[n.Literal], _rpar: Token) -> n.Node:
        self._value(operand, "IN")
        kinds = {item.kind == n.STR for item in items}
        if len(kinds) > 1:
            first = next(i for i in items if (i.kind == n.STR) != (items[0].kind == n.STR))
            raise self._fail(first.pos, "an IN list holds strings or numbers, not both; "
                                        "split it into two conditions joined with OR")
        return n.InList(operand, tuple(dict.fromkeys(items)), negated is not None, operand.pos)

    def in_list(self, *children: n.Literal | Token) -> list[n.Literal]:
        return [c for c in children if isinstance(c, n.Literal)]

    def in_item(self, *children: Token | None) -> n.Literal:
        sign, *rest = children
        if len(children) == 1:  # a STRING alone
            return self.string(sign)  # type: ignore[arg-type]
        (number,) = [c for c in rest if c is not None]
        literal = self.int_(number) if number.type == "INT" else self.float_(number)
        if sign is not None and sign.value == "-":
            return n.Literal(literal.kind, -literal.value, sign.start_pos)
        return literal if sign is None else n.Literal(literal.kind, literal.value, sign.start_pos)

    def like(self, operand: n.Node, negated: Token | None, _kw: Token, pattern: Token,
             _esc: Token | None, escape: Token | None) -> n.Node:
        self._value(operand, "LIKE")
        text = _unquote(pattern.value)
        esc = None
        if escape is not None:
            esc = _unquote(escape.value)
            if len(esc) != 1:
                raise self._fail(escape.start_pos, f"ESCAPE takes one character, not {esc!r}")
        try:
            values.like_regex(text, esc)
        except ValueError as exc:
            raise self._fail(pattern.start_pos, f"bad LIKE pattern: {exc}; double the escape "
                                                "character to match it literally") from None
        return n.Like(operand, text, esc, negated is not None, operand.pos)

    def is_null(self, operand: n.Node, _is: Token, negated: Token | None, _null: Token,
                ) -> n.Node:
        self._value(operand, "IS NULL")
        return n.IsNull(operand, negated is not None, operand.pos)

    # values
    def arith(self, left: n.Node, op: Token, right: n.Node) -> n.Node:
        self._number(left, op.value)
        self._number(right, op.value)
        if isinstance(left, n.Literal) and isinstance(right, n.Literal):
            folded = values.arith(op.value, left.value, right.value)
            if folded is not None:
                return n.Literal(n.INT if type(folded) is int else n.FLOAT, folded, left.pos)
        return n.Arith(op.value, left, right, left.pos)

    def unary(self, op: Token, operand: n.Node) -> n.Node:
        self._number(operand, op.value)
        if op.value == "+":
            return operand
        if isinstance(operand, n.Literal):
            return n.Literal(operand.kind, -operand.value, op.start_pos)
        return n.Negate(operand, op.start_pos)

    def group(self, _lpar: Token, inner: n.Node, _rpar: Token) -> n.Node:
        return inner

    def identifier(self, token: Token) -> n.Node:
        return n.Identifier(str(token.value), token.start_pos)

    def int_(self, token: Token) -> n.Literal:
        return n.Literal(n.INT, int(token.value), token.start_pos)

    def float_(self, token: Token) -> n.Literal:
        return n.Literal(n.FLOAT, float(token.value), token.start_pos)

    def string(self, token: Token) -> n.Literal:
        return n.Literal(n.STR, _unquote(token.value), token.start_pos)

    def true(self, token: Token) -> n.Literal:
        return n.Literal(n.BOOL, True, token.start_pos)

    def false(self, token: Token) -> n.Literal:
        return n.Literal(n.BOOL, False, token.start_pos)


def _unquote(quoted: str) -> str:
    return quoted[1:-1].replace("''", "'")
