"""``topicwire bench persist``: the persistence log's append and replay vs the raw disk.

For 64-byte and 1 KiB payloads and each fsync policy (``batch``: fsync at every commit;
``interval``: at most ``--interval-ms`` after the first unsynced write), ``topicwire``
appends ``--mib`` MiB of records to a fresh ``StreamLog`` (appliance/persistence) in
commits of ``--batch`` messages, as a producer that goes on while the interval policy's
fsync is due. ``raw_disk`` writes the same bytes per commit to a plain file in the same
directory with ``os.write``, and fsyncs with the same cadence (the same policy, decided at
the same points). Figures per payload size and policy: messages/s, bytes/s (records as
written: header, payload, padding) and the p99 of append-to-durable latency (from a
commit's first append to the fsync that covers it). Replay: the 64-byte log read back in
order with every record's CRC checked (``msgs_per_s`` of ``replay_64B``) vs reading the
same file's bytes with ``preadv`` (``raw_disk``). ``replay_pages_64B``: the cache's side of a
replay, ``--replay-messages`` messages of 64 B in a cache's log built into replay page
frames (log read, pattern match, encoding; no client); ``replay_end_to_end_64B``: a client's
``replay`` of them from an appliance with ``[cache]`` on 127.0.0.1 over UDP, every payload
compared (appliance and client in this process). Medians over ``--repeats``, the two
measured alternately, each repeat in fresh files, after one warm-up write and replay (not
counted: it compiles the kernels on a cold cache).

The directory (``--dir``, default the system's temporary directory) decides what is
measured: its filesystem type is in ``params``; on tmpfs fsync costs nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import build_report, positive_int, progress

NAME = "persist"
HELP = "persistence log append (per fsync policy) and replay vs raw disk writes and reads"
SIZES = (64, 1024)
POLICIES = ("batch", "interval")
REPEATS = 3
MIB = 16
REPLAY_MESSAGES = 200_000
BATCH = 256
INTERVAL_MS = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mib", type=positive_int, default=MIB,
                        help=f"MiB of records per measurement (default {MIB})")
    parser.add_argument("--batch", type=positive_int, default=BATCH,
                        help=f"messages per commit (default {BATCH})")
    parser.add_argument("--interval-ms", type=positive_int, default=INTERVAL_MS,
                        help=f"the interval policy's fsync interval (default {INTERVAL_MS})")
    parser.add_argument("--repeats", type=positive_int, default=REPEATS,
                        help=f"repeats (default {REPEATS})")
    parser.add_argument("--replay-messages", type=positive_int, default=REPLAY_MESSAGES,
                        help="messages of 64 B a client replays end to end from an "
                             f"appliance's cache (default {REPLAY_MESSAGES:,})")
    parser.add_argument("--dir", default=None,
                        help="directory for the files (default: the temporary directory)")


def _fs_type(path: Path) -> str:
    best, kind = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, fstype, *_ = line.split()
            if str(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
    except OSError:
        pass
    return kind


class _Durable:
    """Append-to-durable latencies: each commit's start waits for the sync covering it."""

    def __init__(self) -> None:
        self.waiting: list[tuple[int, int]] = []  # (start ns, last sequence)
        self.latencies_ns: list[int] = []

    def synced(self, durable: int, now_ns: int) -> None:
        while self.waiting and self.waiting[0][1] <= durable:
            self.latencies_ns.append(now_ns - self.waiting.pop(0)[0])

    def p99_us(self) -> float:
        return float(np.percentile(self.latencies_ns, 99)) / 1e3 if self.latencies_ns else 0.0


