"""bench.mqtt_shared at a tiny load: the report's shape, and the stable view (the baseline)
delivering each message once."""

from __future__ import annotations

import argparse

from appliance.ops.cli.bench_cmd import BENCHMARKS
from bench import mqtt_shared


def test_the_report_has_both_runs_and_a_stable_view_delivers_each_message_once():
    assert "bench.mqtt_shared" in BENCHMARKS
    report = mqtt_shared.run(argparse.Namespace(rate=50, duration_s=1.5, repeats=1))
    ours, stable = report["results"]["topicwire"], report["results"]["stable_view"]
    assert stable["published"] == ours["published"] == 75
    assert stable["lost"] == 0 and stable["duplicates"] == 0
    assert ours["leave_view_ms"] > 0 and ours["join_view_ms"] > 0
    assert 0 <= ours["lost"] <= 75 and ours["duplicates"] >= 0
