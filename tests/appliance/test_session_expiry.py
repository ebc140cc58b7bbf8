"""Silent peers are ended at the configured bounds, whatever the heartbeat period: a client
session silent for ``clients.session_dead_ms`` is logged out while a client that heartbeats
stays, and a neighbour silent for ``appliance.neighbour_dead_ms`` goes down, also when those
bounds are at their least (a timer that runs once an interval is not a stall of the
process). And the least ``session_dead_ms`` is refused below three client heartbeats."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from appliance.client import connect
from appliance.config import CLIENT_SESSION_DEAD_MIN_MS, ConfigError, parse_config
from appliance.node import Appliance
from bench.scale import _login_frame
from tests.appliance.helpers import (
    FABRIC_KEY,
    counter,
    free_port,
    run_appliance,
    stop,
    udp_url,
    wait_for,
)

IDENTITIES = {name: {"publish": ["#"], "subscribe": ["#"]} for name in ("anonymous", "scale")}


def test_a_silent_session_is_logged_out_and_a_heartbeating_one_stays() -> None:
    # heartbeat_interval_ms 2,000 > session_dead_ms / 2: the timers run less often than half
    # the session bound, which once counted as a stall every time and kept sessions forever.
    port = free_port()
    app = Appliance(parse_config({
        "appliance": {"name": f"exp{port}", "heartbeat_interval_ms": 2_000},
        "clients": {"udp": f"127.0.0.1:{port}",
                    "session_dead_ms": CLIENT_SESSION_DEAD_MIN_MS},
        "pm": {"require_passwords": False, "identities": IDENTITIES}})).start()
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        live = connect(udp_url(app))
        try:
            silent.connect(("127.0.0.1", port))
            silent.send(_login_frame(1))  # a LOGIN, then nothing: no heartbeat, no LOGOUT
            wait_for(lambda: len(app.status()["clients"]) == 2, 30, what="both logins")
            wait_for(lambda: counter(app, "control_sessions_expired") >= 1, 30,
                     what="the silent session to be logged out")
            clients = app.status()["clients"]
            assert [c["session"] for c in clients] == [live.session]  # the heartbeating one
            assert counter(app, "control_sessions_expired") == 1
            sub = live.subscribe("exp/#")
            live.publish("exp/a", b"still here", flush=True)
            msg = sub.get(timeout=10)
            assert msg is not None and msg.payload == b"still here"
        finally:
            live.close()
    finally:
        silent.close()
        app.stop()


def test_a_silent_neighbour_goes_down_at_the_least_dead_interval(tmp_path: Path) -> None:
    fa, fb = free_port(), free_port()
    timers = {"heartbeat_interval_ms": 200, "neighbour_dead_ms": 400}  # the least: two beats
    a = Appliance(parse_config({
        "appliance": {"name": f"nb{fa}", **timers},
        "fabric": {"listen": f"127.0.0.1:{fa}", "key": FABRIC_KEY},
        "neighbours": [{"name": f"nb{fb}", "address": f"127.0.0.1:{fb}"}],
        "pm": {"require_passwords": False, "identities": IDENTITIES}})).start()
    config = tmp_path / "b.toml"
    config.write_text(f"""[appliance]
name = "nb{fb}"
heartbeat_interval_ms = 200
neighbour_dead_ms = 400
[fabric]
listen = "127.0.0.1:{fb}"
key = "{FABRIC_KEY}"
[[neighbours]]
name = "nb{fa}"
address = "127.0.0.1:{fa}"
[pm]
mode = "remote"
""")
    b = run_appliance(config)
    try:
        wait_for(lambda: a.status()["neighbours"][0]["state"] == "up", 30,
                 what="the neighbours to meet")
        b.kill()  # no goodbye: only its silence tells
        b.wait(30)
        wait_for(lambda: a.status()["neighbours"][0]["state"] != "up", 30,
                 what="the killed neighbour to be judged down")
    finally:
        stop(b)
        a.stop()


@pytest.mark.parametrize("dead_ms", [100, CLIENT_SESSION_DEAD_MIN_MS - 1])
def test_a_session_bound_below_three_heartbeats_is_refused(dead_ms: int) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"appliance": {"name": "x"}, "clients": {"udp": "127.0.0.1:1",
                                                              "session_dead_ms": dead_ms}})
    assert "clients.session_dead_ms" in str(err.value)
    assert f"at least {CLIENT_SESSION_DEAD_MIN_MS}" in str(err.value)
