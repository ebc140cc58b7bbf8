"""The topic algebra is exact: checked against seed 000's figures and brute-force enumeration."""

import itertools
import re

import pytest

from datapath.config import MAX_TOPIC_BYTES, MAX_TOPIC_LEVELS
from datapath.topics import algebra
from datapath.topics.algebra import (
    TopicError,
    includes,
    is_pattern,
    matches,
    normalize_pattern,
    overlap_example,
    overlaps,
    seed_example,
    seed_overlaps,
    split_pattern,
    split_topic,
)

# --- seed 000, figure 2: topicIncludes(x, y) with x = 'a/#' -----------------------------


@pytest.mark.parametrize("y, expected", [
    ("a/+", True), ("a/#", True), ("b", False), ("#/a", False), ("#", False)])
def test_figure_2_includes_examples(y, expected):
    assert includes("a/#", y) is expected


# --- seed 000, figure 3: topicOverlaps(x, y) with x = 'a/+' -----------------------------


@pytest.mark.parametrize("y, expected", [
    ("+/a", True), ("a/b", True), ("a/#", True), ("b/#", False)])
def test_figure_3_overlaps_examples(y, expected):
    assert overlaps("a/+", y) is expected
    example = overlap_example("a/+", y)
    assert (example is not None) is expected
    if example is not None:
        assert matches("a/+", example) and matches(y, example)


def test_seed_example_construction_agrees_with_figure_3():
    # The seed builds an example of topic2 from topic1, then tests it against topic1.
    for y, expected in [("+/a", True), ("a/b", True), ("b/#", False)]:
        example = seed_example("a/+", y)
        assert matches("a/+", example) is expected


def test_seed_example_construction_is_not_exact_in_general():
    # For x='+/+/c', y='#/c' the seed's construction drops '#' and builds 'c', which x does
    # not match, although three-level topics such as 'xxx/xxx/c' are in both.
    assert overlaps("+/+/c", "#/c")
    assert not matches("+/+/c", seed_example("+/+/c", "#/c"))
    example = overlap_example("+/+/c", "#/c")
    assert example.count("/") == 2 and matches("+/+/c", example) and matches("#/c", example)


def test_seed_overlaps_is_sound_but_incomplete():
    # Whenever the seed's test says "overlap" the exact method agrees (its example lies in
    # both); the converse fails on the counterexample above.
    pairs = [("a/+", y) for y in ("+/a", "a/b", "a/#", "b/#")] + [("+/+/c", "#/c")]
    for x, y in pairs:
        if seed_overlaps(x, y):
            assert overlaps(x, y)
    assert seed_overlaps("a/+", "+/a") and not seed_overlaps("a/+", "b/#")
    assert overlaps("#/c", "+/+/c") and not seed_overlaps("#/c", "+/+/c")


def test_includes_refuses_past_its_state_bound_instead_of_running_for_ever(monkeypatch):
    # '#/a/+/.../+' makes the subset construction track where recent 'a' levels were; the
    # antichain keeps that small here (a few hundred states), so with a bound below that the
    # pair is refused with a clear error, and with the default bound it is decided.
    k = 12
    x = "#/a/" + "/".join(["+"] * k)
    y = "a/#/a/" + "/".join(["+"] * k)
    monkeypatch.setattr(algebra, "INCLUDES_STATE_LIMIT", 100)
    algebra.includes_levels.cache_clear()
    with pytest.raises(TopicError, match="cannot compare"):
        includes(x, y)
    monkeypatch.undo()
    assert includes(x, y) and not includes(y, x)


# --- exactness where naive level-by-level matching fails ----------------------------------


@pytest.mark.parametrize("x, y", [
    ("+/#", "#/+"), ("#/+", "+/#"), ("#/+/#", "#/b/#"), ("#/a/#", "a/#"), ("+/#", "#"),
    ("#", "+/#"), ("a/#/b", "a/#/b/#/b"), ("#/#", "#")])
def test_includes_is_exact_where_symbolic_matching_is_not(x, y):
    assert includes(x, y)


@pytest.mark.parametrize("x, y", [("a/#", "#/a"), ("+/+", "+/#"), ("#/a/#", "+/#")])
def test_includes_refuses_strict_supersets(x, y):
    assert not includes(x, y)