def _batches(size: int, mib: int, batch: int) -> tuple[np.ndarray, int]:
    record = 24 + (size + 7) // 8 * 8
    messages = max(batch, mib * (1 << 20) // record // batch * batch)
    payloads = np.random.default_rng(1).integers(0, 256, batch * size, dtype=np.uint8)
    return payloads, messages


def _ours(directory: Path, size: int, policy: str, args: argparse.Namespace) -> dict[str, float]:
    from appliance.persistence import LogConfig, StreamLog

    payloads, messages = _batches(size, args.mib, args.batch)
    offsets = np.arange(args.batch, dtype=np.int64) * size
    lengths = np.full(args.batch, size, np.int64)
    seqs = np.arange(1, messages + 1, dtype=np.uint64)  # made before the clock starts, as
    stamps = np.zeros(messages, np.uint64)  # the baseline's bytes are
    durable = _Durable()
    config = LogConfig(fsync=policy, fsync_interval_ms=args.interval_ms)
    with StreamLog(directory, config) as log:
        start = time.perf_counter_ns()
        for first in range(0, messages, args.batch):
            t0 = time.perf_counter_ns()
            part = slice(first, first + args.batch)
            stamps[part] = t0
            log.append_batch(seqs[part], stamps[part], payloads, offsets, lengths)
            durable.waiting.append((t0, first + args.batch))
            log.commit(time.monotonic_ns())
            durable.synced(log.durable_seq, time.perf_counter_ns())
        log.sync()
        elapsed = time.perf_counter_ns() - start
        durable.synced(log.durable_seq, time.perf_counter_ns())
        written = log.counters.appended_bytes
    return {"msgs_per_s": messages * 1e9 / elapsed, "bytes_per_s": written * 1e9 / elapsed,
            "p99_us": durable.p99_us()}


def _raw(directory: Path, size: int, policy: str, args: argparse.Namespace) -> dict[str, float]:
    """The same bytes per commit, written and fsynced with the same cadence."""
    record = 24 + (size + 7) // 8 * 8
    _, messages = _batches(size, args.mib, args.batch)
    data = np.random.default_rng(2).integers(0, 256, record * args.batch, dtype=np.uint8)
    view = memoryview(data)
    durable = _Durable()
    interval_ns = args.interval_ms * 1_000_000
    fd = os.open(directory / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter_ns()
        written_seq = synced_seq = 0
        dirty_since: int | None = None
        for _ in range(messages // args.batch):
            t0 = time.perf_counter_ns()
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
            written_seq += args.batch
            durable.waiting.append((t0, written_seq))
            now = time.monotonic_ns()
            if dirty_since is None:
                dirty_since = now
            if policy == "batch" or now - dirty_since >= interval_ns:
                os.fdatasync(fd)
                synced_seq, dirty_since = written_seq, None
            durable.synced(synced_seq, time.perf_counter_ns())
        os.fdatasync(fd)
        elapsed = time.perf_counter_ns() - start
        durable.synced(written_seq, time.perf_counter_ns())
    finally:
        os.close(fd)
    return {"msgs_per_s": messages * 1e9 / elapsed,
            "bytes_per_s": messages * record * 1e9 / elapsed, "p99_us": durable.p99_us()}


def _replay_ours(directory: Path) -> dict[str, float]:
    from appliance.persistence import StreamLog

    with StreamLog(directory) as log:
        start = time.perf_counter_ns()
        count = sum(len(batch) for batch in log.replay())
        elapsed = time.perf_counter_ns() - start
    return {"msgs_per_s": count * 1e9 / elapsed}


def _fill_cache(directory: Path, count: int) -> None:
    """A cache directory whose log of ``bench/#`` holds ``count`` messages of 64 B."""
    from appliance.cache.settings import CacheSettings
    from appliance.cache.store import CacheStore

    store = CacheStore(CacheSettings(directory, ("bench/#",)))
    try:
        payload = bytes(range(64))
        now = time.time_ns()
        for i in range(count):
            store.append("bench/x", 0, i + 1, 7, 1, 1, 0, 0, now + i, payload)
            if i % 4096 == 4095:
                store.commit()
        store.commit()
    finally:
        store.close()


def _rate(what: str, got: int, count: int, elapsed_ns: int) -> dict[str, float]:
    if got != count:
        raise RuntimeError(f"bench persist: {what} {got} of {count} messages")
    return {"msgs_per_s": count * 1e9 / elapsed_ns}


def _replay_pages(directory: Path, count: int) -> dict[str, float]:
    """The cache's side of a replay alone: every page of ``directory``'s log built into page
    frames (``CacheStore.page``: log read, CRC checked, pattern matched, records encoded)."""
    from appliance.cache.settings import CacheSettings
    from appliance.cache.store import CacheStore, ReplayPage
    from appliance.config import CLIENT_MAX_FRAME_BYTES
    from datapath.protocol.frame_layout import AUTH_TRAILER_BYTES

    store = CacheStore(CacheSettings(directory, ("bench/#",)))
    try:
        page = ReplayPage(CLIENT_MAX_FRAME_BYTES - AUTH_TRAILER_BYTES)
        store.page("bench/#", "bench/#", None, None, page)  # warm (not counted)
        start = time.perf_counter_ns()
        got, at, done = 0, None, False
        while not done:
            at, done = store.page("bench/#", "bench/#", at, None, page)
            got += page.count
        elapsed = time.perf_counter_ns() - start
    finally:
        store.close()
    return _rate("paged", got, count, elapsed)


def _replay_end_to_end(directory: Path, count: int) -> dict[str, float]:
    """An appliance with ``[cache]`` on ``directory`` (``_fill_cache``) on 127.0.0.1; a
    client's ``replay`` of every kept message over UDP (each payload compared), timed from
    the call to the last message."""
    import socket

    from appliance.cache.node import CachingAppliance
    from appliance.client import connect
    from appliance.config import parse_config

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = parse_config({"appliance": {"name": "bench-replay"},
                        "clients": {"udp": f"127.0.0.1:{port}"},
                        "pm": {"require_passwords": False,
                               "identities": {"reader": {"subscribe": ["#"]}}},
                        "cache": {"dir": str(directory), "patterns": ["bench/#"]}})
    app = CachingAppliance(cfg).start()
    try:
        if not app.cache.ready.wait(60):
            raise RuntimeError("bench persist: the cache's session did not subscribe")
        payload = bytes(range(64))
        with connect(f"udp://127.0.0.1:{port}", "reader") as client:
            for _ in client.replay("bench/#", from_sequence=count):  # warm (not counted)
                pass
            start = time.perf_counter_ns()
            got = 0
            for msg in client.replay("bench/#"):
                if msg.payload != payload:
                    raise RuntimeError(f"bench persist: replayed message {got} differs")
                got += 1
            elapsed = time.perf_counter_ns() - start
    finally:
        app.stop()
    return _rate("replayed", got, count, elapsed)


def _replay_raw(directory: Path, records: int) -> dict[str, float]:
    """The same segment files' bytes read in the same chunk size, nothing checked."""
    from appliance.persistence.settings import READ_CHUNK_BYTES

    chunk = bytearray(READ_CHUNK_BYTES)
    start = time.perf_counter_ns()
    for path in sorted(directory.glob("*.log")):
        fd = os.open(path, os.O_RDONLY)
        try:
            pos = 0
            while n := os.preadv(fd, [chunk], pos):
                pos += n
        finally:
            os.close(fd)
    elapsed = time.perf_counter_ns() - start
    return {"msgs_per_s": records * 1e9 / elapsed}


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="tw-bench-persist-", dir=args.dir))
    figures: dict[str, dict[str, list[float]]] = {"topicwire": {}, "raw_disk": {}}

    def keep(name: str, case: str, values: dict[str, float]) -> None:
        for metric, value in values.items():
            figures[name].setdefault(f"{metric}_{case}", []).append(value)

    try:
        progress(NAME, "warm-up (compiles the kernels on a cold cache; not counted)")
        warm = root / "warm-up"
        warm.mkdir()
        _ours(warm, SIZES[0], POLICIES[0], argparse.Namespace(**{**vars(args), "mib": 1}))
        _replay_ours(warm)
        shutil.rmtree(warm)
        for repeat in range(args.repeats):
            for size in SIZES:
                for policy in POLICIES:
                    case = f"{size}B_{policy}"
                    progress(NAME, f"repeat {repeat + 1}/{args.repeats}: {case}")
                    order = ("topicwire", "raw_disk") if repeat % 2 == 0 else (
                        "raw_disk", "topicwire")
                    for name in order:
                        where = root / f"{name}-{case}-{repeat}"
                        where.mkdir()
                        measure = _ours if name == "topicwire" else _raw
                        keep(name, case, measure(where, size, policy, args))
                        if not (name == "topicwire" and size == SIZES[0]
                                and policy == POLICIES[0]):
                            shutil.rmtree(where)
            replay_dir = root / f"topicwire-{SIZES[0]}B_{POLICIES[0]}-{repeat}"
            _, messages = _batches(SIZES[0], args.mib, args.batch)
            for name in ("topicwire", "raw_disk") if repeat % 2 == 0 else ("raw_disk",
                                                                              "topicwire"):
                values = (_replay_ours(replay_dir) if name == "topicwire"
                          else _replay_raw(replay_dir, messages))
                keep(name, f"replay_{SIZES[0]}B", values)
            shutil.rmtree(replay_dir)
        progress(NAME, f"end-to-end replay of {args.replay_messages:,} messages of 64 B")
        cache_dir = root / "cache"
        _fill_cache(cache_dir, args.replay_messages)
        for _ in range(args.repeats):
            keep("topicwire", "replay_pages_64B", _replay_pages(cache_dir,
                                                                 args.replay_messages))
            keep("topicwire", "replay_end_to_end_64B",
                 _replay_end_to_end(cache_dir, args.replay_messages))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = {name: {metric: statistics.median(values) for metric, values in metrics.items()}
               for name, metrics in figures.items()}
    params = {"mib": args.mib, "batch": args.batch, "interval_ms": args.interval_ms,
              "repeats": args.repeats, "replay_messages": args.replay_messages,
              "sizes": list(SIZES), "policies": list(POLICIES),
              "dir": str(root.parent), "fs": _fs_type(root.parent)}
    return build_report(NAME, params, results)
