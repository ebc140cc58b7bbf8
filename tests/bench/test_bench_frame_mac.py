"""bench.frame_mac at a tiny size: the report's shape, every frame shape timed both ways, and
the frames it signs pass their check (the bench refuses to report otherwise)."""

import argparse
import json

from bench import frame_mac


def test_report_has_the_shared_shape_and_a_figure_per_frame_shape_and_baseline():
    parser = argparse.ArgumentParser()
    frame_mac.add_arguments(parser)
    report = json.loads(json.dumps(frame_mac.run(parser.parse_args(
        ["--frames", "8", "--rounds", "3", "--repeats", "1", "--large", "1000"]))))
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert set(report["results"]) == {"topicwire", "copy"}
    ours, copy = report["results"]["topicwire"], report["results"]["copy"]
    shapes = [k[:-len("_ns_per_frame")] for k in copy]
    assert shapes == ["one_64B_message", "13_64B_messages", "one_1000B_message"]
    for shape in shapes:
        assert ours[f"{shape}_ns_per_frame"] > 0 and copy[f"{shape}_ns_per_frame"] > 0
        assert f"{shape}_ns_per_frame topicwire/copy" in report["ratios"]
    assert ours["13_64B_messages_frame_bytes"] <= 1_472 - 32
