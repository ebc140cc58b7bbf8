"""Clients over RDMA (soft-RoCE rxe0 <-> rxe1 in the VM harness).

One appliance, in a process forked from this one (as hwtests/appliance/test_rdma_neighbours.py
runs them), has its RDMA client endpoint (``[clients] rdma``) on the first RDMA end's
address; a subscriber and a publisher client in this process connect to it with
``connect("rdma://...", rdma_bind=...)`` from the second end's address, so every client frame
crosses the RDMA devices; the client UDP socket (on loopback) carries nothing.

Counts are modest: Python in the emulated guest is ~30-40x slower than on a host.
"""

from __future__ import annotations

import time
from pathlib import Path

from appliance.client import Client, connect
from hwtests.appliance.test_rdma_neighbours import ForkedNode, _load_kernels, _row
from hwtests.rdma.base import RdmaTestCase
from tests.fabric.harness import IDENTITIES, wait_until

MESSAGES = 150
"""Per QoS class, numbered in publish order."""
CLIENT_UDP_PORT = 47481
RDMA_CLIENTS_PORT = 47491
SESSION_DEAD_MS = 3_000
CLIENT_TIMEOUT_S = 60.0
"""A client's requests (login, a topic's registration) in the emulated guest."""
WAIT_S = 180.0


def _config(listen: str) -> str:
    return f"""
[appliance]
name = "a"
[clients]
udp = "127.0.0.1:{CLIENT_UDP_PORT}"
rdma = "{listen}:{RDMA_CLIENTS_PORT}"
session_dead_ms = {SESSION_DEAD_MS}
[pm]
mode = "embedded"
require_passwords = false
{IDENTITIES}
"""


def _collect(sub, count: int, deadline: float) -> list:
    """Up to ``count`` messages of ``sub`` until ``deadline`` (one deadline for all: a
    shortfall fails with what the appliance counted, not after a timeout per message)."""
    got: list = []
    while len(got) < count:
        left = deadline - time.monotonic()
        msg = sub.get(timeout=left) if left > 0 else None
        if msg is None:
            break
        got.append(msg)
    return got


def _notable(counters: dict) -> dict:
    """The counters that say where messages went: drops, losses, refusals, queues, sends."""
    words = ("drop", "lost", "loss", "full", "refused", "retr", "nak", "fail", "skip",
             "send", "rnr", "pause")
    return {k: v for k, v in sorted(counters.items())
            if isinstance(v, (int, float)) and v and any(w in k for w in words)}


