"""SelectorIndex (seed 003's shared-list algorithm) returns exactly what evaluating every
selector on its own returns."""

import random

import pytest

from nic_offload.selectors import (
    SelectorError,
    SelectorIndex,
    SelectorSyntaxError,
    compile_selector,
)
from tests.nic_offload.selectors import generate

# seed 003's example selectors (figure 1's book shop)
S1 = "(BookName = 'java basis') OR (NumberOfBuys > 50) AND (Price < 20)"
S2 = "(BookName = 'c++ basis') AND (NumberOfBuys > 40) OR (author = 'smith')"
S3 = "(BookName = 'java basis') OR (NumberOfBuys > 40) OR (author = 'smith')"


def reference(selectors, event):
    return {sub for sub, text in selectors.items() if compile_selector(text).evaluate(event)}


def test_seed_003_example_selectors_match_as_written():
    index = SelectorIndex()
    for sub, text in (("S1", S1), ("S2", S2), ("S3", S3)):
        index.add(sub, text)
    assert index.match({"BookName": "java basis", "NumberOfBuys": 10, "Price": 30}) == {
        "S1", "S3"}
    assert index.match({"BookName": "c++ basis", "NumberOfBuys": 45, "Price": 30}) == {
        "S2", "S3"}
    assert index.match({"BookName": "x", "NumberOfBuys": 60, "Price": 10}) == {"S1", "S3"}
    assert index.match({"author": "smith"}) == {"S2", "S3"}
    assert index.match({"BookName": "x", "NumberOfBuys": 1, "Price": 10}) == set()


def test_identical_predicates_and_selectors_are_shared():
    index = SelectorIndex()
    for sub in range(100):
        index.add(sub, f"price > {sub % 10} AND symbol = 'IBM'")
    stats = index.stats()
    assert stats["subscribers"] == 100 and stats["selectors"] == 10
    assert stats["predicates"] == 11  # ten distinct 'price >' constants and one 'symbol ='
    assert stats["anchored"] == 10 and stats["always"] == 0
    assert index.match({"price": 5, "symbol": "IBM"}) == {s for s in range(100) if s % 10 < 5}


def test_add_replaces_and_remove_withdraws_a_subscribers_selector():
    index = SelectorIndex()
    index.add("a", "x = 1")
    index.add("b", "x = 1")
    assert index.match({"x": 1}) == {"a", "b"}
    index.add("a", "x = 2")
    assert index.match({"x": 1}) == {"b"} and index.match({"x": 2}) == {"a"}
    index.remove("b")
    assert index.match({"x": 1}) == set() and len(index) == 1 and "b" not in index
    with pytest.raises(SelectorError, match="subscriber 'b' has no selector"):
        index.remove("b")


def test_an_invalid_selector_leaves_the_index_unchanged():
    index = SelectorIndex()
    index.add("a", "x = 1")
    with pytest.raises(SelectorSyntaxError):
        index.add("a", "x = ")
    assert index.selector("a").text == "x = 1" and index.match({"x": 1}) == {"a"}


def test_selectors_that_cannot_be_true_are_never_visited_and_true_ones_always():
    index = SelectorIndex()
    index.add("never", "FALSE AND x = 1")
    index.add("unknown", "x = 1 AND 1 / 0 > 1")
    index.add("all", "")
    assert index.stats()["always"] == 1
    assert index.match({"x": 1}) == {"all"} and index.match({}) == {"all"}


def test_range_anchors_find_only_selectors_whose_range_holds():
    index = SelectorIndex()
    texts = {f"lt{c}": f"price < {c}" for c in range(10)}
    texts |= {f"ge{c}": f"price >= {c} AND qty > 0" for c in range(10)}
    texts |= {f"bt{c}": f"price BETWEEN {c} AND {c + 2}" for c in range(10)}
    for sub, text in texts.items():
        index.add(sub, text)
    assert index.stats()["always"] == 0
    for price in (-1, 0, 4, 4.5, 9, 12):
        event = {"price": price, "qty": 1}
        assert index.match(event) == reference(texts, event)


def test_numbers_booleans_and_strings_do_not_mix_in_the_lists():
    texts = {"one": "x = 1", "true": "x = TRUE", "str": "x = '1'", "ne": "x <> 1",
             "in": "x IN (1, 2)", "notin": "x NOT IN ('1')", "float": "x = 1.0"}
    index = SelectorIndex()
    for sub, text in texts.items():
        index.add(sub, text)
    for value in (1, 1.0, True, "1", 2, None, b"1"):
        assert index.match({"x": value}) == reference(texts, {"x": value}), value


@pytest.mark.parametrize("seed", range(4))
def test_shared_lists_match_exactly_the_selectors_that_evaluate_true(seed):
    rng = random.Random(seed)
    selectors = {sub: generate.selector(rng) for sub in range(300)}
    index = SelectorIndex()
    for sub, text in selectors.items():
        index.add(sub, text)
    compiled = {sub: compile_selector(text) for sub, text in selectors.items()}
    matched_any = 0
    for _ in range(250):
        event = generate.event(rng)
        expected = {sub for sub, sel in compiled.items() if sel.evaluate(event)}
        assert index.match(event) == expected, event
        matched_any += bool(expected)
    assert matched_any > 200  # the workload is not trivially empty
    for sub in range(0, 300, 3):  # removal keeps the rest exact
        index.remove(sub)
        del compiled[sub]
    for _ in range(50):
        event = generate.event(rng)
        assert index.match(event) == {s for s, sel in compiled.items() if sel.evaluate(event)}
