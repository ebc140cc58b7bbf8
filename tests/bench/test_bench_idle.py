"""bench.idle at a tiny window: the report's shape, the three idle processes measured in one
run (the appliance alone, with a fabric and a silent client, and the C relay)."""

import argparse
import json

from bench import idle


def test_report_has_the_shared_shape_and_a_figure_for_each_process():
    parser = argparse.ArgumentParser()
    idle.add_arguments(parser)
    report = json.loads(json.dumps(idle.run(parser.parse_args(["--seconds", "0.5",
                                                               "--repeats", "1"]))))
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert set(report["results"]) == {"topicwire", "topicwire_busy_fabric", "c_relay"}
    for name, figures in report["results"].items():
        assert figures["cpu_percent"] >= 0.0, name
        assert len(report["params"]["runs"][name]) == 1
    assert "cpu_percent topicwire/c_relay" in report["ratios"] or \
        report["results"]["c_relay"]["cpu_percent"] == 0.0
