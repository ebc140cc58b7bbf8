"""bench.ack_persisted at a tiny size: both sides (persisted, received) measured for each
fsync policy in one run, the report's shape, the cache directories removed afterwards."""

import argparse
import json

from bench import ack_persisted


def test_report_has_both_sides_for_each_policy(tmp_path):
    parser = argparse.ArgumentParser()
    ack_persisted.add_arguments(parser)
    args = parser.parse_args(["--messages", "200", "--rate", "1000", "--repeats", "1",
                              "--dir", str(tmp_path)])
    report = json.loads(json.dumps(ack_persisted.run(args)))
    assert set(report["results"]) == {"topicwire", "received"}
    for name, figures in report["results"].items():
        for policy in ack_persisted.POLICIES:
            assert 0 < figures[f"p50_us_{policy}"] <= figures[f"p99_us_{policy}"], name
            assert figures[f"acked_per_s_{policy}"] > 0, name
    assert "p99_us_batch topicwire/received" in report["ratios"]
    assert list(tmp_path.iterdir()) == []
