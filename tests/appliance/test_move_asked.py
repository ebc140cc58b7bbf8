"""Moves the appliances decide for a client: an operator asks client sessions to move to their
standby (``topicwire move-clients``, ``POST /clients/move``, ``POST /clients/<session>/move``),
or P&M gives an identity's clients their move bounds (``pm.identities.NAME.move_on``). A
client with a standby moves there and a guaranteed subscriber misses nothing (filled from
the standby's cache); a client without one stays; the others are not disturbed.

The primary is a ``topicwire run`` process with a management API and a token, the standby an
in-process appliance with a cache (``tests/appliance/test_failover.py``'s ``Pair``). Every
wait has a deadline and waits for a message, a state or a counter.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request

import pytest

from appliance.client import MoveBounds, connect
from appliance.config import ConfigError, parse_config
from tests.appliance.helpers import CLI, ROOT, wait_for
from tests.appliance.test_client_state import States
from tests.appliance.test_failover import (
    DEADLINE_S,
    IDENTITIES,
    MGMT_TOKEN,
    SESSION_TIMEOUT_S,
    Pair,
    Publisher,
    _take,
)


@pytest.fixture
def pair(tmp_path):
    pair = Pair(tmp_path)
    yield pair
    pair.close()


def _post(pair, path: str, body: dict, token: str | None = MGMT_TOKEN) -> tuple[int, dict]:
    request = urllib.request.Request(f"{pair.mgmt}{path}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _advertised(pair) -> None:
    wait_for(lambda: any(s["pattern"] == "orders/#" and s["origin"] == pair.primary_name
                         for s in pair.standby.status()["subscriptions"]), DEADLINE_S,
             what="the subscription advertised to the standby")


def test_move_clients_moves_the_sessions_with_a_standby_and_they_miss_nothing(pair):
    states = States()
    client = pair.client(states)
    stayer = connect(pair.primary_url, "reader")  # no standby: it cannot move, and stays
    try:
        sub = client.subscribe("orders/#", qos="guaranteed")
        session = client.session
        _advertised(pair)
        publisher = Publisher(pair.standby_url, 3_000)
        publisher.start()
        got: list[int] = []
        _take(sub, 500, got)
        done = subprocess.run([*CLI, "move-clients", "--all", "--mgmt", pair.mgmt, "--token",
                               MGMT_TOKEN, "--reason", "maintenance"], cwd=ROOT,
                              capture_output=True, text=True, timeout=DEADLINE_S)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer == {"asked": [session], "not_movable": [stayer.session], "unknown": []}
        assert "maintenance" in states.wait("lost").reason
        moved = states.wait("reconnected")
        assert "moved to " + pair.standby_url in moved.reason
        _take(sub, 3_000, got)
        publisher.join(DEADLINE_S)
        assert publisher.error is None and publisher.sent == 3_000
        assert got == list(range(3_000))  # every message, once, in order
        assert client.url == pair.standby_url
        assert client.moves_by_reason == {"asked": 1}
        assert sub.lost_messages == 0 and not sub.losses
        status = wait_for(lambda: (s := pair.primary_status())["counters"].get(
            "control_sessions_moved_out_asked") == 1 and s, DEADLINE_S,
            what="the primary told of the asked move")
        assert status["counters"]["control_sessions_asked_to_move"] == 1
        assert status["counters"]["control_sessions_not_movable"] == 1
        assert [c["session"] for c in status["clients"]] == [stayer.session]
        wait_for(lambda: pair.standby.status()["counters"].get(
            "control_sessions_moved_in_asked") == 1, DEADLINE_S, what="the standby's count")
        assert stayer.state == "connected" and stayer.url == pair.primary_url
    finally:
        client.close()
        stayer.close()


def test_one_session_moves_and_the_other_stays_and_bad_requests_are_refused(pair):
    moving_states, staying_states = States(), States()
    moving = pair.client(moving_states)
    staying = connect(pair.primary_url, "reader", standby=pair.standby_url,
                      session_timeout_s=SESSION_TIMEOUT_S, on_state=staying_states)
    try:
        sub = staying.subscribe("orders/#")
        _advertised(pair)
        session = moving.session
        code, answer = _post(pair, f"/clients/{session}/move", {"reason": "rebalance"})
        assert code == 200 and answer["asked"] == [session], answer
        moving_states.wait("reconnected")
        assert moving.url == pair.standby_url and moving.moves_by_reason == {"asked": 1}
        with connect(pair.primary_url, "feed") as feed:  # the one left still gets its messages
            got: list[int] = []
            for i in range(20):
                feed.publish("orders/y", b"%d" % i, flush=True)
                msg = sub.get(timeout=DEADLINE_S)
                assert msg is not None, f"message {i} did not reach the session that stayed"
                got.append(int(msg.payload))
        assert got == list(range(20))
        assert staying.url == pair.primary_url and staying_states.names == []
        code, answer = _post(pair, "/clients/move", {"sessions": [12345]})
        assert code == 200 and answer["unknown"] == [12345] and answer["asked"] == []
        code, answer = _post(pair, "/clients/move", {})
        assert code == 400 and "takes one of" in answer["error"]
        code, answer = _post(pair, "/clients/move", {"all": True, "identity": "reader"})
        assert code == 400
        code, answer = _post(pair, "/clients/abc/move", {})
        assert code == 400 and "not a session number" in answer["error"]
        code, answer = _post(pair, "/clients/move", {"all": True}, token=None)
        assert code == 401
        code, answer = _post(pair, "/clients/move", {"identity": 5})
        assert code == 409 and "identity" in answer["error"]
        assert staying.url == pair.primary_url and staying_states.names == []
    finally:
        moving.close()
        staying.close()


# P&M's bounds: any round trip is above 1 us, so a client that takes them moves once its
# first window (0.5 s of probes every 20 ms) is measured; the hold-down keeps it there.
PM_BOUNDS = {"latency_ms": 0.001, "window_s": 0.5, "probe_interval_ms": 20}


@pytest.fixture
def bounded_pair(tmp_path):
    identities = {**IDENTITIES, "reader": {**IDENTITIES["reader"], "move_on": PM_BOUNDS}}
    pair = Pair(tmp_path, identities)
    yield pair
    pair.close()


def test_pm_bounds_of_an_identity_move_its_clients_that_have_none_of_their_own(bounded_pair):
    pair = bounded_pair
    states = States()
    client = pair.client(states)
    own = connect(pair.primary_url, "reader", standby=pair.standby_url,
                  session_timeout_s=SESSION_TIMEOUT_S, move_on=MoveBounds(latency_ms=60_000))
    alone = connect(pair.primary_url, "reader")  # no standby: P&M's bounds are not for it
    try:
        moved = states.wait("reconnected")
        assert "moved to " + pair.standby_url in moved.reason and "latency" in moved.reason
        assert client.moves_by_reason == {"latency": 1}
        counters = client.connection_counters()
        assert counters["move_on"] == "pm" and counters["path"]["sent"] > 0
        assert own.connection_counters()["move_on"] == "client"  # its own bounds win
        assert alone.connection_counters()["move_on"] is None
        wait_for(lambda: pair.standby.status()["counters"].get(
            "control_sessions_moved_in_latency") == 1, DEADLINE_S, what="the standby's count")
        assert own.url == pair.primary_url and own.moves == 0
        assert alone.url == pair.primary_url and alone.state == "connected"
    finally:
        client.close()
        own.close()
        alone.close()


@pytest.mark.parametrize("bounds, says", [
    ({"window_s": 5}, "give at least one of latency_ms"),
    ({"latency_ms": -5}, "latency_ms must be milliseconds"),
    ({"loss_ratio": 1.5}, "loss_ratio must be a ratio"),
    ({"latency_ms": 10, "window_s": 0.5, "probe_interval_ms": 200}, "must hold at least"),
    ({"latency_ms": 10, "speed": 3}, "unknown key"),
    ("fast", "must be a table"),
])
def test_bad_pm_move_bounds_are_refused_naming_the_key(bounds, says):
    doc = {"appliance": {"name": "a"}, "clients": {"udp": "127.0.0.1:47999"},
           "pm": {"identities": {"reader": {"subscribe": ["#"], "move_on": bounds}}}}
    with pytest.raises(ConfigError) as caught:
        parse_config(doc)
    assert "pm.identities.reader.move_on" in str(caught.value)
    assert says in str(caught.value)
