"""bench.fabric at tiny sizes: the report's shape, the appliance hop and the C relay (and the
direct reference) measured in one run with the same publisher and subscriber processes, and
every hop delivering exactly what was sent."""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from bench import fabric
from tests.appliance.helpers import free_port, wait_for

TINY = ["--messages", "2000", "--rate", "2000", "--duration-s", "0.25", "--repeats", "1",
        "--direct"]


def tiny_args(*extra):
    parser = argparse.ArgumentParser()
    fabric.add_arguments(parser)
    return parser.parse_args([*TINY, *extra])


def test_report_has_the_shared_shape_and_every_hop_delivers_what_was_sent():
    report = json.loads(json.dumps(fabric.run(tiny_args("--per-frame", "4", "--priority", "3"))))
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert report["bench"] == "fabric" and report["params"]["transport"] == "udp"
    assert report["params"]["repeats"] == 1 and report["params"]["per_frame"] == 4
    assert report["params"]["priority"] == 3
    assert set(report["results"]) == {"topicwire", "c_relay", "direct"}
    for hop, figures in report["results"].items():
        assert figures["msgs_per_s"] > 0 and figures["sent_msgs_per_s"] > 0, hop
        assert 0 < figures["p50_us"] <= figures["p99_us"] <= figures["p999_us"], hop
        assert figures["lost"] == 0 and figures["duplicates"] == 0, hop
    runs = report["params"]["runs"]
    for hop in ("topicwire", "c_relay", "direct"):
        (one,) = runs[hop]
        # throughput: 2000 messages in frames of 4; latency: 0.25 s at 2000/s = 500
        assert one["sent"] == one["received"] == 2000, hop
        assert one["latency_sent"] == one["latency_received"] == 500, hop
        assert one["latency_lost"] == one["latency_duplicates"] == 0, hop
    # the relay forwards the publisher's frames as they are; the appliance reframes them
    assert report["results"]["c_relay"]["frames_per_msg"] == 0.25
    assert 0 < report["results"]["topicwire"]["frames_per_msg"] <= 0.25
    for metric in ("msgs_per_s", "p50_us", "p99_us", "p999_us"):
        assert f"{metric} topicwire/c_relay" in report["ratios"]
        assert f"{metric} topicwire/direct" in report["ratios"]


def test_control_load_is_measured_on_the_appliance_and_elsewhere_beside_the_quiet_run():
    args = tiny_args("--control-load")
    args.direct = False
    report = json.loads(json.dumps(fabric.run(args)))
    load = report["params"]["control_load"]
    for made in (load["made"], load["made_elsewhere"]):  # each appliance answered its load
        (counts,) = made
        assert counts["requests"] > 0 and counts["answers"] == counts["requests"], load
        assert counts["status_reads"] > 0, load
    runs = report["params"]["runs"]
    for hop in ("topicwire", fabric.LOADED, fabric.ELSEWHERE):
        (one,) = runs[hop]
        assert one["latency_sent"] == one["latency_received"] == 500, hop
        assert 0 < one["p50_us"] <= one["p99_us"], hop
    for ratio in ("loaded/quiet", "loaded/elsewhere", "elsewhere/quiet"):
        assert load[f"p99_us {ratio}"] > 0, ratio


def test_the_relay_is_built_once_per_source_version(tmp_path):
    first = fabric.build_relay(tmp_path)
    mtime = first.stat().st_mtime_ns
    assert fabric.build_relay(tmp_path) == first and first.stat().st_mtime_ns == mtime
    assert first.name.startswith("udp_relay-") and len(list(tmp_path.iterdir())) == 1


def test_the_relay_refuses_bad_arguments_and_non_loopback_destinations(tmp_path):
    relay = fabric.build_relay(tmp_path)
    for argv in (["0", "10.1.2.3", "9"], ["0", "127.0.0.1", "0"], ["x", "127.0.0.1", "9"],
                 ["0", "127.0.0.1"]):
        done = subprocess.run([str(relay), *argv], capture_output=True, text=True, timeout=10)
        assert done.returncode == 2 and "udp_relay" in done.stderr, argv


