"""``topicwire bench channel --kind rdma``: the RDMA channel between two processes vs perftest.

The two ends are the soft-RoCE pair ``hwtests/guest/provision.sh --devices`` makes (rxe0 on
192.168.200.1, rxe1 on 192.168.200.2; ``--rdma-pair`` names others): this process accepts on
the first address, a forked child connects from the second. The child is forked, not started
anew: in the emulated guest a new Python spends a minute importing numpy and numba.

- throughput (``msgs_per_s``): as for the other kinds (``bench.channel_loops.send_all``): frames of
  ``--size`` bytes in batches of ``--batch``; the channel packs a batch into one RDMA SEND.
  Baseline ``ib_send_bw`` (perftest): one message of ``--size`` bytes per RDMA SEND, its
  ``MsgRate``, ``--messages`` iterations.
- latency (``p50_us``/``p99_us``/``p999_us``): ping-pong of one frame, half the round trip
  (``bench.channel_loops.ping_pong``). Baseline ``ib_send_lat``: also half the round trip of a
  send ping-pong (its ``t_typical`` is the median), same size, in C with no Python.

perftest runs on the same two devices, GID indexes and size in the same session, right after
each repeat of the channel's own runs. Medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import re
import shutil
import statistics
import subprocess
import time
import traceback
from typing import Any

from bench.report import build_report, progress
from datapath.errors import DeviceError, UserError

RDMA_PAIR = ("192.168.200.1", "192.168.200.2")
"""(accepting end, connecting end): the veth pair of hwtests/guest/provision.sh."""
PERFTEST_PORT = 18_515
PERFTEST_LAT_ITERATIONS = 10_000
PERFTEST_TIMEOUT_S = 300
PERFTEST_TRIES = 3
"""perftest's clock calibration fails now and then under emulation: it is run again."""
SERVER_START_S = 60.0
"""Longest wait for the perftest server to listen before its client starts."""
CHILD_WAIT_S = 600.0
RECEIVE_IDLE_END_S = 60.0
"""The throughput receiver gives up after this long without a frame (the other kinds: 0.5 s,
for UDP's losses; a busy host can hold an emulated CPU back for that long)."""
_COMPONENT = "bench"
_HEADER_WORD = re.compile(r"(?:BW |[\d.]+% )?\S+")
"""A column of perftest's header: ``t_typical[usec]``, ``99% percentile[usec]``,
``BW average[MB/sec]`` (some hold a space, and columns are one space apart at times)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options only ``--kind rdma`` reads."""
    parser.add_argument("--rdma-pair", type=_pair, default=RDMA_PAIR, metavar="LISTEN,CONNECT",
                        help="IPv4 addresses of the two RDMA ends (default: the soft-RoCE "
                             "veth pair of hwtests/guest/provision.sh)")


def _pair(text: str) -> tuple[str, str]:
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError("give two IPv4 addresses: LISTEN,CONNECT")
    return parts[0].strip(), parts[1].strip()


# --- the two ends -------------------------------------------------------------------------

def _ends(args: argparse.Namespace) -> tuple[Any, Any]:
    """(port/GID of the accepting end, of the connecting end), or a clear error."""
    from channels import _rdma_verbs as verbs
    from channels.rdma import RdmaDeviceError, rdma_available

    here, why = rdma_available()
    if not here:
        raise DeviceError(f"{why}; `make bench-rdma` runs this benchmark in a soft-RoCE VM",
                          component=_COMPONENT)
    try:
        return tuple(verbs.choose_port_gid(address) for address in args.rdma_pair)
    except RdmaDeviceError as exc:
        raise DeviceError(f"{exc} (--rdma-pair {','.join(args.rdma_pair)}; "
                          "hwtests/guest/provision.sh --devices makes the default pair)",
                          component=_COMPONENT) from None


def _child(target: Any, address: tuple, bind: str, args: argparse.Namespace,
           pipe: Any) -> None:
    """Forked child: connect, run ``target(channel, args)``, send its result (or the error)."""
    from channels.rdma import RdmaChannel

    try:
        with RdmaChannel(connect=address, bind=bind) as channel:
            pipe.send(target(channel, args))
    except BaseException:
        pipe.send({"error": traceback.format_exc()})


