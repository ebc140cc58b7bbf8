"""CPU time of benchmarked processes, from /proc (Linux).

An appliance is more than one process: ``topicwire run`` forks its data path into a process of
its own (``appliance.dataplane = "process"``), and may start its management API in another
(a separate program, so its command line differs). ``appliance_cpu_seconds`` counts the
appliance's process and the children forked from it with the same command line: the data
path, not the API.
"""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` (all its threads) so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def forked_children(pid: int) -> list[int]:
    """The children of ``pid`` that run its command line (forked, not exec'd)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    children: list[str] = []
    for task in tasks:  # a child belongs to the thread that forked it
        try:
            children += (task / "children").read_text().split()
        except OSError:
            continue
    out = []
    for child in map(int, children):
        try:
            if Path(f"/proc/{child}/cmdline").read_bytes() == cmdline:
                out.append(child)
        except OSError:
            continue
    return out


def appliance_cpu_seconds(pid: int) -> float:
    """CPU seconds of the appliance's process ``pid`` and its data path's process."""
    total = cpu_seconds(pid)
    for child in forked_children(pid):
        try:
            total += cpu_seconds(child)
        except OSError:  # it ended meanwhile
            continue
    return total
