"""Session failover to a standby appliance: a client connected with ``standby=`` moves its
session when the primary goes silent, and a guaranteed subscriber gets what was published
meanwhile from the standby's cache, joined to the live stream: every message once, in order.

The primary is a ``topicwire run`` process (killed with SIGKILL, or stopped with SIGSTOP so
it is alive again when the standby tells it the session moved); the standby is an
in-process appliance with P&M and ``[cache]``, its neighbour on loopback. Every wait has a
deadline and waits for a message, a state or a counter.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request

import pytest

from appliance.cache.node import CachingAppliance
from appliance.client import connect
from appliance.config import parse_config
from tests.appliance.helpers import (
    CLI,
    FABRIC_KEY,
    free_port,
    run_appliance,
    start,
    stop,
    wait_for,
)
from tests.appliance.test_client_state import States

SESSION_TIMEOUT_S = 1.0
MGMT_TOKEN = "failover-test-token"
DEADLINE_S = 60.0
IDENTITIES = {"feed": {"publish": ["orders/#"], "subscribe": ["#"]},
              "reader": {"subscribe": ["orders/#"]}}
PRIMARY = """
[appliance]
name = "{name}"
heartbeat_interval_ms = 50
lsa_refresh_ms = 500
neighbour_dead_ms = 10000
[fabric]
listen = "127.0.0.1:{fabric}"
key = "{key}"
[[neighbours]]
name = "{standby}"
address = "127.0.0.1:{standby_fabric}"
[clients]
udp = "127.0.0.1:{clients}"
{clients_extra}
[mgmt]
listen = "127.0.0.1:{mgmt}"
token = "{token}"
[pm]
mode = "remote"
"""


class Pair:
    """A primary process and an in-process standby with a cache, neighbours."""

    def __init__(self, tmp_path, identities: dict = IDENTITIES, mirror: bool = False) -> None:
        ports = [free_port() for _ in range(5)]
        self.primary_name, self.standby_name = f"pri{ports[0]}", f"sby{ports[1]}"
        self.primary_url = f"udp://127.0.0.1:{ports[2]}"
        self.mgmt = f"http://127.0.0.1:{ports[4]}"
        standby = parse_config({
            "appliance": {"name": self.standby_name, "heartbeat_interval_ms": 50,
                          "lsa_refresh_ms": 500, "neighbour_dead_ms": 10_000},
            "fabric": {"listen": f"127.0.0.1:{ports[1]}", "key": FABRIC_KEY},
            "neighbours": [{"name": self.primary_name, "address": f"127.0.0.1:{ports[0]}"}],
            "clients": {"udp": f"127.0.0.1:{ports[3]}"},
            "cache": {"dir": str(tmp_path / "cache"), "patterns": ["orders/#"]},
            "pm": {"require_passwords": False, "identities": identities}})
        self.standby = CachingAppliance(standby).start()
        self.standby_url = f"udp://127.0.0.1:{ports[3]}"
        config = tmp_path / "primary.toml"
        config.write_text(PRIMARY.format(
            name=self.primary_name, fabric=ports[0], key=FABRIC_KEY, clients=ports[2],
            mgmt=ports[4], standby=self.standby_name, standby_fabric=ports[1],
            token=MGMT_TOKEN,
            clients_extra=f'mirror_to = "{self.standby_name}"' if mirror else ""))
        self.proc = run_appliance(config)
        assert self.standby.cache.ready.wait(DEADLINE_S), "the standby's cache did not start"

    def client(self, states: States):
        """A reader connected to the primary with the standby, once they are neighbours."""
        wait_for(lambda: any(n["state"] == "up" for n in self.standby.status()["neighbours"]),
                 DEADLINE_S, what="the neighbours up")
        return connect(self.primary_url, "reader", standby=self.standby_url,
                       session_timeout_s=SESSION_TIMEOUT_S, on_state=states)

    def primary_status(self) -> dict:
        with urllib.request.urlopen(f"{self.mgmt}/status", timeout=5) as answer:
            return json.load(answer)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        stop(self.proc)
        self.standby.stop()


@pytest.fixture
def pair(tmp_path):
    pair = Pair(tmp_path)
    yield pair
    pair.close()


class Publisher(threading.Thread):
    """Guaranteed messages 0, 1, 2, ... on ``orders/x`` at the standby, paced, until
    ``count`` or ``stop``."""

    def __init__(self, url: str, count: int, per_ms: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.url, self.count, self.per_s = url, count, per_ms / 1000
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with connect(self.url, "feed") as client:
                start = time.monotonic()
                for i in range(self.count):
                    client.publish("orders/x", b"%d" % i, qos="guaranteed")
                    self.sent = i + 1
                    if i % 10 == 9:
                        client.flush()
                        ahead = start + (i + 1) * self.per_s - time.monotonic()
                        if ahead > 0:
                            time.sleep(ahead)
                client.flush(timeout=DEADLINE_S)
        except BaseException as exc:  # the test reports it
            self.error = exc


def _ranges(values: list[int]) -> list[tuple[int, int]]:
    """``values`` as runs of consecutive numbers (for a failure's message)."""
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs


def _take(sub, until: int, got: list[int]) -> None:
    """Messages of ``sub`` into ``got`` until ``until`` of them (a deadline for all)."""
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < until:
        msg = sub.get(timeout=max(0.0, deadline - time.monotonic()))
        assert msg is not None, f"{len(got)} of {until} messages: {_ranges(got)}"
        got.append(int(msg.payload))


def test_a_killed_primary_moves_the_session_and_the_gap_is_filled_from_the_cache(pair):
    states = States()
    client = pair.client(states)
    try:
        assert client.url == pair.primary_url
        sub = client.subscribe("orders/#", qos="guaranteed")
        wait_for(lambda: any(s["pattern"] == "orders/#" and s["origin"] == pair.primary_name
                             for s in pair.standby.status()["subscriptions"]), DEADLINE_S,
                 what="the subscription advertised to the standby")
        publisher = Publisher(pair.standby_url, 3_000)
        publisher.start()
        got: list[int] = []
        _take(sub, 500, got)
        pair.proc.send_signal(signal.SIGKILL)  # no logout, no goodbye
        moved = states.wait("reconnected")
        try:
            _take(sub, 3_000, got)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the publisher sent {publisher.sent} "
                                 f"({publisher.error!r}); filled {client.filled}, "
                                 f"duplicates {sub.duplicates}, client {client.state}, "
                                 f"{client.connection_counters()}") from None
        publisher.join(DEADLINE_S)
        assert publisher.error is None and publisher.sent == 3_000
        assert got == list(range(3_000))  # every message, once, in order
        assert "moved to " + pair.standby_url in moved.reason
        assert client.url == pair.standby_url and client.moves == 1
        assert sub.lost_messages == 0 and not sub.losses  # no SESSION_LOST: filled
        assert client.filled > 0  # what was published while it was away: from the cache
        counters = wait_for(lambda: (c := pair.standby.status()["counters"]).get(
            "control_sessions_moved_in") == 1 and c, DEADLINE_S, what="the standby's count")
        # the primary (dead, but not yet for its neighbour) is told, or not when it is down
        assert counters.get("control_session_moves_told", 0) + counters.get(
            "control_session_moves_not_told", 0) == 1
        print(f"\nfailover: {client.filled} messages filled from the standby's cache, "
              f"{sub.duplicates} duplicates skipped")
    finally:
        client.close()


