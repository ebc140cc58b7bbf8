"""The live fuzzer: one appliance in this process, mutated frames at its client and fabric ports.

``Harness`` starts the appliance (clients over UDP, the fabric over UDP with one configured
neighbour whose address is the fuzzer's own fabric socket), logs a client in from one of its
sockets and brings the neighbour up (signed HELLO, LSA and interest), so that mutated frames
reach every handler: an anonymous client, a logged-in session (its frames carry its session
id), the neighbour (admin frames signed again after mutation: they pass the MAC and the
replay window) and an address that is no neighbour.

``run_live`` fuzzes each port in turn for ``seconds``: a sender process (tests/fuzz/sender.py)
makes and sends the mutants from the fuzzer's sockets as fast as the appliance takes them,
while this process keeps the session logged in, holds the sender while the appliance's inbox
is nearly full and watches for crashes. Then it checks:

- nothing ended the appliance: ``Appliance.failure()`` is None, both agent threads run, and
  no handler raised (``bad_admin``, ``control_bad_admin``: caught, but a bug);
- a real client still logs in, subscribes, publishes and receives its message;
- every frame is accounted for. Sent = received by the port's channel + dropped by the
  kernel (the socket's ``drops`` in /proc/net/udp: its buffer was full) + dropped by the
  channel (larger than a slot). Received = the sum of the per-reason counters below, each
  frame under exactly one (``accounting``; docs/appliance.md, "Every frame counted").

The summary (JSON) gives per port the frames sent, the reasons, frames per second, the crashes
and what was not accounted for; the exit status is non-zero on a crash or an unaccounted frame.
A crash is triaged: the frames sent just before it are replayed against a fresh appliance and
cut down while the crash still happens (``minimize``); what is left is saved in
tests/fuzz/corpus.
"""

from __future__ import annotations

import collections
import json
import os
import random
import select
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.client import connect
from appliance.config import parse_config
from appliance.control.auth import FabricAuth
from appliance.dataplane.names import CLIENT_UDP, FABRIC
from appliance.node import Appliance
from datapath.protocol import admin_layout as al
from datapath.protocol.admin_layout import ControlKind as K
from datapath.protocol.codec import decode_frame
from datapath.protocol.errors import ProtocolError
from datapath.protocol.frame_layout import FrameType
from tests.fuzz import corpus
from tests.fuzz import seeds as S
from tests.fuzz.sender import (
    NEIGHBOUR_EPOCH,
    NEIGHBOUR_NAME,
    PACE_RX_BYTES,
    claim_session,
    hello_frames,
    proc_udp,
    resign,
)

ROOT = Path(__file__).resolve().parents[2]
APPLIANCE_NAME = "fuzz"
IDENTITIES = {"feed": {"publish": ["#"], "subscribe": ["#"]}}
PACE_INBOX = 3_000
"""The sender is held while the appliance's inbox of admin frames holds more than this (and
the replay waits): frames go in as fast as the control agent takes them."""
SETTLE_TIMEOUT_S = 60.0
STATUS_AFTER_TIMEOUT_S = 5.0
"""How long settling waits for a status built from a newer publish of the data path (it
publishes every second when idle, the control agent rebuilds the status every 250 ms)."""
SENDER_START_TIMEOUT_S = 60.0


def _udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    return s


def describe(exc: BaseException | str) -> str:
    """``Type: message (at dir/file.py:line in function)``, at the innermost frame of its
    traceback."""
    if isinstance(exc, str):
        return exc
    tb = exc.__traceback__
    where = ""
    while tb is not None:
        code = tb.tb_frame.f_code
        where = (f" (at {'/'.join(Path(code.co_filename).parts[-2:])}:{tb.tb_lineno} in "
                 f"{code.co_name})")
        tb = tb.tb_next
    return f"{type(exc).__name__}: {exc}{where}"


