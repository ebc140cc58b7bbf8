"""``topicwire run``: SIGHUP reloads the config without dropping sessions, refuses a bad one,
says which keys need a restart; SIGTERM, SIGINT and SIGQUIT each end in the same clean
shutdown (drain, exit 0, no ring left in /dev/shm). Real processes; every wait has a
deadline and polls the appliance's log or a client, no fixed sleeps."""

from __future__ import annotations

import os
import select
import signal
import subprocess
from pathlib import Path

import pytest

from appliance.client import ClientError, EntitlementError, LoginError, connect
from appliance.config import load_config
from appliance.reload import RESTART, RUN_TIME, plan
from tests.appliance.helpers import (
    CLI,
    FABRIC_KEY,
    free_port,
    run_appliance,
    stop,
    wait_for,
    wait_ready,
)
from tests.appliance.helpers import start as start_process

WAIT_S = 30.0


class Log:
    """The appliance's standard error, read as it comes (the pipe is drained on each look)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        self.fd = proc.stderr.fileno()
        os.set_blocking(self.fd, False)
        self.text = ""

    def read(self) -> str:
        while select.select([self.fd], [], [], 0)[0]:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.text += chunk.decode(errors="replace")
        return self.text

    def wait_for(self, needle: str, after: int = 0, timeout_s: float = WAIT_S) -> str:
        """The first line holding ``needle`` past offset ``after`` (fail at the deadline)."""
        def found() -> str | None:
            text = self.read()
            at = text.find(needle, after)
            end = text.find("\n", at) if at >= 0 else -1
            return text[text.rfind("\n", 0, at) + 1:end] if end >= 0 else None
        try:
            return wait_for(found, timeout_s)
        except AssertionError:
            raise AssertionError(f"no log line with {needle!r} within {timeout_s} s; log:\n"
                                 f"{self.read()[-4000:]}") from None

    def rest(self, proc: subprocess.Popen) -> str:
        """Everything, once the process has ended."""
        proc.wait(WAIT_S)
        os.set_blocking(self.fd, True)
        while chunk := os.read(self.fd, 65536):
            self.text += chunk.decode(errors="replace")
        return self.text


def config_text(port: int, identities: str, extra: str = "", name: str = "reloader") -> str:
    """An appliance's config; its embedded P&M lets identities without a password log in
    (pm.require_passwords = false: these tests are about reloading, not credentials)."""
    if 'mode = "remote"' not in identities:
        if "[pm]\n" in identities:
            identities = identities.replace("[pm]\n", "[pm]\nrequire_passwords = false\n", 1)
        elif "[pm." in identities:
            identities = "[pm]\nrequire_passwords = false\n" + identities
    return f"""
[appliance]
name = "{name}"
[clients]
udp = "127.0.0.1:{port}"
{extra}
{identities}
"""


ALICE = """
[pm.identities.alice]
publish = ["t/#"]
subscribe = ["t/#"]
"""
BOB = """
[pm.identities.bob]
publish = ["t/#"]
subscribe = ["t/#"]
"""


def round_trip(client, sub, topic: str, payload: bytes) -> None:
    client.publish(topic, payload, flush=True)
    msg = sub.get(timeout=WAIT_S)
    assert msg is not None and (msg.topic, msg.payload) == (topic, payload)


@pytest.fixture
def appliance(tmp_path):
    """(config path, port, start) where ``start(text)`` writes the config and runs it."""
    procs = []
    port = free_port()
    path = tmp_path / "reload.toml"

    def start(text: str) -> tuple[subprocess.Popen, Log]:
        path.write_text(text)
        proc = run_appliance(path)
        procs.append(proc)
        return proc, Log(proc)

    yield path, port, start
    for proc in procs:
        stop(proc)


def test_sighup_with_a_new_identity_lets_it_log_in_and_keeps_the_sessions(appliance):
    path, port, start = appliance
    proc, log = start(config_text(port, ALICE))
    url = f"udp://127.0.0.1:{port}"
    with connect(url, "alice") as alice:
        sub = alice.subscribe("t/#")
        round_trip(alice, sub, "t/before", b"1")
        with pytest.raises(LoginError, match="not known to P&M"):
            connect(url, "bob", timeout_s=10)

        path.write_text(config_text(port, ALICE + BOB))
        proc.send_signal(signal.SIGHUP)
        line = log.wait_for("reload of")
        assert "applied pm.identities (1 added, 0 removed, 0 changed)" in line
        assert "P&M document version" in line and "restart" not in line

        with connect(url, "bob") as bob:  # refused before the reload, allowed now
            round_trip(alice, sub, "t/after", b"2")  # alice's session kept working
            bob.publish("t/from-bob", b"3", flush=True)
            msg = sub.get(timeout=WAIT_S)
            assert msg is not None and (msg.topic, msg.payload) == ("t/from-bob", b"3")
            assert "ended" not in log.read()  # no session ended
        assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT_S) == 0


def test_sighup_at_the_pm_appliance_floods_the_new_identities_to_the_fabric(tmp_path):
    pm_port, core_port, pm_fabric, core_fabric = (free_port() for _ in range(4))
    fabric = """
