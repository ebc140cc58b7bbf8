"""The '#'-free fast paths of ``matches_levels``, ``includes_levels`` and ``overlaps_levels``
against the automaton and witness constructions on random patterns."""

import random

from datapath.topics.algebra import (
    _fresh_level,
    _matches_automaton,
    _with_other,
    _witness,
    includes_levels,
    matches_levels,
    overlaps_levels,
)

LEVELS = ("a", "b", "", "+")


def _levels(rng: random.Random, wild: bool = True) -> tuple[str, ...]:
    choices = LEVELS if wild else LEVELS[:3]
    levels = tuple(rng.choice(choices) for _ in range(rng.randint(1, 4)))
    return levels if levels != ("",) else ("a",)  # '' is no topic nor pattern


def test_fast_paths_agree_with_the_general_constructions():
    rng = random.Random(19)
    for _ in range(3_000):
        x, y, t = _levels(rng), _levels(rng), _levels(rng, wild=False)
        assert matches_levels(x, t) == _matches_automaton(x, t), (x, t)
        general = _matches_automaton(x, _with_other(y, _fresh_level(x, y)))
        assert includes_levels(x, y) == general, (x, y)
        assert overlaps_levels(x, y) == (_witness(x, y) is not None), (x, y)
        prefix = x + ("#",)  # the trailing '#' fast path of matches_levels
        assert matches_levels(prefix, t) == _matches_automaton(prefix, t), (prefix, t)
        assert matches_levels(("#",), t) == _matches_automaton(("#",), t), t
