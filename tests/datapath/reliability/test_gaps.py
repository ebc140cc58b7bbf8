"""GapList keeps missing ranges exact under fills, splits, isolation and removal."""

import random

from datapath.reliability.nak import Gap, GapList


def _model_ranges(missing):
    out, start, prev = [], None, None
    for s in sorted(missing):
        if prev is not None and s == prev + 1:
            prev = s
            continue
        if start is not None:
            out.append((start, prev))
        start = prev = s
    if start is not None:
        out.append((start, prev))
    return out


def _ranges(gaps):
    return [(g.first, g.last) for g in gaps.gaps]


def test_random_fills_isolations_and_removals_match_a_set_of_missing_sequences():
    rng = random.Random(7)
    for _ in range(50):
        gaps = GapList(10_000)
        missing = set()
        top = 0
        for _ in range(40):
            first = top + 1 + rng.randrange(3)
            last = first + rng.randrange(20)
            gaps.append(Gap(first, last, 0, 100, 0))
            missing.update(range(first, last + 1))
            top = last
        for _ in range(200):
            op = rng.random()
            a = rng.randrange(top + 3)
            if op < 0.6:
                got = gaps.fill(a)
                assert (got is not None) == (a in missing)
                missing.discard(a)
            elif op < 0.8:
                b = a + rng.randrange(30)
                parts = gaps.isolate(a, b)
                inside = {s for s in missing if a <= s <= b}
                assert {s for g in parts for s in range(g.first, g.last + 1)} == inside
            else:
                b = a + rng.randrange(30)
                removed = gaps.remove(a, b)
                inside = {s for s in missing if a <= s <= b}
                got = [s for g in removed for s in range(g.first, g.last + 1)]
                assert got == sorted(inside)  # in order, each once (pieces may touch)
                missing -= inside
            # sorted, disjoint, exactly the missing ones (isolate may leave touching pieces)
            assert [s for g in gaps.gaps for s in range(g.first, g.last + 1)] == sorted(missing)
            assert gaps.missing() == len(missing)


def test_splitting_a_gap_keeps_its_timers():
    gaps = GapList(10)
    gaps.append(Gap(10, 20, detected_ns=5, deadline_ns=99, next_nak_ns=7, naks=3))
    assert gaps.fill(15) is not None
    assert _ranges(gaps) == [(10, 14), (16, 20)]
    assert all((g.detected_ns, g.deadline_ns, g.next_nak_ns, g.naks) == (5, 99, 7, 3)
               for g in gaps.gaps)


def test_the_gap_limit_refuses_a_new_gap():
    gaps = GapList(2)
    assert gaps.append(Gap(1, 1, 0, 0, 0)) and gaps.append(Gap(3, 3, 0, 0, 0))
    assert not gaps.append(Gap(5, 5, 0, 0, 0))
    assert _ranges(gaps) == [(1, 1), (3, 3)]