[fabric]
listen = "127.0.0.1:{me}"
key = "{key}"
[[neighbours]]
name = "{other}"
address = "127.0.0.1:{them}"
"""
    pm_path, core_path = tmp_path / "pm.toml", tmp_path / "core.toml"

    def pm_text(identities: str) -> str:
        return config_text(pm_port, fabric.format(me=pm_fabric, key=FABRIC_KEY, other="core",
                                                  them=core_fabric) + identities, name="pm")

    pm_path.write_text(pm_text(ALICE))
    core_path.write_text(config_text(core_port, fabric.format(
        me=core_fabric, key=FABRIC_KEY, other="pm", them=pm_fabric) + "[pm]\nmode = \"remote\"\n",
        name="core"))
    procs = [start_process([*CLI, "run", "--config", str(p)]) for p in (pm_path, core_path)]
    try:
        for proc in procs:
            wait_ready(proc)
        pm, core = procs
        pm_log = Log(pm)
        url = f"udp://127.0.0.1:{core_port}"

        def login(identity: str):
            try:
                return connect(url, identity, timeout_s=5)
            except LoginError as exc:  # before P&M's document reached the core
                if "no P&M document" in str(exc):
                    return None
                raise

        with wait_for(lambda: login("alice"), WAIT_S) as alice:  # at the core, not at P&M
            sub = alice.subscribe("t/#")
            round_trip(alice, sub, "t/before", b"1")
            with pytest.raises(LoginError, match="not known to P&M"):
                connect(url, "bob", timeout_s=10)
            pm_path.write_text(pm_text(ALICE + BOB))
            pm.send_signal(signal.SIGHUP)
            assert "P&M document version" in pm_log.wait_for("reload of")

            def bob_in():  # the core has the new document once bob may log in there
                try:
                    return connect(url, "bob", timeout_s=5)
                except LoginError as exc:
                    assert "not known to P&M" in str(exc)
                    return None

            with wait_for(bob_in, WAIT_S) as bob:
                bob.publish("t/from-bob", b"2", flush=True)
                assert until(sub, "t/from-bob") == ["t/from-bob"]
            round_trip(alice, sub, "t/after", b"3")  # alice's session at the core stayed
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert [proc.wait(WAIT_S) for proc in procs] == [0, 0]
    finally:
        for proc in procs:
            stop(proc)


def until(sub, topic: str) -> list[str]:
    """The topics ``sub`` delivers up to and including ``topic``."""
    got: list[str] = []
    while topic not in got:
        msg = sub.get(timeout=WAIT_S)
        assert msg is not None, f"{topic} not delivered; got {got}"
        got.append(msg.topic)
    return got


def test_sighup_that_takes_an_entitlement_back_withdraws_its_subscriptions(appliance):
    path, port, start = appliance
    carol_all = """
