"""TopicIndex and TopicCatalog against a linear scan with algebra.matches."""

import random

import pytest

from datapath.errors import UserError
from datapath.topics.algebra import TopicError, matches
from datapath.topics.index import TopicCatalog, TopicIndex

ALPHABET = ("a", "b", "")
WILD = ALPHABET + ("+", "#")


def _non_empty(rng, choices):
    # A single empty level would be the empty string, which is neither a topic nor a pattern.
    while True:
        text = "/".join(rng.choice(choices) for _ in range(rng.randint(1, 5)))
        if text:
            return text


def random_topic(rng):
    return _non_empty(rng, ALPHABET)


def random_pattern(rng):
    return _non_empty(rng, WILD)


def scan(subscriptions, topic):
    return {sub for pattern, sub in subscriptions if matches(pattern, topic)}


@pytest.mark.parametrize("cache_entries", [0, 3, 1000])
def test_match_equals_a_linear_scan_through_adds_and_removes(cache_entries):
    rng = random.Random(cache_entries)
    for _ in range(60):
        index = TopicIndex(cache_entries=cache_entries)
        live = set()
        for _ in range(rng.randint(1, 40)):
            if live and rng.random() < 0.3:
                pair = rng.choice(sorted(live))
                assert index.remove(*pair) is True
                live.discard(pair)
                assert index.remove(*pair) is False
            else:
                pair = (random_pattern(rng), rng.randrange(6))
                index.add(*pair)
                live.add(pair)
            for _ in range(4):
                topic = random_topic(rng)
                assert index.match(topic) == scan(live, topic), (topic, sorted(live))
            assert len(index) == len(live)
        assert sorted(set(index)) == sorted(live)
        assert index.patterns() == sorted({p for p, _ in live})


def test_readding_a_removed_subscription_matches_again():
    index = TopicIndex()
    index.add("a/#/b", "s")
    assert index.match("a/x/b") == {"s"}
    assert index.remove("a/#/b", "s")
    assert index.match("a/x/b") == set()
    assert len(index) == 0 and index.patterns() == []
    index.add("a/#/b", "s")
    assert index.match("a/x/b") == {"s"}


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("#/a", "a", True),
        ("#/a", "x/y/a", True),
        ("#/a", "a/x", False),
        ("a/#/b/#", "a/b", True),
        ("a/#/b/#", "a/x/y/b/z/w", True),
        ("a/#/b/#", "a/x/y/c", False),
        ("#/#", "a/b/c", True),
        ("a/+", "a/", True),
        ("a/+/b", "a//b", True),
        ("a/+/b", "a/b", False),
        ("#", "a/b", True),
        ("a/#", "a", True),
    ],
)
def test_hash_anywhere_and_empty_levels(pattern, topic, expected):
    index = TopicIndex()
    index.add(pattern, 1)
    assert (index.match(topic) == {1}) is expected
    assert matches(pattern, topic) is expected


def test_many_hashes_do_not_blow_up():
    index = TopicIndex(cache_entries=0)
    index.add("/".join(["#"] * 30 + ["z"]), "deep")
    index.add("/".join(["#", "a"] * 15), "alt")
    assert index.match("/".join(["a"] * 60 + ["z"])) == {"deep"}
    assert index.match("/".join(["a"] * 60)) == {"alt"}
    assert index.match("/".join(["b"] * 60)) == set()


def test_same_pattern_two_subscribers_and_same_subscriber_two_patterns():
    index = TopicIndex()
    index.add("a/+", "s1")
    index.add("a/+", "s2")
    index.add("a/b", "s1")
    index.add("a/b", "s1")  # an existing pair is a no-op
    assert len(index) == 3
    assert index.subscribers("a/+") == {"s1", "s2"}
    assert index.match("a/b") == {"s1", "s2"}
    assert index.remove("a/+", "s1")
    assert index.match("a/b") == {"s1", "s2"}  # s1 still matches through a/b
    assert index.match("a/c") == {"s2"}
    assert index.remove("a/b", "s1")
    assert index.match("a/b") == {"s2"}
    assert not index.remove("a/b", "s1")
    assert not index.remove("x/y", "s2")


