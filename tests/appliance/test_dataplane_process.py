"""The data path in a process of its own (``appliance.dataplane = "process"``, the default;
appliance/dataplane/process.py): it forwards, its counters reach the status, a channel that
does not open is the start's ``ConfigError``, its death is the appliance's failure, it does
not outlive its appliance, and large table snapshots cross the link."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from appliance.client.api import connect
from appliance.config import ConfigError, parse_config
from appliance.node import Appliance
from channels.errors import ChannelDeviceError
from channels.udp import UdpChannel
from datapath.errors import TopicwireError
from tests.appliance.helpers import ROOT, free_port, wait_for


def _config(port: int, **appliance) -> object:
    return parse_config({"appliance": {"name": f"dpp{port}", **appliance},
                         "clients": {"udp": f"127.0.0.1:{port}"},
                         "pm": {"anonymous": True, "require_passwords": False}})


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_data_path_runs_in_its_own_process_and_forwards():
    port = free_port()
    with Appliance(_config(port)) as app:
        pid = app.dataplane.pid
        assert pid != os.getpid() and _alive(pid)
        assert not [t for t in threading.enumerate() if t.name.endswith("-dataplane")]
        with connect(f"127.0.0.1:{port}", identity="c") as client:
            sub = client.subscribe("dpp/#")
            for i in range(200):
                client.publish("dpp/x", b"m%d" % i)
            client.flush()
            got = [sub.get(timeout=10).payload for _ in range(200)]
        assert got == [b"m%d" % i for i in range(200)]
        # the child's counters and channel figures reach the status and /metrics' rows
        wait_for(lambda: app.status()["counters"].get("express_receives", 0) > 0,
                 what="the data path's counters in the status")
        wait_for(lambda: {r["channel"]: r for r in app.channel_samples()}
                 .get("clients-udp", {}).get("frames_in", 0) > 0, what="channel samples")
        assert app.failure() is None
    assert not _alive(pid)


def test_a_port_in_use_is_the_starts_config_error_and_nothing_is_left_running():
    port = free_port()
    holder = UdpChannel(("127.0.0.1", port))
    try:
        before = {t.name for t in threading.enumerate()}
        with pytest.raises(ConfigError, match=r"^config: clients\.udp: 127\.0\.0\.1:\d+ is in use"):
            Appliance(_config(port)).start()
        assert {t.name for t in threading.enumerate()} <= before
    finally:
        holder.close()
    with Appliance(_config(port)):  # the port and everything else were released
        pass


def test_a_data_path_that_dies_is_the_appliances_failure():
    port = free_port()
    app = Appliance(_config(port)).start()
    try:
        os.kill(app.dataplane.pid, signal.SIGKILL)
        wait_for(lambda: app.failure() is not None, what="the failure is reported")
        assert isinstance(app.failure(), TopicwireError)
        assert "data-path process" in str(app.failure())
    finally:
        app.stop()  # does not hang on the dead child


def test_the_data_path_does_not_outlive_its_appliance(tmp_path):
    """The appliance's process is killed (no drain): its data path sees the link close and
    exits, releasing the client port."""
    port = free_port()
    script = ("import sys, time\n"
              "from appliance.config import parse_config\n"
              "from appliance.node import Appliance\n"
              f"cfg = parse_config({{'appliance': {{'name': 'orphan{port}'}}, "
              f"'clients': {{'udp': '127.0.0.1:{port}'}}}})\n"
              "app = Appliance(cfg).start()\n"
              "print(app.dataplane.pid, flush=True)\n"
              "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        child = int(proc.stdout.readline())
        assert _alive(child)
        proc.kill()
        proc.wait()
        wait_for(lambda: not _alive(child), 20, what="the orphaned data path exits")
        # its last threads may take a moment more to go, and its sockets with them
        wait_for(lambda: _free(port), 20, what="the client port is released")
    finally:
        proc.kill()


def _free(port: int) -> bool:
    try:
        UdpChannel(("127.0.0.1", port)).close()
    except ChannelDeviceError:
        return False
    return True


def test_sigint_to_the_process_group_leaves_the_drain_to_the_appliance():
    """A terminal's Ctrl-C reaches every process of the group: the data path ignores it and
    stops only when its appliance tells it, after the drain."""
    port = free_port()
    with Appliance(_config(port)) as app:
        pid = app.dataplane.pid
        os.kill(pid, signal.SIGINT)
        os.kill(pid, signal.SIGTERM)
        with connect(f"127.0.0.1:{port}", identity="c") as client:  # still forwarding
            sub = client.subscribe("x")
            client.publish("x", b"1", flush=True)
            assert sub.get(timeout=10).payload == b"1"
        assert _alive(pid) and app.failure() is None


def test_snapshots_larger_than_the_links_buffers_cross_it(tmp_path):
    """A registry of 100,000 topics: every snapshot the control plane publishes is several
    MiB, more than the link's socket buffers hold at once."""
    from datapath.topics.registry import KeyRegistry

    registry = KeyRegistry()
    for i in range(100_000):
        registry.key_for(f"big/{i}")
    path = tmp_path / "registry.json"
    registry.save(path)
    port = free_port()
    cfg = parse_config({"appliance": {"name": f"big{port}"},
                        "clients": {"udp": f"127.0.0.1:{port}"},
                        "pm": {"anonymous": True, "require_passwords": False,
                               "registry": str(path)}})
    with Appliance(cfg) as app:
        with connect(f"127.0.0.1:{port}", identity="c") as client:
            sub = client.subscribe("big/#")  # a new snapshot with 100,000 rows crosses
            client.publish("big/99999", b"last", flush=True)
            assert sub.get(timeout=30).payload == b"last"
        assert app.failure() is None
        assert app.status()["offload"]["keys"] >= 100_000



def test_the_fork_waits_for_numbas_compiler_lock_so_the_child_can_take_it():
    """Another thread holds numba's compiler lock (it is compiling) when the appliance forks
    its data path: the fork waits for it, and the child can compile (it hung for ever when a
    lock held at the fork stayed held in the child)."""
    from numba.core.compiler_lock import global_compiler_lock

    from appliance.dataplane.process import fork_safely

    held, release = threading.Event(), threading.Event()

    def compiling() -> None:
        with global_compiler_lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=compiling)
    holder.start()
    assert held.wait(10)
    threading.Timer(0.2, release.set).start()
    pid = fork_safely()  # waits for the holder's release
    if pid == 0:
        os._exit(0 if global_compiler_lock._lock.acquire(timeout=5) else 1)
    _, status = os.waitpid(pid, 0)
    holder.join(10)
    assert os.waitstatus_to_exitcode(status) == 0


def test_every_data_path_runs_in_a_process_unless_the_config_says_thread():
    rdma = {"fabric": {"listen": "127.0.0.1:4000", "key": "11" * 32},
            "neighbours": [{"name": "b", "address": "127.0.0.1:4001", "transport": "rdma",
                            "rdma_port": 5000}]}
    assert parse_config({"appliance": {"name": "a"}}).dataplane == "process"
    assert parse_config({"appliance": {"name": "a"}, **rdma}).dataplane == "process"
    assert parse_config({"appliance": {"name": "a", "dataplane": "thread"},
                         **rdma}).dataplane == "thread"
