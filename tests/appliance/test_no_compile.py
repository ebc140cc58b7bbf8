"""A started appliance compiles nothing: every kernel signature its traffic needs was compiled
by ``topicwire warm`` and loaded at start (datapath/jit.py, appliance/ops/warm.py).

Three ``topicwire run`` processes with the user's numba cache (not the tests' bounds-checked
one): P&M ``pm`` with a unicast neighbour ``b``; ``b`` and ``c`` on a UDP multicast fabric
group. Clients of this process over UDP and shared memory publish and subscribe with traffic
of every kind, written here independently of the warm-up's own traffic: concurrent
publishers (bursts mixing peers and sessions), single flushed messages, guaranteed
messages, selectors on a schema, new topics every round (parked at the appliances and rerun),
local and remote subscribers; ``c`` writes path telemetry. Then each appliance's
``/status`` must show no kernel that compiled after start.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from appliance.client import connect
from tests.appliance.helpers import (
    FABRIC_KEY,
    ROOT,
    free_port,
    production_env,
    run_appliance,
    stop,
    wait_for,
)
from tests.appliance.mgmt_fabric import http

TICK = struct.Struct(">II")
SCHEMA_ID = 5
ROUNDS = 3
BURST = 50


def _multicast_on() -> bool:
    from appliance.dataplane.open import loopback_multicast as on

    if not on():
        subprocess.run(["ip", "link", "set", "lo", "multicast", "on"], check=False)
    return on()


def _configs(tmp: Path, multicast: bool) -> dict[str, dict]:
    names = ("pm", "b", "c")
    fabric = {n: free_port() for n in names}
    udp = {n: free_port() for n in names}
    mgmt = {n: free_port() for n in names}
    group = f"239.255.77.{fabric['b'] % 200 + 1}:{free_port()}"
    tag = f"{fabric['pm']}"
    links = {"pm": ["b"], "b": ["pm", "c"], "c": ["b"]}
    out = {}
    for name in names:
        lines = ["[appliance]", f'name = "{name}"', "heartbeat_interval_ms = 100",
                 "neighbour_dead_ms = 10000",
                 "[fabric]", f'listen = "127.0.0.1:{fabric[name]}"', f'key = "{FABRIC_KEY}"']
        if multicast and name in ("b", "c"):
            lines += ["[[fabric.groups]]", 'name = "cores"', f'address = "{group}"',
                      'interface = "127.0.0.1"', "ttl = 0"]
        for other in links[name]:
            lines += ["[[neighbours]]", f'name = "{other}"',
                      f'address = "127.0.0.1:{fabric[other]}"']
            if multicast and {name, other} == {"b", "c"}:
                lines.append('group = "cores"')
        lines += ["[clients]", f'udp = "127.0.0.1:{udp[name]}"', f'shm = "twnc-{tag}-{name}"']
        if name == "pm":
            lines += ["[pm]", 'mode = "embedded"', "require_passwords = false",
                      "[pm.identities.app]",
                      'publish = ["#"]', 'subscribe = ["#"]', "[pm.schemas.tick]",
                      f"id = {SCHEMA_ID}", 'fields = [["price", 0, "u32"], ["size", 4, "u32"]]']
        else:
            lines += ["[pm]", 'mode = "remote"']
        lines += ["[mgmt]", f'listen = "127.0.0.1:{mgmt[name]}"']
        if name == "c":
            lines += ["[telemetry]", f'dir = "{tmp / "telemetry"}"', "window_ms = 200"]
        path = tmp / f"{name}.toml"
        path.write_text("\n".join(lines) + "\n")
        out[name] = {"path": path, "udp": f"udp://127.0.0.1:{udp[name]}",
                     "shm": f"shm://twnc-{tag}-{name}",
                     "mgmt": f"http://127.0.0.1:{mgmt[name]}"}
    return out


def _status(cfg: dict) -> dict:
    code, _, body = http("GET", cfg["mgmt"] + "/status")
    assert code == 200
    return body


@pytest.mark.slow
def test_no_kernel_compiles_after_an_appliance_started(tmp_path: Path) -> None:
    env = production_env()
    warm = subprocess.run([sys.executable, "-c", "import sys; from appliance.ops.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "warm"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert warm.returncode == 0, warm.stderr
    multicast = _multicast_on()
    cfgs = _configs(tmp_path, multicast)
    procs = []
    clients = []
    try:
        for name in ("pm", "b", "c"):
            procs.append(run_appliance(cfgs[name]["path"], env=env))
        wait_for(lambda: len(_status(cfgs["pm"]).get("routes", ())) >= 3
                 and all(_status(cfgs[n])["node"].get("pm") for n in ("b", "c")), 60)

        def client(name: str, kind: str) -> object:
            c = connect(cfgs[name][kind], "app")
            clients.append(c)
            return c

        sub_c_udp, sub_c_shm = client("c", "udp"), client("c", "shm")
        sub_b_shm, sub_pm_udp = client("b", "shm"), client("pm", "udp")
        plain = [s.subscribe("t/#") for s in (sub_c_udp, sub_c_shm, sub_b_shm, sub_pm_udp)]
        guaranteed = [sub_c_udp.subscribe("g/#", qos="guaranteed"),
                      sub_b_shm.subscribe("g/#", qos="guaranteed")]
        selected = sub_c_shm.subscribe("q/#", selector="price >= 100")
        pubs = [client("b", "udp") for _ in range(4)] + [client("b", "shm"),
                                                          client("pm", "udp")]
        for rnd in range(ROUNDS):
            errors: list[BaseException] = []

            def publish(i: int, pub: object, rnd: int = rnd, errors: list = errors) -> None:
                try:
                    for topic in (f"t/p{i}", f"t/p{i}/r{rnd}"):  # the second is new: parked
                        for k in range(BURST):
                            pub.publish(topic, b"m" * (k % 17))
                        pub.flush()
                    pub.publish(f"t/p{i}/one", b"1", flush=True)
                    for _ in range(5):
                        pub.publish(f"g/p{i}/r{rnd}", b"g", qos="guaranteed", flush=True)
                    for price in (99, 100, 250):
                        pub.publish(f"q/p{i}", TICK.pack(price, 1), schema_id=SCHEMA_ID,
                                    flush=True)
                except BaseException as exc:  # reported by the test thread
                    errors.append(exc)

            threads = [threading.Thread(target=publish, args=(i, p)) for i, p in enumerate(pubs)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert not errors, errors
            per_round = len(pubs) * (2 * BURST + 1)
            counts = {id(s): 0 for s in [*plain, *guaranteed, selected]}

            def arrived(counts: dict = counts, per_round: int = per_round) -> bool:
                for s in [*plain, *guaranteed, selected]:
                    while s.get(timeout=0) is not None:
                        counts[id(s)] += 1
                return (all(counts[id(s)] >= per_round for s in plain)
                        and all(counts[id(s)] >= 5 * len(pubs) for s in guaranteed)
                        and counts[id(selected)] >= 2 * len(pubs))

            wait_for(arrived, 60)
        for name in ("pm", "b", "c"):
            seen = _status(cfgs[name])["node"]["uptime_s"]  # a snapshot built after the traffic:
            status = wait_for(lambda name=name, seen=seen: (
                s if (s := _status(cfgs[name]))["node"]["uptime_s"] > seen else None), 10)
            jit = status["jit"]
            assert jit["warmed"], (name, jit)
            assert jit["preloaded_signatures"] > 0, (name, jit)
            assert jit["compiled_after_start"] == {}, (name, jit["compiled_after_start"])
    finally:
        for c in clients:
            c.close()
        for proc in procs:
            stop(proc)
