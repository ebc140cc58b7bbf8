"""StreamLog on real files in a temporary directory: append, commit, replay, reopen, roll,
the indexes by sequence and by time, the fsync policies and retention."""

from __future__ import annotations

import os

import numpy as np
import pytest

from appliance.persistence import FSYNC_INTERVAL, LogConfig, StreamLog
from appliance.persistence.layout import index_name, record_bytes
from datapath.errors import UserError

SMALL = LogConfig(segment_bytes=1 << 14, index_interval_bytes=512, max_payload_bytes=2048)


def payload(seq: int) -> bytes:
    return seq.to_bytes(8, "little") * (seq % 9)


def fill(log: StreamLog, first: int, last: int, step: int = 1, commit_every: int = 50) -> None:
    for seq in range(first, last + 1, step):
        log.append(seq, 1_000 * seq, payload(seq))
        if seq % commit_every == 0:
            log.commit()
    log.commit()


def replayed(log: StreamLog, **where) -> list[tuple[int, int, bytes]]:
    return [(int(b.seqs[i]), int(b.stamps[i]), b.payload(i))
            for b in log.replay(**where) for i in range(len(b))]


def test_records_come_back_in_order_after_a_reopen_across_segments(tmp_path):
    with StreamLog(tmp_path, SMALL) as log:
        fill(log, 1, 3_000)
        assert len(log.segments) > 3 and log.durable_seq == 3_000
    with StreamLog(tmp_path, SMALL) as log:
        assert log.last_seq == 3_000 and log.counters.torn_bytes_cut == 0
        assert replayed(log) == [(s, 1_000 * s, payload(s)) for s in range(1, 3_001)]
        fill(log, 3_001, 3_100)
        assert [r[0] for r in replayed(log, from_seq=2_990)] == list(range(2_990, 3_101))


def test_replay_starts_at_a_sequence_or_at_the_first_record_of_a_time(tmp_path):
    with StreamLog(tmp_path, SMALL) as log:
        fill(log, 10, 6_000, step=3)  # sequences with holes: 10, 13, 16, ...
        for start in (1, 10, 11, 2_500, 5_998, 5_999):
            expected = [s for s in range(10, 6_001, 3) if s >= start]
            assert [r[0] for r in replayed(log, from_seq=start)] == expected
        assert replayed(log, from_seq=6_001) == []
        for s in (10, 1_000, 3_001, 5_998):
            got = replayed(log, from_time_ns=1_000 * s - 1)
            assert got[0][0] == s and got[-1][0] == 5_998


def test_the_time_index_finds_the_first_record_reaching_a_time_when_stamps_go_back(tmp_path):
    stamps = [5, 1, 9, 2, 20, 3, 30] * 200
    with StreamLog(tmp_path, SMALL) as log:
        for i, ts in enumerate(stamps):
            log.append(i + 1, ts, b"x" * 40)
        log.commit()
        for t in (0, 6, 10, 21, 30):
            first = next(i for i, ts in enumerate(stamps) if ts >= t) + 1
            assert replayed(log, from_time_ns=t)[0][0] == first
        assert replayed(log, from_time_ns=31) == []


def test_a_sealed_segment_whose_index_does_not_check_is_scanned_again(tmp_path):
    with StreamLog(tmp_path, SMALL) as log:
        fill(log, 1, 1_000)
        base = log.segments[1].base
    (tmp_path / index_name(base)).write_bytes(b"not an index")
    (tmp_path / index_name(1)).unlink()
    with StreamLog(tmp_path, SMALL) as log:
        assert [r[0] for r in replayed(log, from_seq=base + 3)] == list(range(base + 3, 1_001))
        assert [r[0] for r in replayed(log)] == list(range(1, 1_001))


def test_batch_appends_match_single_appends(tmp_path):
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 300, 5_000)
    src = rng.integers(0, 256, int(lengths.sum()), dtype=np.uint8)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    seqs = np.arange(1, 5_001, dtype=np.uint64)
    with StreamLog(tmp_path / "batch", SMALL) as log:
        for part in np.array_split(np.arange(5_000), 7):
            log.append_batch(seqs[part], seqs[part] * 2, src, offsets[part], lengths[part])
            log.commit()
        batch = replayed(log)
    with StreamLog(tmp_path / "single", SMALL) as log:
        for i in range(5_000):
            log.append(i + 1, 2 * (i + 1), src[offsets[i]: offsets[i] + lengths[i]].tobytes())
        log.commit()
        assert replayed(log) == batch
    assert len(batch) == 5_000


