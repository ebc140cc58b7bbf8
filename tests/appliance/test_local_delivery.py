"""One appliance: clients over UDP and shared memory get exactly what their lists say.

The reference is the topic algebra: each subscriber's requests replayed into a seed 000 list
(``naive_decision``) decide which published topics it must receive, once each.
"""

from collections import Counter

import pytest

from appliance.client import connect
from appliance.config import parse_config
from appliance.node import Appliance
from datapath.topics.sublist import naive_decision
from tests.appliance.helpers import free_port, wait_for

TOPICS = [f"{region}/{ex}/{sym}/{kind}" for region in ("us", "eu") for ex in ("x1", "x2")
          for sym in ("ibm", "sap") for kind in ("trade", "quote")]
SUBSCRIBERS = {
    "us-all-but-quotes": ["+us/#", "-us/+/+/quote"],
    "ibm-anywhere": ["+#/ibm/#"],
    "trades": ["+#/trade"],
    "nothing-left": ["+eu/#", "-eu/#"],
}
END = "end/marker"


@pytest.fixture
def appliance(tmp_path):
    port = free_port()
    cfg = parse_config({"appliance": {"name": f"local{port}"},
                        "clients": {"udp": f"127.0.0.1:{port}", "shm": f"local{port}"},
                        "pm": {"anonymous": True, "require_passwords": False}})
    app = Appliance(cfg).start()
    yield app, port
    app.stop()


def test_each_subscriber_gets_exactly_what_its_list_decides(appliance):
    app, port = appliance
    urls = [f"udp://127.0.0.1:{port}", f"shm://local{port}"]
    clients, subs, ends = {}, {}, {}
    for i, (name, requests) in enumerate(SUBSCRIBERS.items()):
        c = clients[name] = connect(urls[i % 2], name)
        for r in requests:
            if r[0] == "+":
                subs.setdefault(name, []).append(c.subscribe(r[1:]))
            else:
                c.unsubscribe(r[1:])
        ends[name] = c.subscribe(END)  # the end marker, apart from the lists under test
    publisher = connect(urls[0], "publisher")
    rounds = 5
    for _ in range(rounds):
        for topic in TOPICS:
            publisher.publish(topic, topic.encode())
    publisher.flush()
    expected = {name: Counter({t: rounds for t in TOPICS if naive_decision(reqs, t)})
                for name, reqs in SUBSCRIBERS.items()}
    got = {name: Counter() for name in SUBSCRIBERS}

    def drained():
        for name, _c in clients.items():
            for sub in subs.get(name, []):
                while (m := sub.get(timeout=0)) is not None:
                    assert m.payload == m.topic.encode()
                    got[name][m.topic] += 1
        return all(got[n] == expected[n] for n in SUBSCRIBERS)

    wait_for(drained, timeout_s=20)
    # a marker published after everything: once a client has it, whatever the publisher
    # sent it before is in its subscriptions (a client takes its messages in order)
    publisher.publish(END, b"end", flush=True)
    for name in SUBSCRIBERS:
        assert ends[name].get(timeout=10) is not None, f"{name}: no end marker"
    assert drained(), "more arrived than expected (duplicates)"
    for c in [*clients.values(), publisher]:
        c.close()
    # the NIC forwards a message once (one descriptor, to a port or a group of them) when
    # anyone wants it: every round of each topic some list decides, and the end marker
    wanted = {t for t in TOPICS if any(naive_decision(r, t) for r in SUBSCRIBERS.values())}
    forwarded = rounds * len(wanted) + 1
    wait_for(lambda: app.status()["offload"]["verdicts"].get("forwarded", 0) >= forwarded)
    assert app.status()["offload"]["verdicts"]["forwarded"] == forwarded


def test_status_shows_local_subscriptions_and_clients(appliance):
    app, port = appliance
    with connect(f"udp://127.0.0.1:{port}", "watcher") as c:
        c.subscribe("a/#")
        c.subscribe("a/b")
        status = wait_for(lambda: app.status() if app.status()["clients"] else None)
        assert status["node"]["name"].startswith("local")
        wait_for(lambda: {s["pattern"] for s in app.status()["subscriptions"]} == {"a/#"})
        assert app.status()["clients"][0]["identity"] == "watcher"
    wait_for(lambda: not app.status()["clients"])


def test_embedded_client_runs_its_own_appliance():
    with connect("embedded:", "me") as c:
        sub = c.subscribe("x/+")
        c.publish("x/y", b"1", flush=True)
        c.publish("x/y/z", b"2", flush=True)
        c.publish("x/end", b"3", flush=True)  # matches: it comes next, x/y/z went nowhere
        m = sub.get(timeout=10)
        assert m is not None and (m.topic, m.payload) == ("x/y", b"1")
        m = sub.get(timeout=10)
        assert m is not None and (m.topic, m.payload) == ("x/end", b"3")
