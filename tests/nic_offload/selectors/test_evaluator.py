"""The reference evaluator: JMS selector semantics, three-valued logic included."""

import math

import numpy as np
import pytest

from nic_offload.selectors import compile_selector

QUOTE = {"symbol": "IBM", "price": 101.25, "qty": 300, "venue": "nyse", "urgent": True}


def truth(text, event):
    return compile_selector(text).evaluate3(event)


@pytest.mark.parametrize("text, expected", [
    ("price > 100", True),
    ("price > 101.25", False),
    ("qty = 300.0", True),                    # exact and approximate numbers compare
    ("symbol = 'IBM' AND qty >= 300", True),
    ("symbol <> 'IBM' OR price < 100", False),
    ("qty BETWEEN 100 AND 300", True),
    ("qty NOT BETWEEN 100 AND 300", False),
    ("venue IN ('nyse', 'arca')", True),
    ("venue NOT IN ('nyse', 'arca')", False),
    ("qty IN (100, 300)", True),
    ("symbol LIKE 'I_M'", True),
    ("symbol LIKE 'i%'", False),              # LIKE is case-sensitive
    ("symbol NOT LIKE '%X%'", True),
    ("urgent", True),
    ("NOT urgent", False),
    ("urgent = TRUE AND urgent <> FALSE", True),
    ("qty * 2 + 1 = 601 AND qty / 7 = 42", True),  # exact numerics divide like Java longs
    ("price / 2 > 50.6", True),
    ("-qty < -299", True),
    ("symbol IS NOT NULL AND missing IS NULL", True),
    ("'IBM' = symbol", True),
    ("300 <= qty", True),
    ("venue > 'nasdaq' AND venue < 'nysf'", True),  # strings order by code point
])
def test_selectors_over_a_quote(text, expected):
    assert compile_selector(text).evaluate(QUOTE) is expected


@pytest.mark.parametrize("text", [
    "missing = 1", "missing <> 1", "missing > 1", "missing BETWEEN 1 AND 2",
    "missing NOT BETWEEN 1 AND 2", "missing IN ('a')", "missing NOT IN ('a')",
    "missing LIKE 'a%'", "missing NOT LIKE 'a%'", "missing", "NOT missing", "missing + 1 > 0",
    "NOT (missing = 1)", "qty = missing",
])
def test_a_null_property_makes_every_comparison_unknown(text):
    assert truth(text, QUOTE) is None
    assert compile_selector(text).evaluate(QUOTE) is False


@pytest.mark.parametrize("text, expected", [
    ("missing = 1 AND qty = 300", None),
    ("missing = 1 AND qty = 1", False),       # FALSE AND UNKNOWN is FALSE
    ("missing = 1 OR qty = 300", True),       # TRUE OR UNKNOWN is TRUE
    ("missing = 1 OR qty = 1", None),
    ("NOT (missing = 1 OR qty = 1)", None),
    ("NOT (missing = 1 AND qty = 1)", True),
])
def test_and_or_not_follow_the_three_valued_truth_tables(text, expected):
    assert truth(text, QUOTE) is expected


@pytest.mark.parametrize("text, expected", [
    ("symbol = 5", False), ("symbol <> 5", False), ("symbol > 5", False),
    ("NOT (symbol = 5)", True), ("qty = '300'", False), ("qty <> '300'", False),
    ("qty IN ('300')", False), ("qty NOT IN ('300')", False), ("symbol IN (1, 2)", False),
    ("qty LIKE '3%'", False), ("qty NOT LIKE '3%'", False), ("NOT (qty LIKE '3%')", True),
    ("symbol BETWEEN 1 AND 5", False), ("symbol NOT BETWEEN 1 AND 5", False),
    ("urgent = 1", False), ("symbol", False), ("NOT symbol", True),
])
def test_comparing_values_of_different_types_is_false(text, expected):
    assert truth(text, QUOTE) is expected


def test_ordering_booleans_held_in_properties_is_false():
    assert truth("urgent > flag", {"urgent": True, "flag": False}) is False
    assert truth("urgent = flag", {"urgent": True, "flag": True}) is True


def test_like_wildcards_and_escape():
    event = {"s": "50%_off\nnow"}
    assert compile_selector(r"s LIKE '50!%!_off%' ESCAPE '!'").evaluate(event)
    assert not compile_selector(r"s LIKE '50!%!_of' ESCAPE '!'").evaluate(event)
    assert compile_selector("s LIKE '5__%w'").evaluate(event)  # % spans the newline
    assert compile_selector("s LIKE '%.%'").evaluate({"s": "a.b"})  # regex characters are literal
    assert not compile_selector("s LIKE '%.%'").evaluate({"s": "ab"})


def test_event_values_are_normalized_from_numpy_and_nan_is_null():
    event = {"qty": np.int64(300), "price": np.float32(2.5), "flag": np.bool_(True),
             "nan": math.nan}
    assert compile_selector("qty = 300 AND price = 2.5 AND flag").evaluate(event)
    assert truth("nan = 1", event) is None and truth("nan IS NULL", event) is True


def test_values_of_other_types_compare_false_but_are_not_null():
    event = {"blob": b"IBM"}
    assert truth("blob = 'IBM'", event) is False and truth("blob IS NULL", event) is False


def test_arithmetic_on_non_numbers_and_division_by_zero_give_null():
    assert truth("s + 1 > 0", {"s": "a"}) is None
    assert truth("qty / 0 > 0", {"qty": 3}) is None
    assert truth("qty / 0.0 > 0", {"qty": 3}) is None
    assert truth("-7 / 2 = -3", {}) is True  # truncation toward zero


def test_literal_only_selectors_are_constant():
    assert compile_selector("TRUE").evaluate({}) and not compile_selector("FALSE").evaluate({})
    assert compile_selector("1 < 2 AND 'a' = 'a'").evaluate({})
    assert compile_selector("").evaluate({})


def test_selector_reports_what_it_reads_and_is_cached_by_text():
    selector = compile_selector("a > 1 AND (b = 'x' OR c IS NULL)")
    assert selector.identifiers == {"a", "b", "c"}
    assert compile_selector("a > 1 AND (b = 'x' OR c IS NULL)") is selector