def _count(channel: Any, args: argparse.Namespace) -> dict:
    from bench.channel_loops import count_frames
    from channels.base import FrameBatch

    # RC loses nothing, so no gap means the end: a long one is an emulated CPU not scheduled
    return count_frames(channel, FrameBatch(args.batch, max(args.size, 64)), args.messages,
                        idle_end_ns=int(RECEIVE_IDLE_END_S * 1e9))


def _echo(channel: Any, args: argparse.Namespace) -> dict:
    from bench.channel_loops import BENCH_BATCH_FRAMES, echo
    from channels.base import FrameBatch

    return echo(channel, FrameBatch(BENCH_BATCH_FRAMES, max(args.size, 64)), None,
                args.idle == "spin")


def _with_child(target: Any, args: argparse.Namespace, work: Any) -> tuple[Any, dict]:
    """Accept a forked child's channel, run ``work(channel)`` here, collect the child's
    result: (what ``work`` returned, the child's dict)."""
    from channels.rdma import RdmaListener

    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    listen, connect = args.rdma_pair
    with RdmaListener((listen, 0)) as listener:
        proc = ctx.Process(target=_child, args=(target, listener.address, connect, args,
                                                theirs), daemon=True)
        proc.start()
        theirs.close()  # the child's end: EOF here if the child dies
        try:
            channel = listener.accept(timeout_ns=int(CHILD_WAIT_S * 1e9))
        except BaseException:
            proc.kill()
            raise
    try:
        with channel:
            mine = work(channel)
            try:
                if not ours.poll(CHILD_WAIT_S):
                    raise EOFError
                theirs_result = ours.recv()
            except EOFError:
                raise DeviceError(f"the benchmark's RDMA child did not answer (exit code "
                                  f"{proc.exitcode})", component=_COMPONENT) from None
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    if "error" in theirs_result:
        raise DeviceError(f"the benchmark's RDMA child failed:\n{theirs_result['error']}",
                          component=_COMPONENT)
    return mine, theirs_result


def measure_throughput(args: argparse.Namespace) -> dict[str, float]:
    from bench.channel_loops import send_all, throughput_figures

    (sent, start, elapsed), got = _with_child(_count, args,
                                              lambda ch: send_all(ch, None, args))
    return throughput_figures(sent, start, elapsed, got)


def measure_latency(args: argparse.Namespace) -> dict[str, float]:
    from bench.channel_loops import WARMUP_PINGS, latency_figures, ping_pong

    warmup = min(WARMUP_PINGS, 100)  # fewer under emulation: each ping is slow
    histogram, child = _with_child(_echo, args,
                                   lambda ch: ping_pong(ch, None, args, warmup=warmup))
    return latency_figures(histogram, child)


# --- perftest -----------------------------------------------------------------------------

def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise UserError(f"{name} is not installed; `make setup` installs it (Debian package "
                        "perftest)", component=_COMPONENT)
    return path


