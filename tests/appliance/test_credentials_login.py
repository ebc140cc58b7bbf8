"""Client credentials: an identity with a password logs in by challenge-response
(appliance/control/credentials.py), a captured login cannot be replayed, and the appliance
proves it knows the credential too.

The SCRAM exchange's functions first, then a real appliance (in this process, loopback) with
real clients (the client API, the `topicwire pub` command) and a raw socket that speaks the
client protocol as a hostile host would.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from appliance.client import LoginError, connect
from appliance.config import parse_config
from appliance.control import credentials as cr
from appliance.node import Appliance
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_mac
from datapath.protocol._kernels import sign_frames
from datapath.protocol.codec import decode_frame, encode_admin, encode_data_frame
from datapath.protocol.frame_layout import FrameType
from tests.appliance.helpers import ROOT, free_port, wait_for
from tests.appliance.helpers import counter as _counter
from tests.appliance.helpers import udp_url as _url

PASSWORD = "correct horse battery staple"
CHEAP = {"n": 1 << 10, "r": 8, "p": 1}  # scrypt cost of the tests' credentials


# --- the exchange --------------------------------------------------------------------------------
def test_a_proof_made_with_the_password_passes_and_one_made_with_another_does_not():
    stored = cr.hash_password(PASSWORD, **CHEAP)
    verifier = cr.verifier_of(stored)
    assert stored.split(":")[-1] not in json.dumps(verifier)  # the hash itself is not shared
    message = cr.auth_message("alice", b"c" * 16, b"s" * 16, "n1")
    proof, expected, key = cr.client_proof(PASSWORD.encode(), verifier, message)
    assert cr.verify_proof(verifier, message, proof) == key  # both ends: one session key
    assert cr.server_signature(verifier, message) == expected
    wrong, _, _ = cr.client_proof(b"Tr0ub4dor&3", verifier, message)
    assert cr.verify_proof(verifier, message, wrong) is None
    other = cr.auth_message("alice", b"c" * 16, b"t" * 16, "n1")  # another server nonce
    assert cr.verify_proof(verifier, other, proof) is None
    assert cr.verify_proof(verifier, message, proof[:-1]) is None
    assert key not in (proof, expected) and len(key) == 32


def test_a_challenge_asking_for_unbounded_scrypt_work_is_refused_by_the_client():
    with pytest.raises(cr.CredentialError, match="N must be"):
        cr.client_proof(b"x", {"n": 1 << 30, "r": 8, "p": 1, "salt": "00" * 16}, b"m")


# --- a real appliance ----------------------------------------------------------------------------
@pytest.fixture
def appliance():
    port = free_port()
    identities = {"alice": {"publish": ["a/#"], "subscribe": ["a/#"],
                            "password": cr.hash_password(PASSWORD, **CHEAP)},
                  "bob": {"publish": ["a/#"], "subscribe": ["a/#"]}}
    app = Appliance(parse_config({"appliance": {"name": f"cred{port}"},
                                  "clients": {"udp": f"127.0.0.1:{port}"},
                                  "pm": {"identities": identities}})).start()
    try:
        yield app
    finally:
        app.stop()


def test_the_right_password_logs_in_and_the_session_works(appliance):
    with connect(_url(appliance), "alice", password=PASSWORD, timeout_s=10) as a:
        sub = a.subscribe("a/#")
        for i in range(20):
            a.publish("a/x", b"hello %d" % i, flush=True)
        got = [sub.get(timeout=10) for _ in range(20)]
        assert [m.payload for m in got] == [b"hello %d" % i for i in range(20)]
    assert wait_for(lambda: _counter(appliance, "control_login_proofs_accepted") == 1)
    # every frame of the session carried its MAC and passed (its publishes, its subscribe)
    assert wait_for(lambda: _counter(appliance, "client_auth_accepted") >= 21)
    assert sum(_counter(appliance, f"client_auth_{r}") for r in
               ("no_trailer", "unknown_key", "bad_mac", "replay")) == 0


def test_an_identity_without_a_password_logs_in_only_in_the_anonymous_mode(tmp_path):
    """P&M requires a password by default: an identity it gives none is refused with the
    reason and counted; ``pm.require_passwords = false`` (demos) lets it in without proof,
    and a reload of the config takes that back without a restart."""
    port = free_port()
    identities = {"bob": {"publish": ["a/#"], "subscribe": ["a/#"]}}
    app = Appliance(parse_config({"appliance": {"name": f"nopw{port}"},
                                  "clients": {"udp": f"127.0.0.1:{port}"},
                                  "pm": {"identities": identities}})).start()
    try:
        with pytest.raises(LoginError, match="identity 'bob' has no password in P&M"):
            connect(_url(app), "bob", timeout_s=10)
        assert wait_for(lambda: _counter(app, "control_login_refused_no_password") == 1)
        assert not app.status()["clients"]
        demo = parse_config({"appliance": {"name": f"nopw{port}"},
                             "clients": {"udp": f"127.0.0.1:{port}"},
                             "pm": {"identities": identities, "require_passwords": False}})
        app.reload(demo)
        assert wait_for(lambda: app.status()["node"]["require_passwords"] is False)
        with connect(_url(app), "bob", timeout_s=10) as b:
            assert b.session > 0
            app.reload(parse_config({"appliance": {"name": f"nopw{port}"},
                                     "clients": {"udp": f"127.0.0.1:{port}"},
                                     "pm": {"identities": identities}}))
            assert wait_for(lambda: app.status()["node"]["require_passwords"] is True)
        with pytest.raises(LoginError, match="has no password"):
            connect(_url(app), "bob", timeout_s=10)
    finally:
        app.stop()


def test_no_password_or_a_wrong_one_is_refused_with_a_reason_and_counted(appliance):
    with pytest.raises(LoginError, match="logs in with a password"):
        connect(_url(appliance), "alice", timeout_s=10)
    with pytest.raises(LoginError, match="wrong password for identity 'alice'"):
        connect(_url(appliance), "alice", password="hunter2", timeout_s=10)
    assert wait_for(lambda: _counter(appliance, "control_login_refused_credential") == 1)
    assert not appliance.status()["clients"]


class RawClient:
    """A UDP socket that speaks the client protocol's LOGIN by hand."""

    def __init__(self, app: Appliance) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.to = app.config.clients_udp

    def frame(self, doc: dict) -> bytes:
        return bytes(encode_admin(FrameType.CONTROL, [al.Control(al.ControlKind.LOGIN,
                                                                 json.dumps(doc))],
                                  source_session=0, send_ts_ns=time.time_ns()))

    def send(self, frame: bytes) -> dict:
        """Send a LOGIN frame; the LOGIN_RESULT it gets."""
        self.sock.sendto(frame, self.to)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(70_000)
            frame_in = decode_frame(data)
            if frame_in.header.frame_type is FrameType.CONTROL:
                for entry in frame_in.admin()[1]:
                    if entry.kind is al.ControlKind.LOGIN_RESULT:
                        return json.loads(entry.document)
        raise AssertionError("no LOGIN_RESULT")

    def close(self) -> None:
        self.sock.close()