class Harness:
    """A running appliance and the fuzzer's sockets (see the module docstring)."""

    def __init__(self) -> None:
        self.socks = {name: _udp() for name in ("anon", "session", "neighbour", "stranger")}
        from tests.appliance.helpers import free_port

        self.client_port, self.fabric_port = free_port(), free_port()
        nb_port = self.socks["neighbour"].getsockname()[1]
        self.cfg = parse_config({
            "appliance": {"name": APPLIANCE_NAME, "dataplane": "thread"},
            "fabric": {"listen": f"127.0.0.1:{self.fabric_port}", "key": S.FABRIC_KEY},
            "neighbours": [{"name": NEIGHBOUR_NAME, "address": f"127.0.0.1:{nb_port}"}],
            "clients": {"udp": f"127.0.0.1:{self.client_port}", "session_dead_ms": 600_000},
            "pm": {"require_passwords": False, "identities": IDENTITIES}})
        self.node_id = self.cfg.node_id
        self.auth = FabricAuth(bytes.fromhex(S.FABRIC_KEY), 1, NEIGHBOUR_EPOCH)
        self.dest = {"anon": ("127.0.0.1", self.client_port),
                     "session": ("127.0.0.1", self.client_port),
                     "neighbour": ("127.0.0.1", self.fabric_port),
                     "stranger": ("127.0.0.1", self.fabric_port)}
        self.port_of = {"anon": "client", "session": "client", "neighbour": "fabric",
                        "stranger": "fabric"}
        self.sent: collections.Counter[str] = collections.Counter()
        """Frames sent per port ("client", "fabric")."""
        self.send_errors = 0
        self.sid = 0
        self.settled = True
        self.app = Appliance(self.cfg).start()

    # --- sending ------------------------------------------------------------------------------
    def send(self, source: str, frame: bytes) -> None:
        while True:
            try:
                self.socks[source].sendto(frame, self.dest[source])
                break
            except BlockingIOError:  # our own send buffer: wait, the frame still goes
                time.sleep(0.0002)
            except OSError:  # e.g. EMSGSIZE: the frame never left, it is not counted
                self.send_errors += 1
                return
        self.sent[self.port_of[source]] += 1

    def resign(self, frame: bytes, restamp: bool = True) -> bytes:
        return resign(self.auth, frame, restamp)

    # --- a session and a neighbour --------------------------------------------------------------
    def login(self, wait_s: float = 0.0) -> None:
        """A LOGIN from the session socket; waits up to ``wait_s`` for the session."""
        doc = {"identity": "feed", "ring": None, "token": random.getrandbits(63)}
        self.send("session", S.frame(FrameType.CONTROL, [al.Control(K.LOGIN, json.dumps(doc))]))
        deadline = time.monotonic() + wait_s
        old = self.sid
        while time.monotonic() < deadline:
            self.poll_replies()
            if self.sid != old:
                return
            time.sleep(0.01)
        if wait_s:
            raise RuntimeError("the appliance did not answer the fuzzer's login")

    def session_alive(self) -> bool:
        return bool(self.sid) and self.sid in self.app.control.sessions

    def neighbour_hello(self, full: bool = False) -> None:
        """The neighbour's heartbeat; ``full``: its link state and interest too (the
        appliance then has a path from it and to it)."""
        for frame in hello_frames(self.auth, self.node_id, full):
            self.send("neighbour", frame)

    def poll_replies(self) -> None:
        """Read what the appliance sent the fuzzer's sockets (a full buffer would only drop
        them); the session socket's LOGIN_RESULT gives the session its frames claim."""
        for name, sock in self.socks.items():
            for _ in range(4_096):
                try:
                    data = sock.recv(70_000)
                except BlockingIOError:
                    break
                if name != "session":
                    continue
                try:
                    frame = decode_frame(data)
                except ProtocolError:
                    continue
                if frame.header.frame_type is not FrameType.CONTROL:
                    continue
                for entry in frame.admin()[1]:
                    if entry.kind is K.LOGIN_RESULT:
                        try:
                            doc = json.loads(entry.document)
                        except ValueError:
                            continue
                        if doc.get("accepted") and isinstance(doc.get("session"), int):
                            self.sid = doc["session"]

    # --- state ----------------------------------------------------------------------------------
    def threads_alive(self) -> bool:
        return all(r is not None and r._thread is not None and r._thread.is_alive()
                   for r in (self.app._dp_runner, self.app._cp_runner))

    def crash_state(self) -> tuple[int, int, str | None]:
        """(frames whose handler raised in the data path, in the control agent, the error that
        stopped a thread) read from the agents directly (no status refresh to wait for)."""
        failure = self.app.failure()
        if failure is None and not self.threads_alive():
            failure = "an agent thread is not running"
        return (int(self.app.dataplane.counters.get("bad_admin", 0)),
                int(self.app.control.counters.get("bad_admin", 0)),
                None if failure is None else describe(failure))

    def snapshot(self) -> dict[str, int]:
        """The counters the accounting reads, flat: status counters (``c:``), the software
        NIC's (``nic:``, ``malformed:``), authentication (``auth:``), each port's channel
        (frames in, dropped oversized) and socket (kernel drops, from /proc/net/udp)."""
        st = self.app.status()
        flat: dict[str, int] = {f"c:{k}": int(v) for k, v in st["counters"].items()}
        flat.update({f"malformed:{k}": int(v) for k, v in st["offload"]["malformed"].items()})
        flat.update({f"nic:{k}": int(v) for k, v in st["offload"]["verdicts"].items()})
        flat.update({f"auth:{k}": int(v) for k, v in st["auth"]["rejected"].items()})
        flat["auth_accepted"] = int(st["auth"]["accepted"])
        for row in st["channels"]:
            flat[f"in:{row['name']}"] = int(row["frames_in"])
        for port, name, number in (("client", CLIENT_UDP, self.client_port),
                                   ("fabric", FABRIC, self.fabric_port)):
            stats = self.app.channels[name].stats
            flat[f"oversized:{port}"] = int(stats.drop_reasons.get("oversized", 0))
            flat[f"kernel_drops:{port}"] = proc_udp(number)[1]
        return flat

    def settle(self, timeout_s: float = SETTLE_TIMEOUT_S) -> dict[str, int]:
        """The counters once the appliance has handled everything sent: both sockets empty,
        its inbox empty, and the counters the accounting reads the same in two status
        snapshots in a row with a publish of the data path between them (``settled`` says
        whether that happened within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        last = None
        self.settled = False
        while time.monotonic() < deadline:
            self.poll_replies()
            if self.app.failure() is not None:  # its counters stop where it stopped
                time.sleep(0.6)
                return self.snapshot()
            busy = (proc_udp(self.client_port)[0] or proc_udp(self.fabric_port)[0]
                    or self.app.dataplane.inbox)
            snap = self.snapshot()
            now = {k: v for k, v in snap.items() if counted(k)}
            if not busy and now == last:
                self.settled = True
                return snap
            last = now
            # the data path's counters (its channels' frames in among them) are what it last
            # published, up to a second old when idle, while the control agent's (the
            # authentication's) are live: the next snapshot is taken after a publish of the
            # data path that came after this one, and after the status was rebuilt from it,
            # or frames the control agent counted may be missing from the channel's count
            self._status_after(self.app.dataplane.published)
        return self.snapshot()

    def _status_after(self, old: dict, timeout_s: float = STATUS_AFTER_TIMEOUT_S) -> None:
        """Until the status was rebuilt from a publish of the data path newer than ``old``
        (its ``published``), or ``timeout_s``: the data path publishes a new dict each time
        and the control agent's status carries the channel rows it made from one of them."""
        newer: list[dict] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            current = self.app.dataplane.published
            if current is not old and not any(current is p for p in newer):
                newer.append(current)
            rows = self.app.control._rows_cache
            if (rows is not None and any(rows[0] is p for p in newer)
                    and self.app.status().get("channels") is rows[1]):
                return
            time.sleep(0.05)

    def round_trip(self, topic: str = "rt/x") -> str | None:
        """None when a real client's publish reaches a real client's subscription, else why
        not."""
        url = f"udp://127.0.0.1:{self.client_port}"
        try:
            with connect(url, "feed", timeout_s=20) as sub_client, \
                    connect(url, "feed", timeout_s=20) as pub_client:
                sub = sub_client.subscribe(topic.split("/")[0] + "/#")
                pub_client.publish(topic, b"still serving", flush=True)
                got = sub.get(timeout=20)
                if got is None or got.payload != b"still serving":
                    return f"the subscriber got {got!r}"
        except Exception as exc:  # whatever went wrong, it is the finding
            return f"{type(exc).__name__}: {exc}"
        return None

    def close(self) -> None:
        try:
            self.app.stop()
        except Exception:  # the error that stopped a thread: reported already
            pass
        finally:
            for s in self.socks.values():
                s.close()


