"""A durable subscriber away for 100,000 guaranteed messages, while the caching appliance is
killed (SIGKILL) and restarted mid-stream, catches up and then follows live
(docs/fault-tolerance.md, "Durable subscriptions"; issue 21's test of the caching engine).

The appliance is a ``topicwire run`` process with ``[cache] acknowledge = "persisted"``: a
publisher's message is acknowledged once the cache's log has it on disk. The publisher
connects with ``resend=True`` (what the killed appliance did not acknowledge is sent again:
at least once). On its return the durable subscriber gets every message, in publish order
of first arrival, none lost; the only repeats are messages that were in flight at the kill.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

from appliance.client import ClientError, ConnectionLostError, connect
from appliance.client.outcomes import ACKNOWLEDGED
from tests.appliance.helpers import free_port, run_appliance, stop, wait_for

MESSAGES = 100_000
KILL_AT = 40_000
DEADLINE_S = 180.0
TOPIC = "orders/eu/x"


def _config(port: int, cache_dir, mgmt: int) -> str:
    return "\n".join([
        "[appliance]", f'name = "dur{port}"', "[clients]", f'udp = "127.0.0.1:{port}"',
        "[mgmt]", f'listen = "127.0.0.1:{mgmt}"',
        "[pm]", "require_passwords = false",
        "[pm.identities.feed]", 'publish = ["orders/#"]', 'subscribe = ["#"]',
        "[pm.identities.viewer]", 'subscribe = ["orders/#"]',
        "[cache]", f'dir = "{cache_dir}"', 'patterns = ["orders/#"]',
        'acknowledge = "persisted"']) + "\n"


def _counters(mgmt: int) -> dict:
    """The appliance's counters on guaranteed messages and the cache (for a failure)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{mgmt}/status", timeout=10) as answer:
        status = json.loads(answer.read())
    return {"clients": status["clients"], **{
        k: v for k, v in sorted(status["counters"].items())
        if v and ("guaranteed" in k or "cache" in k or "persist" in k or "login" in k)}}


def _publish_through_a_kill(url: str, appliance: list, config, mgmt: int) -> tuple[int, int]:
    """MESSAGES numbered messages, the appliance killed and restarted after KILL_AT; returns
    (acknowledged, outcomes still pending at the kill)."""
    acked = [0]
    lock = threading.Lock()

    def done(outcome) -> None:
        if outcome.state == ACKNOWLEDGED:
            with lock:
                acked[0] += 1

    in_flight = 0
    with connect(url, "feed", resend=True, reconnect_s=DEADLINE_S,
                 session_timeout_s=2.0) as pub:
        i = 0
        while i < MESSAGES:
            try:
                pub.publish(TOPIC, b"m%d" % i, qos="guaranteed", on_outcome=done)
            except ConnectionLostError:  # the appliance was killed: wait for the new one
                wait_for(lambda: pub.state == "connected", DEADLINE_S, 0.05,
                         what="the publisher reconnected")
                continue
            i += 1
            if i % 500 == 0:
                pub.flush()
            if i == KILL_AT:
                in_flight = pub.unacknowledged
                appliance[0].kill()  # SIGKILL mid-stream
                appliance[0].wait(30)
                appliance[0] = run_appliance(config)
        try:
            pub.flush(timeout=DEADLINE_S)
        except ClientError as exc:
            raise AssertionError(f"{exc}; the appliance's {_counters(mgmt)}; the publisher's "
                                 f"{pub.connection_counters()}") from None
        with lock:
            return acked[0], in_flight


def test_a_durable_subscriber_away_for_100000_messages_across_a_cache_kill_catches_up(
        tmp_path):
    port, mgmt = free_port(), free_port()
    url = f"udp://127.0.0.1:{port}"
    config = tmp_path / "a.toml"
    config.write_text(_config(port, tmp_path / "cache", mgmt))
    appliance = [run_appliance(config)]
    try:
        with connect(url, "viewer") as viewer:  # the durable subscription is made
            sub = viewer.subscribe("orders/eu/#", durable="catchup")
            with connect(url, "feed") as feed:  # the cache's session subscribes at start
                wait_for(lambda: _probe(feed, sub), 60, 0.2, what="the cache keeping")
        acknowledged, in_flight = _publish_through_a_kill(url, appliance, config, mgmt)
        assert acknowledged == MESSAGES  # resent after the kill, all persisted at last
        t0 = time.monotonic()
        with connect(url, "viewer") as viewer:
            sub = viewer.subscribe("orders/eu/#", durable="catchup")
            got: list[bytes] = []
            seen: set[bytes] = set()
            repeats = 0
            deadline = time.monotonic() + DEADLINE_S
            while len(seen) < MESSAGES:
                msg = sub.get(timeout=max(0.0, deadline - time.monotonic()))
                assert msg is not None, _shortfall(seen, repeats, sub)
                if msg.payload.startswith(b"probe"):
                    continue  # a probe acknowledged before the subscriber left: not counted
                if msg.payload in seen:
                    repeats += 1
                else:
                    seen.add(msg.payload)
                    got.append(msg.payload)
            caught_up_s = time.monotonic() - t0
            assert got == [b"m%d" % i for i in range(MESSAGES)]  # in order, none missing
            assert repeats <= in_flight, (repeats, in_flight)  # at least once: only those
            assert sub.lost_messages == 0
            with connect(url, "feed") as feed:  # then live
                for i in range(100):
                    feed.publish(TOPIC, b"live%d" % i, qos="guaranteed")
                feed.flush(timeout=60)
            live = []
            while len(live) < 100:
                msg = sub.get(timeout=60)
                assert msg is not None, f"{len(live)} of 100 live messages arrived"
                if msg.payload.startswith(b"live"):
                    live.append(msg.payload)
                else:  # a repeat can only be a message in flight at the kill
                    assert msg.payload in seen
            assert live == [b"live%d" % i for i in range(100)]
        print(f"\n{MESSAGES:,} messages kept across a SIGKILL of the caching appliance "
              f"({repeats:,} repeats of {in_flight:,} in flight); the durable subscriber caught up "
              f"in {caught_up_s:.1f} s")
    finally:
        stop(appliance[0])


def _shortfall(seen: set[bytes], repeats: int, sub) -> str:
    missing = sorted(i for i in range(MESSAGES) if b"m%d" % i not in seen)
    runs = []
    for i in missing:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return (f"{len(seen)} of {MESSAGES} arrived ({repeats} repeats); missing {len(missing)} "
            f"in runs {runs[:10]}; losses {sub.losses}")


def _probe(feed, sub) -> bool:
    feed.publish("orders/eu/probe", b"probe", qos="guaranteed")
    feed.flush(timeout=5)
    return sub.get(timeout=0.5) is not None
