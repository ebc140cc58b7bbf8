"""bench.routes at tiny sizes: the report's shape, both sides measured, answers checked."""

import argparse
import json
import os

import pytest

from bench import routes

pytestmark = [
    pytest.mark.slow,  # starts Spark (10-25 s on two shared cores)
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


def tiny_args(extra=()):
    parser = argparse.ArgumentParser()
    routes.add_arguments(parser)
    return parser.parse_args(["--windows", "3000", "--paths", "6", "--eval", "10",
                              "--repeats", "1", *extra])


def test_report_has_the_shared_shape_with_the_pandas_baseline(monkeypatch):
    # a short job: the JVM's client compiler alone starts sooner on two cores
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS",
                       os.environ.get("PYSPARK_SUBMIT_ARGS",
                                      "--driver-java-options -XX:TieredStopAtLevel=1 "
                                      "pyspark-shell"))
    report = json.loads(json.dumps(routes.run(tiny_args())))
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert report["bench"] == "routes"
    params = report["params"]
    assert params["windows"] == 3000 and params["paths"] == 6 and params["files"] >= 1
    assert params["windows_per_path"] == 500 and params["groups"] == 6 * 50
    assert params["routes"] == 6 and params["master"].startswith("local")
    assert set(report["results"]) == {"topicwire", "pandas"}
    ours, theirs = report["results"]["topicwire"], report["results"]["pandas"]
    assert ours["windows_per_s"] > 0 and theirs["windows_per_s"] > 0
    assert ours["run_s"] > 0 and ours["start_s"] > 0
    assert report["ratios"]["windows_per_s topicwire/pandas"] == pytest.approx(
        ours["windows_per_s"] / theirs["windows_per_s"])


def test_the_mesh_has_the_links_asked_for():
    assert routes.mesh_links(2) == [("core0", "core1"), ("core1", "core0")]
    links = routes.mesh_links(56)
    assert len(set(links)) == 56 and len({u for u, _ in links}) == 8


def test_a_disagreement_between_spark_and_pandas_is_an_error():
    from appliance.ops.telemetry.costs import PathStats
    from datapath.errors import TopicwireError

    a = PathStats("b", "a", "fabric", 0, 1, 10, 1.0, 2.0, 3.0, 0.0, 1, 1, 0, 0, 0, 0, 1, 0)
    b = PathStats("b", "a", "fabric", 0, 1, 10, 1.0, 2.5, 3.0, 0.0, 1, 1, 0, 0, 0, 0, 1, 0)
    routes._check([a], [a])
    with pytest.raises(TopicwireError, match="bench: p99_ns of a->b"):
        routes._check([a], [b])
