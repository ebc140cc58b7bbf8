"""bench.client at tiny sizes: both transports through the client API and the raw hop in
one run, the report's shape, and every message accounted for."""

import argparse
import json

import pytest

from bench import client
from datapath.errors import UserError


def test_both_transports_and_the_raw_hop_in_one_run():
    parser = argparse.ArgumentParser()
    client.add_arguments(parser)
    args = parser.parse_args(["--rate", "500", "--duration-s", "0.5", "--messages", "3000",
                              "--repeats", "1"])
    report = json.loads(json.dumps(client.run(args)))
    assert report["bench"] == "client"
    results = report["results"]
    assert set(results) == {"topicwire", "topicwire_udp", "raw_hop", "raw_hop_throughput"}
    assert report["params"]["topicwire"] == "shm"
    for name in ("topicwire", "topicwire_udp"):
        figures = results[name]
        assert figures["latency_received"] == 250 and figures["latency_lost"] == 0
        # the throughput run (publish_batch -> poll): every message accounted for
        assert figures["sent"] == 3000
        assert figures["received"] + figures["lost"] == 3000 and figures["duplicates"] == 0
        assert figures["unreported"] <= figures["lost"]
        assert figures["frame_messages"] > 100  # batched: many messages a frame
        assert figures["msgs_per_s"] > 0 and 0 < figures["p50_us"] <= figures["p99_us"]
    assert results["raw_hop"]["p50_us"] > 0
    assert results["raw_hop_throughput"]["msgs_per_s"] > 0
    assert report["params"]["raw_per_frame"] > 1 and len(report["params"]["load_avg"]) == 3
    for ratio in ("p50_us topicwire/raw_hop", "p50_us topicwire_udp/raw_hop",
                  "msgs_per_s topicwire/raw_hop_throughput",
                  "msgs_per_s topicwire_udp/raw_hop_throughput"):
        assert ratio in report["ratios"]


def test_a_bad_duration_is_refused():
    parser = argparse.ArgumentParser()
    client.add_arguments(parser)
    with pytest.raises(UserError, match="--duration-s"):
        client.run(parser.parse_args(["--duration-s", "0"]))
