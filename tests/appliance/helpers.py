"""Helpers of the appliance tests: free ports, config files, appliance processes."""

from __future__ import annotations

import contextlib
import os
import random
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "tests.appliance.twcli"]
FABRIC_KEY = "11" * 32
READY_TIMEOUT_S = 60.0


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


_FREE_PORTS_FROM = 10_000
_handed_out: set[int] = set()
_port_choice = random.Random(os.getpid() ^ time.time_ns())


def _bindable(port: int) -> bool:
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A port free for UDP and TCP on loopback, below the kernel's ephemeral range.

    A port the kernel handed out for port 0 and that was closed again can be handed to the
    next socket that binds port 0 (a client socket of the same test), before the appliance
    binds it: a clean-clone run failed with 'clients.udp ... in use' that way. Ports below the
    ephemeral range are never handed out for port 0, and this process never gives one out
    twice."""
    lo, _ = _ephemeral_range()
    top = lo if lo > _FREE_PORTS_FROM + 1_000 else 65_536
    for _ in range(10_000):
        port = _port_choice.randrange(_FREE_PORTS_FROM, top)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    raise RuntimeError("tests: no free loopback port below the ephemeral range")


def udp_url(app) -> str:
    """The ``udp://HOST:PORT`` clients of an in-process ``Appliance`` connect to."""
    host, port = app.config.clients_udp
    return f"udp://{host}:{port}"


def counter(app, name: str) -> int:
    """One counter of an in-process ``Appliance``'s status (0 until it counted)."""
    return int(app.status()["counters"].get(name, 0))


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def production_env() -> dict[str, str]:
    """This environment without the tests' numba settings (bounds checks, their own cache):
    a process started with it loads the cache ``topicwire warm`` filled, as a user's does."""
    return {k: v for k, v in os.environ.items()
            if k not in ("NUMBA_BOUNDSCHECK", "NUMBA_CACHE_DIR")}


def start(argv: list[str], prefix: list[str] | None = None,
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a process (optionally inside a namespace: ``prefix``) from the repository root."""
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    return subprocess.Popen([*(prefix or []), *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def wait_ready(proc: subprocess.Popen, timeout_s: float = READY_TIMEOUT_S) -> str:
    """Wait for the appliance's ``ready`` line; fail with its stderr if it exits first."""
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if " ready" in line:
                return line
        if proc.poll() is not None:
            raise AssertionError(f"appliance exited with {proc.returncode}: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
    raise AssertionError("appliance not ready in time")


def run_appliance(config: Path, prefix: list[str] | None = None,
                  env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = start([*CLI, "run", "--config", str(config)], prefix, env)
    wait_ready(proc)
    return proc


def stop(proc: subprocess.Popen, timeout_s: float = 20.0) -> int:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return proc.returncode


def wait_for(predicate, timeout_s: float = 20.0, interval_s: float = 0.05, what: str = ""):
    """Poll ``predicate`` until it returns something truthy; return it (or fail, saying
    ``what`` was awaited)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what or 'condition'} not met within {timeout_s} s")
        time.sleep(interval_s)


@contextlib.contextmanager
def appliance_pair(identities: dict, *, dataplane: str = "thread",
                   namespaces: tuple[int, ...] = (0,), schemas: dict | None = None):
    """Two appliances in this process, neighbours over UDP on loopback, A with the embedded
    P&M (``identities``, no passwords, ``namespaces`` declared, ``schemas``), B asking it;
    yields (a, b, url of A's clients, url of B's) once they have met."""
    from appliance.config import parse_config
    from appliance.node import Appliance

    fa, fb, ca, cb = free_port(), free_port(), free_port(), free_port()
    common = {"heartbeat_interval_ms": 100, "lsa_refresh_ms": 1_000, "dataplane": dataplane}
    a = Appliance(parse_config({
        "appliance": {"name": f"pa{fa}", "namespaces": list(namespaces), **common},
        "fabric": {"listen": f"127.0.0.1:{fa}", "key": FABRIC_KEY},
        "neighbours": [{"name": f"pb{fb}", "address": f"127.0.0.1:{fb}"}],
        "clients": {"udp": f"127.0.0.1:{ca}"},
        "pm": {"require_passwords": False, "identities": identities,
               **({"schemas": schemas} if schemas else {})}})).start()
    b = Appliance(parse_config({
        "appliance": {"name": f"pb{fb}", **common},
        "fabric": {"listen": f"127.0.0.1:{fb}", "key": FABRIC_KEY},
        "neighbours": [{"name": f"pa{fa}", "address": f"127.0.0.1:{fa}"}],
        "clients": {"udp": f"127.0.0.1:{cb}"}, "pm": {"mode": "remote"}})).start()
    try:
        wait_for(lambda: all(n["state"] == "up" for app in (a, b)
                             for n in app.status()["neighbours"])
                 and b.status()["node"]["pm"] is not None, 30, what="the appliances to meet")
        yield a, b, f"udp://127.0.0.1:{ca}", f"udp://127.0.0.1:{cb}"
    finally:
        b.stop()
        a.stop()


def subscription_reached(app, pattern: str) -> bool:
    """Whether ``app`` knows of a subscription to ``pattern`` made at another appliance."""
    return any(s["pattern"] == pattern and s["origin"] != app.config.name
               for s in app.status()["subscriptions"])


def until_marker(sub, last, timeout_s: float = 10.0) -> list:
    """Messages of subscription ``sub`` up to and including the first for which ``last``
    holds (a marker published after the rest: one publisher's messages on a topic arrive in
    order)."""
    out: list = []
    deadline = time.monotonic() + timeout_s
    while not out or not last(out[-1]):
        m = sub.get(timeout=max(deadline - time.monotonic(), 0))
        assert m is not None, f"the marker did not come within {timeout_s} s: {out}"
        out.append(m)
    return out
