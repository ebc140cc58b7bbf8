"""Fabrics of appliances in network namespaces (real UDP across veth), for the tests.

``Mesh(links)`` builds one namespace host per node on the ``tests.netns.Fabric`` bridge,
writes each node's config (neighbours from ``links``, n1 the embedded P&M) and starts
``tests.fabric.node`` in it; ``mesh.node(i).call({...})`` drives it. Links are logical:
every host can reach every other over the bridge, but appliances talk only to their
configured neighbours; ``cut(a, b)`` drops the traffic between two hosts with nftables and
``mend(a, b)`` restores it.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tests.appliance.helpers import FABRIC_KEY, ROOT
from tests.netns import Fabric

FABRIC_PORT = 47470
CLIENT_PORT = 47471
GROUP = "239.77.1.1"
GROUP_PORT = 47480
START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 30.0
IDENTITIES = """
[pm.identities.feed]
publish = ["#"]
subscribe = ["#"]
[pm.identities.reader]
publish = []
subscribe = ["#"]
[pm.identities.eu-only]
publish = ["eu/#"]
subscribe = ["eu/#"]
"""


class NodeProcess:
    def __init__(self, host, config: Path) -> None:
        self.host = host
        self.proc = host.popen([sys.executable, "-m", "tests.fabric.node", str(config)],
                               cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)

    def _read(self, timeout_s: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            raise AssertionError(f"{self.host.name}: no answer within {timeout_s} s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"{self.host.name}: node exited ({self.proc.poll()})")
        return json.loads(line)

    def wait_ready(self) -> None:
        assert self._read(START_TIMEOUT_S).get("ready")

    def call(self, cmd: dict, *, check: bool = True) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        answer = self._read(CALL_TIMEOUT_S)
        if check and not answer.get("ok"):
            raise AssertionError(f"{self.host.name}: {cmd['cmd']} failed: {answer}")
        return answer

    def status(self) -> dict:
        return self.call({"cmd": "status"})["status"]

    def received(self, client: str) -> tuple[Counter, int]:
        answer = self.call({"cmd": "received", "client": client})
        return Counter(answer["counts"]), answer["duplicates"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call({"cmd": "quit"}, check=False)
                self.proc.wait(20)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class Mesh:
    """See the module docstring; nodes are numbered from 1 (node i is 10.77.0.i)."""

    def __init__(self, n: int, links: list[tuple[int, int]], tmp: Path, *,
                 heartbeat_ms: int = 50, dead_ms: int = 400,
                 group_links: tuple[tuple[int, int], ...] = (), extra: str = "",
                 pm_extra: str = "") -> None:
        """``group_links``: links (of ``links``) whose ends are neighbours on the fabric
        group (UDP multicast GROUP:GROUP_PORT on each host's veth, TTL 1). ``extra``: TOML
        tables every node's config ends with; ``pm_extra``: tables after n1's ``[pm]``
        (e.g. ``[pm.schemas.NAME]``)."""
        self.extra, self.pm_extra = extra, pm_extra
        self.fabric = Fabric()
        self.links = links
        self.group_links = {frozenset(link) for link in group_links}
        self.nodes: dict[int, NodeProcess] = {}
        self.hosts = {}
        try:
            for i in range(1, n + 1):
                self.hosts[i] = self.fabric.add_host()
            for i in range(1, n + 1):
                config = tmp / f"n{i}.toml"
                config.write_text(self._config(i, heartbeat_ms, dead_ms))
                self.nodes[i] = NodeProcess(self.hosts[i], config)
            for node in self.nodes.values():
                node.wait_ready()
        except BaseException:
            self.close()
            raise

    def _config(self, i: int, heartbeat_ms: int, dead_ms: int) -> str:
        lines = [f'[appliance]\nname = "n{i}"\nid = {i}\nheartbeat_interval_ms = {heartbeat_ms}',
                 f"neighbour_dead_ms = {dead_ms}\nlsa_refresh_ms = 1000",
                 f'[fabric]\nlisten = "10.77.0.{i}:{FABRIC_PORT}"\nkey = "{FABRIC_KEY}"',
                 f'[clients]\nudp = "127.0.0.1:{CLIENT_PORT}"']
        if any(i in link for link in self.group_links):
            lines.append(f'[[fabric.groups]]\nname = "fab"\naddress = "{GROUP}:{GROUP_PORT}"\n'
                         f'interface = "10.77.0.{i}"\nttl = 1')
        for a, b in self.links:
            if i in (a, b):
                other = b if a == i else a
                group = 'group = "fab"\n' if frozenset((a, b)) in self.group_links else ""
                lines.append(f'[[neighbours]]\nname = "n{other}"\n'
                             f'address = "10.77.0.{other}:{FABRIC_PORT}"\n{group}')
        lines.append('[pm]\nmode = "embedded"\nrequire_passwords = false' + IDENTITIES
                     + self.pm_extra if i == 1 else '[pm]\nmode = "remote"')
        lines.append(self.extra)
        return "\n".join(lines) + "\n"

    def node(self, i: int) -> NodeProcess:
        return self.nodes[i]

    def converged(self, expect_pairs: int | None = None) -> bool:
        """Every running node has a route to every other one and P&M's document."""
        running = [node for node in self.nodes.values() if node.proc.poll() is None]
        n = len(running)
        want = n * (n - 1) if expect_pairs is None else expect_pairs
        for node in running:
            status = node.status()
            if len(status["routes"]) != want or not status["node"]["pm"]:
                return False
        return True

    def _nft(self, i: int, other: int, add: bool) -> None:
        host = self.hosts[i]
        table = f"twcut{other}"
        if add:
            rule = (f"table inet {table} {{\n chain input {{\n  type filter hook input priority 0;"
                    f"\n  ip saddr 10.77.0.{other} drop\n }}\n}}\n")
            subprocess.run(["ip", "netns", "exec", host.name, "nft", "-f", "-"], input=rule,
                           text=True, check=True, capture_output=True)
        else:
            host.run("nft", "delete", "table", "inet", table)

    def cut(self, a: int, b: int) -> None:
        self._nft(a, b, True)
        self._nft(b, a, True)

    def mend(self, a: int, b: int) -> None:
        self._nft(a, b, False)
        self._nft(b, a, False)

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()
        self.fabric.close()


def wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s} s")
        time.sleep(interval_s)
