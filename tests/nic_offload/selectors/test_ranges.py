"""to_ranges / to_raw_ranges: exact per-field intervals, or a clear refusal."""

import random

import pytest

from nic_offload.schema import Schema
from nic_offload.selectors import NotOffloadableError, compile_selector
from nic_offload.selectors.ranges import Interval, to_ranges, to_raw_ranges
from tests.nic_offload.selectors import generate

QUOTE = Schema.of("quote", 7, [("price", 0, "u32"), ("qty", 4, "i16"), ("flags", 6, "u8"),
                               ("symbol", 8, "ascii", 4), ("px", 16, "f64")])


def test_a_conjunction_of_field_conditions_becomes_one_interval_per_field():
    ranges = to_ranges("price > 5 AND price <= 10 AND symbol IN ('IBM', 'AAPL')")
    assert ranges.fields == {
        "price": (Interval(5, 10, low_closed=False),),
        "symbol": (Interval("AAPL", "AAPL"), Interval("IBM", "IBM")),
    }
    assert ranges.domains == {"price": "number", "symbol": "string"}


def test_or_on_one_field_and_not_forms_give_disjoint_sorted_intervals():
    ranges = to_ranges("x BETWEEN 8 AND 9 OR x IN (1, 3) OR x BETWEEN 2 AND 3.5")
    assert ranges.fields["x"] == (Interval(1, 1), Interval(2, 3.5), Interval(8, 9))
    assert to_ranges("x NOT BETWEEN 2 AND 4").fields["x"] == (
        Interval(None, 2, high_closed=False), Interval(4, None, low_closed=False))
    assert to_ranges("x <> 5").fields["x"] == (
        Interval(None, 5, high_closed=False), Interval(5, None, low_closed=False))


def test_contradictions_match_nothing_and_the_empty_selector_everything():
    assert to_ranges("x > 5 AND x < 3").matches_nothing
    assert to_ranges("x = 'a' AND x = 1").matches_nothing
    assert to_ranges("FALSE").matches_nothing and to_ranges("FALSE").never
    everything = to_ranges("")
    assert everything.fields == {} and not everything.matches_nothing


@pytest.mark.parametrize("text, reason", [
    ("s LIKE '%a'", "LIKE"),
    ("s LIKE 'a_c'", "LIKE"),
    ("a = 1 OR b = 2", "OR joins conditions on different fields (a, b)"),
    ("a IS NULL", "IS NULL"),
    ("a IS NOT NULL", "IS NOT NULL"),
    ("flag", "boolean"),
    ("a > b", "compares properties with each other"),
    ("a + 1 > 2", "arithmetic"),
    ("NOT a > 5", "add a condition fixing its type"),
    ("a = 1 OR a = 'x'", "numbers and strings"),
])
def test_what_ranges_cannot_say_is_refused_with_the_reason(text, reason):
    assert to_ranges(text) is None
    with pytest.raises(NotOffloadableError, match="evaluates it in software") as info:
        to_ranges(text, strict=True)
    assert reason in str(info.value)
    assert str(info.value).startswith(f"selectors: selector {text!r} cannot become ACL ranges")


def test_a_like_prefix_is_a_string_range_and_literal_text_an_equality():
    assert to_ranges("s LIKE 'IB%'").fields["s"] == (Interval("IB", "IC", high_closed=False),)
    assert to_ranges(r"s LIKE 'a\%' ESCAPE '\'").fields["s"] == (Interval("a%", "a%"),)
    raw = to_raw_ranges("symbol LIKE 'IB%'", QUOTE)
    assert raw.fields["symbol"] == ((int.from_bytes(b"IB\0\0", "big"),
                                     int.from_bytes(b"IC\0\0", "big") - 1),)


def test_a_negation_is_expressible_beside_a_condition_that_fixes_the_type():
    assert to_ranges("a >= 0 AND NOT a > 5").fields["a"] == (Interval(0, 5),)


