"""The live fuzzer's sender: mutants made and sent from a process of their own.

The appliance under test runs in the fuzzer's process (tests/fuzz/live.py), where making
mutants would compete with it for the interpreter; this process makes and sends them from
the fuzzer's sockets, inherited (``python -m tests.fuzz.sender``, started by ``live.py``).
It reads one JSON line of settings on stdin, then commands, one per line:

- ``sid N``: frames of the session claim session N from now on (the fuzzer logged in again);
- ``pause`` / ``go``: stop and resume sending (the appliance's inbox is nearly full);
- ``dump``: write ``{"recent": [...]}``, the frames sent last, oldest first (a crash);
- ``stop``: write ``{"sent": {source: n}, "auth": [epoch, seq], "waited_s", "recent": [...]}``
  and exit (``waited_s``: seconds it was held or waited for the appliance's socket).

It writes ``{"ready": true}`` once it is about to send the first frame.

A sent frame is ``[source, hex, signed again, session]``. At the fabric port it also sends the
neighbour's heartbeats (and its link state and interest, every ``FULL_HELLO_S``): it owns the
neighbour's authentication sequence while it runs. It paces itself on the appliance's socket
(its receive queue, /proc/net/udp).
"""

from __future__ import annotations

import collections
import json
import os
import random
import select
import socket
import struct
import sys
import time
from typing import Any

from appliance.control.auth import FabricAuth, mac_of
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.admin_layout import ControlKind as K
from datapath.protocol.frame_layout import FrameType
from tests.fuzz import seeds as S
from tests.fuzz.mutate import Mutator

NEIGHBOUR_NAME = "fuzzer"
NEIGHBOUR_ID = 4242
"""The node id the fuzzer's neighbour claims in its HELLOs."""
NEIGHBOUR_EPOCH = 1
"""Its auth epoch: fixed, so frames kept in the corpus replay the same."""
SOURCES = {"client": ("anon", "session"), "fabric": ("neighbour", "stranger")}
SOURCE_WEIGHTS = {"anon": 0.4, "session": 0.6, "neighbour": 0.85, "stranger": 0.15}
CONTROL_MUTANTS = 0.08
"""Share of frames that are a CONTROL frame with a mutated document, framed correctly."""
DERIVED_KEPT = 512
"""Such frames kept per source as seeds of further (byte-level) mutation."""
RECENT_FRAMES = 16_384
"""Frames kept for the triage of a crash (the socket and the inbox hold fewer)."""
PACE_RX_BYTES = 1 << 20
"""The sender waits while the appliance's socket holds more than this (its receive queue)."""
HELLO_INTERVAL_S = 0.1
FULL_HELLO_S = 1.0


def proc_udp(port: int) -> tuple[int, int]:
    """(bytes in the receive queue, datagrams dropped) of the 127.0.0.1 UDP socket bound to
    ``port``, from /proc/net/udp."""
    local = f"0100007F:{port:04X}"
    with open("/proc/net/udp") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 12 and parts[1] == local:
                return int(parts[4].split(":")[1], 16), int(parts[12])
    return 0, 0


def resign(auth: FabricAuth, frame: bytes, restamp: bool = True) -> bytes:
    """``frame`` signed again by the neighbour (a new auth sequence when ``restamp``): a
    mutant with the auth flag and room for a trailer passes the MAC check."""
    n = len(frame)
    if n < fl.FRAME_HEADER_BYTES + fl.AUTH_TRAILER_BYTES:
        return frame
    buf = bytearray(frame)
    at = n - fl.AUTH_TRAILER_BYTES
    if restamp:
        fl.AUTH_TRAILER_STRUCT.pack_into(buf, at, *auth.next_auth())
    else:  # a mutated trailer: an epoch or sequence the appliance may now hold as the
        # neighbour's newest (a restart): keep them, so that later frames can be accepted
        key_id, epoch, seq = fl.AUTH_TRAILER_STRUCT.unpack_from(buf, at)
        if key_id == auth.key_id and (epoch, seq) > (auth.epoch, auth._seq):
            auth.epoch, auth._seq = epoch, seq
    assert auth.key is not None
    buf[n - fl.AUTH_MAC_BYTES:] = mac_of(auth.key, bytes(buf[:n - fl.AUTH_MAC_BYTES]))
    return bytes(buf)


def claim_session(frame: bytes, sid: int, old: int = 0) -> bytes:
    """``frame`` from session ``sid``: its ``source_session`` (when it is ``old``, or any when
    ``old`` is 0), and a reliable stream's id, which names the publishing session."""
    if len(frame) < fl.FRAME_HEADER_BYTES:
        return frame
    src, dst, stream = struct.unpack_from(">III", frame, fl.SOURCE_SESSION_OFFSET)
    if old and src != old:
        return frame
    if stream & S.RELIABLE and (not old or stream == old | S.RELIABLE):
        stream = sid | S.RELIABLE
    return (frame[:fl.SOURCE_SESSION_OFFSET] + struct.pack(">III", sid, dst, stream)
            + frame[fl.SEND_TS_OFFSET:])


