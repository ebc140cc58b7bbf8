"""bench.fabric_fanout at tiny sizes: N publishers and M subscribers through the appliance and
through the C relay (which sends every datagram to each subscriber), the report's shape, and
every subscriber getting every message at a low rate through both hops."""

import argparse
import json
import signal
import socket
import subprocess

import pytest

from bench import fabric, fabric_bench, fabric_fanout
from datapath.errors import UserError

PUBLISHERS, SUBSCRIBERS = 3, 2
TINY = ["--publishers", str(PUBLISHERS), "--subscribers", str(SUBSCRIBERS),
        "--messages", "1500", "--rate", "2000", "--duration-s", "0.25", "--repeats", "1"]


def tiny_args(*extra):
    parser = argparse.ArgumentParser()
    fabric.add_arguments(parser)
    return parser.parse_args([*TINY, *extra])


def test_every_subscriber_gets_every_message_through_both_hops():
    # the command hands more than one publisher or subscriber to the fan-out bench
    report = json.loads(json.dumps(fabric_bench.run(tiny_args())))
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    params = report["params"]
    assert report["bench"] == "fabric" and params["transport"] == "udp"
    assert (params["publishers"], params["subscribers"], params["repeats"]) == (3, 2, 1)
    assert set(report["results"]) == {"topicwire", "c_relay"}
    for hop, figures in report["results"].items():
        assert figures["msgs_per_s"] > 0 and figures["sent_msgs_per_s"] > 0, hop
        assert 0 < figures["p50_us"] <= figures["p99_us"] <= figures["p999_us"], hop
        assert figures["duplicates"] == 0 and figures["latency_lost"] == 0, hop
    for hop in ("topicwire", "c_relay"):
        (one,) = params["runs"][hop]
        # throughput: 1500 messages in all, 500 per publisher, each to both subscribers
        assert one["sent"] == 1500 and one["expected"] == 1500 * SUBSCRIBERS, hop
        assert one["received"] + one["lost"] == one["expected"] and one["duplicates"] == 0
        # latency: 0.25 s at 2000/s = 500 messages from the 3 publishers in turn; every
        # subscriber has each of them once, and one latency sample per delivery
        assert one["latency_sent"] == 500, hop
        assert one["latency_received"] == 500 * SUBSCRIBERS, hop
        assert one["latency_min_subscriber_received"] == 500, hop
        assert one["latency_max_subscriber_received"] == 500, hop
        assert one["latency_lost"] == one["latency_duplicates"] == 0, hop
        assert one["latency_samples"] == 500 * SUBSCRIBERS, hop
    # the relay's copies: every datagram it took went to each subscriber
    (relay,) = params["runs"]["c_relay"]
    assert relay["relay_datagrams_out"] == SUBSCRIBERS * relay["relay_datagrams_in"]
    for metric in ("msgs_per_s", "p50_us", "p99_us", "p999_us"):
        assert f"{metric} topicwire/c_relay" in report["ratios"]
    goals = params["goals"]
    for hop, figures in report["results"].items():  # CPU the hop took (clock ticks of 10 ms:
        assert figures["latency_hop_cpu_us_per_delivery"] >= 0, hop  # the relay's may be 0)
    assert set(goals) == {"p50_us topicwire/c_relay", "p999_us topicwire/c_relay",
                          "msgs_per_s topicwire/c_relay"}
    for name, goal in goals.items():
        assert goal["measured"] == report["ratios"][name]


def test_the_relay_sends_every_datagram_to_each_destination_in_order(tmp_path):
    relay = fabric.build_relay(tmp_path)
    subs = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    pub = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    proc = None
    try:
        for s in subs:
            s.bind(("127.0.0.1", 0))
            s.settimeout(10)  # a deadline per datagram, not a pause
        ports = [str(s.getsockname()[1]) for s in subs]
        proc = subprocess.Popen([str(relay), "0", "127.0.0.1", *ports],
                                stdout=subprocess.PIPE, text=True)
        port = int(proc.stdout.readline().split()[1])
        payloads = [f"datagram {i}".encode() for i in range(5)]
        for payload in payloads:
            pub.sendto(payload, ("127.0.0.1", port))
        for s in subs:
            assert [s.recv(100) for _ in payloads] == payloads
        proc.send_signal(signal.SIGTERM)
        counts = json.loads(proc.communicate(timeout=10)[0])
        assert counts["datagrams_in"] == 5 and counts["datagrams_out"] == 15
        assert counts["send_errors"] == 0 and proc.returncode == 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for s in (*subs, pub):
            s.close()


def test_the_relay_refuses_more_destinations_than_it_holds(tmp_path):
    relay = fabric.build_relay(tmp_path)
    ports = [str(9000 + i) for i in range(fabric_fanout.FANOUT_MAX_PEERS + 1)]
    done = subprocess.run([str(relay), "0", "127.0.0.1", *ports], capture_output=True,
                          text=True, timeout=10)
    assert done.returncode == 2 and "at most" in done.stderr


@pytest.mark.parametrize("extra", [["--direct"], ["--control-load"], ["--isolate"],
                                   ["--subscribers", "65"]])
def test_the_fanout_bench_refuses_what_it_cannot_measure(extra):
    with pytest.raises(UserError, match="bench"):
        fabric_bench.run(tiny_args(*extra))
