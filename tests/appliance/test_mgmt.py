"""The management API over real HTTP against running appliances (three ``topicwire run``
processes on loopback): every read endpoint, /metrics through prometheus_client's parsers,
commands with and without the token, bad requests, the port check, JSON logs."""

import json
import logging
import re
import signal
import socket
import subprocess

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_prom

from appliance.client import EntitlementError, connect
from appliance.ops.mgmt.logs import JsonFormatter
from appliance.ops.mgmt.metrics import METRIC_NAMES
from appliance.ops.mgmt.server import ENDPOINTS, SECTIONS
from tests.appliance.helpers import CLI, ROOT, free_port, start, stop, wait_for
from tests.appliance.mgmt_fabric import TOKEN, Triangle, http


@pytest.fixture(scope="module")
def fabric(tmp_path_factory):
    tri = Triangle(tmp_path_factory.mktemp("mgmt"), log_format="json")
    feed = connect(tri.client_url("m1"), "feed")
    try:
        sub = feed.subscribe("p/#")
        with pytest.raises(EntitlementError):
            feed.subscribe("q/#")  # denied by P&M: counted
        for i in range(5):
            feed.publish(f"p/{i}", b"x" * 16)
        feed.flush()
        for _ in range(5):
            assert sub.get(timeout=10) is not None
        wait_for(lambda: tri.status("m1")["clients"]
                 and tri.status("m1")["clients"][0]["delivered"] == 5)
        yield tri, feed
    finally:
        feed.close()
        codes = tri.close()
        assert codes == {"m1": 0, "m2": 0, "m3": 0}


CONTRACT = {"node", "neighbours", "subscriptions", "routes", "channels", "offload", "denials",
            "auth", "clients", "counters"}


def test_every_read_endpoint_serves_its_section_of_the_status(fabric):
    tri, feed = fabric
    base = tri.mgmt["m1"]
    code, _, index = http("GET", base + "/")
    assert code == 200 and index["node"] == "m1" and index["reads_need_token"] is False
    assert {(e["method"], e["path"]) for e in index["endpoints"]} == {
        (m, p) for m, p, _ in ENDPOINTS}
    code, headers, status = http("GET", base + "/status")
    assert code == 200 and headers["Content-Type"] == "application/json"
    assert CONTRACT <= set(status)
    for section in SECTIONS:
        code, _, doc = http("GET", f"{base}/{section}")
        assert code == 200 and list(doc) == [section]
        assert type(doc[section]) is type(status[section])
    assert http("GET", base + "/node")[2]["node"]["name"] == "m1"
    neighbours = http("GET", base + "/neighbours")[2]["neighbours"]
    assert sorted((n["name"], n["state"]) for n in neighbours) == [("m2", "up"), ("m3", "up")]
    routes = http("GET", base + "/routes")[2]["routes"]
    assert {(r["source"], r["destination"]): r["path"] for r in routes}[("m1", "m3")] == \
        ["m1", "m3"]
    subs = http("GET", base + "/subscriptions")[2]["subscriptions"]
    assert {"origin": "m1", "pattern": "p/#", "namespace": 0, "qos": "best-effort",
            "clients": 1} in subs
    # m1's local subscription reaches m2 as advertised interest
    wait_for(lambda: any(s["origin"] == "m1" and s["pattern"] == "p/#"
                         for s in tri.status("m2")["subscriptions"]))
    channels = {c["name"]: c for c in http("GET", base + "/channels")[2]["channels"]}
    assert set(channels) == {"fabric", "clients-udp"}
    assert channels["fabric"]["frames_in"] > 0 and channels["clients-udp"]["frames_out"] > 0
    offload = http("GET", base + "/offload")[2]["offload"]
    assert offload["verdicts"]["messages"] >= 5 and offload["keys"] >= 5
    denials = http("GET", base + "/denials")[2]["denials"]
    assert {"identity": "feed", "action": "subscribe", "pattern": "q/#", "count": 1} in denials
    clients = http("GET", base + "/clients")[2]["clients"]
    assert [(c["session"], c["identity"], c["published"]) for c in clients] == [
        (feed.session, "feed", 5)]
    assert http("GET", base + "/auth")[2]["auth"]["accepted"] > 0