# --- brute force ---------------------------------------------------------------------------
# Patterns: every sequence of 1..3 levels over {a, b, '' (empty level), +, #}. Topics: every
# sequence of 1..6 levels over {a, b, '', c}, where 'c' occurs in no pattern and stands for
# any other level name. Why 6 is enough: a pattern of at most 3 levels reads at most 3 levels
# one by one; every further level of a topic is absorbed by some '#'. If two such patterns
# disagree on a topic, deleting absorbed levels keeps the disagreement as long as each '#'
# keeps what the other pattern needs, which never takes more than 3 + 3 levels.

NAMES = ("a", "b", "")
LEVELS = (*NAMES, "+", "#")
MAX_LEN = 6
# ('',) would be the empty string, which is not a topic or pattern.
TOPICS = [tuple(t) for n in range(1, MAX_LEN + 1)
          for t in itertools.product((*NAMES, "c"), repeat=n) if t != ("",)]
PATTERNS = sorted({p for n in range(1, 4) for p in itertools.product(LEVELS, repeat=n)
                   if p != ("",)})


def _denote(pattern, topic):
    """Reference semantics, independent of the automata: '#' absorbs 0..n levels, '+' one."""
    if not pattern:
        return not topic
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_denote(rest, topic[i:]) for i in range(len(topic) + 1))
    if not topic:
        return False
    return (head == "+" or head == topic[0]) and _denote(rest, topic[1:])


SETS = {p: frozenset(t for t in TOPICS if _denote(p, t)) for p in PATTERNS}


def test_matches_agrees_with_the_reference_semantics_on_every_pair():
    for p in PATTERNS:
        pattern = "/".join(p)
        for t in TOPICS[::7]:
            assert matches(pattern, "/".join(t)) is _denote(p, t), (pattern, t)


def test_includes_and_overlaps_agree_with_set_inclusion_and_intersection():
    for x, y in itertools.product(PATTERNS, repeat=2):
        sx, sy = SETS[x], SETS[y]
        px, py = "/".join(x), "/".join(y)
        assert includes(px, py) is (sy <= sx), (px, py)
        assert overlaps(px, py) is bool(sx & sy), (px, py)


def test_overlap_examples_are_in_both_sets():
    for x, y in itertools.product(PATTERNS[::3], repeat=2):
        example = overlap_example("/".join(x), "/".join(y))
        if example is not None:
            assert matches("/".join(x), example) and matches("/".join(y), example)


def test_normalizing_a_pattern_keeps_the_set_it_denotes():
    for p in PATTERNS:
        text = "/".join(p)
        norm = normalize_pattern(text)
        assert includes(text, norm) and includes(norm, text)
        assert "#/+" not in norm and "#/#" not in norm


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("pattern, message", [
    ("", "at least one character"),
    ("a/b#", "write 'a/b/#'"),
    ("a+/c", "write 'a/+/c'"),
    ("a\x00b", "NUL"),
    ("a/" * MAX_TOPIC_LEVELS + "a", "levels"),
    ("x" * (MAX_TOPIC_BYTES + 1), "bytes"),
])
def test_invalid_patterns_are_refused_with_a_clear_message(pattern, message):
    with pytest.raises(TopicError, match=re.escape(message)):
        split_pattern(pattern)


def test_a_published_topic_cannot_hold_a_wildcard():
    with pytest.raises(TopicError, match="may appear only in subscription patterns"):
        split_topic("a/+/b")


def test_empty_levels_are_levels_that_plus_matches():
    assert split_topic("a//b") == ("a", "", "b")
    assert split_topic("/a") == ("", "a")
    assert matches("a/+/b", "a//b") and matches("+/a", "/a")
    assert not matches("a/b", "a//b")


def test_hash_matches_zero_levels_anywhere():
    assert matches("a/#", "a") and matches("#/a", "a") and matches("a/#/b", "a/b")
    assert is_pattern("a/#") and not is_pattern("a/b")


def test_errors_name_the_component():
    with pytest.raises(TopicError, match=r"^topics: "):
        matches("a/b#", "a/b")
