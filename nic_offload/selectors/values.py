"""JMS value semantics shared by the reference evaluator and the shared-list index.

Event values are normalized once: Python/numpy integers -> ``int``, reals -> ``float``,
``str``, ``bool``; ``None``, a missing property and a NaN are NULL (``None``); anything else
is kept as an opaque value that compares false with everything. A value's *domain* is
number, string, boolean or other. Comparisons (JMS 3.8.1.2):

- NULL on either side: unknown (``None``);
- different domains ("non-like types"): false;
- numbers with numbers (exact and approximate mixed), strings with strings (code point
  order; JMS allows only ``=``/``<>`` on strings, topicwire orders them too), booleans with
  booleans (``=``/``<>`` only; ordering them is false).
"""

from __future__ import annotations

import numbers
import operator
import re
from collections.abc import Callable

NUM, STR, BOOL, OTHER = 0, 1, 2, 3
DOMAIN_NAMES = {NUM: "number", STR: "string", BOOL: "boolean", OTHER: "other"}

OPS: dict[str, Callable[[object, object], bool]] = {
    "=": operator.eq, "<>": operator.ne, "<": operator.lt, ">": operator.gt,
    "<=": operator.le, ">=": operator.ge,
}
EQUALITY_OPS = ("=", "<>")

_FAST_TYPES = {int: NUM, float: NUM, str: STR, bool: BOOL}


def normalize(value: object) -> object:
    """An event value in the evaluator's terms (see the module docstring); None is NULL."""
    kind = type(value)
    if kind is int or kind is str or kind is bool:
        return value
    if kind is float:
        return None if value != value else value
    if value is None:
        return None
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        real = float(value)
        return None if real != real else real
    if isinstance(value, str):
        return str(value)
    dtype = getattr(value, "dtype", None)
    if dtype is not None and getattr(dtype, "kind", "") == "b":
        return bool(value)  # numpy.bool_
    return value


def domain_of(value: object) -> int:
    """Domain of a normalized, non-NULL value."""
    return _FAST_TYPES.get(type(value), OTHER)


def compare(op: str, left: object, right: object) -> bool | None:
    """``left op right`` on normalized values, three-valued (None: unknown)."""
    if left is None or right is None:
        return None
    domain = domain_of(left)
    if domain != domain_of(right) or domain == OTHER:
        return False
    if domain == BOOL and op not in EQUALITY_OPS:
        return False
    return OPS[op](left, right)


def arith(op: str, left: object, right: object) -> object:
    """``left op right`` on normalized values; NULL unless both are numbers.

    Integers stay integers (``/`` truncates toward zero, as in Java); division by zero and
    NaN results are NULL.
    """
    if domain_of(left) != NUM or domain_of(right) != NUM:
        return None
    if op == "+":
        result = left + right  # type: ignore[operator]
    elif op == "-":
        result = left - right  # type: ignore[operator]
    elif op == "*":
        result = left * right  # type: ignore[operator]
    else:
        if right == 0:
            return None
        if type(left) is int and type(right) is int:
            quotient = abs(left) // abs(right)
            return quotient if (left >= 0) == (right >= 0) else -quotient
        result = left / right  # type: ignore[operator]
    return None if result != result else result


def negate(value: object) -> object:
    """Unary minus; NULL unless a number."""
    return -value if domain_of(value) == NUM else None  # type: ignore[operator]


def like_prefix(pattern: str, escape: str | None) -> tuple[str, bool] | None:
    """``(text, any_suffix)`` when a LIKE pattern is literal text, optionally followed by
    ``%`` only (``'IB%'`` -> ``('IB', True)``, ``'IBM'`` -> ``('IBM', False)``); None when it
    has ``_`` or a ``%`` before its end."""
    literal: list[str] = []
    chars = iter(pattern)
    for ch in chars:
        if escape is not None and ch == escape:
            nxt = next(chars, None)
            if nxt is None:
                return None
            literal.append(nxt)
        elif ch == "_":
            return None
        elif ch == "%":
            rest = "".join(chars)
            return ("".join(literal), True) if rest.strip("%") == "" else None
        else:
            literal.append(ch)
    return "".join(literal), False


def like_regex(pattern: str, escape: str | None) -> re.Pattern[str]:
    """The compiled regular expression of a LIKE pattern (whole-value match).

    ``_`` matches one character, ``%`` any run; the escape character makes the next
    character (``_``, ``%`` or itself) literal. Raises ValueError on a trailing escape.
    """
    parts: list[str] = []
    chars = iter(pattern)
    for ch in chars:
        if escape is not None and ch == escape:
            nxt = next(chars, None)
            if nxt is None:
                raise ValueError("the pattern ends with its escape character")
            parts.append(re.escape(nxt))
        elif ch == "%":
            parts.append(".*")
        elif ch == "_":
            parts.append(".")
        else:
            parts.append(re.escape(ch))
    return re.compile("".join(parts), re.DOTALL)
