"""bench.guaranteed at a tiny size: the report's shape, both ways of the stream measured in one
run, nothing lost either way."""

import argparse
import json

from bench import guaranteed


def test_report_has_the_shared_shape_and_the_signed_and_unsigned_figures():
    parser = argparse.ArgumentParser()
    guaranteed.add_arguments(parser)
    report = json.loads(json.dumps(guaranteed.run(parser.parse_args(
        ["--messages", "300", "--repeats", "1"]))))
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert set(report["results"]) == {"topicwire", "unsigned"}
    for figures in report["results"].values():
        assert figures["msgs_per_s"] > 0 and figures["lost"] == 0
    assert report["results"]["topicwire"]["sign_check_ns_per_frame"] > 0
    assert "msgs_per_s topicwire/unsigned" in report["ratios"]
