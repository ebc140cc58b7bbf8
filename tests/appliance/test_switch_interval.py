"""``appliance.switch_interval_us``: the interpreter switch interval of an appliance process,
checked as a config key and applied by ``topicwire run`` (shown in ``/status``)."""

from __future__ import annotations

import pytest

from appliance.config import ConfigError, parse_config
from tests.appliance.helpers import FABRIC_KEY, free_port, run_appliance, stop, wait_for
from tests.appliance.mgmt_fabric import http


def _doc(**app: object) -> dict:
    return {"appliance": {"name": "sw", **app},
            "fabric": {"listen": f"127.0.0.1:{free_port()}", "key": FABRIC_KEY}}


def test_the_switch_interval_is_a_checked_config_key() -> None:
    assert parse_config(_doc()).switch_interval_us == 5_000
    assert parse_config(_doc(switch_interval_us=250)).switch_interval_us == 250
    for bad in (0, 9, 100_001, "250", 2.5):
        with pytest.raises(ConfigError, match="appliance.switch_interval_us"):
            parse_config(_doc(switch_interval_us=bad))


def test_topicwire_run_applies_the_switch_interval(tmp_path) -> None:
    mgmt = free_port()
    config = tmp_path / "sw.toml"
    config.write_text("\n".join([
        "[appliance]", 'name = "sw"', "switch_interval_us = 250", "[fabric]",
        f'listen = "127.0.0.1:{free_port()}"', f'key = "{FABRIC_KEY}"', "[mgmt]",
        f'listen = "127.0.0.1:{mgmt}"']) + "\n")
    proc = run_appliance(config)
    try:
        node = wait_for(lambda: http("GET", f"http://127.0.0.1:{mgmt}/node")[2].get("node"))
        assert node["switch_interval_us"] == 250
    finally:
        stop(proc)