# --- accounting -------------------------------------------------------------------------------
def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}


COUNTED = {
    "both": ("parked_reruns", "guaranteed_delivery_frames", "inbox_full", "probe_frames",
             "guaranteed_frames_in", "flow_frames_in"),
    "client": ("unknown_client_frames", "control_client_malformed",
               "control_client_no_session", "control_login_accepted", "control_login_repeats",
               "control_client_admin_frames", "control_login_challenges"),
    "fabric": ("unknown_peer", "off_path", "transit_frames", "duplicate_frames"),
}
"""The status counters (``"counters"``) the accounting reads, by port."""
COUNTED_PREFIXES = ("control_login_refused_", "data_auth_", "client_auth_")
REFUSED_BY_MAC = ("no_trailer", "unknown_key", "bad_mac", "replay", "links_full")
"""The frame MAC's refusals (``data_auth_<reason>`` at the fabric port, ``client_auth_``
at the client port): such a frame is dropped before anything else counts it."""


def counted(key: str) -> bool:
    """Whether a key of ``Harness.snapshot()`` takes part in the accounting."""
    if not key.startswith("c:"):
        return True
    name = key[2:]
    return name.startswith(COUNTED_PREFIXES) or any(name in names for names in COUNTED.values())


def accounting(port: str, d: dict[str, int]) -> dict[str, int]:
    """Frames received at ``port`` by reason, from the counters' changes ``d``: each frame
    is counted under exactly one of these (docs/appliance.md, "Every frame counted").

    Data path: a frame the software NIC ran (``nic_malformed_<reason>``, or valid:
    ``nic_frames`` less the frames the data path runs again itself: parked messages and the
    guaranteed plane's deliveries), a telemetry probe, a frame of a reliable stream handed
    to the guaranteed plane, an admin frame the inbox had no room for. Client port: a frame
    from a peer without a session; the control agent's admin frames: malformed, no session,
    logins (accepted, repeated, refused by reason), handled for a session. Fabric port: from
    an address that is no neighbour, off its path, forwarded in transit, a duplicate copy;
    admin frames rejected by the authentication (by reason) or accepted; plain DATA frames
    (fabric) and a password session's frames (client) refused by the frame MAC."""
    r: dict[str, int] = {}
    for k, v in d.items():
        if k.startswith("malformed:"):
            r["nic_malformed_" + k[len("malformed:"):]] = v
    r["nic_valid_frames"] = (d.get("nic:frames", 0) - d.get("nic:malformed_frames", 0)
                             - d.get("c:parked_reruns", 0)
                             - d.get("c:guaranteed_delivery_frames", 0))
    for name in COUNTED["both"][2:] + COUNTED[port]:
        r[name] = d.get("c:" + name, 0)
    mac = "client_auth_" if port == "client" else "data_auth_"
    for reason in REFUSED_BY_MAC:
        r[mac + reason] = d.get("c:" + mac + reason, 0)
    if port == "client":
        for k, v in d.items():
            if k.startswith("c:control_login_refused_"):
                r[k[2:]] = v
    else:
        for k, v in d.items():
            if k.startswith("auth:"):
                r["auth_rejected_" + k[len("auth:"):]] = v
        r["auth_accepted"] = d.get("auth_accepted", 0)
    return {k: v for k, v in sorted(r.items()) if v}


