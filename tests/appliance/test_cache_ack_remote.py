"""Persisted acknowledgements by a neighbour's cache (docs/fault-tolerance.md, "Persisted by
a neighbour's cache"): a publisher at ``a`` (no cache, ``[cache] remote = b``), the cache at
``b`` (``acknowledge = "persisted"``), real appliances on loopback, real files and fsync:
when ``flush`` returns, ``b``'s log holds every acknowledged message, in order; a full disk at
``b`` holds ``a``'s acknowledgements back and nothing unpersisted is acknowledged; once it has
room every one is; a stopped ``b`` fails the publisher's waiting messages with its name."""

from __future__ import annotations

import subprocess
import time

import pytest

from appliance.cache.node import CachingAppliance
from appliance.client import ClientError, ConnectionLostError, connect
from appliance.client.outcomes import ACKNOWLEDGED, PENDING
from appliance.config import parse_config
from appliance.node import Appliance
from tests.appliance.helpers import FABRIC_KEY, free_port, wait_for
from tests.appliance.test_cache_ack import PATTERN, _durable_seq, _log_rows

IDENTITIES = {"feed": {"publish": ["#"], "subscribe": ["#"]}}


def _pair(cache_dir, remote: bool = True, dataplane: str = "process", **cache):
    """(a, b): a without a cache, its acknowledgements held for b's; b with the cache."""
    fa, fb = free_port(), free_port()
    # a neighbour taken for down makes a not ready (its publishes fail): not on a stall of
    # a loaded host
    common = {"heartbeat_interval_ms": 50, "neighbour_dead_ms": 10_000, "lsa_refresh_ms": 500,
              "dataplane": dataplane}
    name_a, name_b = f"ra{fa}", f"rb{fb}"
    b = CachingAppliance(parse_config({
        "appliance": {"name": name_b, **common},
        "fabric": {"listen": f"127.0.0.1:{fb}", "key": FABRIC_KEY},
        "neighbours": [{"name": name_a, "address": f"127.0.0.1:{fa}"}],
        "clients": {"udp": f"127.0.0.1:{free_port()}"},
        "cache": {"dir": str(cache_dir), "patterns": [PATTERN], "acknowledge": "persisted",
                  **cache},
        "pm": {"require_passwords": False, "identities": IDENTITIES}})).start()
    a = Appliance(parse_config({
        "appliance": {"name": name_a, **common},
        "fabric": {"listen": f"127.0.0.1:{fa}", "key": FABRIC_KEY},
        "neighbours": [{"name": name_b, "address": f"127.0.0.1:{fb}"}],
        "clients": {"udp": f"127.0.0.1:{free_port()}"},
        **({"cache": {"remote": name_b, "acknowledge": "persisted"}} if remote else {}),
        "pm": {"mode": "remote"}})).start()
    try:
        assert b.cache.ready.wait(60), "the cache's session did not subscribe"
        wait_for(lambda: any(s["pattern"] == PATTERN and s["qos"] == "guaranteed"
                             for s in a.status()["subscriptions"]
                             if s["origin"] != a.config.name), 30,
                 what="the cache's guaranteed interest at a")
        if remote:
            wait_for(lambda: _counter(a, "persist_remote_ready") == 1, 30,
                     what="b's cache ready for a's publishers")
    except BaseException:
        a.stop()
        b.stop()
        raise
    return a, b


def _url(app) -> str:
    host, port = app.config.clients_udp
    return f"udp://{host}:{port}"


def _counter(app, name: str) -> int:
    return int(app.status()["counters"].get(name, 0))


@pytest.mark.parametrize("remote, dataplane", [(True, "process"), (False, "process"),
                                               (True, "thread")])
def test_acknowledged_once_the_neighbours_cache_has_it_on_disk(tmp_path, remote, dataplane):
    """fsync every 1.5 s at b: flush at a returns only once b's log covers every message
    (without ``cache.remote`` at a it returns before b's sync: the test sees the
    difference)."""
    a, b = _pair(tmp_path / "cache", remote, dataplane, fsync="interval",
                 fsync_interval_ms=1_500 if remote else 60_000)
    try:
        with connect(_url(a), "feed") as client:
            sent, outcomes = [], []
            for i in range(300):
                topic = ("orders/eu/x", "other/z", "orders/us/y")[i % 3]
                payload = f"{topic}:{i}".encode()
                outcomes.append(client.publish(topic, payload, qos="guaranteed"))
                if topic.startswith("orders/"):
                    sent.append((topic, payload))
            client.flush(timeout=60)
            durable = _durable_seq(b)  # read the moment flush returned
            assert all(o.state == ACKNOWLEDGED for o in outcomes)
        if not remote:  # acknowledged on receipt at a: before b's sync (60 s away)
            assert durable < len(sent), durable
            return
        assert durable >= len(sent), (durable, len(sent))
        assert _log_rows(tmp_path / "cache", durable) == sent  # every one, in order
        # the counters (published every 250 ms or so)
        wait_for(lambda: _counter(a, "guaranteed_persisted_acks") >= len(sent)
                 and _counter(b, "persist_remote_persisted") >= len(sent), 30,
                 what="the persisted counters")
        assert _counter(a, "control_persisted_reports_received") >= 1
        assert _counter(b, "control_persisted_reports_sent") >= 1
        assert _counter(a, "persist_remote_entries_refused") == 0
        assert _counter(a, "guaranteed_awaiting_persist") == 0
    finally:
        a.stop()
        b.stop()


