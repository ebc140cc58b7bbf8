"""bench.softnic at tiny sizes: the report's shape, and that what it reports is what the twin
decides for the same workload."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import softnic
from datapath.errors import TopicwireError
from nic_offload.snapshot import Snapshot
from nic_offload.softnic import layout as L
from nic_offload.softnic.twin import TwinState, run_twin

SIZES = {"keys": 3000, "rules": 60, "rules_per_class": 12, "ring_frames": 1500,
         "messages_per_frame": 2, "unknown": 0.05, "seed": 4}
TINY = ["--keys", "3000", "--rules", "60", "--rules-per-class", "12", "--ring-frames", "1500",
        "--messages-per-frame", "2", "--unknown", "0.05", "--seed", "4", "--batch", "16",
        "--twin-messages", "300", "--repeats", "2"]


def tiny_args(extra=()):
    parser = argparse.ArgumentParser()
    softnic.add_arguments(parser)
    return parser.parse_args([*TINY, *extra])


@pytest.fixture(scope="module")
def report():
    return json.loads(json.dumps(softnic.run(tiny_args())))


def test_report_has_the_shared_shape_with_both_baselines(report):
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert report["bench"] == "softnic"
    params = report["params"]
    assert (params["keys"], params["rules"], params["batch"]) == (3000, 60, 16)
    assert params["acl_classes"] == 5 and params["acl_entries"] > 0
    assert params["ring_frames"] == 1500 and params["ring_messages"] == 3000
    assert params["bursts_per_ring"] == -(-1500 // 16)
    assert params["twin_messages"] == params["checked_frames"] * 2 == 300
    assert set(report["results"]) == {"topicwire", "python_twin", "memory_floor"}
    for figures in report["results"].values():
        for metric in ("msgs_per_s", "ns_per_msg", "wall_msgs_per_s", "wall_ns_per_msg"):
            assert figures[metric] > 0
        assert figures["ns_per_msg"] == pytest.approx(1e9 / figures["msgs_per_s"])
    assert report["results"]["topicwire"]["build_s"] > 0
    for baseline in ("python_twin", "memory_floor"):
        assert f"msgs_per_s topicwire/{baseline}" in report["ratios"]


def test_the_reported_counts_are_what_the_twin_decides_for_the_same_ring(report):
    work = softnic.build_workload(**SIZES)
    tables = Snapshot.build(work.entries).tables
    state = TwinState(work.messages)
    descs, verdicts, frames = run_twin(memoryview(work.buf), work.offsets.tolist(),
                                       work.lengths.tolist(), tables, state, 16, 16_384)
    assert frames == len(work.offsets) and len(verdicts) == work.messages
    counts = report["params"]["verdicts"]
    for verdict in L.MessageVerdict:
        if verdict is not L.MessageVerdict.NOT_PROCESSED:
            assert counts[verdict.name.lower()] == verdicts.count(verdict), verdict.name
    assert counts["messages"] == work.messages and counts["frames"] == frames
    assert counts["digests"] == len(state.digests) and counts["digest_drops"] == 0
    assert report["params"]["descriptors"] == len(descs)
    # the workload exercises every path the goal is about
    for name in ("forwarded", "acl_rejected", "unknown_key", "punted", "dropped"):
        assert counts[name] > 0, name


def test_the_workload_is_the_one_described():
    work = softnic.build_workload(**SIZES)
    rows = work.entries.key_rows
    assert len(rows) == 3000 and len(np.unique(rows.keys)) == 3000
    forwards = np.isin(rows.actions, [2, 3])
    assert (rows.acl_classes[forwards] > 0).all() and (rows.acl_classes[~forwards] == 0).all()
    assert work.messages == 3000 and (work.lengths == work.lengths[0]).all()
    again = softnic.build_workload(**SIZES)
    assert np.array_equal(again.buf, work.buf)  # one seed, one workload


def test_defaults_are_the_documented_sizes():
    parser = argparse.ArgumentParser()
    softnic.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.keys, args.rules, args.batch) == (1_000_000, 1_000, 64)
    with pytest.raises(SystemExit):
        parser.parse_args(["--keys", "0"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--unknown", "1.5"])


def test_a_pipeline_that_disagrees_with_its_twin_fails_the_run(monkeypatch):
    real = softnic.run_twin

    def off_by_one(buf, offsets, lengths, tables, state, burst, capacity):
        descs, verdicts, frames = real(buf, offsets, lengths, tables, state, burst, capacity)
        verdicts[0] = L.MessageVerdict.DROPPED if verdicts[0] != L.MessageVerdict.DROPPED \
            else L.MessageVerdict.FORWARDED
        return descs, verdicts, frames

    monkeypatch.setattr(softnic, "run_twin", off_by_one)
    with pytest.raises(TopicwireError, match="bench: the numba pipeline and its Python twin"):
        softnic.run(tiny_args())


def test_the_command_prints_the_report_of_the_same_run(report):
    """``topicwire bench softnic ... --json`` as a user runs it: one JSON document on stdout,
    progress on stderr, and the workload's counts equal to those of ``run()``."""
    script = Path(sys.executable).with_name("topicwire")  # the console script of the venv
    entry = [str(script)] if script.exists() else [
        sys.executable, "-c", "import sys; from appliance.ops.cli import main; sys.exit(main())"]
    command = [*entry, "bench", "softnic", *TINY, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["bench"] == "softnic" and "softnic" in done.stderr
    assert set(printed["results"]) == {"topicwire", "python_twin", "memory_floor"}
    assert printed["params"]["verdicts"] == report["params"]["verdicts"]
    assert printed["params"]["checked_frames"] == report["params"]["checked_frames"] > 0
