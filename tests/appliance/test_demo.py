"""``topicwire demo``: the embedded fabric on this host, run for real as a subprocess.

P&M, two cores (UDP multicast between them on loopback) and an edge in four ``topicwire
run`` processes, three worker processes with the clients: every subscriber must receive
exactly what its requests and selector decide for what was published (the publishers count
it with the topic algebra's reference), nothing lost on loopback, nothing twice; the live
table and the summary are printed; exit code 0; nothing the demo started is left running.
"""

import json
import os
import subprocess
import sys

import pytest

from appliance.ops.demo import PUBLISHERS, SUBSCRIBERS, path_of
from tests.appliance.helpers import ROOT

DEMO_SECONDS = 5
DEMO_RATE = 200
"""Per publisher: modest, so that a busy test machine keeps up."""


def _demo_processes():
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if "topicwire-demo-" in line or "appliance.ops.demo worker" in line]


@pytest.mark.skipif(not os.path.exists("/sys/class/net/lo"), reason="needs Linux loopback")
def test_demo_delivers_what_the_subscriptions_decide_and_exits_0():
    before = set(_demo_processes())
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from appliance.ops.cli import main; "
         "sys.exit(main(sys.argv[1:]))", "demo", "--seconds", str(DEMO_SECONDS), "--rate",
         str(DEMO_RATE), "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["ok"] is True
    # every publisher published for the whole run at its rate (give or take one tick)
    assert summary["sent"] >= 0.9 * len(PUBLISHERS) * DEMO_RATE * DEMO_SECONDS
    subs = summary["subscribers"]
    assert set(subs) == {s.name for s in SUBSCRIBERS}
    for name, doc in subs.items():
        assert doc["expected"] > 0, name  # every subscriber had something to receive
        assert doc["delivered"] == doc["expected"], name
        assert doc["duplicates"] == 0 and doc["loss_events"] == 0, name
    assert summary["delivered"] == summary["expected"] == sum(
        d["expected"] for d in subs.values())
    assert summary["lost"] == 0 and summary["duplicates"] == 0
    assert summary["order_errors"] == 0
    assert 0 < summary["latency_p50_us"] <= summary["latency_p99_us"]
    # the paths: best-effort over the cores' multicast group, guaranteed end to end, transit
    core1, core2 = summary["appliances"]["core1"], summary["appliances"]["core2"]
    assert core1.get("group_data_frames", 0) + core2.get("group_data_frames", 0) > 0
    assert core1.get("guaranteed_offered", 0) > 0 and core2.get("transit_frames", 0) > 0
    # the printed table names the paths and the summary line is there
    assert path_of("core1", "edge") in " ".join(proc.stdout.split())
    assert "demo: OK" in proc.stdout
    assert set(_demo_processes()) <= before  # it stopped everything it started


def test_demo_help_names_its_options():
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from appliance.ops.cli import main; "
         "sys.exit(main(sys.argv[1:]))", "demo", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for option in ("--seconds", "--rate", "--json", "--keep"):
        assert option in proc.stdout
