"""Flow control between an appliance and its clients, end to end (docs/flow-control.md).

One ``topicwire run`` appliance process (started as a user's is: it loads the kernels
``topicwire warm`` compiled); publishers are ``topicwire pub`` processes at full
rate (``--rate 0``); subscribers are ``topicwire sub --stats`` processes, or a client in this
process that does not read until told to (so its appliance must hold its messages: the
policy is certain to act). Every run checks that the counts add up to what was published:
throttle delivers everything, drop-oldest and conflate deliver the rest of what they report;
and that the kernel dropped nothing at the appliance's clients socket (or the in-process
subscriber's): a publisher that outran its appliance lost frames there that no policy saw
(docs/flow-control.md, "Local publishers send under a credit").
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
import urllib.request

import pytest

from appliance.client import ClientError, connect
from tests.appliance.helpers import (
    CLI,
    ROOT,
    appliance_pair,
    free_port,
    production_env,
    run_appliance,
    start,
    stop,
    wait_for,
)

MAX_RATE_MESSAGES = 200_000
"""Messages of the max-rate runs (``pub --rate 0``)."""
HELD_MESSAGES = 100_000
"""Messages of the runs with a subscriber that does not read while they are published."""
REMOTE_RATE = 20_000
"""Messages a second of the publisher on another appliance than its throttled subscriber."""
DEADLINE_S = 240.0
"""How long a run may take at most on a loaded 2-core machine (a shortfall fails there)."""

CONFIG = """
[appliance]
name = "fc{port}"
[clients]
udp = "127.0.0.1:{port}"
[mgmt]
listen = "127.0.0.1:{mgmt}"
[pm]
require_passwords = false
flow_policy = "conflate"
[pm.identities.feed]
publish = ["fc/#"]
subscribe = ["fc/#"]
[pm.identities.viewer]
subscribe = ["fc/#"]
[pm.identities.lossy]
subscribe = ["fc/#"]
flow_policy = "drop-oldest"
"""


def kernel_drops(port: int) -> int:
    """Datagrams the kernel dropped at the loopback UDP socket bound to ``port`` because its
    receive memory was full (``/proc/net/udp``'s ``drops``; 0 when none is bound)."""
    local = f"0100007F:{port:04X}"
    with open("/proc/net/udp") as f:
        return sum(int(line.split()[-1]) for line in list(f)[1:]
                   if line.split()[1] == local)


class Served:
    def __init__(self, tmp_path) -> None:
        self.port, self.mgmt = free_port(), free_port()
        config = tmp_path / "fc.toml"
        config.write_text(CONFIG.format(port=self.port, mgmt=self.mgmt))
        self.proc = run_appliance(config, env=production_env())
        self.address = f"127.0.0.1:{self.port}"

    def kernel_drops(self) -> int:
        """What the kernel dropped at the appliance's clients socket (a publisher that
        outran the data path: no policy would report it)."""
        return kernel_drops(self.port)

    def counters(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.mgmt}/status", timeout=10) as r:
            return json.load(r)["counters"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("flow"))
    yield s
    stop(s.proc)


def _sub(served: Served, identity: str, *args: str) -> subprocess.Popen:
    proc = start([*CLI, "sub", "--appliance", served.address, "--identity", identity,
                  "--stats", "--seconds", str(DEADLINE_S), *args], env=production_env())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until it is subscribed
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready and "subscribed" in proc.stderr.readline():
            return proc
        assert proc.poll() is None, proc.stderr.read()
    raise AssertionError("sub did not subscribe")


def _pub(served: Served | str, topic: str, count: int, rate: int = 0) -> subprocess.Popen:
    address = served if isinstance(served, str) else served.address
    return subprocess.Popen([*CLI, "pub", "--appliance", address, "--identity", "feed",
                             "--topic", topic, "--count", str(count), "--rate", str(rate),
                             "--json"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=production_env())


def _max_rate_run(served: Served, policy: str, topic: str) -> tuple[dict, dict, dict]:
    """``pub --rate 0`` of MAX_RATE_MESSAGES to ``sub --stats --flow-policy policy``:
    (the publisher's summary, the subscriber's, the appliance's counter deltas)."""
    before = served.counters()
    drops_before = served.kernel_drops()
    sub = _sub(served, "viewer", "fc/#", "--count", str(MAX_RATE_MESSAGES),
               "--flow-policy", policy)
    pub = _pub(served, topic, MAX_RATE_MESSAGES)
    pub_out, pub_err = pub.communicate(timeout=DEADLINE_S)
    assert pub.returncode == 0, pub_err
    # nothing lost unseen where the publisher sends: its appliance's credit keeps it within
    # what the appliance's socket holds (docs/flow-control.md); checked before waiting for
    # the subscriber, which would wait out its deadline for what the kernel dropped
    assert served.kernel_drops() == drops_before, "the appliance's socket overflowed"
    sub_out, sub_err = sub.communicate(timeout=DEADLINE_S + 30)
    assert sub.returncode == 0, sub_err
    published, stats = json.loads(pub_out), json.loads(sub_out)
    reported = sum(stats["dropped_by_policy"].values())

    def settled() -> dict | None:  # the data path publishes its counters every 250 ms
        now = served.counters()
        delta = {k: now.get(k, 0) - before.get(k, 0) for k in now
                 if k.startswith("flow_dropped_")}
        return delta if sum(delta.values()) == reported else None
    delta = wait_for(settled, 30, what="the appliance's drop counters to match the report") \
        if reported else {}
    print(json.dumps({"policy": policy, "pub": published, "sub": stats, "appliance": delta}),
          file=sys.stderr)
    return published, stats, delta


def test_throttle_at_full_rate_delivers_every_message(served):
    published, stats, delta = _max_rate_run(served, "throttle", "fc/throttle")
    assert published["sent"] == MAX_RATE_MESSAGES
    assert stats["delivered"] == MAX_RATE_MESSAGES, stats
    assert stats["gaps"] == 0 and stats["lost"] == 0 and stats["dropped_by_policy"] == {}
    assert delta == {}


@pytest.mark.parametrize("policy", ["drop-oldest", "conflate"])
def test_a_dropping_policy_at_full_rate_accounts_for_every_message(served, policy):
    published, stats, delta = _max_rate_run(served, policy, f"fc/{policy}")
    assert published["sent"] == MAX_RATE_MESSAGES
    dropped = sum(stats["dropped_by_policy"].values())
    assert stats["delivered"] + dropped == MAX_RATE_MESSAGES, stats
    assert stats["accounted"] == MAX_RATE_MESSAGES and stats["lost"] == 0, stats
    # each gap is one the appliance reported (what it dropped before the first message
    # delivered, or after the last, shows as no gap)
    assert stats["gaps"] <= dropped, stats
    assert set(stats["dropped_by_policy"]) <= {policy, "drop-oldest"}  # a full conflate
    assert stats["conflated"] == stats["dropped_by_policy"].get("conflate", 0)  # queue
    assert {k: v for k, v in delta.items() if v} == {  # evicts its oldest
        f"flow_dropped_{name.replace('-', '_')}": n
        for name, n in stats["dropped_by_policy"].items()}


def _held_run(served: Served, identity: str, flow_policy: str | None, topic: str,
              poll: bool = False) -> tuple[int, dict, dict]:
    """HELD_MESSAGES published at full rate to a subscriber of this process that reads
    nothing until the publisher is done, or (throttle) until the appliance holds the
    publisher off: (messages delivered, the subscription's policy drops, pub's summary).
    ``poll``: a poll subscription (``Client.poll``) instead of the iterator."""
    # (timeout_s: this process may compile the client's kernels first, with bounds checks)
    drops_before = served.kernel_drops()
    with connect(f"udp://{served.address}", identity, timeout_s=120) as client:
        sub = client.subscribe("fc/#", flow_policy=flow_policy, poll=poll)
        own_port = client.channel._sock.getsockname()[1]
        polled = []
        pub = _pub(served, topic, HELD_MESSAGES)
        if flow_policy == "throttle":
            wait_for(lambda: served.counters().get("flow_level_publishers_held", 0) >= 1,
                     DEADLINE_S, what="the appliance to hold the publisher off")
        else:
            pub.wait(DEADLINE_S)
        delivered = 0
        deadline = time.monotonic() + DEADLINE_S
        def overflowed() -> tuple[int, int]:  # (the appliance's socket, this subscriber's)
            return served.kernel_drops() - drops_before, kernel_drops(own_port)

        while delivered + sum(sub.policy_drops.values()) < HELD_MESSAGES:
            assert time.monotonic() < deadline, (delivered, dict(sub.policy_drops))
            if poll:
                got = client.poll(polled.append, 4096, timeout_s=1.0)
                polled.clear()
            else:
                got = sub.get(timeout=1.0) is not None
            delivered += got
            if not got:  # what the kernel dropped never comes: fail now, saying where
                assert overflowed() == (0, 0), "a socket overflowed: (appliance, subscriber)"
        assert overflowed() == (0, 0), "a socket overflowed: (appliance, subscriber)"
        out, err = pub.communicate(timeout=DEADLINE_S)
        assert pub.returncode == 0, err
        return delivered, dict(sub.policy_drops), json.loads(out)


def test_pm_global_policy_applies_to_an_identity_without_one(served):
    delivered, drops, _ = _held_run(served, "viewer", None, "fc/global")
    assert set(drops) == {"conflate"} and delivered + drops["conflate"] == HELD_MESSAGES


def test_an_identity_policy_overrides_the_global_one(served):
    delivered, drops, _ = _held_run(served, "lossy", None, "fc/identity")
    assert set(drops) == {"drop-oldest"}
    assert delivered + drops["drop-oldest"] == HELD_MESSAGES


def test_a_poll_subscription_is_told_what_its_policy_dropped(served):
    delivered, drops, _ = _held_run(served, "lossy", None, "fc/poll", poll=True)
    assert set(drops) == {"drop-oldest"}, drops  # (none before: counted on callback and
    assert delivered + drops["drop-oldest"] == HELD_MESSAGES  # iterator subscriptions only)


def test_a_subscription_policy_overrides_the_identity_one_and_throttle_holds_the_publisher(
        served):
    delivered, drops, published = _held_run(served, "lossy", "throttle", "fc/subscription")
    assert drops == {} and delivered == HELD_MESSAGES
    assert published["flow_waits"] >= 1, published


def test_a_bad_policy_name_is_refused_with_one_line_naming_its_place(served, tmp_path):
    sub = subprocess.run([*CLI, "sub", "--appliance", served.address, "fc/#",
                          "--flow-policy", "fastest"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env=production_env())
    assert sub.returncode == 2
    assert sub.stderr.strip() == ("topicwire: sub: --flow-policy 'fastest' is not a "
                                  "flow-control policy; use one of throttle, drop-oldest, "
                                  "conflate")
    for key, line in (("pm.flow_policy", 'flow_policy = "fastest"'),
                      ("pm.identities.viewer.flow_policy", None)):
        text = CONFIG.format(port=free_port(), mgmt=free_port())
        if line is None:
            text = text.replace('[pm.identities.viewer]\n',
                                '[pm.identities.viewer]\nflow_policy = "fastest"\n')
        else:
            text = text.replace('flow_policy = "conflate"', line)
        config = tmp_path / "bad.toml"
        config.write_text(text)
        run = subprocess.run([*CLI, "run", "--config", str(config)], cwd=ROOT,
                             capture_output=True, text=True, timeout=120, env=production_env())
        assert run.returncode == 2
        assert run.stderr.strip() == (f"topicwire: config: {key}: 'fastest' is not a "
                                      "flow-control policy; use one of throttle, "
                                      "drop-oldest, conflate")
    with connect(f"udp://{served.address}", "viewer", timeout_s=120) as client, \
            pytest.raises(ClientError, match="flow_policy 'fastest' is not a flow-control"):
        client.subscribe("fc/#", flow_policy="fastest")


def test_throttle_holds_a_publisher_on_another_appliance_and_loses_nothing():
    """Publisher at A, throttling subscriber at B that reads nothing until A holds the
    publisher off: B's queue sends A a hold over the fabric (signed), A holds its publisher,
    and every message arrives once the subscriber reads. The publisher runs at
    REMOTE_RATE, which B's data path (a thread of this process) keeps up with: at full
    rate what is in flight when the hold is sent can overflow B's fabric socket, which the
    subscriber sees as ``lost`` (docs/flow-control.md, Limits)."""
    identities = {"feed": {"publish": ["fc/#"]}, "viewer": {"subscribe": ["fc/#"]}}
    with appliance_pair(identities) as (a, b, url_a, url_b):
        with connect(url_b, "viewer", timeout_s=120) as client:
            sub = client.subscribe("fc/#", flow_policy="throttle")
            wait_for(lambda: any(s["pattern"] == "fc/#" and s["origin"] != a.config.name
                                 for s in a.status()["subscriptions"]), 30,
                     what="A to know B's subscription")
            pub = _pub(url_a.removeprefix("udp://"), "fc/remote", HELD_MESSAGES, REMOTE_RATE)
            wait_for(lambda: a.status()["counters"].get("flow_level_publishers_held", 0) >= 1,
                     DEADLINE_S, what="A to hold its publisher off for B's subscriber")
            wait_for(lambda: b.status()["counters"].get("flow_node_signals_sent", 0) >= 1,
                     30, what="B's count of the holds it sent A")  # (published lazily)
            delivered = 0
            deadline = time.monotonic() + DEADLINE_S
            while delivered < HELD_MESSAGES:
                assert time.monotonic() < deadline, (delivered, dict(sub.policy_drops))
                if sub.get(timeout=1.0) is not None:
                    delivered += 1
            out, err = pub.communicate(timeout=DEADLINE_S)
            assert pub.returncode == 0, err
            assert json.loads(out)["flow_waits"] >= 1
            assert dict(sub.policy_drops) == {} and delivered == HELD_MESSAGES
            counters_a = wait_for(lambda: (lambda c: c if c.get("flow_node_holds", 0) else None)(
                a.status()["counters"]), 30, what="A's count of the holds it took")
            assert counters_a.get("flow_node_signals_refused", 0) == 0, counters_a


def test_a_subscriber_without_a_configured_policy_sends_no_flow_signals_while_it_keeps_up():
    """No policy configured anywhere: the appliance forwards freely until the client first
    says "on", so a client that keeps up has nothing to tell it (no "off" refresh per
    50 ms while frames come)."""
    identities = {"feed": {"publish": ["fc/#"]}, "viewer": {"subscribe": ["fc/#"]}}
    with appliance_pair(identities) as (a, _, url_a, _), \
            connect(url_a, "viewer", timeout_s=120) as viewer, \
            connect(url_a, "feed", timeout_s=120) as feed:
        sub = viewer.subscribe("fc/#")
        assert sub.flow_policy is None
        for i in range(2_000):
            feed.publish("fc/quiet", b"%d" % i)
            if i % 100 == 99:
                time.sleep(0.02)  # ~5,000 msgs/s over ~0.4 s: several refresh intervals
        feed.flush()
        for i in range(2_000):
            assert sub.get(timeout=30) is not None, i
        assert viewer._rflow.signals_sent == 0
