"""The telemetry writer: its own agent and thread between the data path and the store.

The data path hands closed windows over with ``offer`` (an append to a bounded queue, O(1),
never a wait); a queue already holding ``WRITER_QUEUE_WINDOWS`` rows refuses the offer and
counts the rows in ``dropped_windows``. The writer agent (``do_work``) takes what is queued
at least every ``WRITER_FLUSH_INTERVAL_NS``, builds one Arrow table and writes it through
``TelemetryStore`` (atomic files), and applies the retention every ``PRUNE_INTERVAL_NS``.
A failed write (disk full, permissions) is counted and logged once per minute; its rows are
lost, the writer goes on.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from appliance.ops.telemetry.config import (
    PRUNE_INTERVAL_NS,
    RETENTION_NS,
    WRITER_FLUSH_INTERVAL_NS,
    WRITER_IDLE_SLEEP_NS,
    WRITER_QUEUE_WINDOWS,
)
from appliance.ops.telemetry.store import TelemetryStore
from appliance.ops.telemetry.windows import ClosedWindows, windows_table
from datapath.agent import AgentRunner, SleepingIdle

log = logging.getLogger("topicwire.telemetry")
ERROR_LOG_INTERVAL_NS = 60 * 1_000_000_000
"""A failing writer logs at most once per this interval."""


class TelemetryWriter:
    """See the module docstring. ``offer`` from one producer thread; the rest is the agent's."""

    name = "telemetry-writer"

    def __init__(self, store: TelemetryStore, *, queue_windows: int = WRITER_QUEUE_WINDOWS,
                 flush_interval_ns: int = WRITER_FLUSH_INTERVAL_NS,
                 retention_ns: int = RETENTION_NS) -> None:
        self.store = store
        self.queue_windows = queue_windows
        self.flush_interval_ns = flush_interval_ns
        self.retention_ns = retention_ns
        self._queue: deque[ClosedWindows] = deque()
        self._enqueued = 0
        """Rows ever queued (written by the producer only)."""
        self._dequeued = 0
        """Rows ever taken (written by the agent only): queued = enqueued - dequeued."""
        self.offered_windows = 0
        self.dropped_windows = 0
        self.written_windows = 0
        self.files_written = 0
        self.write_errors = 0
        self.pruned_files = 0
        self._flush_at_ns = 0
        self._prune_at_ns = 0
        self._logged_at_ns = -ERROR_LOG_INTERVAL_NS
        self._runner: AgentRunner | None = None

    # --- producer side (the data path) --------------------------------------------------------
    def offer(self, closed: ClosedWindows) -> bool:
        """Queue closed windows; False (and counted) when the queue is full. Never blocks."""
        n = len(closed)
        self.offered_windows += n
        if self._enqueued - self._dequeued + n > self.queue_windows:
            self.dropped_windows += n
            return False
        self._enqueued += n
        self._queue.append(closed)
        return True

    # --- the agent ----------------------------------------------------------------------------
    def do_work(self, now_ns: int) -> int:
        work = 0
        if self._queue and now_ns >= self._flush_at_ns:
            work += self.flush()
            self._flush_at_ns = now_ns + self.flush_interval_ns
        if now_ns >= self._prune_at_ns:
            self._prune_at_ns = now_ns + PRUNE_INTERVAL_NS
            try:
                self.pruned_files += self.store.prune(time.time_ns(), self.retention_ns)
            except OSError as exc:
                self._failed(f"retention: {exc}")
        return work

    def flush(self) -> int:
        """Write everything queued now; returns the rows taken."""
        taken: list[ClosedWindows] = []
        while self._queue:
            taken.append(self._queue.popleft())
        rows = sum(len(c) for c in taken)
        self._dequeued += rows
        if not taken:
            return 0
        try:
            files = self.store.write(windows_table(taken))
        except Exception as exc:  # disk full, permissions, ...: count, log, go on
            self.write_errors += 1
            self.dropped_windows += rows
            self._failed(f"cannot write {rows} windows to {self.store.root}: {exc}")
            return rows
        self.files_written += len(files)
        self.written_windows += rows
        return rows

    def _failed(self, text: str) -> None:
        now = time.monotonic_ns()
        if now - self._logged_at_ns >= ERROR_LOG_INTERVAL_NS:
            self._logged_at_ns = now
            log.error("telemetry: %s", text)

    def on_close(self) -> None:
        self.flush()

    # --- its thread ---------------------------------------------------------------------------
    def start(self, name: str = "telemetry-writer") -> TelemetryWriter:
        self._runner = AgentRunner([self], SleepingIdle(WRITER_IDLE_SLEEP_NS), name=name)
        self._runner.start()
        return self

    def close(self) -> None:
        """Stop the thread (writing what is queued); safe to call twice."""
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.stop()

    def __enter__(self) -> TelemetryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def counters(self) -> dict[str, Any]:
        return {"offered_windows": self.offered_windows, "dropped_windows": self.dropped_windows,
                "written_windows": self.written_windows, "files_written": self.files_written,
                "write_errors": self.write_errors, "pruned_files": self.pruned_files,
                "queued_windows": self._enqueued - self._dequeued}
