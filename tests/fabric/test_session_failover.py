"""One client session moves to its standby when its own path is cut; the others stay.

Four network namespaces on one bridge: the primary appliance ``p`` (10.77.0.1), the standby
``s`` (10.77.0.2: P&M and ``[cache]`` keeping ``g/#``), and two client hosts, ``mover``
(10.77.0.3) and ``stayer`` (10.77.0.4), each running a guaranteed subscriber connected to
``p`` with ``s`` as its standby (``tests.fabric.gclient sub URL PATTERN STANDBY``). A
guaranteed publisher at ``s`` sends numbered messages. After CUT_AT of them, nftables on
``p``'s host drops everything between ``p`` and the mover's host, both ways: the mover's
session goes silent, moves to ``s`` and gets what it missed from ``s``'s cache; ``s`` tells
``p`` (SESSION_MOVE), which ends the old session at once. The stayer's path is untouched: its
session must not notice (no change of state) and get every message once, in order. Both
subscribers get every message exactly once and in order, with no loss event.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.appliance.helpers import FABRIC_KEY
from tests.fabric.harness import wait_until
from tests.fabric.test_guaranteed_restart import (
    MGMT_PORT,
    START_TIMEOUT_S,
    STATUS,
    Appliance,
    Lines,
    _client,
    _ranges,
)
from tests.netns import Fabric, requires_netns

pytestmark = [requires_netns, pytest.mark.slow]

MESSAGES = 6_000
RATE = 1_000.0
CUT_AT = 2_000
FABRIC_PORT = 47470
CLIENT_PORT = 47471
DELIVERY_TIMEOUT_S = 90.0
TOPIC = "g/orders/x"
CONFIG = """\
[appliance]
name = "{name}"
id = {node_id}
heartbeat_interval_ms = 50
neighbour_dead_ms = 3000
lsa_refresh_ms = 1000
[fabric]
listen = "10.77.0.{node_id}:{fabric_port}"
key = "{key}"
[[neighbours]]
name = "{other}"
address = "10.77.0.{other_id}:{fabric_port}"
[clients]
udp = "10.77.0.{node_id}:{client_port}"
[mgmt]
listen = "127.0.0.1:{mgmt_port}"
{extra}
"""
STANDBY_EXTRA = """[cache]
dir = "{cache}"
patterns = ["g/#"]
[pm]
mode = "embedded"
require_passwords = false
[pm.identities.feed]
publish = ["#"]
subscribe = ["#"]
"""


def _url(node_id: int) -> str:
    return f"udp://10.77.0.{node_id}:{CLIENT_PORT}"


def _cut(host, other: str) -> None:
    """Drop everything between ``host`` and ``other`` (an address), both ways, on ``host``."""
    rule = ("table inet twsession {\n"
            " chain input {\n  type filter hook input priority 0;\n"
            f"  ip saddr {other} counter drop\n }}\n"
            " chain output {\n  type filter hook output priority 0;\n"
            f"  ip daddr {other} counter drop\n }}\n}}\n")
    subprocess.run(["ip", "netns", "exec", host.name, "nft", "-f", "-"], input=rule,
                   text=True, check=True, capture_output=True)


def _counters(host) -> dict:
    import json

    done = host.run(sys.executable, "-c", STATUS, str(MGMT_PORT), check=False)
    return json.loads(done.stdout).get("counters", {}) if done.returncode == 0 else {}


def _judge(sub: Lines, what: str) -> tuple[list[int], list[dict], float]:
    """(numbers in arrival order, state changes, the longest pause between two messages)."""
    sub.wait(lambda item: item.get("m") == str(MESSAGES - 1), DELIVERY_TIMEOUT_S,
             f"the last message at the {what}")
    with sub.cond:
        items = list(sub.items)
    got = [int(item["m"]) for item in items if item.get("m", "w").isdigit()]
    times = [item["t"] for item in items if item.get("m", "w").isdigit()]
    states = [item for item in items if "state" in item]
    losses = [item["loss"] for item in items if "loss" in item]
    missing = sorted(set(range(MESSAGES)) - set(got))
    assert got == list(range(MESSAGES)) and not losses, (
        f"{what}: {len(got)} messages, missing {_ranges(missing)[:10]}, duplicates "
        f"{len(got) - len(set(got))}, losses {losses[:3]}, states {states}")
    return got, states, max(b - a for a, b in zip(times, times[1:]))


def test_a_session_whose_path_is_cut_moves_and_the_others_stay(tmp_path: Path):
    with Fabric() as fabric:
        hosts = {name: fabric.add_host() for name in ("p", "s", "mover", "stayer")}
        nodes = {}
        for name, node_id, other, other_id in (("p", 1, "s", 2), ("s", 2, "p", 1)):
            config = tmp_path / f"{name}.toml"
            extra = STANDBY_EXTRA.format(cache=tmp_path / "cache") if name == "s" else \
                '[pm]\nmode = "remote"'
            config.write_text(CONFIG.format(
                name=name, node_id=node_id, other=other, other_id=other_id,
                fabric_port=FABRIC_PORT, key=FABRIC_KEY, client_port=CLIENT_PORT,
                mgmt_port=MGMT_PORT, extra=extra))
            nodes[name] = Appliance(hosts[name], config, tmp_path / name)
        clients: list[Lines] = []
        try:
            for node in nodes.values():
                node.start()
            for node in nodes.values():
                node.wait_ready()
            subs = {}
            for name in ("mover", "stayer"):
                subs[name] = _client(hosts[name], ["sub", _url(1), "g/#", _url(2)],
                                     tmp_path / f"{name}.log", name)
                clients.append(subs[name])
            pub = _client(hosts["s"], ["pub", _url(2), TOPIC, str(MESSAGES), str(RATE)],
                          tmp_path / "publisher.log", "publisher")
            clients.append(pub)
            for name, sub in subs.items():  # the path works end to end for both
                sub.wait(lambda item: item.get("m") == "w", START_TIMEOUT_S,
                         f"a warm-up message at the {name}")
            pub.tell("go")
            pub.wait(lambda item: item.get("sent", 0) >= CUT_AT, 30, f"{CUT_AT} sent")
            _cut(hosts["p"], "10.77.0.3")
            _, moved_states, moved_pause = _judge(subs["mover"], "mover")
            _, stayed_states, stayed_pause = _judge(subs["stayer"], "stayer")
            p_counters = wait_until(lambda: (c := _counters(hosts["p"])).get(
                "control_sessions_moved_out") == 1 and c, 30.0, 0.2)
            s_counters = _counters(hosts["s"])
        finally:
            for client in clients:
                client.close()
            for node in nodes.values():
                node.stop()
    assert [(s["state"], s["appliance"]) for s in moved_states][-1] == ("reconnected", _url(2))
    assert not stayed_states, f"the stayer's session changed: {stayed_states}"
    assert s_counters.get("control_sessions_moved_in") == 1, s_counters
    assert p_counters.get("control_sessions_moved_out") == 1, p_counters
    print(f"\nthe mover's session moved ({[s['state'] for s in moved_states]}), its longest "
          f"pause {moved_pause * 1e3:.0f} ms; the stayer's longest pause "
          f"{stayed_pause * 1e3:.0f} ms, no change of state")
