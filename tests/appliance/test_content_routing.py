"""Content routing's pure parts: the rendezvous ring, popularity, key choice."""

import pytest

from appliance.control.content_routing import (
    AttributeCounts,
    RendezvousRing,
    carried_attributes,
    event_keys,
    rendezvous_key,
)


def test_the_ring_is_deterministic_and_moves_few_keys_when_a_core_joins():
    cores = [f"core{i}" for i in range(16)]
    ring, again = RendezvousRing(cores), RendezvousRing(reversed(cores))
    keys = [f"attr{i}" for i in range(2000)]
    assert [ring.core_of(k) for k in keys] == [again.core_of(k) for k in keys]
    owners = {ring.core_of(k) for k in keys}
    assert owners == set(cores)  # every core holds some keys
    bigger = RendezvousRing([*cores, "core16"])
    moved = [k for k in keys if ring.core_of(k) != bigger.core_of(k)]
    assert all(bigger.core_of(k) == "core16" for k in moved)
    assert len(moved) < len(keys) / 8
    with pytest.raises(ValueError, match="content routing: .* at least one core"):
        RendezvousRing([])


def test_popular_set_is_the_attributes_above_the_share_of_merged_counts():
    one, two = AttributeCounts(), AttributeCounts()
    for _ in range(6):
        one.observe(["a", "b"])
    for _ in range(4):
        two.observe(["a", "c"])
    one.merge(two)
    assert one.events == 10 and one.share("a") == 1.0 and one.share("b") == 0.6
    assert one.popular(0.5) == {"a", "b"} and one.popular(0.6) == {"a"}
    assert carried_attributes({"a": 1, "b": None, "c": float("nan"), "d": "x"}) == ["a", "d"]


def test_a_subscription_prefers_a_required_popular_attribute_then_the_rarest():
    counts = {"a": 100, "b": 90, "c": 5, "d": 2}
    popular = frozenset({"a", "b"})
    assert rendezvous_key({"a", "b", "c"}, popular, counts, 1) == "b"
    assert rendezvous_key({"c", "d"}, popular, counts, 1) == "d"
    assert rendezvous_key(set(), popular, counts, 1) is None
    assert event_keys(["a", "c", "z"], frozenset({"a", "b", "c"})) == {"a", "c"}
    # equal candidates spread over subscriptions
    even = {"x": 10, "y": 10}
    chosen = {rendezvous_key({"x", "y"}, frozenset(even), even, s) for s in range(50)}
    assert chosen == {"x", "y"}
