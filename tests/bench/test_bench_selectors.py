"""bench.selectors at tiny sizes: the report's shape, and that it checks its answers."""

import argparse
import json
import random

import pytest

from bench import selectors
from datapath.errors import TopicwireError
from nic_offload.selectors import SelectorIndex, compile_selector

TINY = ["--subscribers", "300", "--events", "60", "--baseline-events", "12", "--repeats", "2",
        "--seed", "3"]


def tiny_args(extra=()):
    parser = argparse.ArgumentParser()
    selectors.add_arguments(parser)
    return parser.parse_args([*TINY, *extra])


def test_report_has_the_shared_shape_with_the_per_selector_baseline():
    report = json.loads(json.dumps(selectors.run(tiny_args())))
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert report["bench"] == "selectors"
    params = report["params"]
    assert params["subscribers"] == 300 and params["repeats"] == 2
    assert params["checked_events"] == 12 and params["events"] == 60
    assert params["mean_subscribers_per_event"] > 0
    assert set(report["results"]) == {"topicwire", "per_selector"}
    for figures in report["results"].values():
        assert figures["msgs_per_s"] > 0 and figures["p99_us"] >= figures["p50_us"] > 0
    assert "msgs_per_s topicwire/per_selector" in report["ratios"]


def test_defaults_are_the_documented_sizes():
    parser = argparse.ArgumentParser()
    selectors.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.subscribers, args.events) == (10_000, 2_000)
    with pytest.raises(SystemExit):
        parser.parse_args(["--subscribers", "0"])


def test_workload_selectors_parse_and_match_some_events():
    rng = random.Random(2)
    texts = selectors.selector_texts(200, rng)
    events = selectors.events(50, rng)
    compiled = [compile_selector(t) for t in texts]
    assert sum(s.evaluate(e) for s in compiled for e in events) > 50
    assert any("LIKE" in t for t in texts) and any(" OR " in t for t in texts)


def test_a_wrong_index_answer_fails_the_run(monkeypatch):
    real = SelectorIndex.match

    def one_short(self, event):
        found = real(self, event)
        found.discard(min(found, default=None))
        return found

    monkeypatch.setattr(SelectorIndex, "match", one_short)
    with pytest.raises(TopicwireError, match="bench: subscribers for event .* differ"):
        selectors.run(tiny_args())
