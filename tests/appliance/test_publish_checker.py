"""``pm.publish_checker`` (the per-tuple entitlement check of a batched registration) gives
the answers of the pattern algebra's ``matches`` for every form of pattern."""

from __future__ import annotations

import random

import pytest

from appliance.control.pm import Entitlements, publish_checker
from datapath.topics.algebra import TopicError, matches

PATTERNS = ["#", "a/#", "a/b/#", "a/b", "a/+", "+/b/#", "a/+/c", "#/c", "a/#/c", "+", "a//#",
            "/#", "a/b/c/d"]
LEVELS = ["a", "b", "c", "d", "", "ab"]


def topics(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["/".join(rng.choice(LEVELS) for _ in range(rng.randint(1, 5))) for _ in range(n)]


@pytest.mark.parametrize("size", [1, 2, 3])
def test_the_checker_answers_as_the_algebra_does(size: int) -> None:
    rng = random.Random(size)
    for _ in range(200):
        patterns = tuple(rng.sample(PATTERNS, size))
        check = publish_checker(patterns)
        for topic in topics(40, rng.randrange(1 << 30)):
            try:
                expected = any(matches(p, topic) for p in patterns)
            except TopicError:  # (the empty topic): refused by both
                with pytest.raises(TopicError):
                    check(topic)
                continue
            assert check(topic) == expected, (patterns, topic)


def test_a_pattern_is_not_a_topic_and_no_entitlement_allows_nothing() -> None:
    with pytest.raises(TopicError):
        publish_checker(("a/#",))("a/+")
    assert not publish_checker(())("a/b")
    ents = Entitlements(("a/#", "x"), ())
    assert ents.may_publish("a") and ents.may_publish("a/b/c") and ents.may_publish("x")
    assert not ents.may_publish("ab") and not ents.may_publish("x/y")
