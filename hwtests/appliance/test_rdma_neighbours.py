"""Two appliances that are neighbours over RDMA (soft-RoCE rxe0 <-> rxe1 in the VM harness).

Appliance ``a`` (the embedded P&M) has its fabric on the first RDMA end's address, ``b`` on
the second's; each names the other as a neighbour with ``transport = "rdma"`` (``a`` sorts
first, so it listens for the set-up; ``b`` connects). Both run in processes forked from
this one (``tests.fabric.node.Node``, driven over a pipe) after this one has run the
appliance's kernels: a fresh interpreter takes a minute to import numpy and numba under
emulation, and loading each kernel from the cache takes seconds more. A publisher on ``a``
and a subscriber on ``b`` are clients over UDP on loopback; everything between the appliances
goes over the RDMA link, which the status shows (the fabric socket sends nothing).

Counts are modest: Python in the emulated guest is ~30-40x slower than on a host.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from hwtests.rdma.base import RdmaTestCase
from tests.appliance.helpers import FABRIC_KEY
from tests.fabric.harness import IDENTITIES, wait_until
from tests.fabric.node import Node  # imported here: the forked nodes inherit it

MESSAGES = 300
"""Per QoS class, numbered in publish order."""
TOPICS = {"g": ["g/eu/1", "g/us/2", "g/eu/3"], "b": ["b/eu/1", "b/us/2", "b/eu/3"]}
START_TIMEOUT_S = 300.0
CALL_TIMEOUT_S = 120.0
WAIT_S = 180.0
"""Longest wait for anything the tests expect to happen (the emulated guest is slow)."""
FABRIC_PORTS = {"a": 47470, "b": 47473}
CLIENT_PORTS = {"a": 47471, "b": 47472}
RDMA_SETUP_PORT = 47490
HEARTBEAT_MS = 200
DEAD_MS = 3_000
_FORK = multiprocessing.get_context("fork")


def _serve(config: str, conn) -> None:
    """The forked node: answer each command from the pipe (tests/fabric/node.py's)."""
    try:
        node = Node(config)
    except Exception as exc:
        conn.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    conn.send({"ok": True, "ready": node.config.name})
    while True:
        cmd = conn.recv()
        try:
            answer = node.handle(cmd)
        except Exception as exc:
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        conn.send(answer)
        if cmd["cmd"] == "quit":
            return


class ForkedNode:
    """An appliance and its clients in a forked process (``call`` as tests/fabric's)."""

    def __init__(self, name: str, config: Path) -> None:
        self.name = name
        self.conn, child = _FORK.Pipe()
        self.proc = _FORK.Process(target=_serve, args=(str(config), child), daemon=True)
        self.proc.start()
        child.close()
        ready = self._read(START_TIMEOUT_S)
        if not ready.get("ok"):
            self.proc.join(10)
            raise AssertionError(f"{name} did not start: {ready.get('error')}")

    def _read(self, timeout_s: float) -> dict:
        if not self.conn.poll(timeout_s):
            raise AssertionError(f"{self.name}: no answer within {timeout_s} s")
        try:
            return self.conn.recv()
        except EOFError:
            raise AssertionError(f"{self.name}: the node exited "
                                 f"({self.proc.exitcode})") from None

    def call(self, cmd: dict, *, check: bool = True) -> dict:
        self.conn.send(cmd)
        answer = self._read(CALL_TIMEOUT_S)
        if check and not answer.get("ok"):
            raise AssertionError(f"{self.name}: {cmd['cmd']} failed: {answer}")
        return answer

    def status(self) -> dict:
        return self.call({"cmd": "status"})["status"]

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.call({"cmd": "quit"})
            except (AssertionError, OSError):
                pass
            self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def _config(name: str, other: str, hosts: dict[str, str]) -> str:
    pm = ('[pm]\nmode = "embedded"\nrequire_passwords = false' + IDENTITIES if name == "a"
          else '[pm]\nmode = "remote"')
    return f"""
[appliance]
name = "{name}"
id = {1 if name == "a" else 2}
heartbeat_interval_ms = {HEARTBEAT_MS}
neighbour_dead_ms = {DEAD_MS}
lsa_refresh_ms = 2000
[fabric]
listen = "{hosts[name]}:{FABRIC_PORTS[name]}"
key = "{FABRIC_KEY}"
[clients]
udp = "127.0.0.1:{CLIENT_PORTS[name]}"
[[neighbours]]
name = "{other}"
address = "{hosts[other]}:{FABRIC_PORTS[other]}"
transport = "rdma"
rdma_port = {RDMA_SETUP_PORT}
{pm}
"""


def _row(status: dict, name: str) -> dict:
    rows = {row["name"]: row for row in status["channels"]}
    assert name in rows, f"no channel row {name!r}: {sorted(rows)}"
    return rows[name]


def _neighbour_up(node: ForkedNode) -> bool:
    status = node.status()
    return bool(status["neighbours"] and status["neighbours"][0]["state"] == "up"
                and len(status["routes"]) == 2 and status["node"]["pm"])


_kernels_loaded = False


def _load_kernels() -> None:
    """Run the appliance's numba kernels here once, before the first fork, so each forked
    node has them (loading them from the cache takes a node seconds per kernel under
    emulation: long enough for a client's 5 s requests to time out)."""
    global _kernels_loaded
    if not _kernels_loaded:
        from hwtests.guest.warm import warm_appliances

        warm_appliances()
        _kernels_loaded = True


class TestRdmaNeighbours(RdmaTestCase):
    def _start(self, tmp_path: Path, *names: str) -> dict[str, ForkedNode]:
        _load_kernels()
        hosts = {"a": self.ends.listen, "b": self.ends.connect_from}
        nodes = {}
        try:
            for name in names:
                path = tmp_path / f"{name}.toml"
                path.write_text(_config(name, "b" if name == "a" else "a", hosts))
                nodes[name] = ForkedNode(name, path)
        except BaseException:
            for node in nodes.values():
                node.close()
            raise
        return nodes

    def _subscribe(self, a: ForkedNode, b: ForkedNode) -> None:
        """A subscriber on ``b`` (guaranteed g/#, best-effort b/#), publishers on ``a``,
        every topic registered and seen to arrive."""
        b.call({"cmd": "connect", "client": "s", "identity": "reader"})
        b.call({"cmd": "subscribe", "client": "s", "pattern": "g/#", "qos": "guaranteed"})
        b.call({"cmd": "subscribe", "client": "s", "pattern": "b/#"})
        a.call({"cmd": "connect", "client": "p", "identity": "feed"})
        a.call({"cmd": "connect", "client": "q", "identity": "feed"})
        wait_until(lambda: {(s["pattern"], s["qos"]) for s in a.status()["subscriptions"]
                            if s["origin"] == "b"} == {("g/#", "guaranteed"),
                                                        ("b/#", "best-effort")}, WAIT_S, 0.5)
        seen: set[str] = set()
        every = set(TOPICS["g"]) | set(TOPICS["b"])
        deadline = time.monotonic() + WAIT_S
        while not every <= seen:
            # a topic's first publish registers it (a request with a 5 s answer); the
            # subscriber must have seen each topic once, so that its name is known there
            # and the numbered messages are not held back for it (a best-effort one may be
            # lost: published again until seen)
            for client, qos, kind in (("p", "guaranteed", "g"), ("q", "best-effort", "b")):
                topics = [t for t in TOPICS[kind] if t not in seen]
                if not topics:
                    continue
                answer = a.call({"cmd": "publish", "client": client, "qos": qos,
                                 "topics": topics}, check=False)
                # the emulated guest can be slower than that the first time (kernels load)
                assert answer["ok"] or "no answer" in answer["error"], answer
            poll_until = time.monotonic() + 5.0
            while not every <= seen and time.monotonic() < poll_until:
                seen.update(e[1] for e in b.call({"cmd": "log", "client": "s"})["log"])
                time.sleep(0.5)
            assert time.monotonic() < deadline, f"the subscriber saw only {sorted(seen)}"
        wait_until(lambda: not b.call({"cmd": "log", "client": "s"})["log"], WAIT_S, 1.0)

    def _stream(self, a: ForkedNode, b: ForkedNode, messages: int) -> tuple[list, list, list]:
        """Publish ``messages`` of each class, numbered; (guaranteed, best-effort, losses)
        as the subscriber saw them once the guaranteed ones are all there."""
        rounds = messages // len(TOPICS["g"])
        a.call({"cmd": "publish", "client": "p", "qos": "guaranteed", "numbered": True,
                "topics": TOPICS["g"], "rounds": rounds})
        a.call({"cmd": "publish", "client": "q", "numbered": True, "topics": TOPICS["b"],
                "rounds": rounds})
        log, losses = [], []

        def poll() -> list:
            answer = b.call({"cmd": "log", "client": "s"})
            log.extend(e for e in answer["log"] if e[2].isdigit())
            losses.extend(answer["losses"])
            return [e for e in log if e[0] == "g/#"]

        total = rounds * len(TOPICS["g"])
        try:
            wait_until(lambda: len(poll()) >= total and sum(
                e[0] == "b/#" for e in log) >= total, WAIT_S, 0.5)
        except AssertionError:
            raise AssertionError(
                f"incomplete: {sum(e[0] == 'g/#' for e in log)} guaranteed and "
                f"{sum(e[0] == 'b/#' for e in log)} best-effort of {total} each; losses "
                f"{losses[:5]}; a {a.status()['counters']}; b {b.status()['counters']}"
            ) from None
        time.sleep(1.0)  # anything twice would show now
        poll()
        return ([int(e[2]) for e in log if e[0] == "g/#"],
                [int(e[2]) for e in log if e[0] == "b/#"], losses)

    def test_messages_cross_an_rdma_neighbour_link_complete_and_in_order(self, tmp_path):
        started = time.monotonic()
        nodes = self._start(tmp_path, "a", "b")
        a, b = nodes["a"], nodes["b"]
        try:
            wait_until(lambda: _neighbour_up(a) and _neighbour_up(b), WAIT_S, 0.5)
            up_s = time.monotonic() - started
            self._subscribe(a, b)
            t0 = time.monotonic()
            guaranteed, best_effort, losses = self._stream(a, b, MESSAGES)
            elapsed = time.monotonic() - t0
            status_a, status_b = a.status(), b.status()
        finally:
            b.close()
            a.close()
        sent = MESSAGES // len(TOPICS["g"]) * len(TOPICS["g"])
        assert guaranteed == list(range(sent)), "guaranteed: every message once, in order"
        assert best_effort == list(range(sent)), "best-effort: complete and in order"
        assert losses == []
        # the link is in the status: a channel row of kind rdma each way, up, made once
        link_a, link_b = _row(status_a, "fabric-rdma:b"), _row(status_b, "fabric-rdma:a")
        assert link_a["kind"] == link_b["kind"] == "rdma"
        assert link_a["frames_out"] > 0 and link_b["frames_in"] > 0
        for status, other in ((status_a, "b"), (status_b, "a")):
            counters = status["counters"]
            assert counters["rdma_links_up"] == 1 and counters[f"rdma_link_up_{other}"] == 1
            assert counters["rdma_link_connects"] == 1 and counters["rdma_link_failures"] == 0
            # everything between the two went over RDMA: the fabric socket sent nothing
            assert _row(status, "fabric")["frames_out"] == 0
        print(f"\nneighbours up over RDMA ({self.ends.devices}) {up_s:.1f} s after start; "
              f"{2 * sent} messages ({sent} guaranteed, {sent} best-effort) a -> b in "
              f"{elapsed:.1f} s; link a->b {link_a['frames_out']} frames, "
              f"p50 {link_b['p50_us']:.0f} us")

    def test_a_neighbour_that_restarts_is_reached_again_over_a_new_link(self, tmp_path):
        nodes = self._start(tmp_path, "a", "b")
        a = nodes["a"]
        try:
            wait_until(lambda: _neighbour_up(a) and _neighbour_up(nodes["b"]), WAIT_S, 0.5)
            nodes["b"].close()
            t0 = time.monotonic()
            wait_until(lambda: a.status()["neighbours"][0]["state"] == "down", WAIT_S, 0.5)
            down_s = time.monotonic() - t0
            # the data path's counters reach the status a refresh or two later
            wait_until(lambda: a.status()["counters"]["rdma_link_failures"] >= 1, WAIT_S, 0.5)
            counters = a.status()["counters"]
            assert counters["rdma_link_failures"] == 1 and counters["rdma_links_up"] == 0
            nodes["b"] = b = self._start(tmp_path, "b")["b"]
            wait_until(lambda: _neighbour_up(a) and _neighbour_up(b), WAIT_S, 0.5)
            counters = a.status()["counters"]
            assert counters["rdma_link_connects"] == 2 and counters["rdma_links_up"] == 1
            self._subscribe(a, b)
            guaranteed, best_effort, losses = self._stream(a, b, 30)
        finally:
            for node in nodes.values():
                node.close()
        assert guaranteed == list(range(30)) and best_effort == list(range(30))
        assert losses == []
        print(f"\nthe neighbour was down {down_s:.1f} s after it quit; back over a new RDMA "
              "link once it restarted")
