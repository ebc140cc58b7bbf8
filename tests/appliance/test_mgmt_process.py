"""The management API in a process of its own (``mgmt.process``, the default).

The API's process serves reads from the snapshot the appliance sends it and forwards commands,
at most ``MGMT_MAX_FORWARDED`` waiting at once; it imports neither numba nor the data path;
it ends with its appliance (closed or killed); one that ends alone is logged and started
again; one that cannot start stops the appliance's start with one line naming the key.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import types
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import ProcessCollector
from prometheus_client.parser import text_string_to_metric_families as parse_prom
from prometheus_client.registry import CollectorRegistry

from appliance.client import connect
from appliance.config import ConfigError, parse_config
from appliance.node import Appliance
from appliance.ops.mgmt import process as mgmt_process
from appliance.ops.mgmt.config import MGMT_MAX_FORWARDED, MGMT_RETRY_AFTER_S
from appliance.ops.mgmt.process import ProcessServer
from appliance.ops.mgmt.server import MgmtServer
from tests.appliance.helpers import (
    FABRIC_KEY,
    ROOT,
    free_port,
    run_appliance,
    stop,
    wait_for,
    write_config,
)
from tests.appliance.mgmt_fabric import http

TOKEN = "process-test-token-0123456789"


def _config(**mgmt) -> dict:
    port = free_port()
    return {"appliance": {"name": f"proc{port}"},
            "fabric": {"listen": f"127.0.0.1:{free_port()}", "key": FABRIC_KEY},
            "clients": {"udp": f"127.0.0.1:{free_port()}"},
            "pm": {"anonymous": True, "require_passwords": False},
            "mgmt": {"listen": f"127.0.0.1:{port}", "token": TOKEN, **mgmt}}


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no one reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def test_the_api_serves_from_its_own_process_and_follows_the_appliance():
    app = Appliance(parse_config(_config())).start()
    try:
        server = app.mgmt
        assert isinstance(server, ProcessServer)
        assert server.pid is not None and server.pid != os.getpid() and _alive(server.pid)
        with open(f"/proc/{server.pid}/cmdline", "rb") as f:
            assert b"appliance.ops.mgmt.child" in f.read()
        code, _, doc = http("GET", server.url + "/status")
        assert code == 200 and doc["node"]["name"] == app.config.name
        # a change of state shows within a snapshot period or two (the deadline is generous)
        with connect(f"udp://{app.config.clients_udp[0]}:{app.config.clients_udp[1]}"):
            wait_for(lambda: len(http("GET", server.url + "/clients")[2]["clients"]) == 1,
                     timeout_s=10)
        # commands go through the appliance: its control agent answers
        code, _, doc = http("DELETE", server.url + "/clients/999", token=TOKEN)
        assert code == 409 and "no client session 999" in doc["error"]
        code, _, doc = http("DELETE", server.url + "/clients/999", token="wrong")
        assert code == 401
        # /metrics: the process figures are the appliance's, not the API process's
        code, _, text = http("GET", server.url + "/metrics")
        assert code == 200
        samples = {s.name: s.value for f in parse_prom(text) for s in f.samples}
        ours = CollectorRegistry()
        ProcessCollector(registry=ours, pid=lambda: os.getpid())
        mine = {s.name: s.value for f in ours.collect() for s in f.samples}
        assert samples["process_start_time_seconds"] == mine["process_start_time_seconds"]
        assert "python_gc_collections_total" in samples
        assert "topicwire_channel_frames_total" in samples
        pid = server.pid
    finally:
        app.stop()
    wait_for(lambda: not _alive(pid), timeout_s=10, what="the API process ends with stop()")


def test_the_api_process_imports_neither_numba_nor_the_data_path():
    code = ("import sys, appliance.ops.mgmt.child, appliance.ops.mgmt.server, "
            "appliance.ops.tls; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('numba', 'channels', "
            "'nic_offload', 'llvmlite') or m.startswith(('appliance.dataplane', "
            "'appliance.control', 'datapath.topics', 'datapath.protocol'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_api_process_that_ends_alone_is_logged_and_started_again(caplog):
    app = Appliance(parse_config(_config())).start()
    try:
        server = app.mgmt
        first = server.pid
        with caplog.at_level(logging.ERROR, logger="topicwire.mgmt"):
            os.kill(first, signal.SIGKILL)
            wait_for(lambda: server.pid not in (None, first) and server.restarts == 1,
                     timeout_s=30, what="a new API process")
            wait_for(lambda: http("GET", server.url + "/status")[0] == 200, timeout_s=30)
        assert any("ended on its own" in r.getMessage() and r.exc_info is None
                   for r in caplog.records)
        assert not _alive(first)
    finally:
        app.stop()


def test_the_api_process_ends_when_its_appliance_is_killed(tmp_path):
    config = _config()
    port = config["mgmt"]["listen"]
    text = (f'[appliance]\nname = "{config["appliance"]["name"]}"\n'
            f'[fabric]\nlisten = "{config["fabric"]["listen"]}"\nkey = "{FABRIC_KEY}"\n'
            f'[pm]\nanonymous = true\nrequire_passwords = false\n'
            f'[mgmt]\nlisten = "{port}"\n')
    proc = run_appliance(write_config(tmp_path / "a.toml", text))
    try:
        assert http("GET", f"http://{port}/healthz")[0] == 200
        children = [c for c in _children(proc.pid) if _alive(c)]
        assert len(children) == 2  # the API's process and the data path's
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: not any(_alive(c) for c in children), timeout_s=10,
                 what="the API's and the data path's processes end with their appliance")
    finally:
        stop(proc)


class _Slow:
    """An appliance whose control agent takes commands only when ``go`` is set."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.calls = 0
        self._status = {"node": {"name": "slow", "pm": "slow"}}

    def status(self) -> dict:
        return self._status

    def failure(self) -> None:
        return None

    def submit(self, command: str, args: dict) -> dict:
        self.calls += 1
        self.go.wait(30)
        return {"ok": True}


