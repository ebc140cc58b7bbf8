"""Fabric groups: cores on one host exchanging data over UDP multicast on loopback.

Two appliances in this process join one group on 127.0.0.1 (TTL 0: the datagrams cannot
leave the host). The ingress sends the messages a group member wants once to the group; the
member delivers them; each appliance ignores its own looped-back frames; per-destination
frames and admin frames stay unicast. Config errors name the key.
"""

import uuid

import pytest

from appliance.client import connect
from appliance.config import ConfigError, parse_config
from appliance.node import Appliance
from tests.appliance.helpers import FABRIC_KEY, free_port, wait_for


def _group_port():
    return free_port()


def _configs(group_port, ports, ttl=0, group="239.255.77.7"):
    names = ["mc1", "mc2", "mc3"]
    tag = uuid.uuid4().hex[:6]
    docs = []
    for i, name in enumerate(names):
        neighbours = [{"name": other, "address": f"127.0.0.1:{ports[j]}",
                       **({"group": "cores"} if {i, j} != {0, 2} else {})}
                      for j, other in enumerate(names) if j != i]
        docs.append({
            "appliance": {"name": name, "heartbeat_interval_ms": 20, "lsa_refresh_ms": 500},
            "fabric": {"listen": f"127.0.0.1:{ports[i]}", "key": FABRIC_KEY,
                       "groups": [{"name": "cores", "address": f"{group}:{group_port}",
                                   "interface": "127.0.0.1", "ttl": ttl}]},
            "neighbours": neighbours,
            "clients": {"shm": f"tw-{tag}-{name}"},
            "pm": ({"mode": "embedded", "anonymous": True, "require_passwords": False}
                   if i == 0 else {"mode": "remote"}),
        })
    return docs


@pytest.fixture
def trio():
    """mc1, mc2, mc3 fully meshed; mc1-mc2 and mc2-mc3 on the group, mc1-mc3 unicast only."""
    ports = [free_port() for _ in range(3)]
    apps = [Appliance(parse_config(doc)).start() for doc in _configs(_group_port(), ports)]
    try:
        wait_for(lambda: all(len(a.status().get("routes", [])) == 6 and a.status()["node"]["pm"]
                             for a in apps), timeout_s=30)
        yield apps
    finally:
        for app in apps:
            app.stop()


def _counter(app, name):
    return app.status().get("counters", {}).get(name, 0)


def test_group_members_get_each_message_once_over_the_group(trio):
    mc1, mc2, mc3 = trio
    wait_for(lambda: all(n["group_heard_ms"] is not None for n in mc2.status()["neighbours"]),
             timeout_s=20)
    subs = {}
    clients = []
    try:
        for app in (mc2, mc3):
            c = connect(f"shm://{app.config.clients_shm}", "reader")
            clients.append(c)
            subs[app.config.name] = c.subscribe("fx/#")
        pub = connect(f"shm://{mc1.config.clients_shm}", "feed")
        clients.append(pub)
        wait_for(lambda: sum(1 for s in mc1.status()["subscriptions"]
                             if s["pattern"] == "fx/#") == 2, timeout_s=20)
        sent_before = {c["name"]: c["frames_out"] for c in mc1.status()["channels"]}
        n = 300
        for i in range(n):
            pub.publish(f"fx/eur/{i % 7}", b"%d" % i)
        pub.flush()
        pub.publish("fx/end", b"end", flush=True)  # after the rest: comes after them
        for name, sub in subs.items():
            got = []
            while (m := sub.get(timeout=10)) is not None and m.payload != b"end":
                got.append(m)
            assert m is not None, f"{name}: no end marker after {len(got)} messages"
            # each once: what came before the marker is all there is
            assert sorted(int(m.payload) for m in got) == list(range(n)), name
        # mc2 is a direct group member: its messages went to the group, mc3's unicast
        tx = [name for name in sent_before if name.startswith("group-tx:")]
        assert len(tx) == 1
        wait_for(lambda: next(c["frames_out"] for c in mc1.status()["channels"]
                              if c["name"] == tx[0]) > sent_before[tx[0]], timeout_s=5)
        wait_for(lambda: _counter(mc1, "group_own_frames") > 0, timeout_s=5)
        assert _counter(mc2, "group_unknown_peer") == 0
        wait_for(lambda: _counter(mc2, "group_data_frames") > 0, timeout_s=5)
        # ... through the forwarding pipeline, as every other DATA burst
        wait_for(lambda: _counter(mc2, "pipeline_group_frames") > 0, timeout_s=5)
        assert _counter(mc3, "group_data_frames") == 0
        # mc3 hears mc1's group frames too, but mc1 is not its group neighbour: dropped
        wait_for(lambda: _counter(mc3, "group_unknown_peer") > 0, timeout_s=5)
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("group, key", [
    ({"name": "g", "address": "10.0.0.1:47480", "interface": "127.0.0.1"},
     "fabric.groups[0].address"),
    ({"name": "g", "address": "239.1.1.1:47480"}, "fabric.groups[0].interface"),
    ({"name": "g", "address": "239.1.1.1:47480", "interface": "0.0.0.0"},
     "fabric.groups[0].interface"),
    ({"name": "g", "address": "239.1.1.1:47480", "interface": "127.0.0.1", "ttl": 2},
     "fabric.groups[0].ttl"),
    ({"name": "g", "address": "239.1.1.1", "interface": "127.0.0.1"},
     "fabric.groups[0].address"),
    ({"name": "g", "address": "239.1.1.1:1", "interface": "127.0.0.1", "colour": 1},
     "fabric.groups[0].colour"),
])
def test_bad_group_entries_are_refused_naming_the_key(group, key):
    doc = {"appliance": {"name": "c1"},
           "fabric": {"listen": "127.0.0.1:47470", "key": FABRIC_KEY, "groups": [group]}}
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert str(info.value).startswith(f"config: {key}")


def test_a_neighbour_on_an_unknown_group_is_refused():
    doc = {"appliance": {"name": "c1"},
           "fabric": {"listen": "127.0.0.1:47470", "key": FABRIC_KEY},
           "neighbours": [{"name": "c2", "address": "127.0.0.1:47471", "group": "cores"}]}
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert str(info.value).startswith("config: neighbours[0].group")


def test_a_missing_interface_is_refused_at_start_naming_the_key():
    doc = {"appliance": {"name": "c1"},
           "fabric": {"listen": f"127.0.0.1:{free_port()}", "key": FABRIC_KEY,
                      "groups": [{"name": "g", "address": "239.255.77.9:47480",
                                  "interface": "nosuchif0"}]}}
    with pytest.raises(ConfigError) as info:
        Appliance(parse_config(doc)).start()
    assert str(info.value).startswith("config: fabric.groups[0].interface")
