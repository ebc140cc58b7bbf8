"""``topicwire status`` against running appliances: the tables, --json, the exit codes when
the appliance is unreachable or the arguments are wrong, and the token when the API listens
on a non-loopback address (inside a network namespace the test makes)."""

import json
import subprocess
import sys

import pytest

from appliance.client import EntitlementError, connect
from tests.appliance.helpers import ROOT, free_port, stop, wait_for, wait_ready
from tests.appliance.mgmt_fabric import STATUS_CLI, TOKEN, Triangle, http
from tests.netns import Host, requires_netns


def status(*args, prefix=(), env=None):
    return subprocess.run([*prefix, *STATUS_CLI, "status", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture(scope="module")
def fabric(tmp_path_factory):
    tri = Triangle(tmp_path_factory.mktemp("status"))
    feed = connect(tri.client_url("m1"), "feed")
    try:
        feed.subscribe("p/#")
        with pytest.raises(EntitlementError):
            feed.subscribe("q/zz")
        feed.publish("p/one", b"1", flush=True)
        wait_for(lambda: tri.status("m1")["clients"])
        wait_for(lambda: tri.status("m1")["denials"])
        yield tri, feed
    finally:
        feed.close()
        tri.close()


def test_tables_show_every_section(fabric):
    tri, feed = fabric
    done = status("--mgmt", tri.mgmt["m1"])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for title in ("Neighbours", "Subscriptions", "Routes", "Channels", "Offload verdicts",
                  "Offload tables and events", "Entitlement denials",
                  "Admin-frame authentication", "Clients"):
        assert title in out, title
    assert "appliance m1" in out and "P&M m1" in out
    lines = out.splitlines()
    assert any("m2" in line and "up" in line and f"127.0.0.1:{tri.fabric['m2']}" in line
               for line in lines)
    assert any("m1 -> m3" in line for line in lines)
    assert any("feed" in line and "subscribe" in line and "q/zz" in line for line in lines)
    assert any(str(feed.session) in line and "p/#" in line for line in lines)
    assert any("fabric" in line and "udp" in line for line in lines)


def test_json_is_the_status_snapshot(fabric):
    tri, _ = fabric
    host_port = tri.mgmt["m2"][len("http://"):]
    done = status("--mgmt", host_port, "--json")  # a bare HOST:PORT means http://
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["node"]["name"] == "m2" and doc["node"]["pm"] == "m1"
    assert {n["name"] for n in doc["neighbours"]} == {"m1", "m3"}
    assert set(doc) >= {"subscriptions", "routes", "channels", "offload", "denials"}


def test_the_url_can_come_from_the_environment(fabric):
    tri, _ = fabric
    import os

    done = status("--json", env=dict(os.environ, TOPICWIRE_MGMT=tri.mgmt["m1"]))
    assert done.returncode == 0 and json.loads(done.stdout)["node"]["name"] == "m1"


def test_unreachable_appliance_exits_1_and_says_why():
    port = free_port()  # nothing listens here
    done = status("--mgmt", f"http://127.0.0.1:{port}", "--timeout", "5")
    assert done.returncode == 1
    assert done.stderr.startswith(f"topicwire: status: cannot reach the management API at "
                                  f"http://127.0.0.1:{port}")
    assert "mgmt.listen" in done.stderr and done.stdout == ""


def test_something_else_listening_exits_1(tmp_path):
    # an HTTP server that is not an appliance's API: 404 for /status
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                               str(port), "--directory", str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: _answers(port), timeout_s=20)
        done = status("--mgmt", f"127.0.0.1:{port}")
        assert done.returncode == 1 and "answered 404" in done.stderr
    finally:
        server.kill()
        server.wait()


def _answers(port):
    try:
        http("GET", f"http://127.0.0.1:{port}/", timeout_s=2)
        return True
    except OSError:
        return False


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1", "http://127.0.0.1:99999",
                                 "http://127.0.0.1:8470/status/x", "http://"])
def test_a_bad_url_exits_2(url):
    done = status("--mgmt", url)
    assert done.returncode == 2 and done.stderr.startswith("topicwire: status: --mgmt")


def test_an_unreadable_token_file_exits_2(tmp_path):
    done = status("--mgmt", "127.0.0.1:1", "--token-file", str(tmp_path / "missing"))
    assert done.returncode == 2 and "--token-file" in done.stderr


@requires_netns
def test_reads_need_the_token_on_a_non_loopback_address(tmp_path):
    """mgmt.listen on an interface address (inside a namespace of this test): reads need
    the token; status exits 2 without it or with a wrong one, 0 with it."""
    import uuid

    host = Host(f"twmg{uuid.uuid4().hex[:6]}")
    proc = None
    try:
        host.run("ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        host.run("ip", "addr", "add", "10.78.0.1/24", "dev", "v0")
        host.run("ip", "link", "set", "v0", "up")
        host.run("ip", "link", "set", "v1", "up")
        port = free_port()
        config = tmp_path / "ns.toml"
        config.write_text(f'[appliance]\nname = "nsm"\n[clients]\nudp = "127.0.0.1:{free_port()}"'
                          f'\n[pm]\nanonymous = true\n'
                          f'require_passwords = false\n[mgmt]\nlisten = "10.78.0.1:{port}"\n'
                          f'token = "{TOKEN}"\n')
        proc = host.popen([*STATUS_CLI, "run", "--config", str(config)], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_ready(proc)
        prefix = ("ip", "netns", "exec", host.name)
        url = f"http://10.78.0.1:{port}"
        done = status("--mgmt", url, prefix=prefix)
        assert done.returncode == 2
        assert "refused the request (401)" in done.stderr and "--token" in done.stderr
        assert status("--mgmt", url, "--token", "wrong", prefix=prefix).returncode == 2
        token_file = tmp_path / "t"
        token_file.write_text(TOKEN + "\n")
        done = status("--mgmt", url, "--token-file", str(token_file), "--json", prefix=prefix)
        assert done.returncode == 0 and json.loads(done.stdout)["node"]["name"] == "nsm"
        done = status("--mgmt", url, "--token", TOKEN, prefix=prefix)
        assert done.returncode == 0 and "appliance nsm" in done.stdout
    finally:
        if proc is not None:
            stop(proc)
        host.close()
