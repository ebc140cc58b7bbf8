"""bench.topics at tiny sizes: the report's shape, and that it checks its answers."""

import argparse
import json
import random

import pytest

from bench import topics
from datapath.errors import TopicwireError
from datapath.topics.algebra import matches
from datapath.topics.index import TopicIndex

TINY = ["--patterns", "300", "--topics", "3000", "--lookups", "400", "--scan-lookups", "30",
        "--repeats", "2", "--seed", "3"]


def tiny_args(extra=()):
    parser = argparse.ArgumentParser()
    topics.add_arguments(parser)
    return parser.parse_args([*TINY, *extra])


def test_report_has_the_shared_shape():
    report = json.loads(json.dumps(topics.run(tiny_args())))
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert report["bench"] == "topics"
    assert report["params"]["patterns"] == 300 and report["params"]["repeats"] == 2
    assert set(report["results"]) == {"topicwire", "linear_scan"}
    ours, theirs = report["results"]["topicwire"], report["results"]["linear_scan"]
    for figures in (ours, theirs):
        assert figures["msgs_per_s"] > 0 and figures["new_pattern_ms"] >= 0
    assert ours["msgs_per_s_cached"] > 0 and 0 < ours["cache_hit_rate"] <= 1
    assert "msgs_per_s topicwire/linear_scan" in report["ratios"]
    assert "new_pattern_ms topicwire/linear_scan" in report["ratios"]
    assert report["params"]["new_patterns"]["+/+/S00001/#"] > 0


def test_defaults_are_the_documented_sizes():
    parser = argparse.ArgumentParser()
    topics.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.patterns, args.topics) == (100_000, 1_000_000)
    with pytest.raises(SystemExit):
        parser.parse_args(["--patterns", "0"])


def test_workload_topics_are_distinct_and_patterns_match_some():
    registered = topics.market_topics(2_000)
    assert len(set(registered)) == 2_000
    assert {t.split("/")[0] for t in registered} == set(topics.EXCHANGES)
    patterns = topics.subscription_patterns(200, topics.symbols_for(2_000), random.Random(1))
    assert any("#" in p.split("/")[1:-1] for p in patterns)  # some '#' in the middle
    assert sum(any(matches(p, t) for t in registered[:500]) for p in patterns) > 20


def test_a_wrong_index_answer_fails_the_run(monkeypatch):
    real = TopicIndex.match

    def one_short(self, topic):
        found = real(self, topic)
        found.discard(min(found, default=None))
        return found

    monkeypatch.setattr(TopicIndex, "match", one_short)
    with pytest.raises(TopicwireError, match="bench: subscribers for .* differ"):
        topics.run(tiny_args())