[pm.identities.carol]
publish = ["t/#", "u/#"]
subscribe = ["t/#", "u/#"]
[pm.identities.dave]
publish = ["#"]
subscribe = ["#"]
"""
    proc, log = start(config_text(port, carol_all))
    url = f"udp://127.0.0.1:{port}"
    with connect(url, "carol") as carol, connect(url, "dave") as dave:
        t_sub, u_sub = carol.subscribe("t/#"), carol.subscribe("u/#")
        everything = dave.subscribe("#")
        dave.publish("u/1", b"u1", flush=True)
        assert until(u_sub, "u/1") == ["u/1"]
        carol.publish("u/c", b"c", flush=True)  # registers u/c for carol
        until(everything, "u/c")
        assert until(u_sub, "u/c") == ["u/c"]

        path.write_text(config_text(port, carol_all.replace('"t/#", "u/#"', '"t/#"')))
        proc.send_signal(signal.SIGHUP)
        line = log.wait_for("P&M changed its entitlements")
        assert "'carol'" in line and "1 subscriptions withdrawn, 1 registered topics" in line
        assert "applied pm.identities (0 added, 0 removed, 1 changed)" in log.wait_for(
            "reload of")
        carol.subscribe("t/sync")  # answered once the tables after the reload are live

        with pytest.raises(EntitlementError):  # checked against the new entitlements
            carol.subscribe("u/#")
        dave.publish("u/2", b"u2")  # carol's u/# was withdrawn: not delivered, ...
        dave.publish("t/2", b"t2", flush=True)  # ... her t/# stays (same frame, after it)
        assert until(t_sub, "t/2") == ["t/2"]
        assert u_sub.get(timeout=0) is None
        carol.publish("u/c", b"dropped")  # registered before, taken back: dropped, ...
        carol.publish("t/c", b"kept", flush=True)  # ... t/c still allowed (after it)
        assert "u/c" not in until(everything, "t/c")
        assert "ended" not in log.read()  # both sessions stayed
    assert proc.poll() is None


def test_sighup_with_a_broken_config_keeps_the_running_one(appliance):
    path, port, start = appliance
    proc, log = start(config_text(port, ALICE))
    url = f"udp://127.0.0.1:{port}"
    with connect(url, "alice") as alice:
        sub = alice.subscribe("t/#")
        round_trip(alice, sub, "t/before", b"1")
        path.write_text(config_text(port, ALICE + BOB, extra="max_sessions = 0"))
        proc.send_signal(signal.SIGHUP)
        line = log.wait_for("reload refused")
        assert ("topicwire: config: clients.max_sessions: " in line
                and line.endswith("(reload refused; the running config stays in force)")), line
        with pytest.raises(LoginError):  # bob came with the refused config: not in force
            connect(url, "bob", timeout_s=10)
        round_trip(alice, sub, "t/after", b"2")
        path.write_text("[appliance\n")  # not even TOML
        proc.send_signal(signal.SIGHUP)
        log.wait_for("reload refused", after=log.text.find(line) + len(line))
        round_trip(alice, sub, "t/again", b"3")
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT_S) == 0


def test_sighup_with_a_new_listen_address_says_restart_and_keeps_the_old(appliance):
    path, port, start = appliance
    proc, log = start(config_text(port, ALICE + "[log]\nlevel = \"info\"\n"))
    new_port = free_port()
    path.write_text(config_text(new_port, ALICE + BOB + "[log]\nlevel = \"debug\"\n"))
    proc.send_signal(signal.SIGHUP)
    restart = log.wait_for("restart needed")
    assert "config: clients.udp changed: restart needed to apply it" in restart
    line = log.wait_for("reload of")
    assert "applied pm.identities (1 added, 0 removed, 0 changed), log.level" in line
    assert "1 changed key needs a restart (clients.udp)" in line
    with connect(f"udp://127.0.0.1:{port}", "bob") as bob:  # the old address, new identity
        sub = bob.subscribe("t/#")
        round_trip(bob, sub, "t/x", b"x")
    with pytest.raises(ClientError, match="no answer"):
        connect(f"udp://127.0.0.1:{new_port}", "bob", timeout_s=1)
    proc.send_signal(signal.SIGHUP)  # the same file again: still needs the restart
    log.wait_for("restart needed", after=log.text.find(restart) + len(restart))
    assert proc.poll() is None


@pytest.mark.parametrize("sig", [signal.SIGQUIT, signal.SIGINT, signal.SIGTERM])
def test_every_stop_signal_drains_removes_the_ring_and_exits_0(tmp_path, sig):
    port = free_port()
    ring = f"reload-{os.getpid()}-{sig.name.lower()}"
    ring_path = Path(f"/dev/shm/topicwire-{ring}.ring")
    config = tmp_path / "a.toml"
    config.write_text(config_text(port, "[pm]\nanonymous = true\n",
                                  extra=f'shm = "{ring}"', name="stopper"))
    proc = run_appliance(config)
    log = Log(proc)
    try:
        assert ring_path.exists()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        masks = {k: int(v, 16) for k, v in (line.split(":\t") for line in status.splitlines()
                                             if line.startswith(("SigIgn", "SigCgt")))}
        assert masks["SigIgn"] >> (signal.SIGPIPE - 1) & 1  # SIGPIPE ignored
        for caught in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            assert masks["SigCgt"] >> (caught - 1) & 1, caught.name
        with connect(f"udp://127.0.0.1:{port}", "tester") as client:
            sub = client.subscribe("t/#")
            round_trip(client, sub, "t/one", b"payload")
            proc.send_signal(sig)
            assert proc.wait(WAIT_S) == 0
            wait_for(lambda: client.logged_out_reason, timeout_s=10)  # told it was going
    finally:
        stop(proc)
    text = log.rest(proc)
    assert f"{sig.name} received: shutting down" in text
    assert f"draining ({sig.name}): logins refused, logging out 1 client sessions" in text
    assert "drained in" in text and "appliance stopped" in text
    assert not ring_path.exists()


def test_every_config_field_is_either_reloaded_or_named_for_a_restart(tmp_path):
    from dataclasses import fields

    from appliance.config import ApplianceConfig

    names = {f.name for f in fields(ApplianceConfig)} - {"source"}
    assert names == set(RUN_TIME) | set(RESTART)
    assert not set(RUN_TIME) & set(RESTART)
    a = tmp_path / "a.toml"
    a.write_text(config_text(1000, ALICE + "[pm]\nmode = \"embedded\"\n"))
    b = tmp_path / "b.toml"
    b.write_text(config_text(1000, "[pm]\nmode = \"remote\"\n"))
    out = plan(load_config(a), load_config(b))  # P&M's inputs follow pm.mode: a restart
    assert sorted(out.restart) == ["pm.identities", "pm.mode", "pm.require_passwords"]
    assert out.applied == []
    assert out.config.identities == load_config(a).identities
    assert plan(load_config(a), load_config(a)).summary() == "nothing changed"


def test_the_plan_names_each_changed_key_and_takes_only_the_run_time_ones(tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text(config_text(1000, ALICE + '[mgmt]\nlisten = "127.0.0.1:1001"\n'))
    (tmp_path / "routes.json").write_text("{}")
    b.write_text(config_text(2000, ALICE.replace('["t/#"]', '["t/#", "u/#"]', 1) + """
