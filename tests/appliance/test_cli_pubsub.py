"""``topicwire pub`` / ``topicwire sub`` against a running appliance (separate processes)."""

import json
import select
import subprocess
import time

import pytest

from appliance.client import Message
from appliance.client.stats import SubStats
from appliance.config import parse_config
from appliance.node import Appliance
from tests.appliance.helpers import CLI, ROOT, free_port, start


@pytest.fixture
def appliance():
    port = free_port()
    cfg = parse_config({
        "appliance": {"name": f"ps{port}"}, "clients": {"udp": f"127.0.0.1:{port}"},
        "pm": {"require_passwords": False,
               "identities": {"feed": {"publish": ["prices/#"], "subscribe": ["#"]},
                              "viewer": {"subscribe": ["prices/eu/#"]}}}})
    app = Appliance(cfg).start()
    _RUNNING[f"127.0.0.1:{port}"] = app
    yield f"127.0.0.1:{port}"
    app.stop()
    del _RUNNING[f"127.0.0.1:{port}"]


_RUNNING: dict = {}
"""Address -> the fixture's appliance (its counters explain a shortfall)."""


def _sub(address, *args):
    proc = start([*CLI, "sub", "--appliance", address, "--identity", "viewer", *args])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until it is subscribed
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready and "subscribed" in proc.stderr.readline():
            return proc
        assert proc.poll() is None, proc.stderr.read()
    raise AssertionError("sub did not subscribe")


def _pub(address, *args):
    return subprocess.run([*CLI, "pub", "--appliance", address, "--identity", "feed", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_sub_stats_count_every_message_pub_sent_without_gaps_or_duplicates(appliance):
    sub = _sub(appliance, "prices/eu/#", "--count", "300", "--seconds", "45", "--stats")
    pub = _pub(appliance, "--topic", "prices/eu/ibm", "--count", "300", "--rate", "3000",
               "--size", "32", "--json")
    assert pub.returncode == 0, pub.stderr
    assert json.loads(pub.stdout)["sent"] == 300
    out, _ = sub.communicate(timeout=60)
    assert sub.returncode == 0
    stats = json.loads(out)  # --seconds: a shortfall shows here instead of hanging the test
    assert stats["received"] == 300 and stats["gaps"] == 0 and stats["duplicates"] == 0, (
        stats, pub.stderr[-2000:], _RUNNING[appliance].status().get("counters"))
    assert 0 < stats["latency_p50_us"] <= stats["latency_p99_us"]


def test_sub_prints_messages_and_pub_is_refused_outside_its_entitlements(appliance):
    sub = _sub(appliance, "prices/eu/+", "--count", "2", "--seconds", "45", "--json")
    assert _pub(appliance, "--topic", "prices/eu/sap", "--message", "hello",
                "--count", "2").returncode == 0
    out, _ = sub.communicate(timeout=60)
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(m["topic"], m["payload"], m["sequence"]) for m in lines] == [
        ("prices/eu/sap", "hello", 1), ("prices/eu/sap", "hello", 2)]
    denied = _pub(appliance, "--topic", "orders/x", "--count", "1")
    assert denied.returncode == 2 and "may not publish to 'orders/x'" in denied.stderr


def _msg(seq, stream=1, key=5):
    return Message("t", b"", key, seq, time.time_ns() - 1000, 0, 0, 0, 9, stream,
                   time.time_ns())


def test_sub_stats_tell_gaps_late_arrivals_and_duplicates_apart():
    stats = SubStats()
    for seq in (1, 2, 5, 3, 3, 7):
        stats.on_message(_msg(seq))
    stats.on_message(_msg(1, stream=2))  # another publisher: its own sequence
    summary = stats.summary()
    assert summary["received"] == 7 and summary["duplicates"] == 1
    assert summary["gaps"] == 2  # 4 and 6 never came; 3 came late
    assert summary["streams"] == 2


def test_sub_outside_its_entitlements_exits_2_with_the_reason(appliance):
    proc = subprocess.run([*CLI, "sub", "--appliance", appliance, "--identity", "viewer",
                           "prices/#", "--count", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "may not subscribe to 'prices/#'" in proc.stderr
