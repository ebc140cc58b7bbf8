"""Real peers of the bridge tests: a mosquitto on a fixed loopback port that a test stops,
kills and starts again, and paho-mqtt clients of it."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.appliance.helpers import free_port
from tests.edge.conftest import DEADLINE_S, edge_doc, wait_for

MOSQUITTO = shutil.which("mosquitto") or (
    "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
requires_mosquitto = pytest.mark.skipif(
    MOSQUITTO is None or shutil.which("mosquitto_passwd") is None,
    reason="mosquitto is not installed (make test installs it: APT_PACKAGES)")
BRIDGE_USER, BRIDGE_PASSWORD = "edge-bridge", "bridge-secret"


STARTED: list[Mosquitto] = []
"""Every mosquitto started; ``stop_all`` (an autouse fixture of the bridge tests) stops
whatever a failed test left running."""


def stop_all() -> None:
    while STARTED:
        STARTED.pop().stop(kill=True)


class Mosquitto:
    """mosquitto on ``port`` (anonymous clients allowed; the bridge's user only once
    ``allow_bridge``: until then mosquitto refuses the bridge's CONNACK, so a test can
    subscribe first)."""

    def __init__(self, directory: Path, port: int | None = None, bridge_allowed: bool = True,
                 extra: str = "", persistence: bool = False) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.extra = extra
        self.persistence = persistence
        self.proc: subprocess.Popen | None = None
        self.passwd = directory / "passwd"
        self._write_passwd(bridge_allowed)

    def _write_passwd(self, bridge_allowed: bool) -> None:
        self.passwd.write_text("")
        user = BRIDGE_USER if bridge_allowed else "nobody"
        subprocess.run(["mosquitto_passwd", "-b", str(self.passwd), user, BRIDGE_PASSWORD],
                       check=True, capture_output=True)

    def start(self) -> Mosquitto:
        conf = self.dir / "mosquitto.conf"
        persistence = (f"persistence true\npersistence_location {self.dir}/\n"
                       if self.persistence else "persistence false\n")
        conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                        f"password_file {self.passwd}\n{persistence}log_dest stderr\n"
                        f"user root\n{self.extra}")
        self.log = open(self.dir / "mosquitto.log", "ab")
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                     stderr=self.log)
        STARTED.append(self)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("mosquitto did not start: "
                                         + (self.dir / "mosquitto.log").read_text()) from None
                time.sleep(0.05)

    def allow_bridge(self) -> None:
        """Add the bridge's user and have mosquitto reload its passwords (SIGHUP)."""
        self._write_passwd(True)
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        proc.wait(DEADLINE_S)
        self.log.close()


class Client:
    """A paho-mqtt client of mosquitto (anonymous) that records what it receives."""

    def __init__(self, port: int, client_id: str, version: int = 5) -> None:
        self.messages: queue.Queue = queue.Queue()
        self.received: list[Any] = []
        self._acks: queue.Queue = queue.Queue()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311,
                                  reconnect_on_failure=False)
        self.client.on_connect = lambda *a: self._acks.put("connack")
        self.client.on_subscribe = lambda *a: self._acks.put("suback")
        self.client.on_message = lambda _c, _u, m: self.received.append(m)
        self.client.connect("127.0.0.1", port, keepalive=60)
        self.client.loop_start()
        assert self._acks.get(timeout=DEADLINE_S) == "connack"

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        self.client.subscribe(topic_filter, qos)
        assert self._acks.get(timeout=DEADLINE_S) == "suback"

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos, retain)
        info.wait_for_publish(DEADLINE_S)
        assert info.is_published()

    def payloads(self, prefix: str = "") -> Counter:
        return Counter(m.payload for m in list(self.received) if m.topic.startswith(prefix))

    def wait_payload(self, payload: bytes) -> Any:
        return wait_for(lambda: next((m for m in list(self.received) if m.payload == payload),
                                     None), what=f"{payload!r} received")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def bridge_spec(tmp: Path, port: int, **bridge: Any) -> dict:
    """One ``[[mqtt.bridges]]`` table: to ``127.0.0.1:port`` as identity ``native``, with
    mosquitto's bridge user (password file in ``tmp``) and its backlog under ``tmp``."""
    pw = tmp / "bridge.password"
    pw.write_text(BRIDGE_PASSWORD + "\n")
    return {"name": "cloud", "address": f"127.0.0.1:{port}", "identity": "native",
            "username": BRIDGE_USER, "password_file": str(pw), "reconnect_min_ms": 50,
            "reconnect_max_ms": 400, "backlog_dir": str(tmp / "backlog"), **bridge}


def bridge_doc(tmp: Path, port: int, **bridge: Any) -> dict:
    return edge_doc(bridges=[bridge_spec(tmp, port, **bridge)])


def bridge_status(edge: Any, name: str = "cloud") -> dict:
    return edge.mqtt.status()["bridges"][name]


def wait_bridge(edge: Any, what: str, predicate: Any, name: str = "cloud") -> dict:
    return wait_for(lambda: (s := bridge_status(edge, name)) and predicate(s) and s,
                    what=f"bridge {what} (now {bridge_status(edge, name)})")
