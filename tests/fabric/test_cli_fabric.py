"""The real commands across a fabric: ``topicwire run`` in two namespaces, ``topicwire sub
--stats`` on one, ``topicwire pub`` on the other, UDP between the appliances over veth."""

import json
import select
import subprocess
import sys
import time

from tests.appliance.helpers import CLI, FABRIC_KEY, start, stop, wait_ready
from tests.netns import Fabric, requires_netns

CONFIG = """
[appliance]
name = "{name}"
heartbeat_interval_ms = 50
[fabric]
listen = "{me}:47470"
key = "{key}"
[[neighbours]]
name = "{other}"
address = "{other_address}:47470"
[clients]
udp = "127.0.0.1:47471"
[mgmt]
listen = "127.0.0.1:47490"
[pm]
{pm}
"""
INTEREST = """
import json, sys, time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        with opener.open("http://127.0.0.1:47490/status", timeout=5) as reply:
            subs = json.load(reply)["subscriptions"]
        if any((s["origin"], s["pattern"]) == (sys.argv[1], sys.argv[2]) for s in subs):
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.05)
sys.exit(f"no interest of {sys.argv[1]} in {sys.argv[2]} within 30 s")
"""
"""Inside a namespace: wait until its appliance has a neighbour's interest (/status)."""


@requires_netns
def test_pub_on_one_appliance_reaches_sub_on_another_across_the_fabric(tmp_path):
    with Fabric() as fabric:
        hosts = [fabric.add_host(), fabric.add_host()]
        names = ["edge1", "core2"]
        procs = []
        try:
            for i, host in enumerate(hosts):
                path = tmp_path / f"{names[i]}.toml"
                path.write_text(CONFIG.format(
                    name=names[i], me=host.addresses[0], key=FABRIC_KEY, other=names[1 - i],
                    other_address=hosts[1 - i].addresses[0],
                    pm=('mode = "embedded"\nanonymous = true\nrequire_passwords = false'
                        if i == 0 else 'mode = "remote"')))
                procs.append(start([*CLI, "run", "--config", str(path)],
                                 ["ip", "netns", "exec", host.name]))
            for proc in procs:
                wait_ready(proc)
            sub = None
            deadline = time.monotonic() + 60
            while sub is None:  # core2 accepts logins once P&M's document has arrived
                candidate = start([*CLI, "sub", "--appliance", "127.0.0.1:47471", "fx/#",
                                   "--count", "200", "--stats"],
                                  ["ip", "netns", "exec", hosts[1].name])
                while time.monotonic() < deadline:
                    ready, _, _ = select.select([candidate.stderr], [], [], 0.5)
                    line = candidate.stderr.readline() if ready else ""
                    if "subscribed" in line:
                        sub = candidate
                        break
                    if candidate.poll() is not None:
                        time.sleep(0.2)
                        break
                assert time.monotonic() < deadline, "sub never subscribed"
            # the subscriber's interest has reached edge1 (its management API says so)
            seen = subprocess.run(["ip", "netns", "exec", hosts[0].name, sys.executable, "-c",
                                   INTEREST, "core2", "fx/#"], capture_output=True, text=True,
                                  timeout=60)
            assert seen.returncode == 0, seen.stderr[-2000:]
            pub = start([*CLI, "pub", "--appliance", "127.0.0.1:47471", "--topic", "fx/eur/usd",
                         "--count", "200", "--rate", "2000", "--json"],
                        ["ip", "netns", "exec", hosts[0].name])
            out, err = pub.communicate(timeout=60)
            assert pub.returncode == 0, err
            assert json.loads(out)["sent"] == 200
            out, _ = sub.communicate(timeout=30)
            stats = json.loads(out)
            assert stats == {**stats, "received": 200, "gaps": 0, "duplicates": 0}
            assert stats["latency_p50_us"] > 0
        finally:
            for proc in procs:
                assert stop(proc) == 0
