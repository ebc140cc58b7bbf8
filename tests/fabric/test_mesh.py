"""Fabrics of appliances in network namespaces: exact delivery, churn, neighbour loss, P&M
entitlements and rogue admin frames.

Each node is a separate process in its own namespace (an appliance and its local clients);
appliances reach each other over real UDP across veth. The reference for delivery is the
topic algebra: a client's requests replayed as a seed 000 list (``naive_decision``) decide
which of the published topics it must receive, and every message arrives once.
"""

import subprocess
import sys
from collections import Counter

import pytest

from datapath.topics.algebra import matches
from datapath.topics.sublist import naive_decision
from tests.appliance.helpers import FABRIC_KEY, ROOT
from tests.fabric.harness import FABRIC_PORT, Mesh, wait_until
from tests.netns import requires_netns

pytestmark = requires_netns

TOPICS = [f"{region}/{ex}/{sym}/{kind}" for region in ("us", "eu") for ex in ("x1", "x2")
          for sym in ("ibm", "sap") for kind in ("trade", "quote")]
SQUARE = [(1, 2), (2, 3), (3, 4), (4, 1), (1, 5)]
"""A square of cores n1-n2-n3-n4; n1 also lists n5, an address where no appliance runs (the
rogue host's)."""


MARKERS = ["us/x1/ibm/trade", "us/x1/ibm/quote", "us/x2/sap/trade", "eu/x1/ibm/quote"]
"""Published once more by a publisher after its rounds: the last of its messages to reach a
subscriber (one publisher's messages arrive in order), so once a subscriber has all it must,
markers included, nothing of what was published before is still on its way. Every list in
these tests decides at least one of them."""
END = "end"
"""The payload of an end marker that must be told apart from the traffic (``log``)."""


def expected(requests, topics, rounds):
    return Counter({t: rounds for t in topics if naive_decision(requests, t)})


def publish(node, client, topics, rounds):
    """``rounds`` of ``topics``, then the end markers."""
    node.call({"cmd": "publish", "client": client, "topics": topics, "rounds": rounds})
    node.call({"cmd": "publish", "client": client, "topics": MARKERS})


def marked(requests, topics, rounds, publishers=1):
    """What a subscriber with ``requests`` receives from ``publishers`` that each called
    ``publish``: their rounds and their end markers."""
    markers = expected(requests, MARKERS, publishers)
    assert markers, f"{requests} decides no end marker"
    return expected(requests, topics, rounds) + markers


def setup_client(node, name, requests, identity="feed"):
    node.call({"cmd": "connect", "client": name, "identity": identity})
    for r in requests:
        op = "subscribe" if r[0] == "+" else "unsubscribe"
        node.call({"cmd": op, "client": name, "pattern": r[1:]})


def interest_seen(node, origin, patterns):
    subs = node.status()["subscriptions"]
    return {s["pattern"] for s in subs if s["origin"] == origin} == set(patterns)


def collect(node, client, want, timeout_s=20.0):
    """Receive until ``want`` (with the end markers: ``marked``) arrived, or more than it of
    some topic, or time out: (what arrived, duplicates). Once the markers are in, anything
    more would have come before them."""
    got, dups = Counter(), 0

    def done():
        nonlocal got, dups
        more, d = node.received(client)
        got += more
        dups += d
        return got == want or any(got[t] > want[t] for t in got)
    try:
        wait_until(done, timeout_s, 0.05)
    except AssertionError:
        pass  # the caller's comparison says what is missing
    return got, dups


@pytest.fixture(scope="module")
def square(tmp_path_factory):
    mesh = Mesh(4, SQUARE, tmp_path_factory.mktemp("square"))
    try:
        wait_until(lambda: mesh.converged(12), timeout_s=60)
        yield mesh
    finally:
        mesh.close()


