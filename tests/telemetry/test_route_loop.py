"""The whole loop in network namespaces: telemetry -> Spark (--follow) -> route table -> P&M ->
path switch, with guaranteed traffic across the switch and duplication mode.

Four cores with two disjoint paths, n1-n2-n4 and n1-n3-n4 (equal link costs: n1 reaches n4
through n2 first). Every appliance probes its neighbours and writes telemetry to one
directory; the route job follows it with Structured Streaming and writes the route table
that P&M (n1) watches. Delay injected on n2 -> n4 at the channel layer makes the job move
(n1, n4) to n3 within its hysteresis; traffic follows; a guaranteed stream published across
the switch arrives complete and in order; messages of a duplicated topic travel both paths
and are delivered once.
"""

import json
import sys
import threading
import time

import pytest

from appliance.ops.telemetry import routes_job
from tests.appliance.helpers import FABRIC_KEY
from tests.fabric.harness import CLIENT_PORT, FABRIC_PORT, IDENTITIES, NodeProcess, wait_until
from tests.netns import Fabric, requires_netns

pytestmark = [requires_netns, pytest.mark.spark, pytest.mark.slow]
LINKS = [(1, 2), (2, 4), (1, 3), (3, 4)]
DELAY_US = 10_000
MARGIN, K, MIN_GAIN = 0.5, 3, DELAY_US / 3
"""Hysteresis of the test's job: the two paths cost the same until the delay. The delay makes
the slow path cost over 10x the other (checked below), far past the margin; the minimum gain
(a third of the delay) keeps the noise of two shared cores from moving the route before it:
with relative margins alone (0.5, then 0.75) noise did, decided on windows that ended before
the delay began, in clean-clone runs (the core that forwards the guaranteed stream answers
probes later than the idle one, and hops of tens of microseconds make that a large ratio).
With a delay of 3,000 us (a minimum gain of 1,000 us) it still did: the forwarding core's
median reached 974 to 1,671 us against the idle one's 90 to 103 us, in a clean-clone run and
three runs after it, so the delay is 10,000 us (the gain 3,333 us)."""
WEIGHTS = {"p50_us": 1.0, "p99_us": 0.0, "p999_us": 0.0, "jitter_us": 0.0, "loss": 0.0,
           "retransmit_rate": 0.0, "hop_us": 1.0}
"""The test's cost is the median latency per hop, which the delay moves by 10,000 us. The
default weights also count tails, jitter and lost probes, which a host running four
appliances and Spark on two cores moves by milliseconds for seconds at a time (a clean-clone
run moved the route 4.7 s before the delay with them, past a 1,000 us minimum gain): right for
a real fabric, where such tails are the link's, but not what this test measures."""


