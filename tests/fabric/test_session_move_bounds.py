"""A session moves to its standby when its own path's loss or latency stays above the
bounds it was given (``connect(..., move_on=MoveBounds(...))``); the other sessions on the
same appliance stay.

The fabric of tests/fabric/test_session_failover.py: the primary ``p`` (10.77.0.1), the
standby ``s`` (10.77.0.2, P&M and ``[cache]`` keeping ``g/#``), and two client hosts,
``mover`` (10.77.0.3) and ``stayer`` (10.77.0.4), each running a guaranteed subscriber
connected to ``p`` with ``s`` as its standby and the same bounds, under a guaranteed
publisher at ``s``. After CUT_AT messages one client's path to ``p`` is spoiled:

- nftables on ``p``'s host drops the packets from the mover's UDP source port, all of them
  (the appliance's own traffic still reaches the mover: not silence, loss) or half of them
  at random (``numgen random mod 100 < 50``);
- ``tc`` netem on the mover's host delays its packets to ``p`` by DELAY_MS (a prio qdisc
  whose third band, the netem one, takes only what goes to 10.77.0.1); on a kernel without
  the netem or prio qdisc (``CONFIG_NET_SCH_NETEM``, ``CONFIG_NET_SCH_PRIO`` not set) the
  mover reaches ``p`` through a UDP relay on its own host (tests/fabric/delayrelay.py),
  which delays what the mover sends by DELAY_MS from then on.

The mover's session moves to ``s`` with a reason naming the bound and the measured value,
and gets every message once and in order (the gap from ``s``'s cache); ``s`` counts the move
by its reason and tells ``p``, which ends the old session. The stayer never changes state,
stays on ``p`` and gets every message once and in order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.appliance.helpers import FABRIC_KEY
from tests.fabric.harness import wait_until
from tests.fabric.test_guaranteed_restart import (
    MGMT_PORT,
    START_TIMEOUT_S,
    Appliance,
    Lines,
    _client,
)
from tests.fabric.test_session_failover import (
    CLIENT_PORT,
    CONFIG,
    CUT_AT,
    FABRIC_PORT,
    MESSAGES,
    RATE,
    STANDBY_EXTRA,
    TOPIC,
    _counters,
    _judge,
    _url,
)
from tests.netns import Fabric, requires_netns

pytestmark = [requires_netns, pytest.mark.slow]

DELAY_MS = 500
RELAY_PORT = 47481
COMMON = ["probe_interval_ms=50", "hold_down_s=120", "session_timeout_s=10"]
"""Both subscribers' settings besides the bound a test watches. The session timeout is
long: the move must come from the bound (loss is judged after the window and the 1 s loss
timeout of its last probes), never from silence."""
LOSS_BOUNDS = ["loss_ratio=0.3", "window_s=2", *COMMON]
LATENCY_BOUNDS = ["latency_ms=250", "window_s=3", *COMMON]
"""Wide of the healthy path: on the loaded 2-core host a first run with a 150 ms bound over
1 s saw the untouched subscriber's median reach 514 ms (its appliance's control agent, which
answers the probes, stalled) and move it too."""


def _drop_from_port(host, source: str, port: int, percent: int) -> None:
    """On ``host``: drop ``percent`` % of the UDP packets from ``source``:``port``."""
    chance = "" if percent >= 100 else f"numgen random mod 100 < {percent} "
    rule = ("table inet twmove {\n chain input {\n  type filter hook input priority 0;\n"
            f"  ip saddr {source} udp sport {port} {chance}counter drop\n }}\n}}\n")
    subprocess.run(["ip", "netns", "exec", host.name, "nft", "-f", "-"], input=rule,
                   text=True, check=True, capture_output=True)


_NETEM: list[bool] = []


def _netem(host) -> bool:
    """Whether this kernel has the prio and netem qdiscs (asked once, on a veth of a
    namespace of its own)."""
    if not _NETEM:
        from tests.netns import Host

        probe = Host(f"twnetem{os.getpid()}")
        try:
            probe.run("ip", "link", "add", "na", "type", "veth", "peer", "name", "nb")
            ok = probe.run("tc", "qdisc", "add", "dev", "na", "root", "handle", "1:", "prio",
                           check=False).returncode == 0
            ok = ok and probe.run("tc", "qdisc", "add", "dev", "na", "parent", "1:3",
                                  "handle", "30:", "netem", "delay", "1ms",
                                  check=False).returncode == 0
        finally:
            probe.close()
        _NETEM.append(ok)
    return _NETEM[0]


def _delay_to(host, address: str, delay_ms: int) -> None:
    """On ``host``: delay what it sends to ``address`` by ``delay_ms`` (netem)."""
    dev = host.ifname
    for cmd in (["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "prio"],
                ["tc", "qdisc", "add", "dev", dev, "parent", "1:3", "handle", "30:", "netem",
                 "delay", f"{delay_ms}ms"],
                ["tc", "filter", "add", "dev", dev, "parent", "1:0", "protocol", "ip", "prio",
                 "1", "u32", "match", "ip", "dst", f"{address}/32", "flowid", "1:3"]):
        host.run(*cmd)


def _moved(tmp_path: Path, spoil, bound: str, bounds: list[str], relay: bool = False
           ) -> dict:
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
        subs: dict[str, Lines] = {}
        try:
            for node in nodes.values():
                node.start()
            for node in nodes.values():
                node.wait_ready()
            primary = {"mover": _url(1), "stayer": _url(1)}
            path = None
            if relay:  # the mover reaches p through a relay on its own host
                path = Lines(["ip", "netns", "exec", hosts["mover"].name, sys.executable,
                              "-m", "tests.fabric.delayrelay", str(RELAY_PORT), "10.77.0.1",
                              str(CLIENT_PORT)], tmp_path / "relay.log")
                clients.append(path)
                path.wait(lambda item: item.get("ready"), 30, "the relay")
                primary["mover"] = f"udp://127.0.0.1:{RELAY_PORT}"
            for name in ("mover", "stayer"):
                subs[name] = _client(hosts[name], ["sub", primary[name], "g/#", _url(2),
                                                   *bounds], tmp_path / f"{name}.log", name)
                clients.append(subs[name])
            pub = _client(hosts["s"], ["pub", _url(2), TOPIC, str(MESSAGES), str(RATE)],
                          tmp_path / "publisher.log", "publisher")
            clients.append(pub)
            for name, sub in subs.items():
                sub.wait(lambda item: item.get("m") == "w", START_TIMEOUT_S,
                         f"a warm-up message at the {name}")
            port = subs["mover"].wait(lambda item: item.get("ready"), 1, "ready")["port"]
            pub.tell("go")
            pub.wait(lambda item: item.get("sent", 0) >= CUT_AT, 30, f"{CUT_AT} sent")
            spoil(hosts, port, path)
            _, moved_states, moved_pause = _judge(subs["mover"], "mover")
            got, stayed_states, stayed_pause = _judge(subs["stayer"], "stayer")
            p_counters = wait_until(lambda: (c := _counters(hosts["p"])).get(
                "control_sessions_moved_out") == 1 and c, 30.0, 0.2)
            s_counters = _counters(hosts["s"])
        finally:
            for client in clients:
                client.close()
            for node in nodes.values():
                node.stop()
    for sub in subs.values():
        sub.thread.join(5)
    final = {name: next((i["counters"] for i in sub.items if "counters" in i), {})
             for name, sub in subs.items()}
    last = moved_states[-1]
    assert (last["state"], last["appliance"]) == ("reconnected", _url(2)), moved_states
    assert last["reason"].startswith(f"moved to {_url(2)}: {bound} "), last
    assert [s["state"] for s in moved_states] == ["lost", "reconnecting", "reconnected"], \
        moved_states
    assert not stayed_states, f"the stayer's session changed: {stayed_states}"
    assert final["stayer"].get("appliance") == _url(1) and final["stayer"]["moves"] == 0, \
        final["stayer"]
    assert final["mover"].get("moves_by_reason") == {bound: 1}, final["mover"]
    assert s_counters.get(f"control_sessions_moved_in_{bound}") == 1, s_counters
    assert p_counters.get("control_sessions_moved_out") == 1, p_counters
    lost_t = moved_states[0]["t"]
    back_t = last["t"]
    with subs["stayer"].cond:
        during = sum(1 for i in subs["stayer"].items if "m" in i and i["m"].isdigit()
                     and lost_t <= i["t"] <= back_t)
    figures = {"reason": last["reason"], "move_ms": (back_t - lost_t) * 1e3,
               "mover_pause_ms": moved_pause * 1e3, "stayer_pause_ms": stayed_pause * 1e3,
               "stayer_messages_during_move": during, "stayer_path": final["stayer"]["path"],
               "mover_path": final["mover"]["path"]}
    print(f"\n{figures}")
    return figures


def test_a_session_whose_packets_to_its_appliance_are_dropped_moves_on_loss(tmp_path: Path):
    def spoil(hosts, port: int, relay) -> None:
        _drop_from_port(hosts["p"], "10.77.0.3", port, 100)

    _moved(tmp_path, spoil, "loss", LOSS_BOUNDS)


def test_a_session_whose_path_is_delayed_moves_on_latency(tmp_path: Path):
    def spoil(hosts, port: int, relay: Lines) -> None:
        if _netem(hosts["mover"]):
            _delay_to(hosts["mover"], "10.77.0.1", DELAY_MS)
        else:  # this kernel has no netem (or no prio qdisc): the relay delays the path
            relay.tell(f"delay {DELAY_MS}")

    figures = _moved(tmp_path, spoil, "latency", LATENCY_BOUNDS, relay=not _netem(None))
    measured = int(figures["reason"].split("latency ", 1)[1].split(" ms")[0])
    assert measured > 250, figures  # the window's median: the delay began inside it


def test_a_session_losing_half_its_packets_moves_on_loss(tmp_path: Path):
    def spoil(hosts, port: int, relay) -> None:
        _drop_from_port(hosts["p"], "10.77.0.3", port, 50)

    _moved(tmp_path, spoil, "loss", LOSS_BOUNDS)
