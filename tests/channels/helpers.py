"""Shared by the channel tests: the other process (``tests.channels.peer``) and frame batches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Peer:
    """A ``tests.channels.peer`` process, optionally inside a namespace host."""

    def __init__(self, *args: str, host=None) -> None:
        cmd = [sys.executable, "-m", "tests.channels.peer", *args]
        if host is not None:
            cmd = ["ip", "netns", "exec", host.name, *cmd]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.port = None

    def wait_ready(self, timeout_s: float = 30) -> int:
        line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            self.proc.kill()
            raise AssertionError(f"peer did not start: {line!r} {self.proc.stderr.read()}")
        self.port = int(line.split()[1])
        return self.port

    def result(self, timeout_s: float = 60) -> dict:
        out, err = self.proc.communicate(timeout=timeout_s)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def frames_batch(count: int, key: int = 1, slot_bytes: int = 2048):
    """A FrameBatch holding the peer's deterministic frames 0..count-1 of ``key``."""
    from channels.base import FrameBatch
    from tests.channels.peer import make_frame

    batch = FrameBatch(max(count, 1), slot_bytes)
    for i in range(count):
        batch.append(make_frame(key, i))
    return batch