# --- the fuzzer -------------------------------------------------------------------------------
Sent = tuple[str, bytes, bool, int]
"""A frame as sent: (source, frame, signed again by the neighbour, the fuzzer's session)."""


@dataclass
class CrashEvent:
    port: str
    what: str
    frames: list[Sent]
    """The frames sent at the port before the crash was seen, oldest first."""


@dataclass
class PortResult:
    port: str
    seconds: float = 0.0
    sent: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    received: int = 0
    kernel_drops: int = 0
    oversized: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    crashes: list[str] = field(default_factory=list)
    unaccounted: int = 0
    lost: int = 0
    settled: bool = True
    """Whether the counters stood still after the port's frames (else the figures may still
    have been moving when they were read)."""
    sender_waited_s: float = 0.0
    """Of ``seconds``, how long the sender was held for the appliance (its inbox nearly full,
    its socket's queue long): the appliance set the pace, not the sender."""

    def account(self, before: dict[str, int], after: dict[str, int]) -> None:
        """Fill in what the port's counters say between two ``Harness.settle()``s."""
        d = delta(before, after)
        self.received = d.get(f"in:{CLIENT_UDP if self.port == 'client' else FABRIC}", 0)
        self.kernel_drops = d.get(f"kernel_drops:{self.port}", 0)
        self.oversized = d.get(f"oversized:{self.port}", 0)
        self.reasons = accounting(self.port, d)
        self.unaccounted = self.received - sum(self.reasons.values())
        self.lost = self.sent - self.received - self.kernel_drops - self.oversized

    def as_dict(self) -> dict[str, Any]:
        return {"sent": self.sent, "by_source": self.by_source, "seconds": round(self.seconds, 1),
                "frames_per_s": round(self.sent / self.seconds) if self.seconds else 0,
                "sender_waited_s": self.sender_waited_s,
                "received": self.received, "kernel_drops": self.kernel_drops,
                "oversized": self.oversized, "accounted": sum(self.reasons.values()),
                "unaccounted": self.unaccounted, "lost_between_send_and_channel": self.lost,
                "settled": self.settled,
                "reasons": self.reasons, "crashes": self.crashes}