def test_a_captured_login_replayed_from_anywhere_logs_no_one_in(appliance):
    """A host that captured alice's whole login (her LOGIN with the proof) sends it again:
    from another address, and from the same kind of socket after asking for a challenge of
    its own. Both are refused (the proof answers a challenge that was used once, for another
    address), and no session is made; alice's own login worked."""
    alice, thief, late = RawClient(appliance), RawClient(appliance), RawClient(appliance)
    try:
        nonce = secrets.token_bytes(16)
        first = {"identity": "alice", "ring": None, "token": 1, "nonce": nonce.hex()}
        challenge = alice.send(alice.frame(first))
        assert not challenge["accepted"] and set(challenge["challenge"]) == {
            "nonce", "n", "r", "p", "salt"}
        # a LOGIN sent again before the proof gets the same challenge (retries cross)
        assert alice.send(alice.frame(first))["challenge"] == challenge["challenge"]
        message = cr.auth_message("alice", nonce, bytes.fromhex(challenge["challenge"]["nonce"]),
                                  challenge["node"])
        proof, expected, _ = cr.client_proof(PASSWORD.encode(), challenge["challenge"],
                                             message)
        captured = alice.frame({**first, "server_nonce": challenge["challenge"]["nonce"],
                                "proof": proof.hex()})
        accepted = alice.send(captured)
        assert accepted["accepted"] and accepted["server_signature"] == expected.hex()

        refused = thief.send(captured)
        assert not refused["accepted"] and "no login challenge is pending" in refused["reason"]
        assert "challenge" in late.send(late.frame(first))  # a fresh challenge of its own ...
        again = late.send(captured)  # ... which the captured proof does not answer
        assert not again["accepted"] and "no login challenge is pending" in again["reason"]
        assert wait_for(lambda: _counter(appliance, "control_login_refused_challenge") == 2)
        assert wait_for(lambda: len(appliance.status()["clients"]) == 1)
        # a LOGIN forged from alice's address (another token) gets a challenge, and a wrong
        # proof a refusal: neither ends her session
        forged = {**first, "token": 2, "nonce": secrets.token_hex(16)}
        fresh = alice.send(alice.frame(forged))["challenge"]
        wrong = alice.send(alice.frame({**forged, "server_nonce": fresh["nonce"],
                                        "proof": "00" * 32}))
        assert not wrong["accepted"] and "wrong password" in wrong["reason"]
        assert [c["session"] for c in appliance.status()["clients"]] == [accepted["session"]]
    finally:
        for c in (alice, thief, late):
            c.close()