def _samples(families):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in families for s in family.samples}


def test_metrics_parse_and_agree_with_the_status(fabric):
    tri, _ = fabric
    base = tri.mgmt["m1"]
    code, headers, text = http("GET", base + "/metrics")
    assert code == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = list(parse_prom(text))
    names = {s.name for f in families for s in f.samples}
    assert {n for n in names if n.startswith("topicwire_")} <= set(METRIC_NAMES)
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes",
            "process_open_fds", "python_info"} <= names
    samples = _samples(families)
    status = tri.status("m1")
    build = status["node"]["build"]
    assert samples[("topicwire_build_info", tuple(sorted(build.items())))] == 1
    assert samples[("topicwire_node_info", (("id", str(status["node"]["id"])), ("node", "m1"),
                                            ("pm", "m1"), ("role", "core")))] == 1
    assert samples[("topicwire_neighbour_up", (("address", f"127.0.0.1:{tri.fabric['m2']}"),
                                               ("neighbour", "m2")))] == 1
    assert samples[("topicwire_routes", ())] == 6
    assert samples[("topicwire_entitlement_denials_total", (("action", "subscribe"),))] == 1
    assert samples[("topicwire_offload_messages_total", ())] >= 5
    assert samples[("topicwire_offload_message_verdicts_total",
                    (("verdict", "forwarded"),))] >= 5
    channel = status["clients"][0]["channel"]
    assert samples[("topicwire_client_sessions", (("channel", channel),))] == 1
    fabric = (("channel", "fabric"), ("kind", "udp"))
    assert samples[("topicwire_channel_frames_total", (*fabric[:1], ("direction", "in"),
                                                       *fabric[1:]))] > 0
    # the channel's latency and frame sizes are histograms that agree with its counters
    frames_in = samples[("topicwire_channel_frames_total",
                         (("channel", "clients-udp"), ("direction", "in"), ("kind", "udp")))]
    size_count = samples[("topicwire_channel_received_frame_size_bytes_count",
                          (("channel", "clients-udp"), ("kind", "udp")))]
    assert size_count > 0 and frames_in > 0  # read one after the other while frames come
    assert samples[("topicwire_channel_received_frame_size_bytes_bucket",
                    (("channel", "clients-udp"), ("kind", "udp"), ("le", "+Inf")))] == size_count
    assert samples[("topicwire_channel_latency_seconds_count", fabric)] > 0
    assert 0 < samples[("topicwire_channel_latency_seconds_sum", fabric)] < 60 * samples[
        ("topicwire_channel_latency_seconds_count", fabric)]
    assert ("topicwire_auth_accepted_frames_total", ()) in samples
    # OpenMetrics when the scraper asks for it
    code, headers, text = http("GET", base + "/metrics",
                               headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert code == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    assert {f.name for f in parse_om(text)} >= {"topicwire_node", "topicwire_routes"}


def test_metric_names_are_the_documented_ones():
    doc = (ROOT / "docs" / "appliance.md").read_text()
    for name in METRIC_NAMES:  # a histogram is documented by its family's name
        family = re.sub(r"_(bucket|sum|count)$", "", name) if "_seconds_" in name or \
            "_bytes_" in name else name
        assert f"`{family}`" in doc, name


def test_commands_are_refused_without_the_right_token(fabric):
    tri, _ = fabric
    route = {"source": "m1", "destination": "m3", "path": ["m1", "m2", "m3"]}
    before = _path(tri, "m1", "m1", "m3")  # (the route's path alone: its measured costs
    code, headers, doc = http("POST", tri.mgmt["m1"] + "/routes", route)  # move under load)
    assert code == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert doc["error"].startswith("mgmt: POST /routes needs the management token")
    code, _, doc = http("POST", tri.mgmt["m1"] + "/routes", route, token="not-the-token")
    assert code == 401 and "token is wrong" in doc["error"]
    code, _, doc = http("DELETE", tri.mgmt["m1"] + "/clients/1", headers={
        "Authorization": "Basic dXNlcjpwdw=="})
    assert code == 401
    # m2 has no token configured: every command is refused, whatever is sent
    code, _, doc = http("POST", tri.mgmt["m2"] + "/routes", route, token=TOKEN)
    assert code == 403 and "no management token" in doc["error"] and "mgmt.token" in doc["error"]
    assert _path(tri, "m1", "m1", "m3") == before != route["path"]  # nothing changed


def _path(tri, name, src, dst):
    return {(r["source"], r["destination"]): r["path"]
            for r in tri.status(name)["routes"]}[(src, dst)]


def test_route_override_set_and_clear_with_the_token(fabric):
    tri, _ = fabric
    base = tri.mgmt["m1"]
    assert _path(tri, "m1", "m1", "m3") == ["m1", "m3"]
    code, _, doc = http("POST", base + "/routes", {"source": "m1", "destination": "m3",
                                                   "path": ["m1", "m2", "m3"]}, token=TOKEN)
    assert code == 200 and doc["ok"] is True and doc["pm_version"] > 0
    wait_for(lambda: _path(tri, "m1", "m1", "m3") == ["m1", "m2", "m3"])
    wait_for(lambda: _path(tri, "m2", "m1", "m3") == ["m1", "m2", "m3"])  # flooded
    # the appliance's own refusal comes back as 409 with its reason
    code, _, doc = http("POST", base + "/routes", {"source": "m1", "destination": "m3",
                                                   "path": ["m2", "m3"]}, token=TOKEN)
    assert code == 409 and doc["error"].startswith("control: set_route")
    code, _, doc = http("DELETE", base + "/routes?source=m1&destination=m3", token=TOKEN)
    assert code == 200 and doc["ok"] is True
    wait_for(lambda: _path(tri, "m1", "m1", "m3") == ["m1", "m3"])
    wait_for(lambda: _path(tri, "m2", "m1", "m3") == ["m1", "m3"])


def test_disconnect_a_client_with_the_token(fabric):
    tri, _ = fabric
    base = tri.mgmt["m1"]
    with connect(tri.client_url("m1"), "feed") as victim:
        wait_for(lambda: any(c["session"] == victim.session
                             for c in tri.status("m1")["clients"]))
        code, _, doc = http("DELETE", f"{base}/clients/{victim.session}", token=TOKEN)
        assert code == 200 and doc["ok"] is True
        wait_for(lambda: victim.logged_out_reason, timeout_s=10)
        assert "management" in victim.logged_out_reason
        wait_for(lambda: all(c["session"] != victim.session
                             for c in tri.status("m1")["clients"]))
        code, _, doc = http("DELETE", f"{base}/clients/{victim.session}", token=TOKEN)
        assert code == 409 and doc["error"].startswith("control: no client session")


@pytest.mark.parametrize("method,path,body,raw,want", [
    ("GET", "/nope", None, None, 404),
    ("GET", "/clients/12", None, None, 405),
    ("PUT", "/status", None, None, 405),
    ("DELETE", "/metrics", None, None, 405),
    ("POST", "/routes", None, b"{not json", 400),
    ("POST", "/routes", ["m1", "m3"], None, 400),
    ("POST", "/routes", {"source": "m1", "destination": "m3"}, None, 400),
    ("POST", "/routes", {"source": 1, "destination": "m3", "path": ["m1", "m3"]}, None, 400),
    ("DELETE", "/routes", {"source": "m1"}, None, 400),
    ("DELETE", "/clients/abc", None, None, 400),
])
def test_bad_requests_get_json_errors_naming_the_component(fabric, method, path, body, raw,
                                                           want):
    tri, _ = fabric
    code, headers, doc = http(method, tri.mgmt["m1"] + path, body, token=TOKEN, raw=raw)
    assert code == want, doc
    assert headers["Content-Type"] == "application/json"
    assert doc["status"] == want and doc["error"].startswith("mgmt: ")
    if want == 405:
        assert headers["Allow"] in doc["error"]


def test_oversized_bodies_and_unknown_methods_are_refused_in_json(fabric):
    tri, _ = fabric
    host, port = tri.mgmt["m1"][7:].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"POST /routes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                  "Content-Length: 10000000\r\n\r\n".encode())
        answer = s.makefile("rb").read().decode()
    assert answer.startswith("HTTP/1.1 413") and '"error":"mgmt: a body of 10000000 bytes' in \
        answer
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"BREW /status HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = s.makefile("rb").read().decode()
    assert answer.startswith("HTTP/1.1 501") and \
        '"error":"mgmt: BREW is not a method this API knows' in answer


def test_json_logs_are_one_object_per_line(fabric):
    tri, _ = fabric
    # the appliance's own lines so far (it keeps running: read what is buffered)
    proc = tri.procs["m2"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    lines = [line for line in proc.stderr.read().splitlines() if line.strip()]
    docs = [json.loads(line) for line in lines]
    assert all(set(d) == {"ts", "level", "component", "msg", "fields"} for d in docs)
    assert all(d["fields"]["node"] == "m2" and d["ts"].endswith("Z") for d in docs)
    assert any(d["component"] == "mgmt" and d["msg"].startswith("m2: management API on")
               and d["fields"]["url"] == tri.mgmt["m2"] for d in docs)
    assert docs[-1]["msg"] == "m2: appliance stopped" and docs[-1]["level"] == "info"
    # stopped: its API is gone with it
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(tri.mgmt["m2"].rsplit(":", 1)[1])), 2)


