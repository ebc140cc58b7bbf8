"""The standby's mirror (appliance/control/mirror.py): a primary with ``clients.mirror_to``
sends its standby the subscriptions of the sessions whose client has a standby; when the
primary is killed, a session that moves there finds its subscriptions made at its login
and does not make them again, and its guaranteed subscription still misses nothing.

The pair of ``tests/appliance/test_failover.py``: the primary a ``topicwire run`` process,
the standby an in-process appliance with a cache. Every wait has a deadline.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from appliance.client import connect
from tests.appliance.helpers import wait_for
from tests.appliance.test_client_state import States
from tests.appliance.test_failover import (
    DEADLINE_S,
    SESSION_TIMEOUT_S,
    Pair,
    Publisher,
    _ranges,
    _take,
)

PATTERNS = 50


@pytest.fixture
def mirrored(tmp_path):
    pair = Pair(tmp_path, mirror=True)
    yield pair
    pair.close()


def test_a_moved_session_finds_its_subscriptions_made_from_the_mirror(mirrored):
    pair = mirrored
    states = States()
    client = pair.client(states)
    partial_states = States()
    partial = connect(pair.primary_url, "reader", standby=pair.standby_url,
                      session_timeout_s=SESSION_TIMEOUT_S, on_state=partial_states)
    try:
        sub = client.subscribe("orders/#", qos="guaranteed")
        plain = [client.subscribe(f"orders/p{i}") for i in range(PATTERNS)]
        wide = partial.subscribe("orders/#")
        partial.unsubscribe("orders/secret")  # a negative entry: not mirrored
        kept = wait_for(lambda: (c := pair.standby.status()["counters"]).get(
            "control_mirror_records_subscriptions") == PATTERNS + 1 and c, DEADLINE_S,
            what="the standby keeping the session's subscriptions")
        assert kept["control_mirror_records"] == 1
        wait_for(lambda: pair.primary_status()["counters"].get(
            "control_mirror_sessions_not_mirrored", 0) >= 1, DEADLINE_S,
            what="the session with a negative entry not mirrored")
        publisher = Publisher(pair.standby_url, 2_000)
        publisher.start()
        got: list[int] = []
        _take(sub, 300, got)
        killed = time.monotonic()
        pair.proc.send_signal(signal.SIGKILL)
        states.wait("reconnected")
        moved_s = time.monotonic() - killed
        _take(sub, 2_000, got)
        publisher.join(DEADLINE_S)
        assert publisher.error is None and got == list(range(2_000))
        assert sub.lost_messages == 0 and not sub.losses
        counters = client.connection_counters()
        assert counters["restored_subscriptions"] == PATTERNS + 1
        assert client.url == pair.standby_url
        standby = wait_for(lambda: (c := pair.standby.status()["counters"]).get(
            "control_mirror_restores") == 1 and c, DEADLINE_S, what="the standby's restore")
        assert standby["control_mirror_subscriptions_restored"] == PATTERNS + 1
        partial_states.wait("reconnected")
        assert partial.connection_counters()["restored_subscriptions"] == 0
        with connect(pair.standby_url, "feed") as feed:  # both moved sessions get live ones
            for topic in ("orders/p7", "orders/secret", "orders/p8"):
                feed.publish(topic, topic.encode(), flush=True)
            msg = plain[7].get(timeout=DEADLINE_S)
            assert msg is not None and msg.payload == b"orders/p7"
            seen: list[str] = []  # (it also gets the publisher's orders/x ones)
            while "orders/p8" not in seen:
                got_one = wide.get(timeout=DEADLINE_S)
                assert got_one is not None, f"orders/p8 did not reach the wide session: {seen}"
                if got_one.topic != "orders/x":
                    seen.append(got_one.topic)
            assert seen == ["orders/p7", "orders/p8"]  # orders/secret stays unsubscribed
        print(f"\nmove with {PATTERNS + 1} subscriptions made from the mirror: "
              f"{moved_s * 1e3:.0f} ms from SIGKILL to reconnected "
              f"(session timeout {SESSION_TIMEOUT_S * 1e3:.0f} ms)")
    finally:
        client.close()
        partial.close()


def test_live_messages_of_a_restored_session_wait_for_the_gap_to_be_filled(mirrored):
    """A session the mirror restores is live from its login on: messages that reach it before
    the client asks the cache for the gap are held, not handed over ahead of the gap. The
    race made certain: after the login the client waits until a live message has reached the
    subscription, then goes on."""
    pair = mirrored
    states = States()
    client = pair.client(states)
    try:
        sub = client.subscribe("orders/#", qos="guaranteed")
        wait_for(lambda: pair.standby.status()["counters"].get(
            "control_mirror_records_subscriptions") == 1, DEADLINE_S,
            what="the standby keeping the session's subscription")
        register_again = client._register_again
        arrived = threading.Event()

        def after_a_live_message() -> None:
            put = sub._put

            def spy(msg) -> None:
                arrived.set()
                put(msg)

            sub._put = spy
            try:
                wait_for(arrived.is_set, DEADLINE_S, what="a live message at the moved session")
            finally:
                del sub._put
            register_again()

        client._register_again = after_a_live_message
        publisher = Publisher(pair.standby_url, 1_500)
        publisher.start()
        got: list[int] = []
        _take(sub, 300, got)
        pair.proc.send_signal(signal.SIGKILL)
        states.wait("reconnected")
        assert arrived.is_set()
        _take(sub, 1_500, got)
        publisher.join(DEADLINE_S)
        assert publisher.error is None
        assert got == list(range(1_500)), _ranges(got)
        assert sub.lost_messages == 0 and not sub.losses
        assert client.connection_counters()["restored_subscriptions"] == 1
        assert client.filled > 0
    finally:
        client.close()
