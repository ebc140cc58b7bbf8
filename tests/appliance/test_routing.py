"""Paths and suppression: pure functions every appliance runs on the same link state."""

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.control.routing import Lsa, all_paths, graph_of, minimal_patterns, path_cost
from datapath.topics.algebra import includes


def _lsas(links):
    said = {}
    for a, b, cost in links:
        said.setdefault(a, []).append((b, cost))
        said.setdefault(b, []).append((a, cost))
    return {n: Lsa(n, f"n{n}", 1, 1, tuple(v)) for n, v in said.items()}


def test_a_link_counts_only_when_both_ends_advertise_it():
    lsas = _lsas([(1, 2, 1)])
    lsas[1] = Lsa(1, "n1", 1, 2, ((2, 1), (3, 1)))  # 3 never says it sees 1
    assert graph_of(lsas) == {1: {2: 1}, 2: {1: 1}}


def test_square_ties_break_by_the_smallest_sequence_of_node_ids():
    # 1 - 2 - 4 and 1 - 3 - 4, equal costs: 1 -> 4 goes over 2, 4 -> 1 over 2 as well
    paths = all_paths(graph_of(_lsas([(1, 2, 1), (2, 4, 1), (1, 3, 1), (3, 4, 1)])))
    assert paths[(1, 4)] == (2, (1, 2, 4))
    assert paths[(4, 1)] == (2, (4, 2, 1))
    assert paths[(2, 3)] == (2, (2, 1, 3))


def test_costs_decide_and_overrides_replace_a_path_whose_links_are_up():
    graph = graph_of(_lsas([(1, 2, 5), (2, 3, 1), (1, 3, 1)]))
    paths = all_paths(graph)
    assert paths[(1, 2)] == (2, (1, 3, 2))
    forced = all_paths(graph, {(1, 2): (1, 2)})
    assert forced[(1, 2)] == (5, (1, 2))
    assert all_paths(graph, {(1, 2): (1, 4, 2)})[(1, 2)] == (2, (1, 3, 2))  # link down
    assert path_cost(graph, (1, 2, 1)) is None


def test_paths_are_simple_and_optimal_on_random_meshes():
    rng = random.Random(5)
    for _ in range(40):
        n = rng.randint(2, 6)
        links = [(a, b, rng.randint(1, 4)) for a, b in itertools.combinations(range(1, n + 1), 2)
                 if rng.random() < 0.6]
        graph = graph_of(_lsas(links))
        paths = all_paths(graph)
        for (s, d), (cost, path) in paths.items():
            assert path[0] == s and path[-1] == d and len(set(path)) == len(path)
            assert path_cost(graph, path) == cost
            # optimal: no simple path is cheaper (brute force)
            nodes = [x for x in graph if x not in (s, d)]
            for k in range(len(nodes) + 1):
                for mid in itertools.permutations(nodes, k):
                    other = path_cost(graph, (s, *mid, d))
                    assert other is None or other >= cost


def test_suppression_keeps_only_patterns_nothing_else_includes():
    patterns = ["a/#", "a/b", "a/+/c", "x/y", "#/y", "x/+", "q/#/#", "q/#"]
    kept = minimal_patterns(patterns)
    assert kept == ["#/y", "a/#", "q/#", "x/+"]
    for p in patterns:  # everything is still covered
        assert any(includes(k, p) for k in kept)


def _minimal_by_every_pair(patterns):
    """The definition, comparing every pair (the reference of the indexed version)."""
    unique = sorted(set(patterns))
    return [p for p in unique
            if not any(q != p and includes(q, p) and (q < p or not includes(p, q))
                       for q in unique)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "b", "c", "+", "#"]), min_size=1, max_size=4)
                .map("/".join), max_size=12))
def test_suppression_equals_the_pairwise_definition(patterns):
    assert minimal_patterns(patterns) == _minimal_by_every_pair(patterns)


def test_the_minimal_set_followed_pattern_by_pattern_is_minimal_patterns_of_those_held():
    from appliance.control.routing import MinimalSet

    rnd = random.Random(5)
    levels = ["a", "b", "c", "+", "#"]
    for _ in range(300):
        kept, held = MinimalSet(), set()
        for _ in range(60):
            p = "/".join(rnd.choice(levels) for _ in range(rnd.randint(1, 4)))
            if rnd.random() < 0.6 or not held:
                kept.add(p)
                held.add(p)
            else:
                q = rnd.choice(sorted(held)) if rnd.random() < 0.8 else p
                kept.remove(q)
                held.discard(q)
            assert sorted(kept.minimal) == minimal_patterns(list(held))
