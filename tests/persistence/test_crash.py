"""Crashes: torn and corrupted tails are cut at open and never replayed; a writer killed with
SIGKILL loses nothing it reported durable; corruption inside a sealed segment is an error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from appliance.persistence import LogConfig, StreamLog
from appliance.persistence.layout import record_bytes
from datapath.errors import DeviceError
from tests.persistence.test_log import SMALL, fill, payload, replayed

WRITER = """
import sys
from appliance.persistence import LogConfig, StreamLog
config = LogConfig(segment_bytes=1 << 16, max_payload_bytes=2048)
with StreamLog(sys.argv[1], config) as log:
    seq = log.last_seq
    while True:
        for _ in range(int(sys.argv[2])):
            seq += 1
            log.append(seq, seq, seq.to_bytes(8, "little") * (seq % 9))
        print(log.commit(), flush=True)
"""
KILL_AFTER_DURABLE = 20_000
KILL_TIMEOUT_S = 120.0
ROOT = Path(__file__).resolve().parents[2]


def _newest_file(log_dir) -> str:
    return str(sorted(p for p in os.listdir(log_dir) if p.endswith(".log"))[-1])


@pytest.mark.parametrize("damage", ["half_header", "half_payload", "flipped_crc",
                                    "flipped_payload", "zeros", "garbage"])
def test_a_damaged_tail_is_cut_at_open_and_never_replayed(tmp_path, damage):
    with StreamLog(tmp_path, SMALL) as log:
        fill(log, 1, 700)
        newest = log.segments[-1].path
        last_size = record_bytes(len(payload(700)))
    size = os.path.getsize(newest)
    with open(newest, "r+b") as f:
        if damage == "half_header":  # record 701 written in part: its first 12 bytes
            f.seek(size)
            f.write(b"\x11" * 12)
        elif damage == "half_payload":
            f.truncate(size - last_size // 2)
        elif damage in ("flipped_crc", "flipped_payload"):
            at = size - last_size + (1 if damage == "flipped_crc" else 30)
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x40]))
        elif damage == "zeros":
            f.seek(size)
            f.write(bytes(4096))
        else:
            f.seek(size)
            f.write(os.urandom(333))
    survivors = 700 if damage in ("half_header", "zeros", "garbage") else 699
    with StreamLog(tmp_path, SMALL) as log:
        assert log.counters.torn_bytes_cut > 0
        assert log.last_seq == survivors
        assert replayed(log) == [(s, 1_000 * s, payload(s)) for s in range(1, survivors + 1)]
        fill(log, survivors + 1, survivors + 50)
    with StreamLog(tmp_path, SMALL) as log:
        assert log.counters.torn_bytes_cut == 0
        assert [r[0] for r in replayed(log)] == list(range(1, survivors + 51))


def test_a_writer_killed_with_sigkill_keeps_every_record_it_reported_durable(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "37"],
                            stdout=subprocess.PIPE, text=True, env=env)
    durable = 0
    deadline = time.monotonic() + KILL_TIMEOUT_S
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            durable = int(line)
            if durable >= KILL_AFTER_DURABLE or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert durable >= KILL_AFTER_DURABLE, f"the writer reported only {durable} durable"
    config = LogConfig(segment_bytes=1 << 16, max_payload_bytes=2048)
    with StreamLog(tmp_path, config) as log:
        assert log.last_seq >= durable
        seqs = [r[0] for r in replayed(log)]
        assert seqs == list(range(1, log.last_seq + 1))
        assert all(r[2] == r[0].to_bytes(8, "little") * (r[0] % 9) for r in replayed(log))
        fill(log, log.last_seq + 1, log.last_seq + 10)


def test_corruption_inside_a_sealed_segment_is_an_error_naming_the_file(tmp_path):
    with StreamLog(tmp_path, SMALL) as log:
        fill(log, 1, 2_000)
        sealed = log.segments[1]
        path, at = sealed.path, sealed.size // 2
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    with StreamLog(tmp_path, SMALL) as log:
        with pytest.raises(DeviceError, match=f"persistence: record at .* of {path}"):
            replayed(log)
        assert [r[0] for r in replayed(log, from_seq=log.segments[2].first_seq)][-1] == 2_000


def test_an_index_write_interrupted_by_a_crash_is_ignored(tmp_path):
    with StreamLog(tmp_path, SMALL) as log:
        fill(log, 1, 1_000)
        base = log.segments[0].base
    (tmp_path / f"{base:020d}.idx.tmp").write_bytes(b"half an index")
    with StreamLog(tmp_path, SMALL) as log:
        assert [r[0] for r in replayed(log)] == list(range(1, 1_001))
    assert not (tmp_path / f"{base:020d}.idx.tmp").exists()
    assert _newest_file(tmp_path).endswith(".log")
