"""Random selectors and events for the differential tests (seeded, reproducible).

Selectors use every construct of the language over a few attributes, with literals of the
right and the wrong types; events hold random subsets of the attributes with numbers (ints
and floats that collide with the literals), strings, booleans, None and NaN.
"""

from __future__ import annotations

import random

NUMERIC = ("x", "y", "z")
TEXT = ("s", "t")
BOOLEAN = ("flag",)
ATTRS = NUMERIC + TEXT + BOOLEAN
NUMBERS = (-2, -1, 0, 1, 2, 3, 2.5, 10)
WORDS = ("", "a", "ab", "abc", "b", "ba", "IBM", "x_y", "x%y")
PATTERNS = ("a%", "%b", "_b%", "a_c", "%", "x\\_y", "x\\%%", "ab")
OPS = ("=", "<>", "<", ">", "<=", ">=")


def _number(rng: random.Random) -> str:
    value = rng.choice(NUMBERS)
    return str(value) if value >= 0 or rng.random() < 0.5 else f"-{-value}"


def _word(rng: random.Random) -> str:
    return "'" + rng.choice(WORDS).replace("'", "''") + "'"


def _literal_for(attr: str, rng: random.Random) -> str:
    """Mostly a literal of the attribute's type, sometimes another type."""
    roll = rng.random()
    if attr in TEXT:
        return _word(rng) if roll < 0.85 else _number(rng)
    if attr in BOOLEAN:
        return rng.choice(("TRUE", "FALSE"))
    return _number(rng) if roll < 0.85 else _word(rng)


def predicate(rng: random.Random) -> str:
    attr = rng.choice(ATTRS)
    roll = rng.random()
    if attr in BOOLEAN:
        return rng.choice((attr, f"{attr} = TRUE", f"{attr} <> FALSE", f"NOT {attr}",
                           f"{attr} IS NULL", f"TRUE = {attr}"))
    if roll < 0.40:
        op = rng.choice(OPS)
        literal = _literal_for(attr, rng)
        return f"{attr} {op} {literal}" if rng.random() < 0.8 else f"{literal} {op} {attr}"
    if roll < 0.52:
        neg = "NOT " if rng.random() < 0.4 else ""
        a, b = sorted((rng.choice(NUMBERS), rng.choice(NUMBERS)))
        if attr in TEXT and rng.random() < 0.7:
            w1, w2 = sorted((rng.choice(WORDS), rng.choice(WORDS)))
            return f"{attr} {neg}BETWEEN '{w1}' AND '{w2}'"
        return f"{attr} {neg}BETWEEN {a} AND {b}"
    if roll < 0.66:
        neg = "NOT " if rng.random() < 0.4 else ""
        if attr in TEXT:
            items = ", ".join(_word(rng) for _ in range(rng.randint(1, 4)))
        else:
            items = ", ".join(_number(rng) for _ in range(rng.randint(1, 4)))
        return f"{attr} {neg}IN ({items})"
    if roll < 0.76:
        neg = "NOT " if rng.random() < 0.4 else ""
        pattern = rng.choice(PATTERNS)
        escape = " ESCAPE '\\'" if "\\" in pattern else ""
        return f"{attr} {neg}LIKE '{pattern}'{escape}"
    if roll < 0.84:
        return f"{attr} IS {'NOT ' if rng.random() < 0.5 else ''}NULL"
    if roll < 0.90:  # residual: two properties, or arithmetic
        other = rng.choice(ATTRS)
        return rng.choice((f"{attr} {rng.choice(OPS)} {other}", f"{attr} + 1 > {other}",
                           f"{attr} * 2 <= {_number(rng)}", f"-{attr} < {other} / 2"))
    if roll < 0.93:
        return rng.choice(("TRUE", "FALSE", "1 = 1", "'a' = 1", "NULL_PROP IS NULL"))
    return f"{attr} {rng.choice(OPS)} {_literal_for(attr, rng)}"


def selector(rng: random.Random, depth: int = 0) -> str:
    """A random condition: predicates under AND/OR/NOT, nested up to depth 3."""
    roll = rng.random()
    if depth >= 3 or roll < 0.35:
        return predicate(rng)
    if roll < 0.45:
        return f"NOT ({selector(rng, depth + 1)})"
    op = " AND " if roll < 0.75 else " OR "
    items = [selector(rng, depth + 1) for _ in range(rng.randint(2, 4))]
    text = op.join(f"({item})" if rng.random() < 0.6 else item for item in items)
    return f"({text})" if depth and rng.random() < 0.5 else text


def value_for(attr: str, rng: random.Random) -> object:
    roll = rng.random()
    if roll < 0.06:
        return None
    if roll < 0.09:
        return float("nan")
    if roll < 0.16:  # a value of some other type
        return rng.choice((1, 2.5, "a", True, b"bytes"))
    if attr in TEXT:
        return rng.choice(WORDS)
    if attr in BOOLEAN:
        return rng.random() < 0.5
    value = rng.choice(NUMBERS)
    return float(value) if rng.random() < 0.3 else value


def event(rng: random.Random) -> dict[str, object]:
    return {a: value_for(a, rng) for a in ATTRS if rng.random() < 0.8}
