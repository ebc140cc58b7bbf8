"""``topicwire bench idle``: what an idle appliance costs, CPU over a window read from /proc.

Three processes measured side by side in one run, each idle for ``--seconds`` (medians over
``--repeats``): ``topicwire`` (one ``topicwire run``, no clients, no neighbours),
``topicwire_busy_fabric`` (the same appliance with two neighbours and a client of its own
that is logged in, subscribed and silent: heartbeats, link state and the client's session
timers only) and the baseline ``c_relay`` (bench/c/udp_relay.c, the fabric benchmark's
relay: a process blocked in recvmmsg, what idle costs when nothing runs). The figure is
``cpu_percent``: user plus system time of the process over the window, as a percentage of
one core. Goal: an idle appliance under 1 % of a core.
"""

from __future__ import annotations

import argparse
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.procstat import appliance_cpu_seconds
from bench.report import build_report, positive_int, progress
from datapath.config import BENCH_REPEATS
from datapath.errors import DeviceError, UserError

NAME = "idle"
HELP = ("CPU of an idle appliance (alone, and with neighbours and a silent client) vs an idle "
        "C relay")
IDLE_SECONDS = 10.0
"""Length of each measured window (``--seconds``)."""
SETTLE_S = 2.0
"""After start (and after the client subscribed), this long before the window opens."""
READY_TIMEOUT_S = 60.0
LOOPBACK = "127.0.0.1"
_COMPONENT = "bench"
_CLI = "import sys; from appliance.ops.cli import main; sys.exit(main(sys.argv[1:]))"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=IDLE_SECONDS,
                        help=f"measured window per process (default {IDLE_SECONDS:g})")
    parser.add_argument("--repeats", type=positive_int, default=BENCH_REPEATS)


def _port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def cpu_percent(pid: int, seconds: float) -> float:
    """CPU of process ``pid`` (with its data path's process, when it is an appliance) over
    ``seconds``, in percent of one core."""
    before = appliance_cpu_seconds(pid)
    started = time.monotonic()
    time.sleep(seconds)  # the measured window itself: the process is left alone in it
    return 100.0 * (appliance_cpu_seconds(pid) - before) / (time.monotonic() - started)


def _appliance(workdir: Path, name: str, fabric: dict[str, int], neighbours: list[str],
               key: str, udp: int | None) -> subprocess.Popen:
    lines = ["[appliance]", f'name = "{name}"', "[fabric]",
             f'listen = "{LOOPBACK}:{fabric[name]}"', f'key = "{key}"']
    for other in neighbours:
        lines += ["[[neighbours]]", f'name = "{other}"',
                  f'address = "{LOOPBACK}:{fabric[other]}"']
    if udp is not None:
        lines += ["[clients]", f'udp = "{LOOPBACK}:{udp}"', "[pm]", "anonymous = true",
                  "require_passwords = false"]
    else:
        lines += ["[pm]", 'mode = "remote"'] if neighbours else []
    lines += ["[log]", 'level = "warning"']
    config = workdir / f"{name}.toml"
    config.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([sys.executable, "-c", _CLI, "run", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + READY_TIMEOUT_S
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if " ready" in line:
            return proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise DeviceError(f"the appliance {name} did not start: {proc.stderr.read()[-2000:]}",
                      component=_COMPONENT)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure_alone(workdir: Path, seconds: float) -> float:
    key = secrets.token_hex(32)
    proc = _appliance(workdir, "idle", {"idle": _port()}, [], key, None)
    try:
        time.sleep(SETTLE_S)
        return cpu_percent(proc.pid, seconds)
    finally:
        _stop(proc)


def measure_with_fabric(workdir: Path, seconds: float) -> float:
    from appliance.client import connect

    key = secrets.token_hex(32)
    fabric = {n: _port() for n in ("a", "b", "c")}
    udp = _port()
    procs = [_appliance(workdir, "a", fabric, ["b", "c"], key, udp),
             _appliance(workdir, "b", fabric, ["a"], key, None),
             _appliance(workdir, "c", fabric, ["a"], key, None)]
    try:
        with connect(f"udp://{LOOPBACK}:{udp}", "idle-client") as client:
            client.subscribe("idle/#")
            time.sleep(SETTLE_S)
            return cpu_percent(procs[0].pid, seconds)
    finally:
        for proc in procs:
            _stop(proc)


def measure_relay(seconds: float) -> float:
    from bench.fabric import build_relay

    relay = build_relay()
    proc = subprocess.Popen([str(relay), "0", LOOPBACK, str(_port())], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        if not proc.stdout.readline().startswith("READY"):
            raise DeviceError("the C relay did not start", component=_COMPONENT)
        time.sleep(SETTLE_S)
        return cpu_percent(proc.pid, seconds)
    finally:
        _stop(proc)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not 0 < args.seconds <= 3600:
        raise UserError("--seconds must be in (0, 3600]", component=_COMPONENT)
    runs: dict[str, list[float]] = {"topicwire": [], "topicwire_busy_fabric": [],
                                    "c_relay": []}
    with tempfile.TemporaryDirectory(prefix="tw-bench-idle-") as tmp:
        for repeat in range(args.repeats):
            progress(NAME, f"repeat {repeat + 1}/{args.repeats}")
            runs["topicwire"].append(measure_alone(Path(tmp), args.seconds))
            runs["topicwire_busy_fabric"].append(measure_with_fabric(Path(tmp), args.seconds))
            runs["c_relay"].append(measure_relay(args.seconds))
    results = {name: {"cpu_percent": statistics.median(values)} for name, values in runs.items()}
    params = {"seconds": args.seconds, "repeats": args.repeats, "runs": runs,
              "goal": "topicwire cpu_percent < 1 (of one core)",
              "topicwire_busy_fabric": "the appliance with two neighbours and one logged-in, "
                                       "subscribed, silent client"}
    return build_report(NAME, params, results)
