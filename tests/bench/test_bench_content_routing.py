"""bench.content_routing at small sizes: both modes deliver the same pairs, once each, and the
figures agree with each other (no wall-clock assertions)."""

import argparse
import json
import random

import pytest

from bench import content_routing as cr
from datapath.errors import TopicwireError

SMALL = ["--cores", "12", "--subscriptions", "1500", "--events", "80", "--history", "800",
         "--seed", "5"]


def small_args(extra=()):
    parser = argparse.ArgumentParser()
    cr.add_arguments(parser)
    return parser.parse_args([*SMALL, *extra])


@pytest.fixture(scope="module")
def report():
    return json.loads(json.dumps(cr.run(small_args())))


def test_report_has_the_shared_shape_with_flooding_as_the_baseline(report):
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert report["bench"] == "content-routing"
    assert set(report["results"]) == {"topicwire", "flood"}
    assert "messages_per_event topicwire/flood" in report["ratios"]
    assert "state_per_core_max topicwire/flood" in report["ratios"]


def test_both_modes_deliver_the_same_pairs_and_the_figures_are_consistent(report):
    params, rdv, flood = report["params"], report["results"]["topicwire"], \
        report["results"]["flood"]
    cores, subs, events = params["cores"], params["subscriptions"], params["events"]
    # the run checked pair equality; the counts it reports agree
    assert rdv["deliveries"] == flood["deliveries"] == params["checked_pairs"] > 0
    assert params["mean_deliveries_per_event"] == pytest.approx(params["checked_pairs"] / events)
    # flooding: every core stores every subscription, one match per event at its ingress
    assert flood["state_per_core_mean"] == flood["state_per_core_max"] == subs
    assert flood["matches_per_event_per_core_mean"] == pytest.approx(1 / cores)
    assert flood["match_load_per_event_per_core_mean"] == pytest.approx(subs / cores)
    assert flood["registration_messages_per_subscription"] == cores - 1
    assert flood["duplicate_copies_per_event"] == 0
    assert flood["messages_per_event_replying"] == flood["messages_per_event"]
    # replying: requests and replies to rendezvous cores, then at most one copy per core
    assert rdv["messages_per_event_replying"] <= 2 * params["rendezvous_cores"] + cores - 1
    assert flood["messages_per_event"] <= cores - 1
    # rendezvous: each subscription is stored once, plus flooded ones everywhere
    flooded = params["flooded_subscriptions"]
    assert rdv["state_per_core_mean"] == pytest.approx((subs - flooded) / cores + flooded)
    assert rdv["state_per_core_max"] < subs
    assert params["rendezvous_cores"] <= min(cores, params["rendezvous_keys"])
    assert params["subscriptions_at_popular_keys"] <= subs - flooded
    assert 0 < params["popular_attributes"] < params["attributes"]
    # means never exceed maxima
    for figures in (rdv, flood):
        for name in ("matches_per_event_per_core", "match_load_per_event_per_core",
                     "state_per_core"):
            assert figures[f"{name}_mean"] <= figures[f"{name}_max"]
        assert figures["messages_per_event"] <= figures["messages_per_event_max"]
        assert figures["hops_per_event"] == pytest.approx(figures["messages_per_event"])


def test_every_pair_is_delivered_once_and_equally_in_both_modes():
    """The simulation's outcomes themselves, not only its report."""
    rng = random.Random(9)
    cores = 8
    texts = cr.selector_texts(600, rng)
    home = [rng.randrange(cores) for _ in texts]
    history = cr.events(400, rng)
    workload = cr.events(60, rng)
    ingress = [rng.randrange(cores) for _ in workload]
    counts = cr.AttributeCounts()
    for event in history:
        counts.observe(cr.carried_attributes(event))
    _, flood = cr.simulate_flood(texts, home, ingress, workload, cores)
    _, rdv, info = cr.simulate_rendezvous(texts, home, ingress, workload, cores,
                                          counts.popular(0.3), counts)
    assert rdv.pairs == flood.pairs and set(flood.pairs.values()) == {1}
    # the reference: every selector evaluated on every event
    compiled = [cr.compile_selector(t) for t in texts]
    expected = {(e, s) for e, event in enumerate(workload)
                for s, sel in enumerate(compiled) if sel.evaluate(event)}
    assert set(flood.pairs) == expected and len(expected) > 100
    assert info["popular_attributes"] > 0 and info["flooded_subscriptions"] < len(texts)


def test_on_a_sparse_fabric_hops_exceed_messages_and_rarest_keys_spread_state():
    sparse = cr.run(small_args(["--degree", "3", "--key-choice", "rarest"]))
    params, rdv, flood = sparse["params"], sparse["results"]["topicwire"], \
        sparse["results"]["flood"]
    assert params["mean_hops_between_cores"] > 1
    for figures in (rdv, flood):
        assert figures["hops_per_event"] > figures["messages_per_event"]
    assert rdv["deliveries"] == flood["deliveries"]
    assert params["subscriptions_at_popular_keys"] < params["subscriptions"] / 2


def test_with_one_publishing_core_flooding_matches_everything_there():
    one = cr.run(small_args(["--publishers", "1"]))
    params, rdv, flood = one["params"], one["results"]["topicwire"], one["results"]["flood"]
    assert params["publishers"] == 1
    assert flood["matches_per_event_per_core_max"] == 1.0
    assert flood["match_load_per_event_per_core_max"] == params["subscriptions"]
    # rendezvous spreads the matching: no core matches every event against everything
    assert rdv["match_load_per_event_per_core_max"] < params["subscriptions"]
    assert rdv["deliveries"] == flood["deliveries"]


def test_hop_matrix_is_symmetric_and_connected():
    hops = cr.hop_matrix(20, 3, random.Random(1))
    assert all(hops[a][b] == hops[b][a] >= (a != b) for a in range(20) for b in range(20))
    assert cr.hop_matrix(5, 0, random.Random(1))[0] == [0, 1, 1, 1, 1]


def test_a_subscription_matched_at_two_places_fails_the_run():
    flood, rdv = cr._Outcome(), cr._Outcome()
    flood.pairs.update([(0, 1)])
    rdv.pairs.update([(0, 1), (0, 1)])
    with pytest.raises(TopicwireError, match="more than once"):
        cr.check_same_deliveries(flood, rdv)
    rdv.pairs.clear()
    with pytest.raises(TopicwireError, match="missed 1"):
        cr.check_same_deliveries(flood, rdv)


def test_defaults_are_the_issue_sizes():
    parser = argparse.ArgumentParser()
    cr.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.cores, args.subscriptions, args.popular_share) == (64, 100_000, 0.5)
