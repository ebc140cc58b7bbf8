"""bench.scale at tiny sizes: the report's shape and every phase's figure (no thresholds:
the figures are what a loaded host gives)."""

import argparse
import json

from bench import scale


def test_report_has_the_shared_shape_and_every_phase(tmp_path):
    parser = argparse.ArgumentParser()
    scale.add_arguments(parser)
    args = parser.parse_args(["--sessions", "5", "--topics", "400", "--subscriptions", "3",
                              "--register", "100", "--repeats", "3", "--big-repeats", "1",
                              "--trace", str(tmp_path / "trace.json")])
    report = json.loads(json.dumps(scale.run(args)))
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert report["bench"] == "scale"
    figures = report["results"]["topicwire"]
    for name in ("login_s", "subscribe_10_keys_median_ms", "subscribe_10_keys_p90_ms",
                 "subscribe_100k_keys_median_ms", "unsubscribe_100k_keys_median_ms",
                 "register_s", "bytes_per_idle_session", "bytes_per_subscription", "rss_mib"):
        assert isinstance(figures[name], float), name
    for name in ("login_s", "subscribe_10_keys_median_ms", "subscribe_100k_keys_median_ms",
                 "register_s", "rss_mib"):
        assert figures[name] > 0, name
    params = report["params"]
    assert params["sessions"] == 5 and params["topics"] == 400
    assert params["register_batch"] == 100 and params["preloaded_topics"] == 300
    assert len(params["subscribe_10_keys_ms"]) == 3
    assert len(params["subscribe_100k_keys_ms"]) == 1
    assert set(params["phases"]) == {"preload_s", "subscribe_all_s", "preload_control_cpu_s",
                                     "register_control_cpu_s", "register_process_cpu_s",
                                     "register_dataplane_cpu_s"}
    assert params["phases"]["register_process_cpu_s"] > 0
    assert set(params["rss_bytes"]) == {"start", "before_logins", "after_logins",
                                        "after_subscriptions", "end"}
    # --trace: each timed subscribe's stages, in the control thread and the data path's
    # process (its records come from the forked child), in the order they run
    trace = params["trace"]
    assert json.loads((tmp_path / "trace.json").read_text()) == trace
    assert set(trace) == {"small", "big", "big_off"}
    small = trace["small"]["labels"]
    for label in ("admin", "build_snapshot", "compiler_build", "publish_snapshot", "reply"):
        assert small[label]["runs"] == 3, label
    assert small["admin"]["start_ms"] <= small["build_snapshot"]["start_ms"] \
        <= small["publish_snapshot"]["start_ms"] <= small["reply"]["start_ms"]
    assert any(label.startswith("child_") for label in small), small
    assert 0 < trace["small"]["answer_ms"]
    from nic_offload.compiler import OffloadCompiler
    assert not hasattr(OffloadCompiler.build, "__wrapped__")  # the wrappers are gone


def test_topics_and_patterns_touch_the_stated_keys():
    from datapath.topics.algebra import matches

    topics = [scale.topic(i) for i in range(200)]
    assert len(set(topics)) == 200
    assert sum(matches(scale.group_pattern(3), t) for t in topics) == 10
    assert sum(matches("scale/0/#", t) for t in topics) == 200
