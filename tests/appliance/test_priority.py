"""``appliance.priority``: the data-path thread runs at that nice value (the rest of the
appliance keeps the process's); a value out of range is the config's error; a priority the
host refuses stops the start with an error naming the key, and nothing is left running."""

import errno
import os
import threading

import pytest

from appliance import node
from appliance.config import ConfigError, parse_config
from appliance.node import Appliance
from channels.udp import UdpChannel
from tests.appliance.helpers import free_port


def _config(port: int, priority: int | None):
    app = {"name": f"prio{port}"} | ({} if priority is None else {"priority": priority})
    return parse_config({"appliance": app, "clients": {"udp": f"127.0.0.1:{port}"},
                         "pm": {"anonymous": True, "require_passwords": False}})


def _datapath_nice(app: Appliance) -> int:
    """The nice value of the appliance's data-path thread (asked on that thread)."""
    got: list[int] = []
    done = threading.Event()
    app.dataplane.commands.offer(
        lambda: (got.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())),
                 done.set()))
    assert done.wait(10)
    return got[0]


@pytest.mark.parametrize("priority", [5, -5])
def test_the_data_path_thread_runs_at_the_configured_priority(priority):
    if priority < 0 and os.geteuid() != 0:
        pytest.skip("a negative nice value needs root or CAP_SYS_NICE")
    port = free_port()
    with Appliance(_config(port, priority)) as app:
        assert _datapath_nice(app) == priority
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == os.nice(0)


def test_by_default_the_data_path_thread_keeps_the_process_priority():
    port = free_port()
    cfg = _config(port, None)
    assert cfg.priority == 0
    with Appliance(cfg) as app:
        assert _datapath_nice(app) == os.nice(0)


@pytest.mark.parametrize("value", [-21, 20, "high", True, 1.5])
def test_a_priority_out_of_range_is_a_config_error(value):
    with pytest.raises(ConfigError, match="appliance.priority"):
        _config(free_port(), value)


def test_a_priority_the_host_refuses_stops_the_start_and_leaves_nothing_running(monkeypatch):
    def refuse(nice):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(node, "set_thread_priority", refuse)  # as for a user without the right
    port = free_port()
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(ConfigError, match=r"appliance.priority.*CAP_SYS_NICE"):
        Appliance(_config(port, -10)).start()
    assert {t.name for t in threading.enumerate()} <= before  # no agent thread left behind
    UdpChannel(("127.0.0.1", port)).close()  # the client port was released