def test_json_formatter_carries_extra_fields_and_exceptions():
    record = logging.LogRecord("topicwire.mgmt", logging.ERROR, __file__, 1, "%s went %s",
                               ("it", "wrong"), None)
    record.peer = "10.0.0.1"
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    doc = json.loads(JsonFormatter("n1").format(record))
    assert doc["level"] == "error" and doc["component"] == "mgmt"
    assert doc["msg"] == "it went wrong"
    assert doc["fields"]["node"] == "n1" and doc["fields"]["peer"] == "10.0.0.1"
    assert "ValueError: boom" in doc["fields"]["exc"]


def test_text_logs_by_default_and_a_busy_mgmt_port_is_a_config_error(tmp_path):
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        config = tmp_path / "busy.toml"
        config.write_text(f'[appliance]\nname = "busy"\n[pm]\nanonymous = true\n'
                          'require_passwords = false\n'
                          f'[mgmt]\nlisten = "127.0.0.1:{port}"\n')
        proc = start([*CLI, "run", "--config", str(config)])
        try:
            assert proc.wait(60) == 2
        finally:
            stop(proc)
        err = proc.stderr.read()
    assert f"mgmt.listen: cannot listen on 127.0.0.1:{port}" in err
    assert "ready" not in proc.stdout.read()
    # the text format: no line is JSON
    assert err.strip() and not any(line.startswith("{") for line in err.splitlines())