[pm.schemas.quote]
id = 7
fields = [["price", 0, "u32"]]
[mgmt]
listen = "127.0.0.1:1002"
[log]
format = "json"
[routes]
table = "routes.json"
switch_hold_ms = 50
"""))
    running, new = load_config(a), load_config(b)
    out = plan(running, new)
    assert out.applied == ["pm.identities", "pm.schemas", "log.format", "routes.switch_hold_ms",
                           "routes.table"]
    assert out.restart == ["clients.udp", "mgmt.listen"] and out.control
    assert out.identities == (0, 0, 1)
    assert out.config.clients_udp == running.clients_udp  # kept until a restart
    assert out.config.mgmt == running.mgmt
    assert (out.config.identities, out.config.schemas, out.config.log, out.config.routes) == (
        new.identities, new.schemas, new.log, new.routes)
    assert out.summary().startswith("applied pm.identities (0 added, 0 removed, 1 changed), "
                                    "pm.schemas, log.format")
    assert out.summary().endswith("; 2 changed keys need a restart (clients.udp, mgmt.listen)")


def test_a_reload_that_names_a_route_table_applies_it(tmp_path):
    from appliance.node import Appliance

    table = tmp_path / "routes.json"
    table.write_text('{"routes": []}')
    path = tmp_path / "a.toml"
    path.write_text(config_text(free_port(), ALICE))
    app = Appliance(load_config(path)).start()
    try:
        version = app.control.pm_doc["version"]
        path.write_text(path.read_text() + '[routes]\ntable = "routes.json"\npoll_ms = 10\n')
        out = app.reload(load_config(path))
        assert out.applied == ["routes.table", "routes.poll_ms"] and out.result["ok"]
        assert "pm_version" not in out.result  # P&M's inputs did not change
        wait_for(lambda: app.status().get("counters", {}).get("control_route_tables_applied"))
        assert app.control.pm_doc["version"] > version  # the table made a new version
        assert app.reload(load_config(path)).summary() == "nothing changed"
    finally:
        app.stop()