def hello_frames(auth: FabricAuth, appliance_id: int, full: bool) -> list[bytes]:
    """The neighbour's heartbeat; ``full``: its link state and interest too (the appliance
    then has a path from it and to it)."""
    hello = al.Hello(NEIGHBOUR_ID, NEIGHBOUR_EPOCH, 100, al.NodeRole.CORE, 0, NEIGHBOUR_NAME)
    out = [S.frame(FrameType.HEARTBEAT, [hello], session=NEIGHBOUR_ID, auth=auth,
                   dest=appliance_id)]  # bound to the appliance: docs/protocol.md
    if full:
        seq = int(time.monotonic() * 1_000)
        lsa = {"origin": NEIGHBOUR_ID, "name": NEIGHBOUR_NAME, "epoch": NEIGHBOUR_EPOCH,
               "seq": seq, "links": [[appliance_id, 1]]}
        interest = {"origin": NEIGHBOUR_ID, "epoch": NEIGHBOUR_EPOCH, "seq": seq,
                    "patterns": [[0, "fz/#"]], "guaranteed": [[0, "fz/g/#"]]}
        out.append(S.frame(FrameType.CONTROL, [al.Control(K.LSA, json.dumps(lsa)),
                                               al.Control(K.INTEREST, json.dumps(interest))],
                           session=NEIGHBOUR_ID, auth=auth, dest=appliance_id))
    return out


class Generator:
    """Mutants per source (tests/fuzz/live.py's module docstring)."""

    def __init__(self, seed: int, appliance_id: int, auth: FabricAuth) -> None:
        self.rng = random.Random(seed)
        self.mutator = Mutator(self.rng)
        self.auth = auth
        self.seeds = S.frame_seeds(NEIGHBOUR_ID, appliance_id, auth, NEIGHBOUR_NAME).__dict__
        self.derived: dict[str, collections.deque[bytes]] = {
            name: collections.deque(maxlen=DERIVED_KEPT) for name in self.seeds}

    def one(self, source: str, sid: int) -> tuple[bytes, bool]:
        """A mutant for ``source`` and whether it was signed again (``sid``: the session)."""
        rng = self.rng
        pool = self.seeds[source]
        derived = self.derived[source]
        base = rng.choice(derived) if derived and rng.random() < 0.3 else rng.choice(pool)
        if source == "session" and rng.random() < 0.9:
            base = claim_session(base, sid)
        frame = None
        if rng.random() < CONTROL_MUTANTS:
            frame = self.mutator.control(base)
            if frame is not None:
                derived.append(frame)
        if frame is None:
            frame = self.mutator.frame(base, pool)
        signed = False
        if (source == "neighbour" and len(frame) >= 64 and frame[5] & fl.FrameFlags.AUTH_TRAILER
                and rng.random() < 0.85):
            frame = resign(self.auth, frame, restamp=rng.random() < 0.95)
            signed = True
        return frame, signed


def _recent(recent: collections.deque) -> list[list[Any]]:
    return [[s, f.hex(), g, sid] for s, f, g, sid in recent]


def main() -> int:
    settings = json.loads(sys.stdin.readline())
    port = settings["port"]
    socks = {name: socket.socket(fileno=fd) for name, fd in settings["fds"].items()}
    dest = {name: tuple(a) for name, a in settings["dest"].items()}
    auth = FabricAuth(bytes.fromhex(S.FABRIC_KEY), 1, settings["auth"][0])
    auth._seq = settings["auth"][1]
    gen = Generator(settings["seed"], settings["appliance_id"], auth)
    sid = settings["sid"]
    target = settings["target_port"]
    sources = SOURCES[port]
    weights = [SOURCE_WEIGHTS[s] for s in sources]
    recent: collections.deque = collections.deque(maxlen=RECENT_FRAMES)
    sent: collections.Counter[str] = collections.Counter()
    stdin = sys.stdin.fileno()
    os.set_blocking(stdin, False)
    pending = b""
    paused = held = False
    next_hello = next_full = 0.0
    n = 0
    waited = 0.0
    """Seconds held by the fuzzer or waiting for the appliance's socket: the appliance, not
    this process, set the pace meanwhile."""

    def reply(doc: dict) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

    def send(source: str, frame: bytes) -> bool:
        while True:
            try:
                socks[source].sendto(frame, dest[source])
                return True
            except BlockingIOError:
                time.sleep(0.0002)
            except OSError:  # e.g. EMSGSIZE: the frame never left, it is not counted
                return False

    reply({"ready": True})
    while True:
        if n % 64 == 0 or held:
            # held by the fuzzer, or the appliance's socket has a long queue: wait (for a
            # command, or 1 ms), then look again; the commands are read meanwhile
            held = paused or proc_udp(target)[0] > PACE_RX_BYTES
            t = time.monotonic()
            ready = select.select([stdin], [], [], 0.001 if held else 0)[0]
            if held:
                waited += time.monotonic() - t
            if ready:
                chunk = os.read(stdin, 65_536)
                if not chunk:
                    return 0
                pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                command = line.decode().split()
                if not command:
                    continue
                if command[0] == "sid":
                    sid = int(command[1])
                elif command[0] == "pause":
                    paused = held = True
                elif command[0] == "go":
                    paused = False
                elif command[0] == "dump":
                    reply({"recent": _recent(recent)})
                elif command[0] == "stop":
                    reply({"sent": dict(sent), "auth": [auth.epoch, auth._seq],
                           "waited_s": round(waited, 1), "recent": _recent(recent)})
                    return 0
            if held:
                continue
        if port == "fabric":
            now = time.monotonic()
            if now >= next_hello:
                next_hello = now + HELLO_INTERVAL_S
                full = now >= next_full
                if full:
                    next_full = now + FULL_HELLO_S
                for frame in hello_frames(auth, settings["appliance_id"], full):
                    if send("neighbour", frame):
                        sent["neighbour"] += 1
                        recent.append(("neighbour", frame, True, sid))
        source = gen.rng.choices(sources, weights)[0]
        frame, signed = gen.one(source, sid)
        if send(source, frame):
            sent[source] += 1
            recent.append((source, frame, signed, sid))
        n += 1


if __name__ == "__main__":
    sys.exit(main())
