"""Requests that are safe to repeat (login, registration) are sent again inside their deadline,
and the appliance answers a repeated login with the session it already made.

A real appliance (in this process) and a real client reach each other through a UDP relay on
loopback that drops chosen datagrams: the first LOGIN, the first LOGIN_RESULT, or the first
registration, as a lost datagram or an appliance busy for a moment would.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

from appliance.client import ClientError, connect
from appliance.config import parse_config
from appliance.node import Appliance
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.codec import decode_frame
from tests.appliance.helpers import counter as _counter
from tests.appliance.helpers import free_port, wait_for


def _kind(data: bytes) -> str:
    """``login``, ``login_result``, ``register`` or ``other`` for one datagram."""
    try:
        frame = decode_frame(memoryview(data))
        if frame.is_message_frame:
            return "other"
        _, entries = frame.admin()
    except Exception:
        return "other"
    ftype = frame.header.frame_type
    if ftype is fl.FrameType.REGISTRY_UPDATE:
        return "register"
    if ftype is fl.FrameType.CONTROL and entries:
        if entries[0].kind is al.ControlKind.LOGIN:
            return "login"
        if entries[0].kind is al.ControlKind.LOGIN_RESULT:
            return "login_result"
    return "other"


class LossyRelay:
    """client <-> 127.0.0.1:port <-> appliance, dropping the first datagram of each kind in
    ``drop``; ``dropped`` counts what it dropped."""

    def __init__(self, appliance_port: int, drop: set[str]) -> None:
        self.target = ("127.0.0.1", appliance_port)
        self.drop = set(drop)
        self.dropped: list[str] = []
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", 0))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.bind(("127.0.0.1", 0))
        self.port = self.front.getsockname()[1]
        self.client: tuple | None = None
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._pump, args=(up,), daemon=True)
                        for up in (True, False)]
        for t in self.threads:
            t.start()

    def _pump(self, up: bool) -> None:
        src = self.front if up else self.back
        src.settimeout(0.05)
        while not self.stop.is_set():
            try:
                data, peer = src.recvfrom(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            kind = _kind(data)
            if kind in self.drop:
                self.drop.discard(kind)
                self.dropped.append(kind)
                continue
            if up:
                self.client = peer
                self.back.sendto(data, self.target)
            elif self.client is not None:
                self.front.sendto(data, self.client)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(2)
        self.front.close()
        self.back.close()


@pytest.fixture
def appliance():
    port = free_port()
    app = Appliance(parse_config({
        "appliance": {"name": f"retry{port}"},
        "fabric": {"listen": f"127.0.0.1:{free_port()}", "key": "33" * 32},
        "clients": {"udp": f"127.0.0.1:{port}"},
        "pm": {"anonymous": True, "require_passwords": False}})).start()
    try:
        yield app, port
    finally:
        app.stop()


@pytest.mark.parametrize("drop", ["login", "login_result", "register"])
def test_a_lost_request_or_answer_costs_a_retry_not_the_request(appliance, drop) -> None:
    app, port = appliance
    relay = LossyRelay(port, {drop})
    try:
        with connect(f"udp://127.0.0.1:{relay.port}") as client:
            client.publish("retry/topic", b"x", flush=True)  # registers the topic
            assert relay.dropped == [drop]
            assert client.request_retries >= 1
            # one session, the one the client holds, whichever datagram was lost
            sessions = wait_for(lambda: [c["session"] for c in app.status()["clients"]] or None)
            assert sessions == [client.session]
            if drop == "login_result":  # the appliance saw the same login twice
                wait_for(lambda: _counter(app, "control_login_repeats") >= 1)
    finally:
        relay.close()


def test_a_request_that_gets_no_answer_still_fails_clearly() -> None:
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    try:
        with pytest.raises(ClientError, match="no answer from the appliance to login within"):
            connect(f"udp://127.0.0.1:{silent.getsockname()[1]}", timeout_s=1.0)
        logins = 0
        silent.settimeout(0.1)
        while True:  # every retry the client sent is queued at the socket
            try:
                data, _ = silent.recvfrom(65536)
            except TimeoutError:
                break
            logins += _kind(data) == "login"
        assert logins >= 2  # sent, then sent again inside the deadline
    finally:
        silent.close()


def test_a_repeated_login_with_another_token_replaces_the_session(appliance) -> None:
    """A new login (another token) from the same peer still ends the old session."""
    app, port = appliance
    from datapath.protocol.codec import encode_admin

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    try:
        sessions = []
        for token in (1, 1, 2):
            doc = {"identity": "anonymous", "ring": None, "token": token}
            sock.sendto(bytes(encode_admin(fl.FrameType.CONTROL, [al.Control(
                al.ControlKind.LOGIN, json.dumps(doc))], source_session=0, send_ts_ns=0)),
                ("127.0.0.1", port))
            while True:
                data, _ = sock.recvfrom(65536)
                if _kind(data) == "login_result":
                    _, entries = decode_frame(memoryview(data)).admin()
                    sessions.append(json.loads(entries[0].document)["session"])
                    break
        assert sessions[0] == sessions[1] != sessions[2]
        wait_for(lambda: [c["session"] for c in app.status()["clients"]] == [sessions[2]])
    finally:
        sock.close()