def test_token_file_is_read_relative_to_the_config(tmp_path):
    port = free_port()
    (tmp_path / "mgmt.token").write_text(f"  {TOKEN}\n")
    config = tmp_path / "tf.toml"
    config.write_text(f'[appliance]\nname = "tf"\n[pm]\nanonymous = true\n'
                      'require_passwords = false\n'
                      f'[mgmt]\nlisten = "127.0.0.1:{port}"\ntoken_file = "mgmt.token"\n')
    proc = start([*CLI, "run", "--config", str(config)], None)
    try:
        from tests.appliance.helpers import wait_ready

        wait_ready(proc)
        base = f"http://127.0.0.1:{port}"
        assert http("DELETE", base + "/clients/7", token="wrong")[0] == 401
        code, _, doc = http("DELETE", base + "/clients/7", token=TOKEN)
        assert code == 409 and "no client session 7" in doc["error"]
    finally:
        assert stop(proc) == 0


def test_empty_token_file_refuses_to_start(tmp_path):
    (tmp_path / "empty.token").write_text("\n")
    config = tmp_path / "e.toml"
    config.write_text(f'[appliance]\nname = "e"\n[pm]\nanonymous = true\n'
                      'require_passwords = false\n'
                      f'[mgmt]\nlisten = "127.0.0.1:{free_port()}"\n'
                      'token_file = "empty.token"\n')
    done = subprocess.run([*CLI, "run", "--config", str(config)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "mgmt.token_file" in done.stderr and "is empty" in \
        done.stderr
