"""The telemetry store: Parquet files partitioned by date and hour, written atomically.

Layout (UTC, by each row's ``window_start_ns``)::

    DIR/date=2025-01-01/hour=13/part-<first window ns>-<tag>-<pid>-<seq>.parquet

A file is written to a hidden temporary name in its partition directory (``.part-...tmp``;
Spark and pyarrow skip names that start with ``.``), flushed and fsync'd, then renamed to its
final name (atomic within a directory), so a reader never sees a partial file. Retention
deletes whole hour partitions whose hour ended before ``now - retention`` (and temporary files
a crashed writer left behind).

``read_windows`` reads a store with pyarrow, file by file: a file whose footer does not parse
(corrupt, truncated) or that lacks a column of ``WINDOW_SCHEMA`` is reported as a ``Problem``
and left out, never fatal.
"""

from __future__ import annotations

import calendar
import itertools
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from appliance.ops.telemetry.config import TEMP_FILE_MAX_AGE_NS
from appliance.ops.telemetry.errors import TelemetryUserError
from appliance.ops.telemetry.windows import REQUIRED_COLUMNS, WINDOW_SCHEMA

HOUR_NS = 3600 * 1_000_000_000
DAY_NS = 24 * HOUR_NS
_seq = itertools.count()


def partition_of(window_start_ns: int) -> tuple[str, int]:
    """(``YYYY-MM-DD``, hour) in UTC of a wall-clock time in ns."""
    t = time.gmtime(window_start_ns // 1_000_000_000)
    return time.strftime("%Y-%m-%d", t), t.tm_hour


def partition_dir(root: Path, window_start_ns: int) -> Path:
    date, hour = partition_of(window_start_ns)
    return root / f"date={date}" / f"hour={hour:02d}"


@dataclass(frozen=True)
class Problem:
    """A file or rows left out, and why."""

    what: str
    """A file path, or a path (appliance<-neighbour/channel) for rows."""
    reason: str
    rows: int = 0


class TelemetryStore:
    """Writes and prunes one telemetry directory (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str], tag: str = "w") -> None:
        self.root = Path(root)
        self.tag = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in tag) or "w"
        self.root.mkdir(parents=True, exist_ok=True)

    def write(self, table: pa.Table) -> list[Path]:
        """Write ``table`` (``WINDOW_SCHEMA``) as one file per hour partition; their paths."""
        if table.num_rows == 0:
            return []
        table = table.cast(WINDOW_SCHEMA)
        hours = pc.divide(table["window_start_ns"], pa.scalar(HOUR_NS, pa.int64()))
        written = []
        for hour in np.unique(hours.to_numpy()).tolist():
            part = table.filter(pc.equal(hours, pa.scalar(hour, pa.int64())))
            first = int(pc.min(part["window_start_ns"]).as_py())
            directory = partition_dir(self.root, first)
            directory.mkdir(parents=True, exist_ok=True)
            name = f"part-{first}-{self.tag}-{os.getpid()}-{next(_seq):06d}.parquet"
            written.append(_write_atomically(part, directory, name))
        return written

    def prune(self, now_ns: int, retention_ns: int) -> int:
        """Delete hour partitions that ended before ``now_ns - retention_ns`` and stale
        temporary files; returns the number of files deleted."""
        cutoff = now_ns - retention_ns
        removed = 0
        for date_dir in sorted(self.root.glob("date=*")):
            for hour_dir in sorted(date_dir.glob("hour=*")):
                start = _hour_start_ns(date_dir.name, hour_dir.name)
                if start is not None and start + HOUR_NS <= cutoff:
                    removed += sum(1 for p in hour_dir.iterdir() if p.is_file())
                    shutil.rmtree(hour_dir, ignore_errors=True)
                    continue
                for tmp in hour_dir.glob(".part-*"):
                    try:
                        if now_ns - tmp.stat().st_mtime_ns > TEMP_FILE_MAX_AGE_NS:
                            tmp.unlink()
                            removed += 1
                    except FileNotFoundError:
                        pass
            try:
                date_dir.rmdir()  # only when empty
            except OSError:
                pass
        return removed

    def files(self) -> list[Path]:
        return data_files(self.root)


def _write_atomically(table: pa.Table, directory: Path, name: str) -> Path:
    final = directory / name
    tmp = directory / f".{name}.tmp"
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return final


def _hour_start_ns(date_name: str, hour_name: str) -> int | None:
    try:
        date = date_name.removeprefix("date=")
        hour = int(hour_name.removeprefix("hour="))
        t = time.strptime(date, "%Y-%m-%d")
    except ValueError:
        return None
    return (calendar.timegm(t) + hour * 3600) * 1_000_000_000


def data_files(root: str | os.PathLike[str]) -> list[Path]:
    """The visible Parquet files under ``root`` (hidden and temporary names skipped)."""
    root = Path(root)
    if not root.is_dir():
        raise TelemetryUserError(f"no telemetry directory {root}; give the directory the "
                                 "appliances write to (telemetry.dir)")
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        out += [Path(dirpath) / f for f in sorted(filenames)
                if f.endswith(".parquet") and not f.startswith((".", "_"))]
    return out


def check_file(path: Path) -> Problem | None:
    """Why ``path`` cannot be used (footer does not parse, a column missing), or None.
    Reads the footer only."""
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        return Problem(str(path), f"corrupt file: {str(exc).splitlines()[0][:200]}")
    missing = [c for c in REQUIRED_COLUMNS if c not in schema.names]
    if missing:
        return Problem(str(path), "missing columns: " + ", ".join(missing))
    return None


def read_windows(root: str | os.PathLike[str],
                 files: list[Path] | None = None) -> tuple[pa.Table, list[Problem]]:
    """Every usable row under ``root`` (or of ``files``) and the files left out."""
    problems: list[Problem] = []
    tables = []
    for path in files if files is not None else data_files(root):
        problem = check_file(path)
        if problem is None:
            try:
                tables.append(pq.read_table(path, columns=list(REQUIRED_COLUMNS))
                              .cast(WINDOW_SCHEMA))
                continue
            except (OSError, pa.ArrowException) as exc:
                problem = Problem(str(path), f"corrupt file: {str(exc).splitlines()[0][:200]}")
        problems.append(problem)
    if not tables:
        return WINDOW_SCHEMA.empty_table(), problems
    return pa.concat_tables(tables), problems