def test_triangle_delivers_exactly_to_matching_subscribers(tmp_path):
    mesh = Mesh(3, [(1, 2), (2, 3), (1, 3)], tmp_path)
    try:
        wait_until(lambda: mesh.converged(), timeout_s=60)
        n1, n2, n3 = (mesh.node(i) for i in (1, 2, 3))
        plans = {(2, "s2"): ["+us/#", "-us/+/+/quote"], (3, "s3"): ["+#/ibm/#", "+#/ibm/trade"],
                 (1, "s1"): ["+#/trade"]}
        for (i, name), requests in plans.items():
            setup_client(mesh.node(i), name, requests)
        # superset suppression: n3 advertises #/ibm/# only (it includes #/ibm/trade)
        wait_until(lambda: interest_seen(n1, "n3", ["#/ibm/#"]) and interest_seen(n1, "n2", [
            "us/#"]) and interest_seen(n3, "n2", ["us/#"]) and interest_seen(n2, "n3",
                                                                              ["#/ibm/#"]))
        n1.call({"cmd": "connect", "client": "p1"})
        n3.call({"cmd": "connect", "client": "p3"})
        publish(n1, "p1", TOPICS, 3)
        publish(n3, "p3", TOPICS, 2)
        for (i, name), requests in plans.items():
            want = marked(requests, TOPICS, 5, publishers=2)
            got, dups = collect(mesh.node(i), name, want)
            assert dups == 0
            assert got == want, f"n{i} {name}"
        tables = []
        for i in (1, 2, 3):  # loop-free: every path simple, and the same everywhere
            routes = {(r["source"], r["destination"]): tuple(r["path"])
                      for r in mesh.node(i).status()["routes"]}
            assert len(routes) == 6
            assert all(len(set(p)) == len(p) for p in routes.values())
            tables.append(routes)
        assert tables[0] == tables[1] == tables[2]
        assert n1.status()["offload"]["off_path"] == 0
    finally:
        mesh.close()


def test_square_delivers_exactly_and_forwards_through_intermediate_cores(square):
    n1, n3 = square.node(1), square.node(3)
    plans = {(3, "q3"): ["+eu/#", "-eu/x2/#", "+eu/x2/sap/trade"], (2, "q2"): ["+#/quote"],
             (4, "q4"): ["+us/x1/#"]}
    for (i, name), requests in plans.items():
        setup_client(square.node(i), name, requests)
    wait_until(lambda: interest_seen(n1, "n3", ["eu/#"]) and interest_seen(n1, "n2", ["#/quote"])
               and interest_seen(n1, "n4", ["us/x1/#"]))
    n1.call({"cmd": "connect", "client": "pub"})
    before = n3.status()["counters"].get("transit_frames", 0) + \
        square.node(2).status()["counters"].get("transit_frames", 0) + \
        square.node(4).status()["counters"].get("transit_frames", 0)
    publish(n1, "pub", TOPICS, 4)
    for (i, name), requests in plans.items():
        want = marked(requests, TOPICS, 4)
        got, dups = collect(square.node(i), name, want)
        assert dups == 0 and got == want, f"n{i} {name}"
    # n1 -> n3 is two hops: some node between them forwarded without running the tables
    wait_until(lambda: sum(square.node(i).status()["counters"].get("transit_frames", 0)
                           for i in (2, 3, 4)) > before, timeout_s=5)


def test_subscription_churn_while_traffic_flows(square):
    n1, n3 = square.node(1), square.node(3)
    n1.call({"cmd": "connect", "client": "streamer"})
    n3.call({"cmd": "connect", "client": "churner"})
    topics = TOPICS[:8]
    n1.call({"cmd": "stream", "client": "streamer", "topics": topics, "interval_s": 0.02})
    ever: set[str] = set()
    steps = [["+us/#"], ["-us/#", "+#/ibm/#"], ["-us/x1/ibm/#"], ["+us/x2/sap/quote"],
             ["-#"], ["+us/x1/#"]]
    dups = 0

    def streamed():
        return n1.call({"cmd": "streamed", "client": "streamer"})["rounds"]
    try:
        for step in steps:
            for r in step:
                op = "subscribe" if r[0] == "+" else "unsubscribe"
                n3.call({"cmd": op, "client": "churner", "pattern": r[1:]})
                if r[0] == "+":
                    ever.add(r[1:])
            # traffic flows under this list: ten more rounds of the stream
            after = streamed() + 10
            wait_until(lambda after=after: streamed() >= after, timeout_s=20, interval_s=0.02)
            got, d = n3.received("churner")
            dups += d
            assert all(any(matches(p, t) for p in ever) for t in got), got
    finally:
        n1.call({"cmd": "end_stream", "client": "streamer"})
    # after the churn the fabric has converged to the final list
    final = [r for step in steps for r in step]
    wait_until(lambda: interest_seen(n1, "n3", ["eu/#", "us/x1/#"]))
    # the streamer's end marker: once the churner has it, the stream's last messages have
    # come too (one publisher's messages arrive in order)
    n1.call({"cmd": "publish", "client": "streamer", "topics": [MARKERS[0]], "payload": END})
    log = []

    def ended():
        log.extend(n3.call({"cmd": "log", "client": "churner"})["log"])
        return any(entry[2] == END for entry in log)
    wait_until(ended, timeout_s=20)
    got, d = n3.received("churner")
    dups += d
    assert all(any(matches(p, t) for p in ever) for t in got), got
    assert dups == 0
    # exact delivery again
    publish(n1, "streamer", topics, 3)
    want = marked(final, topics, 3)
    got, d = collect(n3, "churner", want)
    assert d == 0 and got == want


