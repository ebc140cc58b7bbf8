"""An edge started by ``topicwire run`` from a TOML config, reached by mosquitto_pub and
mosquitto_sub (Debian's mosquitto-clients, MQTT 3.1.1 and 5.0) and by a native client; its
counters in the management API's ``/status``; a bad ``[mqtt]`` refused with exit code 2."""

from __future__ import annotations

import queue
import shutil
import subprocess

import pytest

from appliance.client import connect
from appliance.control.credentials import hash_password
from tests.appliance.helpers import CLI, free_port, run_appliance, stop, write_config
from tests.appliance.mgmt_fabric import http
from tests.edge.conftest import DEADLINE_S, wait_for

pytestmark = pytest.mark.skipif(shutil.which("mosquitto_pub") is None,
                                reason="mosquitto-clients is not installed (make test "
                                       "installs it: APT_PACKAGES)")


def edge_toml(mqtt_port: int, mgmt_port: int, udp_port: int) -> str:
    return f"""
[appliance]
name = "edge-run"
role = "edge"

[clients]
udp = "127.0.0.1:{udp_port}"

[pm]
require_passwords = false

[pm.identities.sensor]
publish = ["plant/#"]
subscribe = ["plant/#", "cmd/#"]
password = "{hash_password('s3nsor', n=1 << 10)}"

[pm.identities.app]
publish = ["#"]
subscribe = ["#"]

[mqtt]
listen = "127.0.0.1:{mqtt_port}"
max_packet_bytes = 8192

[mgmt]
listen = "127.0.0.1:{mgmt_port}"
"""


def mqtt_status(base: str) -> dict:
    code, _, doc = http("GET", base + "/status")
    return doc.get("mqtt", {}) if code == 200 else {}


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_clients_and_a_native_client_talk_through_a_running_edge(tmp_path, version):
    mqtt_port, mgmt_port, udp_port = free_port(), free_port(), free_port()
    config = write_config(tmp_path / "edge.toml", edge_toml(mqtt_port, mgmt_port, udp_port))
    proc = run_appliance(config)
    base = f"http://127.0.0.1:{mgmt_port}"
    auth = ["-h", "127.0.0.1", "-p", str(mqtt_port), "-u", "sensor", "-P", "s3nsor",
            "-V", version]
    try:
        sub = subprocess.Popen(["mosquitto_sub", *auth, "-t", "plant/#", "-q", "1", "-C", "2",
                                "-v", "-W", str(int(DEADLINE_S))],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: mqtt_status(base).get("counters", {}).get("subscriptions"),
                 what="mosquitto_sub's subscription")
        subprocess.run(["mosquitto_pub", *auth, "-t", "plant/boiler/temp", "-m", "81",
                        "-q", "1"], check=True, timeout=DEADLINE_S)
        with connect(f"udp://127.0.0.1:{udp_port}", "app") as native:
            got = queue.Queue()
            native.subscribe("plant/#", callback=got.put)
            subprocess.run(["mosquitto_pub", *auth, "-t", "plant/pump", "-m", "on", "-q", "1"],
                           check=True, timeout=DEADLINE_S)
            msg = got.get(timeout=DEADLINE_S)
            assert (msg.topic, msg.payload) == ("plant/pump", b"on")
        out, err = sub.communicate(timeout=DEADLINE_S)
        assert sub.returncode == 0, err
        assert out.splitlines() == ["plant/boiler/temp 81", "plant/pump on"]
        # a wrong password and a topic the identity may not publish to
        bad = subprocess.run(["mosquitto_pub", *auth[:-4], "-u", "sensor", "-P", "wrong",
                              "-V", version, "-t", "plant/x", "-m", "1"],
                             capture_output=True, text=True, timeout=DEADLINE_S)
        assert bad.returncode != 0
        # the API answers from a snapshot at most one period old (docs/appliance.md)
        counters = wait_for(lambda: (lambda c: c if c.get("connect_refused_bad_credentials")
                                     else None)(mqtt_status(base).get("counters", {})))
        assert counters["connect_refused_bad_credentials"] == 1
        assert counters["connects_accepted"] >= 3 and counters["publishes_in"] == 2
        code, _, text = http("GET", base + "/metrics")
        assert code == 200
        assert 'topicwire_mqtt_events_total{counter="connect_refused_bad_credentials"} 1.0' \
            in text
    finally:
        assert stop(proc) == 0


def test_mqtt_on_a_core_is_refused_with_one_line_naming_the_key(tmp_path):
    config = write_config(tmp_path / "core.toml", """
[appliance]
name = "core-x"

[clients]
udp = "127.0.0.1:47999"

[mqtt]
listen = "127.0.0.1:1883"
""")
    done = subprocess.run([*CLI, "run", "--config", str(config)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("topicwire: config: mqtt: only for "
                                                           "appliance.role = \"edge\"")


def test_a_running_edge_keeps_a_mosquitto_sub_persistent_session_and_serves_websocket(
        tmp_path):
    mqtt_port, mgmt_port, udp_port = free_port(), free_port(), free_port()
    ws_port = free_port()
    toml = edge_toml(mqtt_port, mgmt_port, udp_port).replace(
        "max_packet_bytes = 8192", f"max_packet_bytes = 8192\nws_listen = \"127.0.0.1:{ws_port}\"\n"
        "max_offline_sessions = 4\nmax_session_expiry_s = 600")
    proc = run_appliance(write_config(tmp_path / "edge.toml", toml))
    base = f"http://127.0.0.1:{mgmt_port}"
    auth = ["-h", "127.0.0.1", "-p", str(mqtt_port), "-u", "sensor", "-P", "s3nsor"]
    try:
        # -c: a persistent session (clean session 0); -C 1 -E: subscribe, then go away
        wait_for(lambda: mqtt_status(base).get("listeners"), what="the edge's listeners")
        subprocess.run(["mosquitto_sub", *auth, "-i", "keeper", "-c", "-q", "1", "-t",
                        "plant/#", "-E"], check=True, timeout=DEADLINE_S)
        wait_for(lambda: mqtt_status(base).get("sessions_offline") == 1)
        subprocess.run(["mosquitto_pub", *auth, "-t", "plant/queued", "-m", "kept", "-q", "1"],
                       check=True, timeout=DEADLINE_S)
        wait_for(lambda: mqtt_status(base)["counters"].get("deliveries_queued") == 1)
        code, _, text = http("GET", base + "/metrics")
        assert 'topicwire_mqtt_sessions{state="offline"} 1.0' in text
        back = subprocess.run(["mosquitto_sub", *auth, "-i", "keeper", "-c", "-q", "1", "-t",
                               "plant/#", "-C", "1", "-v", "-W", str(int(DEADLINE_S))],
                              capture_output=True, text=True, timeout=DEADLINE_S)
        assert back.stdout.strip() == "plant/queued kept", back.stderr
        assert mqtt_status(base)["listeners"]["ws"] == f"127.0.0.1:{ws_port}"
    finally:
        assert stop(proc) == 0


def test_a_bad_tls_key_is_refused_with_one_line_naming_it(tmp_path):
    toml = edge_toml(free_port(), free_port(), free_port()).replace(
        "max_packet_bytes = 8192", "max_packet_bytes = 8192\ntls_listen = \"127.0.0.1:0\"")
    done = subprocess.run([*CLI, "run", "--config", str(write_config(tmp_path / "e.toml", toml))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        "topicwire: config: mqtt.tls_cert_file: required with mqtt.tls_listen")
