"""bench.channel at tiny sizes: the report's shape, sockperf side by side, every kind measured."""

import argparse
import json
import os

import pytest

from bench import channel
from datapath.errors import UserError

TINY = ["--messages", "3000", "--duration-s", "0.3", "--repeats", "1"]


def tiny_args(*extra):
    parser = argparse.ArgumentParser()
    channel.add_arguments(parser)
    return parser.parse_args([*TINY, *extra])


def test_report_has_the_shared_shape_with_sockperf_beside_it():
    report = json.loads(json.dumps(channel.run(tiny_args("--kind", "udp", "--size", "64"))))
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert report["bench"] == "channel" and report["params"]["kind"] == "udp"
    assert report["params"]["size"] == 64 and report["params"]["repeats"] == 1
    assert set(report["results"]) == {"topicwire", "sockperf"}
    ours, theirs = report["results"]["topicwire"], report["results"]["sockperf"]
    for figures in (ours, theirs):
        assert figures["msgs_per_s"] > 0
        assert 0 < figures["p50_us"] <= figures["p99_us"] <= figures["p999_us"]
    assert 0 <= ours["lost"] < 3000 and ours["header_p50_us"] > 0
    assert "msgs_per_s topicwire/sockperf" in report["ratios"]
    assert "p99_us topicwire/sockperf" in report["ratios"]


@pytest.mark.parametrize("kind", ["shm", "mcast"])
def test_every_kind_moves_frames_between_two_processes(kind):
    args = tiny_args("--kind", kind, "--size", "128")
    throughput = channel.measure_throughput(args)
    assert throughput["msgs_per_s"] > 0 and throughput["sent_msgs_per_s"] > 0
    if kind == "shm":
        assert throughput["lost"] == 0  # the ring pushes back instead of dropping
    latency = channel.measure_latency(args)
    assert 0 < latency["p50_us"] <= latency["p999_us"]
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("topicwire-bench-")]


@pytest.mark.parametrize("size", ["16", "60", "70000"])
def test_sizes_that_are_not_frames_are_refused(size):
    with pytest.raises(SystemExit):
        tiny_args("--size", size)


def test_a_missing_sockperf_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(channel, "SOCKPERF", "sockperf-is-not-here")
    with pytest.raises(UserError, match="^bench: sockperf is not installed; `make setup`"):
        channel.run(tiny_args())


def test_spin_idles_both_ends_and_sockperf_the_same_way():
    report = channel.run(tiny_args("--kind", "udp", "--idle", "spin"))
    assert report["params"]["idle"] == "spin"
    assert report["params"]["baseline"].endswith("--nonblocked")
    for figures in report["results"].values():
        assert 0 < figures["p50_us"] <= figures["p99_us"] <= figures["p999_us"]