def test_cached_results_change_after_add_and_remove():
    index = TopicIndex(cache_entries=16)
    index.add("a/b", 1)
    assert index.match("a/b") == {1}
    assert index.match("a/b") == {1}
    assert index.cache_hits == 1 and index.lookups == 2
    index.add("#/b", 2)  # wildcard: the cached entry is updated
    assert index.match("a/b") == {1, 2}
    index.add("a/b", 3)  # literal: the cached entry is updated
    assert index.match("a/b") == {1, 2, 3}
    assert index.remove("#/b", 2)
    assert index.match("a/b") == {1, 3}
    assert index.remove("a/b", 1)
    assert index.match("a/b") == {3}
    index.add("c", 4)  # not matching: the cached entry stays
    hits = index.cache_hits
    assert index.match("a/b") == {3}
    assert index.cache_hits == hits + 1


def test_returned_sets_are_copies():
    index = TopicIndex()
    index.add("a", 1)
    index.match("a").add(99)
    assert index.match("a") == {1}  # from the cache
    index.match("a").clear()
    assert index.match("a") == {1}


def test_cache_is_a_bounded_lru():
    index = TopicIndex(cache_entries=2)
    index.add("#", 0)
    for topic in ("x", "y", "x", "z"):  # z evicts y, the least recently used
        index.match(topic)
    assert index.stats()["cache_entries"] == 2
    hits = index.cache_hits
    index.match("x")
    assert index.cache_hits == hits + 1
    index.match("y")
    assert index.cache_hits == hits + 1


def test_a_disabled_cache_never_hits():
    index = TopicIndex(cache_entries=0)
    index.add("a", 1)
    for _ in range(3):
        assert index.match("a") == {1}
    assert index.cache_hits == 0 and index.lookups == 3


def test_refusals_are_user_errors():
    index = TopicIndex()
    with pytest.raises(TopicError):
        index.match("a/+")
    with pytest.raises(TopicError):
        index.match("a/#")
    with pytest.raises(UserError, match="topic-index: refused cache_entries=-1"):
        TopicIndex(cache_entries=-1)


# --- TopicCatalog --------------------------------------------------------------------------------
def test_catalog_matching_equals_a_linear_scan():
    rng = random.Random(7)
    for _ in range(80):
        catalog = TopicCatalog()
        registered = set()
        for _ in range(rng.randint(0, 50)):
            topic = random_topic(rng)
            assert catalog.add(topic) is (topic not in registered)
            registered.add(topic)
            if rng.random() < 0.25:
                gone = rng.choice(sorted(registered))
                assert catalog.remove(gone) is True
                assert catalog.remove(gone) is False
                registered.discard(gone)
        assert len(catalog) == len(registered)
        assert sorted(catalog) == sorted(registered)
        for topic in registered:
            assert topic in catalog
        for _ in range(15):
            pattern = random_pattern(rng)
            found = catalog.matching(pattern)
            assert len(found) == len(set(found)), pattern
            assert set(found) == {t for t in registered if matches(pattern, t)}, pattern


def test_catalog_keeps_a_topic_and_the_topics_below_it_apart():
    catalog = TopicCatalog(["a/b", "a/b/c", "a/b/c/d"])
    assert catalog.matching("a/b") == ["a/b"]
    assert sorted(catalog.matching("a/#")) == ["a/b", "a/b/c", "a/b/c/d"]
    assert catalog.remove("a/b/c")
    assert "a/b/c" not in catalog and "a/b/c/d" in catalog and "a/b" in catalog
    assert catalog.remove("a/b/c/d")
    assert catalog.matching("#") == ["a/b"]
    assert not catalog.remove("a")
    assert catalog.remove("a/b")
    assert len(catalog) == 0 and list(catalog) == [] and catalog.matching("#") == []


def test_catalog_leading_hash_follows_a_later_literal():
    topics = [f"r{r}/x{x}/s{s}/{f}" for r in range(3) for x in range(4) for s in range(20)
              for f in ("bid", "ask", "depth/1")]
    catalog = TopicCatalog(topics)
    assert len(catalog) == len(topics)
    assert sorted(catalog.matching("#/s7/depth/+")) == sorted(
        t for t in topics if "/s7/depth/" in t)
    assert sorted(catalog.matching("#/ask/#")) == sorted(t for t in topics if t.endswith("/ask"))
    assert catalog.matching("#/#/s3/#/nope") == []


def test_catalog_refuses_patterns_as_topics():
    catalog = TopicCatalog()
    with pytest.raises(TopicError):
        catalog.add("a/+")
    assert "a/+" not in catalog
    assert 42 not in catalog