def test_the_measuring_clients_leave_no_session_behind(tmp_path):
    # a publisher or subscriber killed before its logout stays a session at the appliance,
    # and every later measurement's messages go to the stale subscriber too
    port = free_port()
    appliance = fabric.Appliance("block", tmp_path, mgmt_port=port)

    def clients():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as reply:
            return json.load(reply)["clients"]
    try:
        args = tiny_args()
        for mode in ("throughput", "latency", "throughput"):
            figures = fabric.measure("topicwire", mode, args, appliance, None)
            assert figures.get("lost", figures.get("latency_lost")) == 0
            # each client's logout is one datagram it sends after printing its result: the
            # appliance ends their sessions a moment after measure() returns (this appliance
            # never times a session out, so only the logouts can empty the list)
            try:
                wait_for(lambda: clients() == [], timeout_s=20)
            except AssertionError:
                raise AssertionError(f"{mode}: sessions left behind: {clients()}") from None
    finally:
        assert appliance.stop() == 0


def test_a_child_runs_at_the_nice_value_it_is_given():
    # --priority applies to the C relay too, so both hops run at the same priority
    child = fabric._Child([sys.executable, "-c",
                           "import os; print('NICE', os.getpriority(os.PRIO_PROCESS, 0))"],
                          "nice probe", stdin=False, nice=5)
    try:
        assert child.expect("NICE").split() == ["NICE", "5"]
    finally:
        child.kill()


def test_a_child_runs_on_the_cpus_it_is_given():
    cpu = min(os.sched_getaffinity(0))
    child = fabric._Child([sys.executable, "-c",
                           "import os; print('CPUS', *sorted(os.sched_getaffinity(0)))"],
                          "cpu probe", stdin=False, cpus={cpu})
    try:
        assert child.expect("CPUS").split() == ["CPUS", str(cpu)]
    finally:
        child.kill()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--isolate needs 2 CPUs")
def test_isolate_gives_the_hop_the_last_cpu_and_leaves_the_callers_cpus_as_they_were():
    before = os.sched_getaffinity(0)
    report = fabric.run(tiny_args("--isolate"))
    assert os.sched_getaffinity(0) == before
    isolate = report["params"]["isolate"]
    assert isolate["hop_cpus"] == [max(before)]
    assert set(isolate["other_cpus"]) == before - {max(before)}
    for hop in ("topicwire", "c_relay"):
        assert report["results"][hop]["lost"] == 0, hop


def test_the_scraper_reads_status_and_metrics_at_its_rate(tmp_path):
    # --scrape-hz: the same appliance config with the API in its own process and in-process
    ports = {process: free_port() for process in (True, False)}
    appliances = {process: fabric.Appliance("block", tmp_path, mgmt_port=ports[process],
                                            mgmt_process=process, name=f"scrape-{process}")
                  for process in (True, False)}
    try:
        for process, port in ports.items():
            scraper = fabric._child("scrape", {"mgmt_port": port, "hz": 20})
            try:
                scraper.expect("READY")
                deadline = time.monotonic() + 60
                while True:  # until it made 5 reads of each, or the deadline
                    scraper.tell("COUNT")
                    counts = scraper.result()
                    if counts["errors"] or min(counts["status_reads"],
                                               counts["metrics_reads"]) >= 5 \
                            or time.monotonic() > deadline:
                        break
                scraper.tell("STOP")
                counts = scraper.result()
            finally:
                scraper.kill(fabric.CHILD_EXIT_GRACE_S)
            assert counts["errors"] == 0 and counts["status_reads"] >= 5 \
                and counts["metrics_reads"] >= 5, (process, counts)
        assert "process = false" in appliances[False].config.read_text()
    finally:
        assert all(a.stop() == 0 for a in appliances.values())
