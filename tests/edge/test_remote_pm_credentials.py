"""Credentials at an edge whose P&M is remote: two ``topicwire run`` processes (a core that is
the fabric's P&M, an edge with ``pm.mode = "remote"``) and paho-mqtt clients. The edge checks
MQTT passwords against the identities' verifiers in the P&M document it received over the
fabric: before it has one, every username is refused; then the right password is accepted and
a wrong one refused; a password changed at P&M (SIGHUP) takes effect at the edge."""

from __future__ import annotations

import signal

from appliance.control.credentials import hash_password
from tests.appliance.helpers import FABRIC_KEY, free_port, run_appliance, stop, write_config
from tests.edge.conftest import DEADLINE_S, wait_for
from tests.edge.peers import Peer

FAST = "heartbeat_interval_ms = 50\nlsa_refresh_ms = 500\n"


def pm_toml(me: int, them: int, password: str) -> str:
    return f"""
[appliance]
name = "pmcore"
{FAST}
[clients]
udp = "127.0.0.1:{free_port()}"
[fabric]
listen = "127.0.0.1:{me}"
key = "{FABRIC_KEY}"
[[neighbours]]
name = "edge-far"
address = "127.0.0.1:{them}"
[pm.identities.sensor]
publish = ["plant/#"]
subscribe = ["plant/#"]
password = "{hash_password(password, n=1 << 10)}"
"""


def edge_toml(me: int, them: int, mqtt_port: int) -> str:
    return f"""
[appliance]
name = "edge-far"
role = "edge"
{FAST}
[clients]
udp = "127.0.0.1:{free_port()}"
[fabric]
listen = "127.0.0.1:{me}"
key = "{FABRIC_KEY}"
[[neighbours]]
name = "pmcore"
address = "127.0.0.1:{them}"
[pm]
mode = "remote"
[mqtt]
listen = "127.0.0.1:{mqtt_port}"
"""


def rc_of(port: int, password: str, client_id: str) -> int:
    """The CONNACK reason code of a 5.0 CONNECT as ``sensor`` with ``password``."""
    peer = Peer(None, client_id, user="sensor", password=password, version=5, port=port)
    rc = peer.rc.value
    if rc == 0:
        peer.client.disconnect()
    peer.client.loop_stop()
    return rc


def test_a_remote_pm_edge_checks_passwords_and_follows_a_change_at_pm(tmp_path):
    pm_fabric, edge_fabric, mqtt_port = free_port(), free_port(), free_port()
    edge = run_appliance(write_config(tmp_path / "edge.toml",
                                      edge_toml(edge_fabric, pm_fabric, mqtt_port)))
    pm = None
    try:
        # no P&M document yet: the right password is refused (bad credentials), not accepted
        assert rc_of(mqtt_port, "first-pw", "early") == 0x86
        pm_path = write_config(tmp_path / "pm.toml", pm_toml(pm_fabric, edge_fabric, "first-pw"))
        pm = run_appliance(pm_path)
        wait_for(lambda: rc_of(mqtt_port, "first-pw", "right") == 0, DEADLINE_S,
                 "the right password accepted once P&M's document reached the edge")
        assert rc_of(mqtt_port, "wrong-pw", "wrong") == 0x86
        assert rc_of(mqtt_port, "", "empty") == 0x86
        # the password changes at P&M: the edge follows without a restart
        pm_path.write_text(pm_toml(pm_fabric, edge_fabric, "second-pw"))
        pm.send_signal(signal.SIGHUP)
        wait_for(lambda: rc_of(mqtt_port, "second-pw", "new") == 0, DEADLINE_S,
                 "the new password accepted at the edge after P&M's reload")
        assert rc_of(mqtt_port, "first-pw", "old") == 0x86
        assert edge.poll() is None and pm.poll() is None
    finally:
        for proc in (edge, pm):
            if proc is not None:
                stop(proc)
