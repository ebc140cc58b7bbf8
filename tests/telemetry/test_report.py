"""topicwire routes report: a PNG of latency percentiles and loss per path, route changes
marked on the links they concern, bad files left out and listed."""

import argparse
import json

import pytest

from appliance.ops.cli import routes_cmd
from appliance.ops.telemetry.errors import RoutesError
from appliance.ops.telemetry.report import render
from appliance.ops.telemetry.store import TelemetryStore
from tests.telemetry.scenario import LINKS, WINDOWS, S, scenario

PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def cli(argv):
    parser = argparse.ArgumentParser()
    routes_cmd.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.handler(args)


def test_the_report_renders_every_path_and_marks_the_route_changes(tmp_path):
    TelemetryStore(tmp_path / "t").write(scenario())
    (tmp_path / "t" / "part-garbage.parquet").write_bytes(b"not parquet")
    drawn = render(tmp_path / "t", tmp_path / "r.png", step_ns=2 * S, k=2, margin=0.2)
    assert len(drawn["paths"]) == len(LINKS)
    assert drawn["points"] == len(LINKS) * WINDOWS // 2
    # a->d and b->d move off b->d at the same window: b->d's panel gets both marks,
    # a->b's (old a->d path), a->c and c->d's (new paths), b->a's (new b->d path)
    assert drawn["changes"] == 2
    assert drawn["marked"] == 2 + 1 + 2 + 2 + 1
    assert [e["reason"].split(":")[0] for e in drawn["excluded"]] == ["corrupt file"]
    width, height = png_size(tmp_path / "r.png")
    assert width == 1500 and height >= 3 * 260


def test_the_report_takes_the_changes_of_a_route_table_through_the_cli(tmp_path):
    TelemetryStore(tmp_path / "t").write(scenario())
    table = {"changes": [{"eval_start_ns": scenario()["window_start_ns"][0].as_py() + 5 * S,
                          "source": "a", "destination": "b", "from": ["a", "c", "d", "b"],
                          "to": ["a", "b"], "reason": "better"}]}
    (tmp_path / "routes.json").write_text(json.dumps(table))
    assert cli(["routes", "report", "--telemetry", str(tmp_path / "t"), "--out",
                str(tmp_path / "r.png"), "--routes", str(tmp_path / "routes.json")]) == 0
    assert png_size(tmp_path / "r.png")[0] > 0
    drawn = render(tmp_path / "t", tmp_path / "r2.png", routes=tmp_path / "routes.json")
    assert drawn["changes"] == 1 and drawn["marked"] == 4  # a->c, c->d, d->b, a->b
    assert drawn["step_ns"] == S


def test_a_report_without_usable_telemetry_is_a_clear_error(tmp_path):
    (tmp_path / "part-x.parquet").write_bytes(b"nope")
    with pytest.raises(RoutesError, match="routes: no usable telemetry"):
        render(tmp_path, tmp_path / "r.png")
