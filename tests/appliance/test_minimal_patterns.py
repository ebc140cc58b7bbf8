"""``minimal_patterns`` (index of witnesses) against the pairwise definition on random
pattern sets, and its cost on sets whose patterns all start with a wildcard."""

import random

from appliance.control.routing import minimal_patterns
from datapath.topics.algebra import includes


def pairwise(patterns):
    """The definition: p stays unless another q includes it (of equivalent ones, the
    smallest text stays)."""
    unique = sorted(set(patterns))
    return [p for p in unique
            if not any(q != p and includes(q, p) and (q < p or not includes(p, q))
                       for q in unique)]


LEVELS = ("a", "b", "c", "+", "#")


def random_pattern(rng: random.Random) -> str:
    levels = [rng.choice(LEVELS) for _ in range(rng.randint(1, 4))]
    text = "/".join(levels)
    return text


def test_same_result_as_pairwise_on_random_sets():
    rng = random.Random(19)
    for _ in range(300):
        patterns = [random_pattern(rng) for _ in range(rng.randint(0, 25))]
        assert minimal_patterns(patterns) == pairwise(patterns), patterns


def test_equivalent_patterns_keep_the_smallest_text():
    assert minimal_patterns(["#/#", "#"]) == ["#"]
    assert minimal_patterns(["a/+", "a/b", "a/+/#", "x"]) == ["a/+/#", "x"]


def test_patterns_starting_with_a_wildcard_are_not_compared_pairwise():
    import datapath.topics.algebra as algebra

    calls = 0
    real = algebra.includes_levels

    def counted(x, y):
        nonlocal calls
        calls += 1
        return real(x, y)

    import appliance.control.routing as routing

    patterns = [f"+/t{i}/x" for i in range(2_000)]
    routing.includes_levels = counted
    try:
        assert routing.minimal_patterns(patterns) == sorted(patterns)
    finally:
        routing.includes_levels = real
    assert calls < 4 * len(patterns)  # the prefix buckets compared all 4,000,000 pairs