@pytest.mark.parametrize("seed", range(3))
def test_value_ranges_agree_with_the_evaluator_on_random_selectors(seed):
    rng = random.Random(seed)
    expressible = 0
    for _ in range(400):
        text = generate.selector(rng)
        ranges = to_ranges(text)
        if ranges is None:
            continue
        expressible += 1
        selector = compile_selector(text)
        for _ in range(40):
            event = generate.event(rng)
            assert ranges.matches(event) == selector.evaluate(event), (text, event)
    assert expressible > 40


def test_raw_ranges_of_integer_and_text_fields():
    raw = to_raw_ranges("price > 5.5 AND qty BETWEEN -2 AND 1 AND symbol < 'M'", QUOTE)
    assert raw.fields == {
        "price": ((6, 2**32 - 1),),
        "qty": ((0, 1), (2**16 - 2, 2**16 - 1)),   # two's complement: negatives on top
        "symbol": ((0, int.from_bytes(b"M\0\0\0", "big") - 1),),
    }
    assert to_raw_ranges("NOT price > 5", QUOTE).fields == {"price": ((0, 5),)}
    assert to_raw_ranges("flags = 300", QUOTE).matches_nothing  # outside u8
    assert to_raw_ranges("symbol = 'IBM'", QUOTE).fields["symbol"] == (
        (int.from_bytes(b"IBM\0", "big"),) * 2,)


@pytest.mark.parametrize("text, reason", [
    ("px > 1", "cannot be compared by an offload table"),
    ("vendor = 1", "not a field of schema 'quote'"),
    ("symbol = 'TOOLONG'", "at most 4 bytes"),
])
def test_raw_ranges_refuse_what_the_tables_cannot_read(text, reason):
    assert to_raw_ranges(text, QUOTE) is None
    with pytest.raises(NotOffloadableError, match=reason):
        to_raw_ranges(text, QUOTE, strict=True)


def _field_selector(rng, depth=0):
    if depth < 2 and rng.random() < 0.4:
        op = " AND " if rng.random() < 0.6 else " OR "
        return op.join(f"({_field_selector(rng, depth + 1)})" for _ in range(2))
    name = rng.choice(("price", "qty", "flags", "symbol"))
    if name == "symbol":
        words = ("", "A", "AB", "IBM", "M", "ZZZZ", "B")
        lit = lambda: "'" + rng.choice(words) + "'"  # noqa: E731
    else:
        numbers = (-40000, -2, -1, 0, 1, 2.5, 7, 255, 256, 70000)
        lit = lambda: str(rng.choice(numbers))  # noqa: E731
    neg = "NOT " if rng.random() < 0.3 else ""
    if name == "symbol" and rng.random() < 0.25:
        return f"symbol {neg}LIKE '{rng.choice(('A', 'AB', 'I', 'Z', 'ZZZZ', ''))}%'"
    form = rng.randrange(4)
    if form == 0:
        return f"{neg}{name} {rng.choice(generate.OPS)} {lit()}"
    if form == 1:
        return f"{name} {neg}BETWEEN {lit()} AND {lit()}"
    if form == 2:
        return f"{name} {neg}IN ({lit()}, {lit()})"
    return f"{neg}({name} {rng.choice(generate.OPS)} {lit()})"


def _payload(rng):
    edge = {"price": (0, 1, 2, 7, 255, 256, 2**32 - 1), "qty": (-32768, -2, -1, 0, 1, 7, 32767),
            "flags": (0, 1, 2, 7, 255)}
    values = {name: rng.choice(options) for name, options in edge.items()}
    values["symbol"] = rng.choice(("", "A", "AB", "IBM", "M", "ZZZZ", "B", "AAAA"))
    return QUOTE.encode(values)


@pytest.mark.parametrize("seed", range(3))
def test_raw_ranges_agree_with_the_evaluator_on_decoded_payloads(seed):
    rng = random.Random(seed)
    checked = 0
    for _ in range(150):
        text = _field_selector(rng)
        raw = to_raw_ranges(text, QUOTE)
        if raw is None:
            continue
        selector = compile_selector(text)
        for _ in range(30):
            payload = _payload(rng)
            values = {f.name: f.read_raw(payload) for f in QUOTE.fields if f.name != "px"}
            assert raw.matches(values) == selector.evaluate(QUOTE.decode(payload)), text
            checked += 1
    assert checked > 1500