class TestRdmaClients(RdmaTestCase):
    def _start(self, tmp_path: Path) -> ForkedNode:
        _load_kernels()
        path = tmp_path / "a.toml"
        path.write_text(_config(self.ends.listen))
        return ForkedNode("a", path)

    def _connect(self, identity: str) -> Client:
        return connect(f"rdma://{self.ends.listen}:{RDMA_CLIENTS_PORT}", identity,
                       rdma_bind=self.ends.connect_from, timeout_s=CLIENT_TIMEOUT_S)

    def test_messages_between_rdma_clients_arrive_complete_and_in_order(self, tmp_path):
        node = self._start(tmp_path)
        clients: list[Client] = []
        try:
            t0 = time.monotonic()
            sub = self._connect("reader")
            clients.append(sub)
            pub = self._connect("feed")
            clients.append(pub)
            pub.send_wait_s = CLIENT_TIMEOUT_S  # credits come back at the guest's pace
            login_s = time.monotonic() - t0
            guaranteed = sub.subscribe("g/#", qos="guaranteed")
            best_effort = sub.subscribe("b/#")
            wait_until(lambda: len(node.status()["subscriptions"]) >= 2, WAIT_S, 0.5)
            # first publishes register the topics (a request each), then the numbered ones
            pub.publish("g/eu/1", b"first", qos="guaranteed")
            pub.publish("b/eu/1", b"first")
            pub.flush()
            assert guaranteed.get(timeout=WAIT_S).payload == b"first"
            assert best_effort.get(timeout=WAIT_S).payload == b"first"
            t1 = time.monotonic()
            for i in range(MESSAGES):
                pub.publish("g/eu/1", b"%d" % i, qos="guaranteed")
                pub.publish("b/eu/1", b"%d" % i)
                if i % 10 == 9:
                    pub.flush()
                    time.sleep(0.01)  # best-effort: no faster than the guest takes them
            pub.flush()
            deadline = time.monotonic() + WAIT_S
            got_g = _collect(guaranteed, MESSAGES, deadline)
            got_b = _collect(best_effort, MESSAGES, deadline)
            elapsed = time.monotonic() - t1
            if len(got_g) < MESSAGES or len(got_b) < MESSAGES:
                raise AssertionError(
                    f"incomplete after {WAIT_S} s: {len(got_g)} guaranteed and {len(got_b)} "
                    f"best-effort of {MESSAGES} each; losses {sub.losses}; the appliance's "
                    f"counters {_notable(node.status()['counters'])}; the subscriber's "
                    f"{_notable(sub.connection_counters())}; the publisher's "
                    f"{_notable(pub.connection_counters())} and channel's "
                    f"{_notable(pub.channel.stats.snapshot())}")
            wait_until(lambda: node.status()["counters"].get("rdma_clients_up") == 2,
                       WAIT_S, 0.5)
            status = node.status()
        finally:
            for client in clients:
                client.close()
            node.close()
        assert [m.payload for m in got_g] == [b"%d" % i for i in range(MESSAGES)]
        assert [m.payload for m in got_b] == [b"%d" % i for i in range(MESSAGES)], \
            "best-effort: complete and in order"
        assert sub.losses == 0
        # the status: a channel row of kind rdma per client, the UDP socket unused
        rows = [_row(status, f"clients-rdma:{n}") for n in (1, 2)]
        assert all(row["kind"] == "rdma" for row in rows)
        assert rows[0]["frames_out"] > 0 and rows[1]["frames_in"] > 0
        assert _row(status, "clients-udp")["frames_in"] == 0
        counters = status["counters"]
        assert counters["rdma_clients_accepted"] == 2 and counters["rdma_clients_closed"] == 0
        assert {c["identity"] for c in status["clients"]} == {"reader", "feed"}
        print(f"\ntwo clients logged in over RDMA ({self.ends.devices}) in {login_s:.1f} s; "
              f"{2 * MESSAGES} messages ({MESSAGES} guaranteed, {MESSAGES} best-effort) "
              f"publisher -> appliance -> subscriber in {elapsed:.1f} s; "
              f"p50 to the subscriber {rows[0]['p50_us']:.0f} us")

    def test_a_client_whose_rdma_channel_fails_is_closed_counted_and_expires(self, tmp_path):
        node = self._start(tmp_path)
        clients: list[Client] = []
        try:
            stays = self._connect("reader")
            clients.append(stays)
            goes = self._connect("feed")
            clients.append(goes)
            wait_until(lambda: len(node.status()["clients"]) == 2, WAIT_S, 0.5)
            goes._runner.stop()  # the client goes silent and its channel goes away,
            goes.channel.close()  # without a logout
            t0 = time.monotonic()
            wait_until(lambda: node.status()["counters"].get("rdma_clients_closed") == 1,
                       WAIT_S, 0.5)
            closed_s = time.monotonic() - t0
            wait_until(lambda: [c["identity"] for c in node.status()["clients"]] == ["reader"],
                       WAIT_S, 0.5)
            expired_s = time.monotonic() - t0
            status = node.status()
            # the other client carries on: a new one connects and reaches it
            again = self._connect("feed")
            clients.append(again)
            sub = stays.subscribe("b/#")
            wait_until(lambda: len(node.status()["subscriptions"]) >= 1, WAIT_S, 0.5)
            again.publish("b/x", b"after")
            again.flush()
            msg = sub.get(timeout=WAIT_S)
            # the data path's counters reach the status a refresh or two later
            wait_until(lambda: node.status()["counters"].get("rdma_clients_accepted") == 3,
                       WAIT_S, 0.5)
            counters = node.status()["counters"]
        finally:
            for client in clients:
                client.close()
            node.close()
        assert status["counters"]["rdma_clients_up"] == 1
        assert msg is not None and msg.payload == b"after"
        assert counters["rdma_clients_accepted"] == 3 and counters["rdma_clients_up"] == 2
        print(f"\na client's RDMA channel failed: closed on the appliance {closed_s:.1f} s "
              f"later, its session gone after {expired_s:.1f} s (session_dead_ms "
              f"{SESSION_DEAD_MS})")

    def test_a_client_whose_appliance_vanishes_ends_its_session_with_a_client_error(
            self, tmp_path):
        """The appliance is killed (no logout, no goodbye): the client's RDMA channel fails
        for good (``Channel.failure``), the client thread ends the session, and a publish is
        the caller's ClientError, not the channel's device error."""
        from appliance.client import ClientError

        node = self._start(tmp_path)
        client = None
        try:
            client = self._connect("feed")
            client.publish("b/x", b"before", flush=True)
            node.proc.kill()
            node.proc.join()
            wait_until(lambda: client.logged_out_reason is not None, WAIT_S, 0.5)
            reason = client.logged_out_reason
            failure = client.channel.failure
            try:
                client.publish("b/x", b"after", flush=True)
                raised = None
            except ClientError as exc:
                raised = exc
        finally:
            if client is not None:
                client.close()
            node.close()
        assert reason.startswith("connection lost"), reason
        assert failure is not None
        assert raised is not None, "a publish after the connection was lost did not raise"
        print(f"\nthe appliance vanished: the client said {reason!r}; a publish: {raised}")
