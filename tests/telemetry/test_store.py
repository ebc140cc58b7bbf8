"""The telemetry store and writer: partitions, atomic files, retention, bad files reported,
bounded queue with counted drops, a writer thread that writes while the producer goes on."""

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from appliance.ops.telemetry import _kernels as k
from appliance.ops.telemetry.config import LATENCY_BUCKETS
from appliance.ops.telemetry.store import (
    HOUR_NS,
    TelemetryStore,
    data_files,
    partition_of,
    read_windows,
)
from appliance.ops.telemetry.windows import WINDOW_SCHEMA, ClosedWindows, windows_table
from appliance.ops.telemetry.writer import TelemetryWriter

T0 = 1_735_732_800 * 1_000_000_000  # 2025-01-01 12:00:00 UTC


def closed(start_ns: int, neighbours=("n1", "n2"), appliance="a") -> ClosedWindows:
    n = len(neighbours)
    stats = np.zeros((n, k.STATS), np.int64)
    stats[:, k.FRAMES] = np.arange(1, n + 1) * 10
    stats[:, k.LAT_COUNT] = 3
    stats[:, k.LAT_MIN] = 1000
    stats[:, k.LAT_MAX] = 9000
    counts = np.zeros((n, LATENCY_BUCKETS), np.int64)
    counts[:, 20] = 2
    counts[:, 40] = 1
    return ClosedWindows(appliance, "fabric", start_ns, 1_000_000_000, tuple(neighbours),
                         stats, counts, np.full(n, 5.0))


def test_partition_directories_are_utc_date_and_hour():
    assert partition_of(T0) == ("2025-01-01", 12)
    assert partition_of(T0 + 12 * HOUR_NS - 1) == ("2025-01-01", 23)
    assert partition_of(T0 + 12 * HOUR_NS) == ("2025-01-02", 0)


def test_rows_of_two_hours_land_in_two_partitions_and_read_back(tmp_path):
    store = TelemetryStore(tmp_path, tag="core1")
    table = windows_table([closed(T0 + HOUR_NS - 1_000_000_000), closed(T0 + HOUR_NS)])
    files = store.write(table)
    rel = sorted(str(p.parent.relative_to(tmp_path)) for p in files)
    assert rel == ["date=2025-01-01/hour=12", "date=2025-01-01/hour=13"]
    assert all(p.name.startswith(f"part-{T0 + HOUR_NS - 10**9}-core1-")
               or p.name.startswith(f"part-{T0 + HOUR_NS}-core1-") for p in files)
    back, problems = read_windows(tmp_path)
    assert problems == [] and back.num_rows == 4
    assert sorted(back.to_pylist(), key=str) == sorted(table.to_pylist(), key=str)
    assert not [p for p in tmp_path.rglob(".*")]  # no temporary file left behind


def test_readers_never_see_a_partial_file(tmp_path):
    """A reader lists and opens every visible file while a writer keeps writing large ones."""
    store = TelemetryStore(tmp_path)
    big = windows_table([closed(T0 + i * 10**9, tuple(f"n{j}" for j in range(200)))
                         for i in range(20)])
    stop = threading.Event()
    errors = []

    def reader():
        seen = 0
        while not stop.is_set():
            for path in data_files(tmp_path):
                try:
                    assert pq.read_table(path).num_rows == big.num_rows
                    seen += 1
                except FileNotFoundError:
                    pass
                except Exception as exc:  # a partial file would fail here
                    errors.append(repr(exc))
        errors.append(seen)

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(25):
        store.write(big)
    stop.set()
    t.join()
    seen = errors.pop()
    assert errors == [] and seen > 0
    assert len(data_files(tmp_path)) == 25


