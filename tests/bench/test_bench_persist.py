"""bench.persist at a tiny size: the report's shape, every case measured for the log and for
the raw disk in one run, the files removed afterwards."""

import argparse
import json

from bench import persist


def test_report_has_every_case_for_the_log_and_the_raw_disk(tmp_path):
    parser = argparse.ArgumentParser()
    persist.add_arguments(parser)
    args = parser.parse_args(["--mib", "1", "--repeats", "1", "--batch", "64",
                              "--dir", str(tmp_path)])
    report = json.loads(json.dumps(persist.run(args)))
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert set(report["results"]) == {"topicwire", "raw_disk"}
    cases = [f"{size}B_{policy}" for size in persist.SIZES for policy in persist.POLICIES]
    for name, figures in report["results"].items():
        for case in cases:
            assert figures[f"msgs_per_s_{case}"] > 0, (name, case)
            assert figures[f"bytes_per_s_{case}"] > 0, (name, case)
            assert figures[f"p99_us_{case}"] > 0, (name, case)
        assert figures["msgs_per_s_replay_64B"] > 0
    assert f"bytes_per_s_{cases[0]} topicwire/raw_disk" in report["ratios"]
    assert report["params"]["fs"] != ""
    assert list(tmp_path.iterdir()) == []