class LoopNodeProcess(NodeProcess):
    def __init__(self, host, config):
        import subprocess

        from tests.appliance.helpers import ROOT

        self.host = host
        self.proc = host.popen([sys.executable, "-m", "tests.telemetry.fabric_node",
                                str(config)], cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def config(i: int, telemetry, table) -> str:
    # a thread data path: the test's node swaps in a delaying channel on that thread
    lines = [f'[appliance]\nname = "n{i}"\nid = {i}\nheartbeat_interval_ms = 50',
             'dataplane = "thread"',
             "neighbour_dead_ms = 600\nlsa_refresh_ms = 1000",
             f'[fabric]\nlisten = "10.77.0.{i}:{FABRIC_PORT}"\nkey = "{FABRIC_KEY}"',
             f'[clients]\nudp = "127.0.0.1:{CLIENT_PORT}"',
             f'[telemetry]\ndir = "{telemetry}"\nprobe_interval_ms = 5']
    for a, b in LINKS:
        if i in (a, b):
            other = b if a == i else a
            lines.append(f'[[neighbours]]\nname = "n{other}"\n'
                         f'address = "10.77.0.{other}:{FABRIC_PORT}"')
    if i == 1:
        lines.append('[pm]\nmode = "embedded"\nrequire_passwords = false' + IDENTITIES)
        lines.append(f'[routes]\ntable = "{table}"\npoll_ms = 200\nduplicate = ["dup/#"]')
    else:
        lines.append('[pm]\nmode = "remote"')
    return "\n".join(lines) + "\n"


@pytest.fixture
def mesh(tmp_path):
    fabric = Fabric()
    nodes = {}
    try:
        hosts = {i: fabric.add_host() for i in range(1, 5)}
        for i in range(1, 5):
            path = tmp_path / f"n{i}.toml"
            path.write_text(config(i, tmp_path / "telemetry", tmp_path / "routes.json"))
            nodes[i] = LoopNodeProcess(hosts[i], path)
        for node in nodes.values():
            node.wait_ready()
        yield nodes
    finally:
        for node in nodes.values():
            node.close()
        fabric.close()


def route(node, src, dst):
    for r in node.status()["routes"]:
        if (r["source"], r["destination"]) == (src, dst):
            return r["path"]
    return None


def counter(node, name):
    return node.status()["counters"].get(name, 0)


def test_telemetry_moves_the_route_and_guaranteed_traffic_follows_without_loss(
        spark, mesh, tmp_path):
    n1, n2, n3, n4 = (mesh[i] for i in range(1, 5))
    wait_until(lambda: all(len(n.status()["routes"]) == 12 and n.status()["node"]["pm"]
                           for n in mesh.values()), 60)
    # all four links up: equal costs, the smallest sequence of node ids wins
    wait_until(lambda: route(n1, "n1", "n4") == ["n1", "n2", "n4"], 30)
    n4.call({"cmd": "connect", "client": "sub", "identity": "reader"})
    n4.call({"cmd": "subscribe", "client": "sub", "pattern": "g/#", "qos": "guaranteed"})
    n4.call({"cmd": "subscribe", "client": "sub", "pattern": "dup/#"})
    n1.call({"cmd": "connect", "client": "pub", "identity": "feed"})
    n1.call({"cmd": "connect", "client": "dup", "identity": "feed"})
    wait_until(lambda: {s["pattern"] for s in n1.status()["subscriptions"]
                        if s["origin"] == "n4"} == {"g/#", "dup/#"}, 30)
    n1.call({"cmd": "pubstream", "client": "pub", "topic": "g/x", "qos": "guaranteed",
             "interval_s": 0.005, "burst": 2})

    tables, stop, failure = [], threading.Event(), {}

    def follow():
        try:
            routes_job.follow(spark, tmp_path / "telemetry", tmp_path / "routes.json",
                              eval_ns=1_000_000_000, weights=WEIGHTS, margin=MARGIN,
                              k=K, min_gain=MIN_GAIN,
                              trigger_s=1.0, stop=stop,
                              on_table=tables.append)
        except BaseException as exc:  # reported below
            failure["error"] = exc

    job = threading.Thread(target=follow)
    job.start()
    try:
        def first_full_table():  # an early window may lack a link not measured yet
            for table in list(tables):
                routes = {(r["source"], r["destination"]): r for r in table["routes"]}
                if routes.get(("n1", "n4"), {}).get("backup"):
                    return routes
            return None

        wait_until(lambda: first_full_table() or failure, 120)
        assert not failure, failure
        first = first_full_table()
        # equal costs: the measured figures decide which of the two paths is first
        path, backup = first[("n1", "n4")]["path"], first[("n1", "n4")]["backup"]
        assert sorted([path, backup]) == [["n1", "n2", "n4"], ["n1", "n3", "n4"]]
        slow, fast = mesh[int(path[1][1])], mesh[int(backup[1][1])]
        wait_until(lambda: counter(n1, "control_route_tables_applied") >= 1
                   and route(n1, "n1", "n4") == path, 30)
        transit_slow = counter(slow, "transit_frames")
        # the link between the slow node and n4 gets slow both ways
        n4.call({"cmd": "delay", "peer": f"10.77.0.{path[1][1]}:{FABRIC_PORT}",
                 "delay_us": DELAY_US})
        slow.call({"cmd": "delay", "peer": f"10.77.0.4:{FABRIC_PORT}", "delay_us": DELAY_US})
        delayed_at, delayed_ns = time.monotonic(), time.time_ns()
        wait_until(lambda: route(n1, "n1", "n4") == backup or failure, 180)
        wait_until(lambda: route(n4, "n4", "n1") == backup[::-1] or failure, 60)
        assert not failure, failure
        switched_s = time.monotonic() - delayed_at
        assert counter(slow, "transit_frames") > transit_slow  # (n1, n4) went through it
        # traffic follows: the other path carries (n1, n4) and (n4, n1) now, the old one none
        time.sleep(1.0)  # past the switch hold and the old path's drain
        fast_before, slow_before = counter(fast, "transit_frames"), counter(slow, "transit_frames")
        wait_until(lambda: counter(fast, "transit_frames") > fast_before + 100, 60)
        carried = counter(fast, "transit_frames") - fast_before
        assert counter(slow, "transit_frames") - slow_before < carried / 10, (
            route(n1, "n1", "n4"), route(n4, "n4", "n1"),
            [c for t in tables for c in t["changes"]])
        # the table that moved it: better by the margin for k windows
        moved = [c for t in tables for c in t["changes"]
                 if (c["source"], c["destination"]) == ("n1", "n4")]
        assert moved[-1]["to"] == backup and moved[-1]["reason"] == "better"
        # decided in the K-th evaluation window (1 s each) after the delay began
        seen = [(t["evaluation"]["last_ns"], {p["neighbour"]: p["p50_us"] for p in t["paths"]
                                              if p["appliance"] == "n4"}) for t in tables]
        assert delayed_ns - 1e9 < moved[-1]["eval_start_ns"] <= delayed_ns + K * 1e9, (
            delayed_ns, moved, seen)
        paths = {(p["appliance"], p["neighbour"]): p for p in tables[-1]["paths"]}
        assert paths[("n4", path[1])]["p50_us"] > DELAY_US * 0.9 > 10 * paths[
            ("n4", backup[1])]["p50_us"], seen
        # duplication mode: the new path, and the old one as its link-disjoint backup
        wait_until(lambda: json.loads((tmp_path / "routes.json").read_text())["routes"], 5)
        n1.call({"cmd": "publish", "client": "dup", "topics": ["dup/a", "dup/b"],
                 "rounds": 100, "numbered": True})
    finally:
        stop.set()
        job.join(120)
    sent = n1.call({"cmd": "end_stream", "client": "pub"})["sent"]["g/x"]
    got: list = []
    losses: list = []

    def all_in():
        answer = n4.call({"cmd": "log", "client": "sub"})
        got.extend(answer["log"])
        losses.extend(answer["losses"])
        return sum(1 for e in got if e[1] == "g/x") >= sent and sum(
            1 for e in got if e[1].startswith("dup/")) >= 200
    try:
        wait_until(all_in, 90)
    except AssertionError:
        pass  # the assertions below say what is missing
    # every duplicated message's second copy has reached n4 and been dropped there (only
    # dup/# is duplicated): none of them is still on its way to the subscriber
    try:
        wait_until(lambda: counter(n1, "duplicated_messages") >= 200
                   and counter(n4, "duplicates_dropped") >= 200, 30)
    except AssertionError:
        pass  # the assertions below say what is missing
    all_in()
    guaranteed = [int(e[2]) for e in got if e[1] == "g/x"]
    assert guaranteed == list(range(sent)), (
        f"guaranteed: {len(guaranteed)} of {sent}, first missing "
        f"{min(set(range(sent)) - set(guaranteed), default=None)}, in order: "
        f"{guaranteed == sorted(guaranteed)}; losses {losses}; "
        f"counters: { {f'n{i}': mesh[i].status()['counters'] for i in mesh} }")
    assert losses == []
    dup = sorted(int(e[2]) for e in got if e[1].startswith("dup/"))
    assert dup == list(range(200)), (len(dup), n1.status()["counters"], n4.status()["counters"])
    assert counter(n1, "duplicated_messages") >= 200
    assert counter(n4, "duplicates_dropped") >= 200
    print(f"\nroute moved {switched_s:.1f} s after the delay; {sent} guaranteed messages, "
          f"{counter(n4, 'duplicates_dropped')} duplicates dropped; off_path n2/n3/n4: "
          f"{counter(n2, 'off_path')}/{counter(n3, 'off_path')}/{counter(n4, 'off_path')}; "
          f"retransmissions: {counter(n1, 'guaranteed_retransmitted')}")