def test_retention_deletes_whole_old_hours_and_stale_temporary_files(tmp_path):
    store = TelemetryStore(tmp_path)
    for hour in range(4):
        store.write(windows_table([closed(T0 + hour * HOUR_NS)]))
    stale = tmp_path / "date=2025-01-01" / "hour=15" / ".part-x.parquet.tmp"
    stale.write_bytes(b"half")
    os.utime(stale, ns=(T0, T0))
    fresh = tmp_path / "date=2025-01-01" / "hour=15" / ".part-y.parquet.tmp"
    fresh.write_bytes(b"being written")
    now = T0 + 4 * HOUR_NS + 10
    fresh_ns = now - 10**9
    os.utime(fresh, ns=(fresh_ns, fresh_ns))
    removed = store.prune(now, retention_ns=2 * HOUR_NS)  # hours 12 and 13 ended before 14:00
    assert removed == 3
    left = sorted(p.name for p in (tmp_path / "date=2025-01-01").iterdir())
    assert left == ["hour=14", "hour=15"]
    assert fresh.exists() and not stale.exists()
    assert store.prune(now + 10 * HOUR_NS, retention_ns=HOUR_NS) == 3
    assert list(tmp_path.iterdir()) == []  # the empty date directory went too


def test_corrupt_and_incomplete_files_are_reported_and_skipped(tmp_path):
    store = TelemetryStore(tmp_path)
    good = store.write(windows_table([closed(T0)]))[0]
    bad = good.parent / "part-garbage.parquet"
    bad.write_bytes(b"PAR1 this is not parquet at all")
    half = good.parent / "part-truncated.parquet"
    half.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    partial = pa.table({"appliance": ["a"], "neighbour": ["b"]})
    pq.write_table(partial, good.parent / "part-columns.parquet")
    table, problems = read_windows(tmp_path)
    assert table.num_rows == 2 and table.schema == WINDOW_SCHEMA
    reasons = {os.path.basename(p.what): p.reason for p in problems}
    assert reasons["part-garbage.parquet"].startswith("corrupt file")
    assert reasons["part-truncated.parquet"].startswith("corrupt file")
    assert reasons["part-columns.parquet"].startswith("missing columns: channel, ")


def test_a_missing_directory_is_a_user_error(tmp_path):
    from appliance.ops.telemetry.errors import TelemetryUserError

    with pytest.raises(TelemetryUserError, match="telemetry: no telemetry directory"):
        read_windows(tmp_path / "nope")


def test_a_full_writer_queue_drops_and_counts_instead_of_waiting(tmp_path):
    writer = TelemetryWriter(TelemetryStore(tmp_path), queue_windows=5)
    assert writer.offer(closed(T0)) and writer.offer(closed(T0 + 10**9))
    assert not writer.offer(closed(T0 + 2 * 10**9))  # 4 queued + 2 > 5
    assert writer.offer(closed(T0 + 3 * 10**9, ("n1",)))
    assert writer.counters()["dropped_windows"] == 2
    assert writer.counters()["queued_windows"] == 5
    assert writer.flush() == 5
    assert writer.counters()["queued_windows"] == 0 and writer.written_windows == 5
    table, _ = read_windows(tmp_path)
    assert table.num_rows == 5


def test_the_writer_thread_writes_while_the_producer_goes_on(tmp_path):
    writer = TelemetryWriter(TelemetryStore(tmp_path), flush_interval_ns=20_000_000).start()
    try:
        for i in range(30):
            assert writer.offer(closed(T0 + i * 10**9))
            time.sleep(0.005)
        deadline = time.monotonic() + 20
        while writer.written_windows < 60 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        writer.close()
        writer.close()
    assert writer.written_windows == 60 and writer.dropped_windows == 0
    assert writer.files_written >= 2  # written in several flushes while offers went on
    table, problems = read_windows(tmp_path)
    assert problems == [] and table.num_rows == 60


def test_a_failing_disk_is_counted_not_raised(tmp_path):
    store = TelemetryStore(tmp_path / "t")
    writer = TelemetryWriter(store)
    (tmp_path / "t").rmdir()
    (tmp_path / "t").write_text("a file where the directory was")
    writer.offer(closed(T0))
    assert writer.flush() == 2
    assert writer.write_errors == 1 and writer.dropped_windows == 2
    assert writer.written_windows == 0
