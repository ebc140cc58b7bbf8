"""The management API's ``shutdown`` command (``POST /shutdown``, ``topicwire shutdown``): a real
``topicwire run`` drains as on SIGTERM and exits with ``--shutdown-exit-code``; a bad call is
refused with an error naming the component (docs/appliance.md, "Management API")."""

from __future__ import annotations

import subprocess

import pytest

from appliance.client import connect
from tests.appliance.helpers import CLI, ROOT, free_port, start, stop, wait_for, wait_ready
from tests.appliance.mgmt_fabric import TOKEN, http


def _config(tmp_path, port: int, udp: int, token: bool = True):
    config = tmp_path / "sd.toml"
    config.write_text('[appliance]\nname = "sd"\n[pm]\nanonymous = true\n'
                      'require_passwords = false\n'
                      f'[clients]\nudp = "127.0.0.1:{udp}"\n'
                      f'[mgmt]\nlisten = "127.0.0.1:{port}"\n'
                      + (f'token = "{TOKEN}"\n' if token else ""))
    return config


@pytest.mark.parametrize("process", [True, False], ids=["api-process", "api-thread"])
def test_shutdown_command_drains_and_ends_the_run_with_its_exit_code(tmp_path, process):
    port, udp = free_port(), free_port()
    config = _config(tmp_path, port, udp)
    config.write_text(config.read_text() + f"process = {'true' if process else 'false'}\n")
    proc = start([*CLI, "run", "--config", str(config), "--shutdown-exit-code", "10"])
    try:
        wait_ready(proc)
        client = connect(f"udp://127.0.0.1:{udp}", identity="c1")
        try:
            done = subprocess.run([*CLI, "shutdown", "--mgmt", f"http://127.0.0.1:{port}",
                                   "--token", TOKEN, "--reason", "maintenance"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            assert "the appliance is stopping (maintenance)" in done.stderr
            assert proc.wait(60) == 10
            # the client was logged out by the drain, as on SIGTERM
            wait_for(lambda: client.logged_out_reason, what="the client's logout")
        finally:
            client.close()
    finally:
        stop(proc)
    err = proc.stderr.read()
    assert "shutdown requested through the management API (maintenance)" in err
    assert "draining (shutdown through the management API: maintenance)" in err
    assert "logging out 1 client sessions" in err
    assert "drained in" in err and "appliance stopped" in err


def test_shutdown_exits_0_by_default_and_refuses_bad_calls(tmp_path):
    port, udp = free_port(), free_port()
    proc = start([*CLI, "run", "--config", str(_config(tmp_path, port, udp))])
    try:
        wait_ready(proc)
        base = f"http://127.0.0.1:{port}"
        code, _, doc = http("POST", base + "/shutdown", {})
        assert code == 401 and doc["error"].startswith("mgmt: ")
        code, _, doc = http("POST", base + "/shutdown", {"reason": 7}, token=TOKEN)
        assert code == 400 and doc["error"].startswith("mgmt: POST /shutdown takes")
        code, _, doc = http("POST", base + "/shutdown", {"now": True}, token=TOKEN)
        assert code == 400 and "'now'" in doc["error"]
        code, headers, doc = http("GET", base + "/shutdown", token=TOKEN)
        assert code == 405 and headers["Allow"] == "POST"
        done = subprocess.run([*CLI, "shutdown", "--mgmt", base, "--token", "wrong"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert done.stderr.startswith("topicwire: shutdown: ") and "(401)" in done.stderr
        assert proc.poll() is None  # none of these stopped it
        code, _, doc = http("POST", base + "/shutdown", None, token=TOKEN)
        assert code == 200 and doc["ok"] and doc["stopping"]
        assert proc.wait(60) == 0
    finally:
        stop(proc)
    done = subprocess.run([*CLI, "shutdown", "--mgmt", f"http://127.0.0.1:{port}", "--token",
                           TOKEN], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "cannot reach the management API" in done.stderr


def test_shutdown_is_refused_without_a_configured_token(tmp_path):
    port, udp = free_port(), free_port()
    proc = start([*CLI, "run", "--config", str(_config(tmp_path, port, udp, token=False))])
    try:
        wait_ready(proc)
        code, _, doc = http("POST", f"http://127.0.0.1:{port}/shutdown", {}, token=TOKEN)
        assert code == 403 and "no management token" in doc["error"]
        assert proc.poll() is None
    finally:
        assert stop(proc) == 0


def test_a_bad_shutdown_exit_code_is_a_usage_error():
    done = subprocess.run([*CLI, "run", "--config", "x.toml", "--shutdown-exit-code", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--shutdown-exit-code '1': give 0 or a number from 3 to 125" in done.stderr