def _fake_config(**mgmt) -> types.SimpleNamespace:
    return types.SimpleNamespace(name="slow", mgmt=mgmt)


def test_forwarded_commands_are_bounded_and_the_rest_get_503_with_retry_after():
    slow = _Slow()
    server = ProcessServer(slow, _fake_config(), "127.0.0.1", 0, TOKEN).start()
    try:
        count = 3 * MGMT_MAX_FORWARDED
        with ThreadPoolExecutor(count) as pool:
            futures = [pool.submit(http, "DELETE", server.url + "/clients/1", None, TOKEN,
                                   timeout_s=60) for _ in range(count)]
            # while the appliance holds the first, only MGMT_MAX_FORWARDED may wait
            wait_for(lambda: sum(f.done() for f in futures) == count - MGMT_MAX_FORWARDED,
                     timeout_s=30)
            refused = [f.result() for f in futures if f.done()]
            assert all(code == 503 and headers.get("Retry-After") == str(MGMT_RETRY_AFTER_S)
                       and "MGMT_MAX_FORWARDED" in doc["error"] for code, headers, doc in refused)
            slow.go.set()
            answers = [f.result() for f in futures]
        assert sorted(code for code, _, _ in answers).count(200) == MGMT_MAX_FORWARDED
        assert slow.calls == MGMT_MAX_FORWARDED
        assert http("GET", server.url + "/status")[0] == 200
    finally:
        slow.go.set()
        server.close()


def test_an_api_process_that_cannot_start_is_one_config_error(monkeypatch):
    monkeypatch.setattr(mgmt_process.sys, "executable", "/bin/false")
    port = free_port()
    with pytest.raises(ConfigError, match=r"mgmt.process: the management API's process did not "
                       r"start \(it exited with 1.*mgmt.process = false"):
        ProcessServer(_Slow(), _fake_config(), "127.0.0.1", port, None).start()
    # the port is free again
    server = ProcessServer(_Slow(), _fake_config(), "127.0.0.1", port, None)
    server.close()


def test_mgmt_process_false_serves_from_the_appliance_process_and_is_checked():
    app = Appliance(parse_config(_config(process=False))).start()
    try:
        assert isinstance(app.mgmt, MgmtServer)
        assert http("GET", app.mgmt.url + "/status")[0] == 200
    finally:
        app.stop()
    with pytest.raises(ConfigError, match="mgmt.process: must be true"):
        parse_config(_config(process="yes"))


def test_the_api_process_logs_at_the_appliances_level_and_follows_a_change(capfd):
    root = logging.getLogger()
    level = root.level
    app = Appliance(parse_config(_config())).start()
    try:
        url = app.mgmt.url
        assert http("GET", url + "/nowhere")[0] == 404
        root.setLevel(logging.DEBUG)  # as a reload of [log] level = "debug" does
        seen: list[str] = []

        def refusal_logged() -> bool:  # the API process's own debug record of the answer
            http("GET", url + "/nowhere")
            seen.append(capfd.readouterr().err)
            return any('"GET /nowhere HTTP/1.1" -> 404' in text for text in seen)
        wait_for(refusal_logged, timeout_s=10)
        assert "topicwire.mgmt" in "".join(seen)
    finally:
        root.setLevel(level)
        app.stop()