def perftest_table(output: str) -> dict[str, float]:
    """The result row of a perftest report: {column header: value}."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("#bytes"):
            header = _HEADER_WORD.findall(line)
            for row in lines[i + 1:]:
                values = row.split()
                if len(values) == len(header) and values[0].isdigit():
                    return dict(zip(header, map(float, values)))
    raise DeviceError(f"perftest printed no result row:\n{output[-1500:]}",
                      component=_COMPONENT)


def _listening(port: int) -> bool:
    """Is a TCP socket listening on ``port`` here (/proc/net/tcp, tcp6)?"""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def run_perftest(tool: str, ends: tuple, size: int, iterations: int, server_address: str,
                 need: tuple[str, ...]) -> dict[str, float]:
    """Server on the accepting end's device, client on the other; the client's result row,
    whose ``need`` columns must be finite and positive (else the run counts as failed)."""
    exe = _tool(tool)
    server_end, client_end = ends
    common = ["-s", str(size), "-n", str(iterations), "-F", "-p", str(PERFTEST_PORT)]
    failures = []
    for _ in range(PERFTEST_TRIES):
        server = subprocess.Popen([exe, "-d", server_end.device, "-x", str(server_end.gid_index),
                                   *common], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        try:
            deadline = time.monotonic() + SERVER_START_S
            while not _listening(PERFTEST_PORT) and server.poll() is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            client = subprocess.run([exe, "-d", client_end.device, "-x",
                                     str(client_end.gid_index), *common, server_address],
                                    capture_output=True, text=True, timeout=PERFTEST_TIMEOUT_S)
            if client.returncode != 0:  # the server would wait for a client for ever
                server.kill()
            server_out, _ = server.communicate(timeout=PERFTEST_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            failures.append(f"{tool} did not finish in {PERFTEST_TIMEOUT_S} s")
            continue
        finally:
            if server.poll() is None:
                server.kill()
                server.communicate()
        output = client.stdout + client.stderr
        if client.returncode == 0 and server.returncode == 0:
            row = perftest_table(output)
            bad = [k for k in need if not (math.isfinite(row.get(k, math.nan)) and row[k] > 0)]
            if not bad:
                return row
            # perftest's cycle-counter calibration fails now and then under emulation
            failures.append(f"{', '.join(bad)} not a positive number: {output[-600:]}")
            continue
        failures.append(f"client exit {client.returncode}: {output[-600:]}\n"
                        f"server exit {server.returncode}: {server_out[-600:]}")
    raise DeviceError(f"{tool} failed {PERFTEST_TRIES} times:\n" + "\n".join(failures),
                      component=_COMPONENT)


def measure_perftest(args: argparse.Namespace, ends: tuple) -> dict[str, dict[str, float]]:
    """ib_send_lat and ib_send_bw at ``args.size``, under the project's metric names."""
    server_address = args.rdma_pair[0]
    lat_columns = ("t_typical[usec]", "99% percentile[usec]", "99.9% percentile[usec]")
    lat = run_perftest("ib_send_lat", ends, args.size, PERFTEST_LAT_ITERATIONS, server_address,
                       lat_columns)
    bw = run_perftest("ib_send_bw", ends, args.size, args.messages, server_address,
                      ("MsgRate[Mpps]",))
    return {"ib_send_lat": dict(zip(("p50_us", "p99_us", "p999_us"),
                                    (lat[c] for c in lat_columns))),
            "ib_send_bw": {"msgs_per_s": bw["MsgRate[Mpps]"] * 1e6}}


# --- the report ---------------------------------------------------------------------------

def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure the RDMA channel and perftest ``--repeats`` times each; medians."""
    import channels
    from channels import rdma

    if args.duration_s <= 0:
        raise UserError("--duration-s must be positive", component=_COMPONENT)
    _tool("ib_send_lat"), _tool("ib_send_bw")
    ends = _ends(args)
    channels.warm_up()
    rdma.warm_up()
    ours: list[dict[str, float]] = []
    lat: list[dict[str, float]] = []
    bw: list[dict[str, float]] = []
    for repeat in range(args.repeats):
        progress("channel", f"rdma repeat {repeat + 1}/{args.repeats}: channel throughput")
        figures = measure_throughput(args)
        progress("channel", "channel latency")
        figures.update(measure_latency(args))
        ours.append(figures)
        progress("channel", "perftest ib_send_lat, ib_send_bw")
        baselines = measure_perftest(args, ends)
        lat.append(baselines["ib_send_lat"])
        bw.append(baselines["ib_send_bw"])
    params = {"kind": "rdma", "size": args.size, "messages": args.messages,
              "batch": args.batch, "duration_s": args.duration_s, "repeats": args.repeats,
              "idle": args.idle, "devices": [e.device for e in ends],
              "gid_indexes": [e.gid_index for e in ends],
              "baseline": "perftest ib_send_lat (-n "
                          f"{PERFTEST_LAT_ITERATIONS}) and ib_send_bw (-n {args.messages}) on "
                          "the same devices, GIDs and size, same session",
              "note": "the channel packs a batch of frames into one RDMA SEND; ib_send_bw "
                      "sends one message per RDMA SEND. Latency: half round trips of one "
                      "frame (ib_send_lat: t_typical, its median)"}
    return build_report("channel", params, {"topicwire": _medians(ours),
                                            "ib_send_lat": _medians(lat),
                                            "ib_send_bw": _medians(bw)})
