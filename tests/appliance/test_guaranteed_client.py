"""Guaranteed QoS through one appliance on loopback: the client API and ``topicwire sub``.

(Loss and recovery across lossy links: tests/fabric/test_guaranteed.py.) Here: a guaranteed
subscription gets its messages from a reliable stream (flagged, numbered contiguously per
publisher across topics, in publish order), a best-effort subscription of the same client
gets its own copies with the publisher's per-topic numbers, and ``topicwire sub --qos
guaranteed --stats`` counts no gaps for a publisher on several topics.
"""

import json
import select
import subprocess
import time

import pytest

from appliance.client import connect
from appliance.config import parse_config
from appliance.node import Appliance
from tests.appliance.helpers import CLI, ROOT, free_port, start, wait_for

TOPICS = ["g/a", "g/b", "g/c"]


@pytest.fixture
def appliance():
    port = free_port()
    cfg = parse_config({"appliance": {"name": f"gq{port}"},
                        "clients": {"udp": f"127.0.0.1:{port}"},
                        "pm": {"anonymous": True, "require_passwords": False}})
    app = Appliance(cfg).start()
    yield app, f"127.0.0.1:{port}"
    app.stop()


def test_a_guaranteed_subscription_gets_a_reliable_stream_in_publish_order(appliance):
    app, address = appliance
    with connect(f"udp://{address}", "s") as sub_client, \
            connect(f"udp://{address}", "p") as pub:
        guaranteed = sub_client.subscribe("g/#", qos="guaranteed")
        plain = sub_client.subscribe("g/#")
        n = 600
        for i in range(n):
            pub.publish(TOPICS[i % 3], b"%d" % i, qos="guaranteed")
        pub.flush()
        got = [guaranteed.get(timeout=10) for _ in range(n)]
        other = [plain.get(timeout=10) for _ in range(n)]
    assert None not in got and None not in other
    assert [int(m.payload) for m in got] == list(range(n))
    assert all(m.guaranteed for m in got) and not any(m.guaranteed for m in other)
    seqs = [m.sequence for m in got]
    assert seqs == list(range(seqs[0], seqs[0] + n))  # one stream across the topics
    per_topic = {t: [m.sequence for m in other if m.topic == t] for t in TOPICS}
    assert all(s == list(range(1, n // 3 + 1)) for s in per_topic.values())  # publisher's
    assert guaranteed.lost_messages == 0 and not guaranteed.losses
    # the status snapshot is rebuilt periodically: wait for one taken after the stream
    assert wait_for(lambda: app.status()["counters"].get("guaranteed_offered", 0) >= n)
    assert app.status()["counters"].get("guaranteed_lost_messages", 0) == 0


def test_sub_stats_on_a_guaranteed_stream_count_no_gaps_across_topics(appliance):
    _, address = appliance
    proc = start([*CLI, "sub", "--appliance", address, "g/#", "--qos", "guaranteed",
                  "--count", "300", "--seconds", "45", "--stats"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready and "subscribed" in proc.stderr.readline():
            break
        assert proc.poll() is None, proc.stderr.read()
    with connect(f"udp://{address}", "p") as pub:
        for i in range(300):
            pub.publish(TOPICS[i % 3], b"x", qos="guaranteed")
        pub.flush()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    stats = json.loads(out)
    assert stats["received"] == 300 and stats["gaps"] == 0 and stats["duplicates"] == 0
    assert stats["lost"] == 0


def test_pub_refuses_nothing_new_for_guaranteed(appliance):
    _, address = appliance
    done = subprocess.run([*CLI, "pub", "--appliance", address, "--topic", "g/a", "--count",
                           "50", "--qos", "guaranteed", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sent"] == 50
