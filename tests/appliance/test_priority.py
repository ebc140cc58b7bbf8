"""``appliance.priority``: the data-path thread runs at that nice value (the rest of the
appliance keeps the process's); a value out of range is the config's error; a priority the
host refuses stops the start with an error naming the key, and nothing is left running."""

import errno
import os
import threading

import pytest

from appliance.config import ConfigError, parse_config
from appliance.dataplane import open as dataplane_open
from appliance.node import Appliance
from channels.udp import UdpChannel
from tests.appliance.helpers import free_port


def _config(port: int, priority: int | None, dataplane: str = "process"):
    app = {"name": f"prio{port}", "dataplane": dataplane} | (
        {} if priority is None else {"priority": priority})
    return parse_config({"appliance": app, "clients": {"udp": f"127.0.0.1:{port}"},
                         "pm": {"anonymous": True, "require_passwords": False}})


def _datapath_nice(app: Appliance) -> int:
    """The nice value of the appliance's data-path thread (asked on that thread), or of its
    process's (whose main thread runs it)."""
    if app.config.dataplane == "process":
        return os.getpriority(os.PRIO_PROCESS, app.dataplane.pid)
    got: list[int] = []
    done = threading.Event()
    app.dataplane.commands.offer(
        lambda: (got.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())),
                 done.set()))
    assert done.wait(10)
    return got[0]


@pytest.mark.parametrize("dataplane", ["process", "thread"])
@pytest.mark.parametrize("priority", [5, -5])
def test_the_data_path_runs_at_the_configured_priority(priority, dataplane):
    if priority < 0 and os.geteuid() != 0:
        pytest.skip("a negative nice value needs root or CAP_SYS_NICE")
    port = free_port()
    with Appliance(_config(port, priority, dataplane)) as app:
        assert _datapath_nice(app) == priority
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == os.nice(0)


@pytest.mark.parametrize("dataplane", ["process", "thread"])
def test_by_default_the_data_path_keeps_the_process_priority(dataplane):
    port = free_port()
    cfg = _config(port, None, dataplane)
    assert cfg.priority == 0
    with Appliance(cfg) as app:
        assert _datapath_nice(app) == os.nice(0)


@pytest.mark.parametrize("value", [-21, 20, "high", True, 1.5])
def test_a_priority_out_of_range_is_a_config_error(value):
    with pytest.raises(ConfigError, match="appliance.priority"):
        _config(free_port(), value)


@pytest.mark.parametrize("dataplane", ["process", "thread"])
def test_a_priority_the_host_refuses_stops_the_start_and_leaves_nothing_running(monkeypatch,
                                                                                 dataplane):
    def refuse(nice):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    # as for a user without the right (a forked data path inherits the patch)
    monkeypatch.setattr(dataplane_open, "set_thread_priority", refuse)
    port = free_port()
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(ConfigError, match=r"appliance.priority.*CAP_SYS_NICE"):
        Appliance(_config(port, -10, dataplane)).start()
    assert {t.name for t in threading.enumerate()} <= before  # no agent thread left behind
    UdpChannel(("127.0.0.1", port)).close()  # the client port was released


# --- appliance.dataplane_cpus ------------------------------------------------------------------

def _datapath_cpus(app: Appliance) -> set[int]:
    """The CPUs the appliance's data path may run on (asked as ``_datapath_nice`` asks)."""
    if app.config.dataplane == "process":
        return os.sched_getaffinity(app.dataplane.pid)
    got: list[set[int]] = []
    done = threading.Event()
    app.dataplane.commands.offer(
        lambda: (got.append(os.sched_getaffinity(threading.get_native_id())), done.set()))
    assert done.wait(10)
    return got[0]


def _pinned(port: int, cpus: list, dataplane: str = "process"):
    return parse_config({"appliance": {"name": f"pin{port}", "dataplane": dataplane,
                                       "dataplane_cpus": cpus},
                         "clients": {"udp": f"127.0.0.1:{port}"},
                         "pm": {"anonymous": True, "require_passwords": False}})


@pytest.mark.parametrize("dataplane", ["process", "thread"])
def test_the_data_path_runs_on_the_configured_cpus_and_the_rest_where_it_was(dataplane):
    cpu = max(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    with Appliance(_pinned(free_port(), [cpu], dataplane)) as app:
        assert _datapath_cpus(app) == {cpu}
        assert os.sched_getaffinity(0) == before  # the caller's thread (control side) keeps its


@pytest.mark.parametrize("dataplane", ["process", "thread"])
def test_cpus_this_process_may_not_use_stop_the_start_naming_the_key(dataplane):
    port = free_port()
    with pytest.raises(ConfigError, match=r"appliance\.dataplane_cpus: cannot run the data "
                       r"path on CPUs \[4000\].*may use CPUs"):
        Appliance(_pinned(port, [4000], dataplane)).start()
    UdpChannel(("127.0.0.1", port)).close()  # the client port was released


@pytest.mark.parametrize("value", [[-1], [True], ["1"], [1, 1], [4096], 1])
def test_a_bad_cpu_list_is_a_config_error(value):
    with pytest.raises(ConfigError, match="appliance.dataplane_cpus"):
        _pinned(free_port(), value)
