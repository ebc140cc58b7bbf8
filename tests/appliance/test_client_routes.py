"""``appliance.client.routes.Routes``: the subscriptions a received topic goes to, found by
lookup for plain patterns and by test for wildcard ones, against a pass over every
subscription (what ``Client._targets`` did before), on generated subscriptions."""

from __future__ import annotations

import random
from types import SimpleNamespace

from appliance.client.routes import Routes
from datapath.topics.algebra import matches

LEVELS = ("a", "b", "c")


def _pattern(rng: random.Random) -> str:
    levels = [rng.choice(LEVELS + ("+", "#") if rng.random() < 0.3 else LEVELS)
              for _ in range(rng.randint(1, 3))]
    return "/".join(levels)


def _topics() -> list[str]:
    out = list(LEVELS)
    for _ in range(2):
        out += [f"{t}/{x}" for t in out for x in LEVELS]
    return sorted(set(out))


def _naive(subs: list, namespace: int, topic: str) -> list:
    return [s for s in subs if s.namespace == namespace and matches(s.pattern, topic)]


def test_routes_find_what_a_pass_over_every_subscription_finds_in_its_order():
    rng = random.Random(7)
    topics = _topics()
    for _ in range(200):
        subs = [SimpleNamespace(pattern=_pattern(rng), namespace=rng.randint(0, 1))
                for _ in range(rng.randint(0, 12))]
        split = rng.randint(0, len(subs))
        routes = Routes(subs[:split])  # made from some, then added to (subscribe_many)
        routes.add(subs[split:])
        for namespace in (0, 1):
            for topic in topics:
                assert routes.matching(namespace, topic) == _naive(subs, namespace, topic), (
                    [(s.pattern, s.namespace) for s in subs], namespace, topic)


def test_a_plain_pattern_held_twice_routes_both_subscriptions():
    first, wild, second = (SimpleNamespace(pattern=p, namespace=0)
                           for p in ("x/1", "x/+", "x/1"))
    routes = Routes([first, wild, second])
    assert routes.matching(0, "x/1") == [first, wild, second]
    assert routes.matching(0, "x/2") == [wild]
    assert routes.matching(1, "x/1") == []