def _path(node, src, dst):
    for r in node.status()["routes"]:
        if (r["source"], r["destination"]) == (src, dst):
            return r["path"]
    return None


def _neighbour_state(node, name):
    return next(n["state"] for n in node.status()["neighbours"] if n["name"] == name)


def test_neighbour_loss_reroutes_and_its_return_restores_the_path(square):
    n1, n2 = square.node(1), square.node(2)
    setup_client(n2, "lossy", ["+us/x2/#"])
    n1.call({"cmd": "connect", "client": "lp"})
    wait_until(lambda: "us/x2/#" in {s["pattern"] for s in n1.status()["subscriptions"]
                                     if s["origin"] == "n2"})
    assert _path(n1, "n1", "n2") == ["n1", "n2"]
    want = marked(["+us/x2/#"], TOPICS, 2)
    square.cut(1, 2)
    try:
        wait_until(lambda: _neighbour_state(n1, "n2") == "down"
                   and _neighbour_state(n2, "n1") == "down", timeout_s=10)
        wait_until(lambda: _path(n1, "n1", "n2") == ["n1", "n4", "n3", "n2"], timeout_s=10)
        wait_until(lambda: _path(square.node(3), "n1", "n2") == ["n1", "n4", "n3", "n2"])
        publish(n1, "lp", TOPICS, 2)
        got, dups = collect(n2, "lossy", want)
        assert dups == 0 and got == want
    finally:
        square.mend(1, 2)
    wait_until(lambda: _neighbour_state(n1, "n2") == "up", timeout_s=10)
    wait_until(lambda: all(_path(square.node(i), "n1", "n2") == ["n1", "n2"] for i in (1, 2)),
               timeout_s=10)
    publish(n1, "lp", TOPICS, 2)
    got, dups = collect(n2, "lossy", want)
    assert dups == 0 and got == want


def test_entitlements_from_the_embedded_pm_deny_publish_subscribe_and_login(square):
    n3 = square.node(3)  # P&M is embedded in n1; n3 checks with the document it received
    n3.call({"cmd": "connect", "client": "r", "identity": "reader"})
    answer = n3.call({"cmd": "publish", "client": "r", "topics": ["us/x1/ibm/trade"]},
                     check=False)
    assert not answer["ok"] and "may not publish" in answer["error"]
    n3.call({"cmd": "connect", "client": "e", "identity": "eu-only"})
    answer = n3.call({"cmd": "subscribe", "client": "e", "pattern": "us/#"}, check=False)
    assert not answer["ok"] and "may not subscribe" in answer["error"]
    assert n3.call({"cmd": "subscribe", "client": "e", "pattern": "eu/x1/#"})["ok"]
    answer = n3.call({"cmd": "connect", "client": "x", "identity": "nobody"}, check=False)
    assert not answer["ok"] and "not known to P&M" in answer["error"]
    want = {("reader", "publish", "us/x1/ibm/trade"), ("eu-only", "subscribe", "us/#"),
            ("nobody", "login", "")}
    wait_until(lambda: want <= {(d["identity"], d["action"], d["pattern"])
                                for d in n3.status()["denials"]}, timeout_s=5)
    # the denied subscription added no route: n1 sees n3's interest without us/#
    wait_until(lambda: "us/#" not in {s["pattern"] for s in square.node(1).status()[
        "subscriptions"] if s["origin"] == "n3"})


