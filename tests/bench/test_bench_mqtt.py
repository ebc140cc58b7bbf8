"""bench.mqtt at tiny counts: the report's shape, the edge and mosquitto measured in one run
under the same load, and both delivering every message in both runs (full rate and paced)."""

import argparse
import json
import subprocess
import sys

import pytest

from bench import mqtt

pytestmark = pytest.mark.skipif(
    mqtt.shutil.which("mosquitto") is None and not mqtt.Path("/usr/sbin/mosquitto").exists(),
    reason="mosquitto is not installed (make setup installs it: APT_PACKAGES)")

TINY = ["--qos", "1", "--rate", "200", "--duration-s", "0.5", "--repeats", "1"]


def tiny_args(*extra):
    parser = argparse.ArgumentParser()
    mqtt.add_arguments(parser)
    return parser.parse_args([*TINY, *extra])


@pytest.mark.parametrize(("scenario", "clients", "connections", "per_message"), [
    ("p2p", 2, 4, 1), ("fanout", 3, 4, 3), ("fanin", 3, 4, 1), ("conns", 4, 4, 1)])
def test_both_brokers_deliver_every_message_in_the_shared_report_shape(
        scenario, clients, connections, per_message):
    report = json.loads(json.dumps(mqtt.run(tiny_args("--scenario", scenario,
                                                      "--clients", str(clients)))))
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    params = report["params"]
    assert report["bench"] == "mqtt" and params["scenario"] == scenario
    assert params["connections"] == connections and params["qos"] == 1
    assert params["half_rate_publishes_per_s"] == 200
    assert set(report["results"]) == {"topicwire", "mosquitto"}
    for broker in ("topicwire", "mosquitto"):
        (one,) = params["runs"][broker]
        for prefix in ("", "half_"):
            # every publish reached every subscriber it was for, once
            assert one[prefix + "sent"] > 0, (broker, prefix)
            assert one[prefix + "received"] == one[prefix + "sent"] * per_message, (
                broker, prefix, one)
            assert one[prefix + "lost"] == 0 and one[prefix + "duplicates"] == 0
            assert 0 < one[prefix + "p50_us"] <= one[prefix + "p99_us"] <= one[prefix + "p999_us"]
            assert one[prefix + "msgs_per_s"] > 0 and one[prefix + "cpu_pct"] >= 0
        figures = report["results"][broker]
        assert figures["lost"] == figures["half_lost"] == 0
    if scenario == "conns":  # the scenario's own rate: 1 msg/s per connection
        assert params["full_rate"] == "1 msg/s per connection"
    for metric in ("msgs_per_s", "p99_us", "half_p99_us"):
        assert f"{metric} topicwire/mosquitto" in report["ratios"]


def test_the_generator_is_built_once_per_source_version(tmp_path):
    first = mqtt.build_load(tmp_path)
    mtime = first.stat().st_mtime_ns
    assert mqtt.build_load(tmp_path) == first and first.stat().st_mtime_ns == mtime
    assert first.name.startswith("mqtt_load-") and len(list(tmp_path.iterdir())) == 1


def test_the_generator_refuses_bad_arguments(tmp_path):
    load = mqtt.build_load(tmp_path)
    for argv in (["pub"], ["pub", "0", "1", "0", "t", "0", "1", "20", "64", "x"],
                 ["pub", "1883", "1", "2", "t", "0", "1", "20", "64", "x"],
                 ["pub", "1883", "1", "0", "t/%s", "0", "1", "20", "64", "x"],
                 ["pub", "1883", "1", "0", "t", "0", "1", "20", "8", "x"],
                 ["sub", "1883", "1", "0", "t", "0", "x"], ["both", "1883"]):
        done = subprocess.run([str(load), *argv], capture_output=True, text=True, timeout=10)
        assert done.returncode == 2 and done.stderr.startswith("mqtt_load:"), argv
        assert len(done.stderr.strip().splitlines()) == 1, argv


def test_bad_cli_arguments_give_one_line_and_exit_2():
    base = [sys.executable, "-c", "import sys; from appliance.ops.cli import main; "
            "sys.exit(main(sys.argv[1:]))", "bench", "mqtt"]
    for bad in (["--scenario", "mesh"], ["--qos", "2"], ["--rate", "0"],
                ["--duration-s", "-1"], ["--clients", "0"], ["--payload-bytes", "8"],
                ["--scenario", "p2p", "--clients", "60000"]):
        done = subprocess.run([*base, *bad], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (bad, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == "", (bad, done)


def test_the_connections_scenario_asks_what_the_edge_now_holds():
    # the MQTT sessions of one identity share one native session: no cap below the asked 5,000
    assert mqtt.EDGE_MAX_CONNECTIONS >= 5_000 + mqtt.EDGE_SPARE_CONNECTIONS
    conns = mqtt.shape("conns", 5_000)
    assert conns.connections == 5_000 and conns.echo and conns.per_message == 1
    assert mqtt.shape("fanout", 100).per_message == 100
    assert mqtt.shape("fanin", 100).filter.startswith("$share/g/")


def test_the_bench_is_registered_as_a_topicwire_bench_subcommand():
    from appliance.ops.cli.bench_cmd import BENCHMARKS

    assert "bench.mqtt" in BENCHMARKS


def test_the_connections_scenario_measures_both_brokers_at_the_asked_count():
    report = mqtt.run(tiny_args("--scenario", "conns", "--clients", "4"))
    params = report["params"]
    assert params["connections"] == 4 and "limit" not in params
    for broker in ("topicwire", "mosquitto"):
        (one,) = params["runs"][broker]
        assert one["lost"] == one["half_lost"] == 0