def _crash_text(old: tuple[int, int, str | None], new: tuple[int, int, str | None]) -> str:
    if new[2]:
        return f"thread stopped: {new[2]}"
    return f"handler raised: data path {new[0] - old[0]}, control {new[1] - old[1]}"


class Fuzzer:
    """Runs the sender process at each port and watches the appliance meanwhile (see the
    module docstring)."""

    def __init__(self, harness: Harness, seed: int) -> None:
        self.h = harness
        self.seed = seed
        self.crashes: list[CrashEvent] = []
        self.crash_seen = harness.crash_state()
        self.proc: subprocess.Popen | None = None
        self.last_recent: tuple[str, list[Sent]] = ("", [])

    def late_check(self, result: PortResult) -> bool:
        """A crash after the last port's frames (a timer): triaged with its frames."""
        state = self.h.crash_state()
        if state != self.crash_seen:
            what = "after the frames: " + _crash_text(self.crash_seen, state)
            self.crashes.append(CrashEvent(result.port, what, self.last_recent[1]))
            result.crashes.append(what)
            self.crash_seen = state
        return state[2] is not None

    def check(self, port: str, result: PortResult) -> bool:
        """Record a crash seen since the last check (with the sender's recent frames); True
        when an agent thread stopped."""
        state = self.h.crash_state()
        if state != self.crash_seen:
            what = _crash_text(self.crash_seen, state)
            frames = self._ask("dump").get("recent", []) if self.proc is not None else []
            self.crashes.append(CrashEvent(port, what, _sent_of(frames)))
            result.crashes.append(what)
            self.crash_seen = state
        return state[2] is not None

    # --- the sender process ---------------------------------------------------------------------
    def _start(self, port: str) -> None:
        h = self.h
        sources = ("anon", "session") if port == "client" else ("neighbour", "stranger")
        fds = {name: h.socks[name].fileno() for name in sources}
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz.sender"], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     pass_fds=list(fds.values()), env=env)
        settings = {"port": port, "seed": self.seed + (0 if port == "client" else 1),
                    "fds": fds, "dest": {n: list(h.dest[n]) for n in sources},
                    "appliance_id": h.node_id, "sid": h.sid,
                    "auth": [h.auth.epoch, h.auth._seq],
                    "target_port": h.client_port if port == "client" else h.fabric_port}
        self._tell(json.dumps(settings))
        ready = select.select([self.proc.stdout], [], [], SENDER_START_TIMEOUT_S)[0]
        if not ready or not self.proc.stdout.readline():
            raise RuntimeError(f"the sender process did not start (exit status "
                               f"{self.proc.poll()})")

    def _tell(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((line + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def _ask(self, command: str) -> dict[str, Any]:
        """The sender's answer (one JSON line) to ``command``."""
        assert self.proc is not None and self.proc.stdout is not None
        self._tell(command)
        ready = select.select([self.proc.stdout], [], [], SENDER_START_TIMEOUT_S)[0]
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            raise RuntimeError(f"the sender process did not answer {command!r} "
                               f"(exit status {self.proc.poll()})")
        return json.loads(line)

    def _stop(self) -> dict[str, Any]:
        try:
            return self._ask("stop")
        finally:
            assert self.proc is not None
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def run_port(self, port: str, seconds: float) -> PortResult:
        h = self.h
        result = PortResult(port)
        if port == "client" and not h.session_alive():
            h.login(wait_s=10)
        if port == "fabric":
            h.neighbour_hello(full=True)
        before = h.settle()
        self.check(port, result)
        sent0 = h.sent[port]
        self._start(port)
        progress(f"{port} port: sending for {seconds:g} s")
        start = time.monotonic()
        deadline = start + seconds
        next_tick = 0.0
        paused = False
        sid = h.sid
        try:
            while time.monotonic() < deadline:
                inbox = len(h.app.dataplane.inbox)
                if not paused and inbox > PACE_INBOX:
                    self._tell("pause")
                    paused = True
                elif paused and inbox < PACE_INBOX // 2:
                    self._tell("go")
                    paused = False
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + 0.1
                    if self.proc is not None and self.proc.poll() is not None:
                        raise RuntimeError(f"the sender process ended ({self.proc.returncode})")
                    h.poll_replies()
                    if self.check(port, result):
                        break
                    if port == "client" and not h.session_alive():
                        h.login()
                    if h.sid != sid:
                        sid = h.sid
                        self._tell(f"sid {sid}")
                time.sleep(0.001)
            result.seconds = time.monotonic() - start
        finally:
            done = self._stop()
        h.auth.epoch, h.auth._seq = done["auth"]  # the neighbour's sequence goes on from it
        by_source = done["sent"]
        result.sender_waited_s = done.get("waited_s", 0.0)
        h.sent[port] += sum(by_source.values())
        progress(f"{port} port: {sum(by_source.values()):,} frames sent in "
                 f"{result.seconds:.1f} s; waiting for the appliance to handle them")
        t = time.monotonic()
        after = h.settle()
        result.settled = h.settled
        if h.app.failure() is not None:
            progress(f"{port} port: the appliance stopped")
        else:
            progress(f"{port} port: handled in {time.monotonic() - t:.1f} s more"
                     + ("" if h.settled else " (its counters still moved: not settled)"))
        recent = _sent_of(done["recent"])
        state = h.crash_state()
        if state != self.crash_seen:
            what = _crash_text(self.crash_seen, state)
            self.crashes.append(CrashEvent(port, what, recent))
            result.crashes.append(what)
            self.crash_seen = state
        result.sent = h.sent[port] - sent0
        result.by_source = by_source
        result.account(before, after)
        self.last_recent = (port, recent)
        return result


def progress(text: str) -> None:
    """A line on stderr (stdout is the summary's)."""
    print(f"fuzz live: {text}", file=sys.stderr, flush=True)


def _sent_of(frames: list[list[Any]]) -> list[Sent]:
    return [(s, bytes.fromhex(f), bool(g), int(sid)) for s, f, g, sid in frames]


def run_live(seconds: float, ports: list[str], seed: int, triage: bool = True,
             save: bool = True) -> dict[str, Any]:
    """Fuzz ``ports`` of a fresh appliance for ``seconds`` each; the summary (module
    docstring)."""
    t0 = time.monotonic()
    h = Harness()
    summary: dict[str, Any] = {"seed": seed, "seconds_per_port": seconds, "ports": {}}
    fuzzer = Fuzzer(h, seed)
    results: list[PortResult] = []
    try:
        h.login(wait_s=10)
        problem = h.round_trip()  # compiles what a client's traffic needs before the clock
        if problem is not None:
            raise RuntimeError(f"the appliance does not serve a client before fuzzing: {problem}")
        for port in ports:
            results.append(fuzzer.run_port(port, seconds))
            if h.crash_state()[2]:
                break
        time.sleep(REPLAY_LINGER_S)  # timers that act on what the frames left run
        stopped = fuzzer.late_check(results[-1])
        summary["appliance_running"] = not stopped
        summary["round_trip"] = (h.round_trip() or "ok") if not stopped else "not tried"
        fuzzer.late_check(results[-1])
        summary["registry_keys"] = len(h.app.control.registry)
        summary["auth_windows"] = len(h.app.control.auth._windows)
        summary["sessions"] = len(h.app.control.sessions)
    finally:
        h.close()
    summary["ports"] = {r.port: r.as_dict() for r in results}
    saved = []
    if triage:
        for event in fuzzer.crashes[:3]:
            saved += triage_crash(event, save)
    summary["crashes"] = max(len(fuzzer.crashes), int(not summary.get("appliance_running")))
    summary["unaccounted"] = sum(abs(r.unaccounted) + abs(r.lost) for r in results)
    summary["saved_to_corpus"] = saved
    summary["total_seconds"] = round(time.monotonic() - t0, 1)
    summary["ok"] = (summary["crashes"] == 0 and summary["unaccounted"] == 0
                     and summary["round_trip"] == "ok")
    return summary


def verdict(summary: dict[str, Any]) -> str:
    """One line saying whether the run passed and, if not, what failed where (printed last,
    so a log cut short by its length still says it)."""
    if summary["ok"]:
        return f"fuzz live: seed {summary['seed']}: passed"
    problems = []
    if not summary.get("appliance_running", False):
        problems.append("the appliance stopped")
    for port, r in summary["ports"].items():
        if r["crashes"]:
            problems.append(f"{port} port: {len(r['crashes'])} crash(es): {r['crashes'][0]}")
        if r["unaccounted"] or r["lost_between_send_and_channel"]:
            problems.append(
                f"{port} port: {r['unaccounted']} frame(s) received but under no counter, "
                f"{r['lost_between_send_and_channel']} sent but neither received nor dropped "
                f"by the kernel (settled: {r['settled']})")
    if summary.get("round_trip") != "ok":
        problems.append(f"the client round trip after fuzzing: {summary.get('round_trip')}")
    if summary.get("saved_to_corpus"):
        problems.append(f"saved to the corpus: {', '.join(summary['saved_to_corpus'])}")
    return (f"fuzz live: seed {summary['seed']}: FAILED: " + "; ".join(problems or ["see above"])
            + f" (repeat with --seed {summary['seed']})")


# --- triage and replay ------------------------------------------------------------------------
REPLAY_LINGER_S = 2.5
"""How long a replay watches an idle appliance after its last frame: timers that act on what
the frames left (the reliable receivers' recovery bound is 2 s) run meanwhile."""


def replay(h: Harness, frames: list[Sent], linger_s: float = REPLAY_LINGER_S
           ) -> tuple[int, int, str | None]:
    """Send ``frames`` to a harness whose session is logged in and whose neighbour is up;
    the crash state once they are handled (or at the first crash). A session frame that
    claims the session it was sent for claims the harness's session instead; a frame that
    was signed again is signed again (a new auth sequence); the neighbour keeps sending
    heartbeats while fabric frames are replayed, as while fuzzing."""
    fabric = any(h.port_of[f[0]] == "fabric" for f in frames)
    next_hello = 0.0
    for source, frame, signed, session in frames:
        if fabric and time.monotonic() >= next_hello:
            next_hello = time.monotonic() + 0.1
            h.neighbour_hello()
        if h.app.failure() is not None:
            break
        if source == "session" and session:
            frame = claim_session(frame, h.sid, session)
        if signed:
            frame = h.resign(frame)
        while (proc_udp(h.dest[source][1])[0] > PACE_RX_BYTES
               or len(h.app.dataplane.inbox) > PACE_INBOX) and h.app.failure() is None:
            time.sleep(0.0005)
        h.send(source, frame)
    before = h.crash_state()
    deadline = time.monotonic() + 20
    quiet_since = None
    while time.monotonic() < deadline:  # until it crashed, or all is handled and lingered
        state = h.crash_state()
        if state != before or state[2]:
            break
        if fabric and time.monotonic() >= next_hello:
            next_hello = time.monotonic() + 0.1
            h.neighbour_hello()
        busy = proc_udp(h.client_port)[0] or proc_udp(h.fabric_port)[0] or h.app.dataplane.inbox
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > linger_s:
            break
        time.sleep(0.02)
    return h.crash_state()


def frames_of(entry: dict[str, Any]) -> list[Sent]:
    """The frames of a ``live`` corpus entry (corpus.py)."""
    return [(f["source"], bytes.fromhex(f["hex"]), bool(f.get("signed")), int(f.get("session", 0)))
            for f in entry["frames"]]


def fresh_harness() -> Harness:
    h = Harness()
    h.login(wait_s=10)
    h.neighbour_hello(full=True)
    time.sleep(0.3)
    h.neighbour_hello(full=True)
    return h


def _crashes(frames: list[Sent]) -> bool:
    h = fresh_harness()
    try:
        before = h.crash_state()
        return replay(h, frames) != before
    finally:
        h.close()


TRIAGE_BUDGET_S = 240.0
"""Time one crash's triage may take (each try starts a fresh appliance)."""


def minimize(frames: list, crashes: Any, budget_s: float = TRIAGE_BUDGET_S) -> list:
    """A shorter list of ``frames`` that still ``crashes`` (a predicate): halves first, then
    chunks of a quarter, an eighth, ... down to single frames removed while it still crashes
    (delta debugging without its complements), until the budget is spent."""
    deadline = time.monotonic() + budget_s
    while len(frames) > 1 and time.monotonic() < deadline:
        half = len(frames) // 2
        if crashes(frames[half:]):
            frames = frames[half:]
        elif crashes(frames[:half]):
            frames = frames[:half]
        else:
            break
    chunk = max(1, len(frames) // 4)
    while len(frames) > 1 and time.monotonic() < deadline:
        i = 0
        removed = False
        while i < len(frames) and time.monotonic() < deadline:
            trial = frames[:i] + frames[i + chunk:]
            if trial and crashes(trial):
                frames = trial
                removed = True
            else:
                i += chunk
        if chunk == 1 and not removed:
            break
        chunk = max(1, chunk // 2)
    return frames


def triage_crash(event: CrashEvent, save: bool, budget_s: float = TRIAGE_BUDGET_S) -> list[str]:
    """Find the frames of ``event`` that crash a fresh appliance (``minimize``); save them
    (one frame, or the few a crash needs together)."""
    progress(f"triage: replaying the {len(event.frames):,} {event.port} port frames sent "
             f"before: {event.what}")
    if not _crashes(event.frames):
        progress("triage: a fresh appliance did not crash on them (timing or state); nothing "
                 "saved")
        return []
    frames = minimize(event.frames, _crashes, budget_s)
    progress(f"triage: {len(frames)} frame(s) of them crash a fresh appliance")
    if not save:
        return []
    entry = {"target": "live", "port": event.port, "note": event.what,
             "frames": [{"source": s, "hex": f.hex(), "signed": g, "session": sid}
                        for s, f, g, sid in frames]}
    return [str(corpus.save(entry))]