def test_a_full_disk_at_the_neighbour_holds_acknowledgements_back(tmp_path, small_disk):
    a, b = _pair(small_disk / "cache")
    try:
        payload = bytes(900)
        sent: list[tuple[str, bytes]] = []
        outcomes = []
        with connect(_url(a), "feed") as client:
            for i in range(6_000):  # ~5.6 MB into 2 MiB
                body = f"{i}:".encode() + payload
                try:
                    outcomes.append(client.publish("orders/eu/x", body, qos="guaranteed"))
                except ClientError:  # the sender's window is full: pushed back
                    break
                sent.append(("orders/eu/x", body))
                if i % 100 == 99:
                    client.flush()
                    time.sleep(0.002)
            wait_for(lambda: b.status()["cache"]["storage"].startswith("failing"), 60,
                     what="b's cache to report its failing storage")
            with pytest.raises(ClientError):
                client.flush(timeout=2)  # what is not on b's disk is not acknowledged
            acked = [o.state == ACKNOWLEDGED for o in outcomes]
            n_acked = sum(acked)
            assert acked == [True] * n_acked + [False] * (len(acked) - n_acked)  # a prefix
            assert 0 < n_acked < len(sent)
            assert all(o.state == PENDING for o in outcomes[n_acked:])
            assert _counter(a, "guaranteed_awaiting_persist") > 0
            rows = _log_rows(small_disk / "cache")
            assert rows[:n_acked] == sent[:n_acked]  # every acknowledged one is in b's log
            subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
            wait_for(lambda: all(o.state == ACKNOWLEDGED for o in outcomes), 60,
                     what="every outcome acknowledged once b's disk has room")
            client.flush(timeout=30)
        assert _log_rows(small_disk / "cache") == sent  # each once, in order
    finally:
        a.stop()
        b.stop()


def test_a_stopped_neighbour_fails_what_waited_for_it_and_acknowledges_nothing_else(tmp_path):
    """b's cache syncs every 30 s and b stops: a's publisher's messages waiting for b's
    report are not acknowledged; the publisher's session is ended with a reason naming b
    (b's cache's session ended before they were on disk, or b said goodbye)."""
    a, b = _pair(tmp_path / "cache", fsync="interval", fsync_interval_ms=30_000)
    stopped = False
    try:
        with connect(_url(a), "feed") as client:
            outcomes = [client.publish("orders/eu/x", f"{i}".encode(), qos="guaranteed")
                        for i in range(50)]
            wait_for(lambda: _counter(b, "persist_remote_waiting") >= 50, 60,
                     what="b's cache to hold a's messages")
            assert not any(o.state == ACKNOWLEDGED for o in outcomes)
            b_name = b.config.name
            b.stop()
            stopped = True
            with pytest.raises(ClientError) as err:
                client.flush(timeout=60)
            assert b_name in str(err.value), str(err.value)
            assert not any(o.state == ACKNOWLEDGED for o in outcomes)
        wait_for(lambda: _counter(a, "guaranteed_persist_failed") >= 1, 30,
                 what="a's counter of what was not persisted")
    finally:
        a.stop()
        if not stopped:
            b.stop()


def test_publishing_through_a_neighbour_restart_loses_nothing_acknowledged(tmp_path):
    """A publisher with ``resend=True`` goes on while b is stopped and started again on the
    same directory: whatever a acknowledged is in b's log, and once b is back every message
    is acknowledged (at least once: the ones b never reported are published again)."""
    cache_dir = tmp_path / "cache"
    a, b = _pair(cache_dir)
    b_cfg = b.config
    try:
        sent: list[bytes] = []
        outcomes = []
        with connect(_url(a), "feed", resend=True, reconnect_s=120) as client:
            i = 0
            while i < 300:
                body = f"m{i}".encode()
                try:
                    outcomes.append(client.publish("orders/eu/x", body, qos="guaranteed"))
                except ConnectionLostError:  # a ended the session (b down): it reconnects
                    wait_for(lambda: client.state == "connected", 120, 0.05,
                             what="the publisher reconnected")
                    continue
                sent.append(body)
                if i == 99:
                    client.flush(timeout=60)
                    b.stop()
                    wait_for(lambda: _counter(a, "persist_remote_ready") == 0, 30,
                             what="a to see b's cache gone")
                if i == 199:  # b back: a new incarnation on the same log
                    b = CachingAppliance(b_cfg).start()
                    assert b.cache.ready.wait(60)
                i += 1
            deadline = time.monotonic() + 120
            while True:  # the losses while b was away are told at the next call: go on
                try:
                    client.flush(timeout=max(deadline - time.monotonic(), 1))
                    break
                except ConnectionLostError:
                    assert time.monotonic() < deadline, "not all acknowledged within 120 s"
            assert all(o.state == ACKNOWLEDGED for o in outcomes)
        kept = [payload for _, payload in _log_rows(cache_dir)]
        missing = [m for m in sent if m not in set(kept)]
        assert not missing, (len(missing), missing[:5])
    finally:
        a.stop()
        b.stop()
