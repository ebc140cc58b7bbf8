"""``[[mqtt.bridges]]`` is checked as strictly as the rest of the config: every bad value is one
line naming its key (``parse_config``, and ``topicwire run`` exits 2 with it)."""

from __future__ import annotations

import subprocess
import tomllib

import pytest

from appliance.config import ConfigError, parse_config
from appliance.edge.node import EdgeAppliance
from tests.appliance.helpers import CLI
from tests.edge.bridge_peers import bridge_doc
from tests.edge.conftest import edge_doc

OUT = [{"local": "plant/#", "remote_prefix": "edge1/", "qos": 1}]


def refusal(doc: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    text = str(info.value)
    assert "\n" not in text and text.startswith("config: ")
    return text.removeprefix("config: ")


@pytest.mark.parametrize(("change", "key"), [
    ({"name": None}, "mqtt.bridges[0].name: required"),
    ({"name": "a b"}, "mqtt.bridges[0].name: 'a b': 1..32 letters"),
    ({"address": None}, "mqtt.bridges[0].address: required"),
    ({"address": "127.0.0.1"}, "mqtt.bridges[0].address:"),
    ({"address": "no-such-host.invalid:1883"}, "mqtt.bridges[0].address: cannot resolve"),
    ({"identity": None}, "mqtt.bridges[0].identity: required"),
    ({"identity": "ghost"}, "mqtt.bridges[0].identity: 'ghost' is no identity"),
    ({"protocol": 5}, "mqtt.bridges[0].protocol: must be \"5\" or \"3.1.1\""),
    ({"protocol": "3"}, "mqtt.bridges[0].protocol: must be"),
    ({"password_file": "/nonexistent/pw"}, "mqtt.bridges[0].password_file: no such file"),
    ({"username": None}, "mqtt.bridges[0].password_file: only with a username"),
    ({"tls": "yes"}, "mqtt.bridges[0].tls: must be true or false"),
    ({"tls_ca_file": "/nonexistent/ca.pem"}, "mqtt.bridges[0].tls_ca_file: only with tls"),
    ({"tls": True, "tls_ca_file": "/nonexistent/ca.pem"},
     "mqtt.bridges[0].tls_ca_file: no such file"),
    ({"keep_alive_s": 0}, "mqtt.bridges[0].keep_alive_s: must be an integer in [5, 65535]"),
    ({"max_inflight": 0}, "mqtt.bridges[0].max_inflight: must be an integer"),
    ({"reconnect_min_ms": 1_000, "reconnect_max_ms": 100},
     "mqtt.bridges[0].reconnect_max_ms: 100 is below reconnect_min_ms"),
    ({"backlog_dir": None}, "mqtt.bridges[0].backlog_dir: required with a QoS 1 out mapping"),
    ({"backlog_max_messages": 0}, "mqtt.bridges[0].backlog_max_messages: must be an integer"),
    ({"backlog_max_bytes": "1G"}, "mqtt.bridges[0].backlog_max_bytes: must be an integer"),
    ({"out": []}, "mqtt.bridges[0].in: a bridge needs at least one in or out mapping"),
    ({"out": "plant/#"}, "mqtt.bridges[0].out: must be an array"),
    ({"out": [{"local": "plant/#/x"}]}, "mqtt.bridges[0].out[0].local: 'plant/#/x' is not a "
                                        "valid topic filter"),
    ({"out": [{"remote_prefix": "x/"}]}, "mqtt.bridges[0].out[0].local: required"),
    ({"out": [{"local": "a/#", "remote_prefix": "x/+/"}]},
     "mqtt.bridges[0].out[0].remote_prefix: a topic prefix takes no wildcards"),
    ({"out": [{"local": "a/#", "qos": 2}]}, "mqtt.bridges[0].out[0].qos: must be 0 or 1"),
    ({"out": [{"local": "a/#", "filter": "x"}]}, "mqtt.bridges[0].out[0].filter: unknown key"),
    ({"in": [{"remote": "+x"}]}, "mqtt.bridges[0].in[0].remote: '+x' is not a valid"),
    ({"in": [{"remote": "a/#", "local_prefix": "$SYS/"}]},
     "mqtt.bridges[0].in[0].local_prefix: a topic prefix may not start with '$'"),
    ({"colour": "red"}, "mqtt.bridges[0].colour: unknown key"),
])
def test_bad_bridge_values_are_refused_in_one_line_naming_the_key(tmp_path, change, key):
    doc = bridge_doc(tmp_path, 1883, out=OUT)
    bridge = doc["mqtt"]["bridges"][0]
    for k, v in change.items():
        if v is None:
            del bridge[k]
        else:
            bridge[k] = v
    assert refusal(doc).startswith(key)


def test_two_bridges_need_their_own_names(tmp_path):
    doc = bridge_doc(tmp_path, 1883, out=OUT)
    doc["mqtt"]["bridges"].append(dict(doc["mqtt"]["bridges"][0]))
    assert refusal(doc).startswith("mqtt.bridges[1].name: 'cloud' names two bridges")
    doc["mqtt"]["bridges"][1]["name"] = "other"  # (one backlog_dir: a subdirectory each)
    assert parse_config(doc).mqtt.bridges[1].name == "other"
    doc["mqtt"]["bridges"] = "cloud"
    assert refusal(doc).startswith("mqtt.bridges: must be an array")


def test_an_out_pattern_the_identity_may_not_read_stops_the_start(tmp_path):
    doc = bridge_doc(tmp_path, 1883, identity="bob",
                     out=[{"local": "plant/#", "remote_prefix": "", "qos": 1}])
    with pytest.raises(ConfigError) as info:
        EdgeAppliance(parse_config(doc)).start()
    assert str(info.value).startswith("config: mqtt.bridges[0].out[0].local: identity 'bob' "
                                      "may not subscribe to 'plant/#'")


def test_topicwire_run_exits_2_with_the_line(tmp_path):
    doc = edge_doc()
    doc["mqtt"]["bridges"] = [{"name": "cloud", "address": "127.0.0.1:1883",
                               "identity": "native", "out": OUT}]
    lines = ["[appliance]", 'name = "edge1"', 'role = "edge"', "[clients]",
             f'udp = "{doc["clients"]["udp"]}"', "[pm.identities.native]",
             'publish = ["#"]', 'subscribe = ["#"]', "[mqtt]", 'listen = "127.0.0.1:0"',
             "[[mqtt.bridges]]", 'name = "cloud"', 'address = "127.0.0.1:1883"',
             'identity = "native"', 'out = [{ local = "plant/#", remote_prefix = "e/" }]']
    path = tmp_path / "edge.toml"
    path.write_text("\n".join(lines) + "\n")
    tomllib.loads(path.read_text())  # (the file itself is valid TOML)
    proc = subprocess.run([*CLI, "run", "--config", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "topicwire: config: mqtt.bridges[0].backlog_dir: required with a QoS 1 out mapping: "
        "the durable backlog of messages the remote has not acknowledged")