def test_a_primary_that_comes_back_ends_the_moved_session_when_the_standby_tells_it(pair):
    states = States()
    client = pair.client(states)
    other = connect(pair.primary_url, "reader")  # a session without a standby
    try:
        session = client.session
        wait_for(lambda: len(pair.primary_status()["clients"]) == 2, DEADLINE_S,
                 what="both sessions in the primary's status")
        pair.proc.send_signal(signal.SIGSTOP)  # silent, not dead: its neighbour stays up
        states.wait("reconnected")
        assert client.url == pair.standby_url
        pair.proc.send_signal(signal.SIGCONT)
        status = wait_for(lambda: (s := pair.primary_status())["counters"].get(
            "control_sessions_moved_out") == 1 and s, DEADLINE_S,
            what="the primary told of the move")
        sessions = [c["session"] for c in status["clients"]]
        assert session not in sessions and len(sessions) == 1  # the other session stays
        wait_for(lambda: pair.standby.status()["counters"].get(
            "control_sessions_moved_in") == 1, DEADLINE_S, what="the standby's count")
    finally:
        client.close()
        other.close()


def test_topicwire_sub_with_a_standby_says_it_moved_and_misses_nothing(pair):
    wait_for(lambda: any(n["state"] == "up" for n in pair.standby.status()["neighbours"]),
             DEADLINE_S, what="the neighbours up")
    sub = start([*CLI, "sub", "orders/#", "--appliance", pair.primary_url, "--standby",
                 pair.standby_url, "--identity", "reader", "--qos", "guaranteed", "--count",
                 "2000", "--json", "--session-timeout", "1"])
    try:
        wait_for(lambda: any(s["pattern"] == "orders/#" and s["origin"] == pair.primary_name
                             for s in pair.standby.status()["subscriptions"]), DEADLINE_S,
                 what="the subscription advertised to the standby")
        publisher = Publisher(pair.standby_url, 2_000)
        publisher.start()
        assert sub.stdout is not None
        watchdog = threading.Timer(DEADLINE_S * 2, sub.kill)  # a hung sub fails, not hangs
        watchdog.start()
        lines = [sub.stdout.readline() for _ in range(300)]
        pair.proc.send_signal(signal.SIGKILL)
        lines += sub.stdout.readlines()  # the same buffered reader: no line skipped
        sub.wait()
        watchdog.cancel()
        err = sub.stderr.read() if sub.stderr else ""
    finally:
        if sub.poll() is None:
            sub.kill()
    payloads = [int(json.loads(line)["payload"]) for line in lines]
    assert sub.returncode == 0, err
    assert payloads == list(range(2_000))
    assert f"session moved to {pair.standby_url}" in err
