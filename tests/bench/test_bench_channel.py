"""bench.channel at tiny sizes: the report's shape, sockperf side by side, every kind measured."""

import argparse
import json
import os
import subprocess
import sys
import uuid

import pytest

from bench import channel
from datapath.errors import UserError
from tests.appliance.helpers import ROOT
from tests.netns import Host, requires_netns

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
    # (what ``lost`` counts is checked exactly, in a namespace of its own, below)
    assert "lost" in ours and ours["header_p50_us"] > 0
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


IN_NAMESPACE = """
import argparse, json, sys
from bench import channel

def kernel_drops():
    # datagrams the kernel dropped on their way in: UDP receive errors (a full socket
    # buffer, the protocol's memory limit) and the loopback's receive backlog
    with open("/proc/net/snmp") as f:
        udp = [line.split() for line in f if line.startswith("Udp:")]
    with open("/proc/net/dev") as f:
        lo = next(line.split(":", 1)[1].split() for line in f
                  if line.split(":", 1)[0].strip() == "lo")
    return dict(zip(udp[0][1:], map(int, udp[1][1:])))["InErrors"] + int(lo[3])

parser = argparse.ArgumentParser()
channel.add_arguments(parser)
args = parser.parse_args(sys.argv[1:])
before = kernel_drops()
figures = channel.measure_throughput(args)
print(json.dumps({**figures, "kernel_drops": kernel_drops() - before}))
"""


@requires_netns
@pytest.mark.parametrize("kind", ["udp", "mcast"])
def test_a_datagram_channel_loses_only_what_the_receiving_kernel_dropped(kind):
    # UDP is best-effort: sent as fast as the channel takes them, frames are lost when the
    # receiver falls behind and its socket buffer is full. What the channel promises is
    # that this is the only loss: every frame it sent is received or was dropped by the
    # kernel on the way in. The run has a network namespace of its own, so the kernel's
    # drop counters there count this run's datagrams and nothing else's. (100,000 frames
    # sent flat out usually overrun the receiver: the drops are counted, not assumed away.)
    host = Host(f"twbench{uuid.uuid4().hex[:6]}")
    try:
        if kind == "mcast":
            host.run("ip", "link", "set", "lo", "multicast", "on")
        done = subprocess.run(
            ["ip", "netns", "exec", host.name, sys.executable, "-c", IN_NAMESPACE,
             "--kind", kind, "--size", "64", "--messages", "100000"],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        figures = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        host.close()
    assert figures["msgs_per_s"] > 0
    assert figures["lost"] == figures["kernel_drops"], figures


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