def _signed(frame: bytes, mac: tuple, node_id: int) -> bytes:
    """``frame`` with the session's MAC trailer (the client's own signing kernel)."""
    buf = np.frombuffer(bytearray(frame) + bytes(32), np.uint8).copy()
    length = np.array([len(frame)], np.int64)
    zero, none = np.zeros(1, np.int64), np.zeros(0, np.int64)
    sign_frames(buf, zero, length, zero, 1, len(buf), none, none, node_id, time.time_ns(),
                *mac)
    return bytes(buf[:length[0]])


def test_a_sessions_frames_are_taken_only_with_its_mac(appliance):
    """alice logs in with her password from a raw socket; from her own address (what a host
    that forges it sends), frames with her session id are taken only with the MAC under her
    session key: an unsigned SUBSCRIBE and DATA frame, a DATA frame with a byte changed,
    and a signed SUBSCRIBE sent again are dropped, each counted under its reason; the
    signed ones are taken."""
    alice = RawClient(appliance)
    try:
        nonce = secrets.token_bytes(16)
        first = {"identity": "alice", "ring": None, "token": 1, "nonce": nonce.hex()}
        challenge = alice.send(alice.frame(first))
        message = cr.auth_message("alice", nonce, bytes.fromhex(challenge["challenge"]["nonce"]),
                                  challenge["node"])
        proof, _, key = cr.client_proof(PASSWORD.encode(), challenge["challenge"], message)
        result = alice.send(alice.frame({**first, "proof": proof.hex(),
                                         "server_nonce": challenge["challenge"]["nonce"]}))
        sid, node_id = result["session"], result["node_id"]
        mac = frame_mac.new_state(key, 0, 0, sid, time.time_ns())

        def subscribe(sub_id):
            return bytes(encode_admin(FrameType.SUBSCRIBE, [al.Subscription(sub_id, 0, 0, 0,
                                                                            "a/#")],
                                      source_session=sid, send_ts_ns=time.time_ns()))
        data = encode_data_frame([{"topic_key": 7, "sequence": 1, "payload": b"x" * 16}],
                                 source_session=sid, stream_id=sid)

        def counts():
            return {r: _counter(appliance, f"client_auth_{r}") for r in
                    ("accepted", "no_trailer", "bad_mac", "replay")}
        alice.sock.sendto(subscribe(1), alice.to)
        alice.sock.sendto(data, alice.to)
        assert wait_for(lambda: counts()["no_trailer"] == 2)
        signed = _signed(subscribe(2), mac, node_id)
        alice.sock.sendto(signed, alice.to)
        assert wait_for(lambda: any(s["pattern"] == "a/#" and s["origin"] ==
                                    appliance.config.name
                                    for s in appliance.status()["subscriptions"]))
        alice.sock.sendto(signed, alice.to)
        tampered = bytearray(_signed(data, mac, node_id))
        tampered[60] ^= 1
        alice.sock.sendto(bytes(tampered), alice.to)
        alice.sock.sendto(_signed(data, mac, node_id), alice.to)
        assert wait_for(lambda: counts() == {"accepted": 2, "no_trailer": 2, "bad_mac": 1,
                                             "replay": 1}), counts()
    finally:
        alice.close()


def test_only_the_appliances_own_process_logs_in_without_the_proof(appliance):
    """The MQTT edge (this process) vouches for the identities it authenticated with the
    appliance's trusted login token; a LOGIN with any other token is challenged."""
    raw = RawClient(appliance)
    try:
        doc = {"identity": "alice", "ring": None, "token": 5, "nonce": secrets.token_hex(16),
               "trusted": secrets.token_hex(32)}
        assert "challenge" in raw.send(raw.frame(doc))
    finally:
        raw.close()
    with connect(_url(appliance), "alice", timeout_s=10,
                 _trusted=appliance.control.trusted_login_token) as a:
        assert a.session > 0
    assert wait_for(lambda: _counter(appliance, "control_login_trusted") == 1)


def test_the_pub_command_logs_in_with_a_password_file(appliance, tmp_path):
    secret = tmp_path / "alice.password"
    secret.write_text(PASSWORD + "\n")
    cli = [sys.executable, "-c", "import sys; from appliance.ops.cli import main; "
           "sys.exit(main(sys.argv[1:]))"]
    host, port = appliance.config.clients_udp
    common = ["pub", "--topic", "a/x", "--appliance", f"{host}:{port}", "--identity", "alice",
              "--message", "hi", "--json"]
    done = subprocess.run(cli + common + ["--password-file", str(secret)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["sent"] == 1
    missing = subprocess.run(cli + common + ["--password-file", str(tmp_path / "nope")],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "--password-file" in missing.stderr
    assert "Traceback" not in missing.stderr
    refused = subprocess.run(cli + common, cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode != 0 and "password" in refused.stderr