def test_batch_policy_is_durable_at_commit_and_interval_policy_once_due(tmp_path):
    with StreamLog(tmp_path / "b", SMALL) as log:
        log.append(1, 1, b"a")
        assert log.durable_seq == 0
        assert log.commit() == 1 and log.counters.fsyncs == 1
    config = LogConfig(fsync=FSYNC_INTERVAL, fsync_interval_ms=5, segment_bytes=1 << 14,
                       max_payload_bytes=2048)
    with StreamLog(tmp_path / "i", config) as log:
        log.append(1, 1, b"a")
        log.commit(now_ns=0)
        assert log.written_seq == 1 and log.durable_seq == 0
        due = log.wake_at_ns()
        assert due is not None
        assert log.do_work(due - 1) == 0 and log.durable_seq == 0
        log.append(2, 2, b"b")
        log.commit(now_ns=due - 1)
        assert log.durable_seq == 0 and log.wake_at_ns() == due  # the first write's deadline
        assert log.do_work(due) == 1 and log.durable_seq == 2 and log.wake_at_ns() is None
        log.append(3, 3, b"c")
        log.commit(now_ns=due)
        assert log.durable_seq == 2
        fsyncs = log.counters.fsyncs
    assert log.counters.fsyncs == fsyncs + 1  # close syncs what was written and not synced


def test_retention_deletes_the_oldest_sealed_segments_by_size_and_by_age(tmp_path):
    config = LogConfig(segment_bytes=1 << 14, max_payload_bytes=2048,
                       retention_max_bytes=3 << 14)
    with StreamLog(tmp_path / "size", config) as log:
        fill(log, 1, 3_000)
        segments = len(log.segments)
        deleted = log.enforce_retention()
        assert deleted == segments - 3 and log.size_bytes() <= 3 << 14
        assert log.counters.records_deleted == log.first_seq() - 1
        assert [r[0] for r in replayed(log)] == list(range(log.first_seq(), 3_001))
    config = LogConfig(segment_bytes=1 << 14, max_payload_bytes=2048, retention_max_age_ms=1)
    with StreamLog(tmp_path / "age", config) as log:
        fill(log, 1, 3_000)  # timestamps 1 us apart
        cut_ns = 1_000 * 1_500 + 1_000_000  # records up to 1,500 are over 1 ms old
        log.enforce_retention(now_wall_ns=cut_ns)
        first = log.first_seq()
        assert first <= 1_501 and all(s.max_ts >= 1_000 * 1_500 for s in log.segments)
        assert log.segments[0].first_seq == first and len(log.segments) >= 1
        log.enforce_retention(now_wall_ns=10**18)
        assert len(log.segments) == 1  # the newest segment stays


def test_bad_appends_and_settings_are_refused_naming_the_component(tmp_path):
    with StreamLog(tmp_path, SMALL) as log:
        log.append(5, 0, b"x")
        for seq in (5, 4):
            with pytest.raises(UserError, match="persistence: sequences must rise"):
                log.append(seq, 0, b"x")
        with pytest.raises(UserError, match="persistence: a payload of 2049 bytes"):
            log.append(6, 0, bytes(2_049))
        log.append(6, 0, bytes(2_048))
    with pytest.raises(UserError, match="persistence: fsync policy 'sometimes'"):
        LogConfig(fsync="sometimes")
    with pytest.raises(UserError, match="persistence: segment_bytes 100 cannot hold"):
        LogConfig(segment_bytes=100)


def test_a_record_as_large_as_allowed_fills_a_segment_of_its_own(tmp_path):
    config = LogConfig(segment_bytes=record_bytes(4_096), max_payload_bytes=4_096)
    with StreamLog(tmp_path, config) as log:
        for seq in range(1, 4):
            log.append(seq, seq, bytes([seq]) * 4_096)
        log.commit()
        assert len(log.segments) == 3
    with StreamLog(tmp_path, config) as log:
        assert [r[2][:1] for r in replayed(log)] == [b"\x01", b"\x02", b"\x03"]
        assert os.path.getsize(log.segments[0].path) == record_bytes(4_096)
