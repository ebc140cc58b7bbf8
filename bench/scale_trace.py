"""Time stamps of one subscribe, end to end (``topicwire bench scale --trace FILE``).

Switched on only by the bench: ``install`` wraps the methods a subscribe runs through, on
their classes, before the appliance forks its data path (so the child runs the wrapped ones
too). Each call records (label, start, end) in ``time.monotonic_ns`` (one clock for both
processes); the data path's child appends its records to ``FILE.child`` (a line a call).
``breakdown`` then takes, for each timed subscribe (from the bench's send of the SUBSCRIBE
to its answer read), the records inside it: per label, the median start (from the send),
the median duration, the median CPU time of the thread that ran it (``thread_time``) and
in how many of the subscribes it ran.

The labels: ``link_in`` (the parent's reader thread takes frames the child received,
``_on_message`` of an ``i`` message), ``admin`` (the control thread decodes and handles
the SUBSCRIBE: parse, entitlement, algebra, the compiler's lists), ``interest`` (the
interest sets), ``sync_destinations``, ``build_snapshot`` (with ``install_tables`` and
``compiler_build`` inside it), ``built_snapshot`` (the process link's chain),
``publish_snapshot`` (the patch made and sent over the link), ``reply`` (the answer
encoded and handed to the link), and in the child ``child_set_ports``,
``child_set_tables``, ``child_install_rows`` / ``child_install_delta`` (the snapshot
installed), ``child_evolve`` and ``child_send_outbox`` (the answer sent).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

_RECORDS: list[tuple[str, int, int, int]] = []
_PARENT_PID = 0
_CHILD_FILE: Path | None = None
_INSTALLED: list[tuple[type, str, Any]] = []


def _targets() -> list[tuple[type, str, str]]:
    from appliance.control.agent import ControlAgent
    from appliance.dataplane.agent import DataPlaneAgent
    from appliance.dataplane.process import DataPathProcess
    from nic_offload.compiler import OffloadCompiler
    from nic_offload.snapshot import Snapshot

    return [
        (ControlAgent, "_on_admin", "admin"),
        (ControlAgent, "_advertise_interest", "interest"),
        (ControlAgent, "_sync_destinations", "sync_destinations"),
        (ControlAgent, "_build_snapshot", "build_snapshot"),
        (ControlAgent, "_install_tables", "install_tables"),
        (ControlAgent, "_reply_many", "reply"),
        (OffloadCompiler, "build", "compiler_build"),
        (DataPathProcess, "built_snapshot", "built_snapshot"),
        (DataPathProcess, "publish_snapshot", "publish_snapshot"),
        (DataPathProcess, "_on_message", "link_in"),
        (DataPlaneAgent, "set_ports", "child_set_ports"),
        (DataPlaneAgent, "set_tables", "child_set_tables"),
        (DataPlaneAgent, "publish_snapshot_rows", "child_install_rows"),
        (DataPlaneAgent, "publish_snapshot_delta", "child_install_delta"),
        (DataPlaneAgent, "_send_outbox", "child_send_outbox"),
        (Snapshot, "evolve", "evolve"),
    ]


def _record(label: str, start: int, end: int, cpu: int) -> None:
    if os.getpid() == _PARENT_PID:
        _RECORDS.append((label, start, end, cpu))
    elif _CHILD_FILE is not None:
        with open(_CHILD_FILE, "a") as f:
            f.write(f"child_{label.removeprefix('child_')} {start} {end} {cpu}\n")


def _wrap(label: str, method: Any) -> Any:
    @functools.wraps(method)
    def traced(*args: Any, **kwargs: Any) -> Any:
        if label == "link_in" and args[1][0] != "i":
            return method(*args, **kwargs)
        start, cpu = time.monotonic_ns(), time.thread_time_ns()
        try:
            return method(*args, **kwargs)
        finally:
            _record(label, start, time.monotonic_ns(), time.thread_time_ns() - cpu)

    return traced


def install(path: Path) -> None:
    """Wrap the methods (before the appliance starts); the child writes ``path``.child."""
    global _PARENT_PID, _CHILD_FILE
    _PARENT_PID = os.getpid()
    _CHILD_FILE = Path(f"{path}.child")
    _CHILD_FILE.unlink(missing_ok=True)
    for cls, name, label in _targets():
        method = cls.__dict__.get(name) or getattr(cls, name)
        _INSTALLED.append((cls, name, cls.__dict__.get(name)))
        setattr(cls, name, _wrap(label, method))


def uninstall() -> None:
    while _INSTALLED:
        cls, name, own = _INSTALLED.pop()
        if own is None:
            delattr(cls, name)
        else:
            setattr(cls, name, own)


def records() -> list[tuple[str, int, int, int]]:
    """The parent's records and the child's."""
    got = list(_RECORDS)
    if _CHILD_FILE is not None and _CHILD_FILE.exists():
        for line in _CHILD_FILE.read_text().splitlines():
            label, start, end, cpu = line.split()
            got.append((label, int(start), int(end), int(cpu)))
    got.sort(key=lambda r: r[1])
    return got


def breakdown(windows: list[tuple[int, int]]) -> dict[str, Any]:
    """Per label: in how many of ``windows`` (send, answer) it ran, its median start from
    the send, median total duration inside the window and median CPU time of its thread
    meanwhile (ms; the CPU time is what a loaded host does not inflate)."""
    got = records()
    per: dict[str, list[tuple[float, float, float]]] = {}
    for begin, end in windows:
        seen: dict[str, list[float]] = {}
        for label, start, stop, cpu in got:
            if start >= begin and start <= end:
                held = seen.setdefault(label, [(start - begin) / 1e6, 0.0, 0.0])
                held[1] += (stop - start) / 1e6
                held[2] += cpu / 1e6
        for label, (first, total, used) in seen.items():
            per.setdefault(label, []).append((first, total, used))
    out = {}
    for label, values in sorted(per.items(), key=lambda kv: statistics.median(
            v[0] for v in kv[1])):
        out[label] = {"runs": len(values),
                      "start_ms": round(statistics.median(v[0] for v in values), 3),
                      "duration_ms": round(statistics.median(v[1] for v in values), 3),
                      "cpu_ms": round(statistics.median(v[2] for v in values), 3)}
    answer = [(end - begin) / 1e6 for begin, end in windows]
    return {"answer_ms": round(statistics.median(answer), 3) if answer else None,
            "labels": out}


def dump(path: Path, result: dict[str, Any]) -> None:
    path.write_text(json.dumps(result, indent=1))