ROGUE = """
import socket, sys, hashlib
from datapath.protocol import admin_layout as al
from datapath.protocol.codec import encode_admin, set_mac
from datapath.protocol.frame_layout import FrameType
target = (sys.argv[1], int(sys.argv[2]))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.77.0.5", int(sys.argv[2])))
interest = al.Control(al.ControlKind.INTEREST,
                      '{"origin":99,"epoch":1,"seq":1,"patterns":[[0,"#"]]}')
plain = encode_admin(FrameType.CONTROL, [interest], source_session=99)
forged = encode_admin(FrameType.CONTROL, [interest], source_session=99, auth=(1, 1, 1))
set_mac(forged, hashlib.blake2b(bytes(forged[:-16]), key=bytes(32), digest_size=16).digest())
hello = encode_admin(FrameType.HELLO, [al.Hello(99, 1, 50, al.NodeRole.CORE, 0, "n5")],
                     source_session=99, auth=(1, 1, 2))
set_mac(hello, bytes(16))
for frame in (plain, forged, hello, b"TW\\x01\\x0e garbage that is not a frame"):
    for _ in range(3):
        s.sendto(bytes(frame), target)
"""


def test_admin_frames_from_a_rogue_host_are_counted_and_dropped(square):
    n1 = square.node(1)
    rogue = square.fabric.add_host()  # 10.77.0.5: the address n1 lists as neighbour n5
    assert rogue.addresses == ["10.77.0.5"]
    rejected_before = Counter(n1.status()["auth"]["rejected"])
    subprocess.run(["ip", "netns", "exec", rogue.name, sys.executable, "-c", ROGUE,
                    "10.77.0.1", str(FABRIC_PORT)], cwd=ROOT, check=True, capture_output=True)

    def counted():
        now = Counter(n1.status()["auth"]["rejected"]) - rejected_before
        return now if now["no_trailer"] >= 3 and now["bad_mac"] >= 6 and \
            now["malformed"] >= 3 else None
    wait_until(counted, timeout_s=10)
    status = n1.status()
    assert all(s["origin"] not in ("99", "n5") for s in status["subscriptions"])
    assert _neighbour_state(n1, "n5") == "down"
    assert all("99" not in r["path"] for r in status["routes"])
    assert FABRIC_KEY  # the rogue never had it


def test_a_route_override_from_pm_moves_a_pair_onto_another_path_fabric_wide(square):
    n1, n2 = square.node(1), square.node(2)
    setup_client(n2, "routed", ["+eu/x1/#"])
    n1.call({"cmd": "connect", "client": "rp"})
    wait_until(lambda: "eu/x1/#" in {s["pattern"] for s in n1.status()["subscriptions"]
                                     if s["origin"] == "n2"})
    refused = square.node(3).call({"cmd": "submit", "command": "set_route", "args": {
        "source": "n1", "destination": "n2", "path": ["n1", "n4", "n3", "n2"]}})["result"]
    assert not refused["ok"] and "P&M" in refused["error"]
    result = n1.call({"cmd": "submit", "command": "set_route", "args": {
        "source": "n1", "destination": "n2", "path": ["n1", "n4", "n3", "n2"]}})["result"]
    assert result["ok"]
    try:
        wait_until(lambda: all(_path(square.node(i), "n1", "n2") == ["n1", "n4", "n3", "n2"]
                               for i in (1, 2, 3, 4)), timeout_s=10)
        transit_before = square.node(4).status()["counters"].get("transit_frames", 0)
        want = marked(["+eu/x1/#"], TOPICS, 2)
        publish(n1, "rp", TOPICS, 2)
        got, dups = collect(n2, "routed", want)
        assert dups == 0 and got == want
        wait_until(lambda: square.node(4).status()["counters"].get("transit_frames", 0)
                   > transit_before, timeout_s=5)
    finally:
        n1.call({"cmd": "submit", "command": "clear_route",
                 "args": {"source": "n1", "destination": "n2"}})
    wait_until(lambda: all(_path(square.node(i), "n1", "n2") == ["n1", "n2"]
                           for i in (1, 2, 3, 4)), timeout_s=10)


def test_a_stopping_appliance_says_goodbye_and_its_neighbours_route_around_it(tmp_path):
    mesh = Mesh(3, [(1, 2), (2, 3), (1, 3)], tmp_path, dead_ms=30_000)
    try:
        wait_until(lambda: mesh.converged(), timeout_s=60)
        mesh.node(3).close()  # drains and stops: a goodbye, long before 30 s of silence
        wait_until(lambda: _neighbour_state(mesh.node(1), "n3") == "down"
                   and _neighbour_state(mesh.node(2), "n3") == "down", timeout_s=5)
        wait_until(lambda: mesh.converged(2), timeout_s=10)
    finally:
        mesh.close()
