"""Subscription lists reproduce seed 000's figures 5-7 and always decide like the naive list."""

import random

import pytest

from datapath.topics.algebra import TopicError
from datapath.topics.sublist import SubscriptionList, naive_decision, replay


def lst(*requests):
    return SubscriptionList(requests)


def test_figure_5_subscribing_to_everything_discards_every_earlier_entry():
    s = lst("+a/#", "+#/a")
    assert [str(e) for e in s.entries] == ["+a/#", "+#/a"]
    s.apply("+a/b")  # included in a/#: discarded
    assert [str(e) for e in s.entries] == ["+a/#", "+#/a"]
    s.apply("+#")
    assert [str(e) for e in s.entries] == ["+#"]
    assert s.decides("anything/at/all")


def test_figure_6_partial_and_total_unsubscribe():
    s = lst("+a/+")
    s.apply("-a/b")
    assert [str(e) for e in s.entries] == ["+a/+", "-a/b"]
    assert s.decides("a/c") and not s.decides("a/b")
    s.apply("-c")  # overlaps nothing subscribed: discarded
    assert [str(e) for e in s.entries] == ["+a/+", "-a/b"]
    s.apply("-a/#")  # includes every entry: the list empties
    assert s.entries == ()
    assert not s.decides("a/c")


def test_figure_7_a_newer_subscription_overrides_an_older_unsubscribe():
    s = lst("+a/#", "-a/b/#")
    assert [str(e) for e in s.entries] == ["+a/#", "-a/b/#"]
    s.apply("+a/c")  # inside a/#, no overlap with a/b/#: discarded
    assert [str(e) for e in s.entries] == ["+a/#", "-a/b/#"]
    s.apply("+a/+/c")  # inside a/#, overlaps a/b/#: appended
    assert [str(e) for e in s.entries] == ["+a/#", "-a/b/#", "+a/+/c"]
    assert s.decides("a/b/c")  # +a/+/c beats -a/b/#
    assert not s.decides("a/b/d")  # -a/b/# beats +a/#
    assert s.decides("a/x/y")


NAMES = ("a", "b", "c")


def random_pattern(rng):
    return "/".join(rng.choice(NAMES + ("+", "#", "#")) for _ in range(rng.randint(1, 3)))


TOPICS = ["/".join(levels) for n in range(1, 5)
          for levels in __import__("itertools").product(NAMES + ("z",), repeat=n)]


def test_the_optimized_list_decides_like_the_naive_list_of_all_requests():
    rng = random.Random(20261122)
    longest = 0
    for _ in range(300):
        requests = [rng.choice("+-") + random_pattern(rng) for _ in range(rng.randint(1, 8))]
        s = lst(*requests)
        longest = max(longest, len(requests) - len(s))
        for topic in TOPICS[::3]:
            assert s.decides(topic) is naive_decision(requests, topic), (requests, topic, s)
    assert longest > 0  # the optimisation really shortened lists


def test_negative_entries_never_lead_the_list():
    rng = random.Random(7)
    for _ in range(200):
        s = lst(*(rng.choice("+-") + random_pattern(rng) for _ in range(6)))
        assert not s.entries or s.entries[0].positive


def test_replay_reads_requests_skips_blank_lines_and_names_a_bad_line():
    s = replay(["+a/#", "", "-a/b/#", "a/+/c"])
    assert [str(e) for e in s.entries] == ["+a/#", "-a/b/#", "+a/+/c"]
    with pytest.raises(TopicError, match=r"^topics: line 2: invalid pattern 'a/b#'"):
        replay(["+a/#", "-a/b#"])


def test_withdraw_takes_back_one_positive_entry_and_delivers_a_subset():
    s = lst("+a/#", "-a/b/#", "+a/b/c")
    assert s.withdraw("a/#")  # the older entry: a/b/c stays, the leading negative goes
    assert [str(e) for e in s.entries] == ["+a/b/c"]
    assert s.decides("a/b/c") and not s.decides("a/x")
    assert not s.withdraw("a/#") and not s.withdraw("a/b/#")  # no such positive entry
    rng = random.Random(20260101)
    for _ in range(300):
        requests = [rng.choice("+-") + random_pattern(rng) for _ in range(rng.randint(1, 8))]
        s = lst(*requests)
        positives = s.positive_patterns()
        if not positives:
            continue
        gone = rng.choice(positives)
        before = {t for t in TOPICS[::3] if s.decides(t)}
        s.withdraw(gone)
        after = {t for t in TOPICS[::3] if s.decides(t)}
        assert after <= before, (requests, gone)
        assert gone not in s.positive_patterns()
        assert not s.entries or s.entries[0].positive


def test_plain_topics_take_the_short_way_and_decide_as_the_naive_list():
    """Requests mixing plain topics (the short way: only the wildcard entries and the
    topic's own are looked at) with patterns decide every topic as the naive list does,
    and the list's indexes of its entries stay true."""
    rnd = random.Random(9)
    levels = ["a", "b", "c", "+", "#"]
    topics = ["a", "b", "a/b", "a/c", "b/c/a", "c/c", "a/a/a"]
    for _ in range(1_000):
        requests: list[str] = []
        sl = SubscriptionList()
        for _ in range(25):
            pool = levels if rnd.random() < 0.4 else levels[:3]
            pattern = "/".join(rnd.choice(pool) for _ in range(rnd.randint(1, 3)))
            request = ("+" if rnd.random() < 0.7 else "-") + pattern
            requests.append(request)
            sl.apply(request)
            for topic in topics:
                assert sl.decides(topic) == naive_decision(requests, topic), (requests, topic)
            wild = [e for e in sl.entries if "+" in e.levels or "#" in e.levels]
            assert sl._wild == wild
            assert sl._plain == {e.pattern: e for e in sl.entries if e not in wild}


def test_tracked_changes_are_the_difference_of_the_positive_patterns():
    """``tracked`` (what the offload compiler's topic index follows) says exactly which
    patterns a request made positive and which it took back, over random requests, plain
    topics, repeats and withdrawals."""
    rng = random.Random(20261129)
    for _ in range(400):
        s = SubscriptionList()
        for _ in range(rng.randint(1, 12)):
            pattern = random_pattern(rng) if rng.random() < 0.6 else f"a/{rng.choice('xyz')}"
            kind = rng.random()
            before = set(s.positive_patterns())
            if kind < 0.55:
                added, removed = s.tracked(lambda lst, p=pattern: lst.subscribe(p))
            elif kind < 0.9:
                added, removed = s.tracked(lambda lst, p=pattern: lst.unsubscribe(p))
            else:
                added, removed = s.tracked(lambda lst, p=pattern: lst.withdraw(p))
            after = set(s.positive_patterns())
            assert (added, removed) == (after - before, before - after), (s, pattern)
