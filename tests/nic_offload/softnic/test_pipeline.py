"""The software NIC against its pure-Python twin, and the behaviour a data path relies on."""

from __future__ import annotations

import random

import numpy as np
import pytest

from datapath.protocol import admin_layout as al
from datapath.protocol import codec
from datapath.protocol.batch import decode_frames, new_message_batch
from datapath.protocol.frame_layout import FrameType
from nic_offload import model
from nic_offload.acl import AclClass, compile_class
from nic_offload.errors import OffloadUserError
from nic_offload.model import DigestReason, EntrySet, KeyAction, KeyRows
from nic_offload.snapshot import Snapshot, SnapshotSwitch
from nic_offload.softnic import SoftNic
from nic_offload.softnic import layout as L
from nic_offload.softnic.layout import MessageVerdict as V
from tests.nic_offload.helpers import QUOTE, random_burst, random_entry_set
from tests.nic_offload.twins import TwinState, messages_from_batch, process_twin, run_twin


def _frames(*frames: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = np.array([len(f) for f in frames], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return np.frombuffer(b"".join(frames), np.uint8).copy(), offsets, lengths


def _rows(*rows: tuple[int, KeyAction, int, int]) -> KeyRows:
    keys, actions, targets, classes = zip(*rows)
    return KeyRows(np.array(keys, np.uint64), np.array(actions, np.uint8),
                   np.array(targets, np.uint32), np.array(classes, np.uint16))


def _nic(rows: KeyRows, acl: tuple = (), groups: tuple = (), **kw) -> SoftNic:
    return SoftNic(Snapshot.build(EntrySet(model.DEFAULT_SPEC, rows, acl, groups, 1)), **kw)


@pytest.mark.parametrize("seed", range(12))
def test_process_matches_its_twin_on_random_bursts(seed):
    rng = random.Random(seed)
    entries, _ = random_entry_set(rng, rng.choice([5, 60, 400]))
    digest_cap = rng.choice([2, 8, 1024])
    nic = SoftNic(Snapshot.build(entries), digest_entries=digest_cap)
    state = TwinState(len(nic._digests))
    keys = entries.key_rows.keys.tolist()
    for _ in range(3):
        buf, offsets, lengths = random_burst(rng, keys, rng.randint(1, 40))
        # the twin gets the same first pass: decode_frames on its own arrays
        batch = new_message_batch(len(nic.batch))
        status = np.zeros(len(offsets), np.uint8)
        types = np.zeros(len(offsets), np.uint8)
        decoded = decode_frames(buf, offsets, lengths, batch, status, types)
        result = nic.process(buf, offsets, lengths)
        assert (result.frames, result.messages) == (decoded.frames, decoded.messages)
        descs, verdicts = process_twin(
            bytes(buf), messages_from_batch(batch, decoded.messages),
            status[:decoded.frames].tolist(), types[:decoded.frames].tolist(),
            nic.snapshot.tables, state)
        assert nic.verdicts[:result.messages].tolist() == verdicts
        got = [tuple(int(x) for x in d) for d in nic.descriptors[:result.descriptors]]
        assert got == descs
        assert nic._counters.tolist() == state.counters
        assert nic._malformed.tolist() == state.malformed
        counts = {row: [int(nic._key_counts[2 * row]), int(nic._key_counts[2 * row + 1])]
                  for row in range(len(keys)) if nic._key_counts[2 * row]}
        assert counts == state.key_counts
        if rng.random() < 0.5:
            drained = [tuple(int(x) for x in d) for d in nic.drain_digests()]
            assert drained == list(state.digests)
            state.digests.clear()


def test_every_verdict_happens_as_the_tables_say():
    acl = tuple(compile_class(AclClass.parse(
        1, QUOTE, ["(price < 50, ACCEPT)", "(price < 100, LOG, REJECT)"]), model.DEFAULT_SPEC))
    nic = _nic(_rows((11, KeyAction.DROP, 0, 0), (12, KeyAction.PUNT, 0, 0),
                     (13, KeyAction.FORWARD, 7, 0), (14, KeyAction.FORWARD_GROUP, 3, 1)),
               acl, (model.MulticastGroup(3, (1, 2)),))
    msgs = [{"topic_key": 11}, {"topic_key": 12}, {"topic_key": 13}, {"topic_key": 99},
            {"topic_key": 14, "payload": QUOTE.encode({"price": 10})},
            {"topic_key": 14, "payload": QUOTE.encode({"price": 70})},
            {"topic_key": 14, "payload": QUOTE.encode({"price": 700})},
            {"topic_key": 14, "payload": QUOTE.encode({"price": 10})[:12]},
            {"topic_key": 0}]
    frame = codec.encode_data_frame(msgs)
    result = nic.process(*_frames(frame))
    assert nic.verdicts[:result.messages].tolist() == [
        V.DROPPED, V.PUNTED, V.FORWARDED, V.UNKNOWN_KEY, V.FORWARDED, V.LOGGED, V.ACL_REJECTED,
        V.ACL_SHORT_PAYLOAD, V.UNKNOWN_KEY]
    descs = nic.descriptors[:result.descriptors]
    assert descs["target"].tolist() == [7, 3, 3]
    assert descs["kind"].tolist() == [L.DescriptorKind.PORT, L.DescriptorKind.GROUP,
                                      L.DescriptorKind.GROUP]
    reasons = nic.drain_digests()["reason"].tolist()
    assert reasons == [DigestReason.PUNT, DigestReason.UNKNOWN_KEY, DigestReason.ACL_LOG,
                       DigestReason.UNKNOWN_KEY]


def test_descriptors_point_at_the_forwarded_messages_in_the_buffer():
    nic = _nic(_rows((5, KeyAction.FORWARD, 1, 0), (6, KeyAction.DROP, 0, 0)))
    msgs = [{"topic_key": k, "sequence": i, "payload": bytes([i]) * (i + 3)}
            for i, k in enumerate([5, 6, 5, 5])]
    buf, offsets, lengths = _frames(codec.encode_data_frame(msgs[:2]),
                                    codec.encode_data_frame(msgs[2:]))
    result = nic.process(buf, offsets, lengths)
    out = nic.descriptors[:result.descriptors]
    assert out["index"].tolist() == [0, 2, 3]
    for d, i in zip(out, (0, 2, 3)):
        view = codec.MessageView(bytes(buf), int(d["offset"]))
        assert view.sequence == i and bytes(view.payload) == bytes([i]) * (i + 3)
        assert view.size == d["length"]


def test_malformed_frames_are_counted_per_reason_and_the_rest_is_processed():
    nic = _nic(_rows((5, KeyAction.FORWARD, 1, 0)))
    good = codec.encode_data_frame([{"topic_key": 5}])
    bad_magic = b"XX" + good[2:]
    bad_version = good[:2] + b"\x09" + good[3:]
    result = nic.process(*_frames(good, bad_magic, good, bad_version, bad_magic))
    assert result.frames == 5 and result.descriptors == 2
    assert nic.malformed() == {"bad_magic": 2, "bad_version": 1}
    counters = nic.counters()
    assert counters["malformed_frames"] == 3 and counters["frames"] == 5
    assert counters["forwarded"] == 2


def test_admin_frames_are_counted_and_leave_no_messages():
    nic = _nic(_rows((5, KeyAction.FORWARD, 1, 0)))
    nak = bytes(codec.encode_admin(FrameType.NAK, [al.SeqRange(1, 3)]))
    result = nic.process(*_frames(nak, codec.encode_data_frame([{"topic_key": 5}])))
    assert result.messages == 1 and nic.counters()["admin_frames"] == 1


def test_the_digest_queue_is_bounded_and_counts_what_it_drops():
    nic = _nic(_rows((5, KeyAction.FORWARD, 1, 0)), digest_entries=4)
    frame = codec.encode_data_frame([{"topic_key": 1000 + i, "sequence": i} for i in range(10)])
    nic.process(*_frames(frame))
    assert nic.pending_digests() == 4
    assert nic.counters()["digest_drops"] == 6
    first = nic.drain_digests(3)
    assert first["sequence"].tolist() == [0, 1, 2]
    nic.process(*_frames(frame))
    assert nic.drain_digests()["sequence"].tolist() == [3, 0, 1, 2]


def test_a_full_batch_stops_early_and_the_rest_goes_in_the_next_call():
    nic = _nic(_rows((5, KeyAction.FORWARD, 1, 0)), burst_messages=5)
    frame = codec.encode_data_frame([{"topic_key": 5}] * 2)
    buf, offsets, lengths = _frames(frame, frame, frame, frame)
    first = nic.process(buf, offsets, lengths)
    assert (first.frames, first.messages) == (2, 4)
    rest = nic.process(buf, offsets[first.frames:], lengths[first.frames:])
    assert (rest.frames, rest.messages) == (2, 4)
    assert nic.counters()["forwarded"] == 8 and nic.counters()["frames"] == 4


def test_a_burst_with_too_many_frames_is_refused_with_advice():
    nic = _nic(_rows((5, KeyAction.FORWARD, 1, 0)), burst_frames=2)
    frame = codec.encode_data_frame([{"topic_key": 5}])
    with pytest.raises(OffloadUserError, match="burst_frames"):
        nic.process(*_frames(frame, frame, frame))


def test_per_key_counters_count_packets_and_bytes_and_survive_snapshot_swaps():
    rows = _rows((5, KeyAction.FORWARD, 1, 0), (6, KeyAction.DROP, 0, 0))
    switch = SnapshotSwitch(Snapshot.build(EntrySet(model.DEFAULT_SPEC, rows, version=1)))
    nic = SoftNic(switch)
    frame = codec.encode_data_frame([{"topic_key": 5, "payload": b"x" * 9}, {"topic_key": 6}])
    nic.process(*_frames(frame))
    # v2 keeps the rows and adds one: counters carry on
    grown = _rows((5, KeyAction.DROP, 0, 0), (6, KeyAction.DROP, 0, 0), (7, KeyAction.DROP, 0, 0))
    switch.publish(Snapshot.build(EntrySet(model.DEFAULT_SPEC, grown, version=2)))
    nic.process(*_frames(frame))
    assert nic.key_counters().as_dict() == {5: (2, 112), 6: (2, 80)}
    # v3 reorders the rows: counts are kept by key
    moved = _rows((7, KeyAction.DROP, 0, 0), (6, KeyAction.DROP, 0, 0))
    switch.publish(Snapshot.build(EntrySet(model.DEFAULT_SPEC, moved, version=3)))
    nic.process(*_frames(frame))
    assert nic.key_counters().as_dict() == {5: (2, 112), 6: (3, 120)}


@pytest.mark.parametrize("seed", range(6))
def test_the_fused_decode_agrees_with_the_protocols_batch_decoder(seed):
    """The kernel validates and parses frames itself (to prefetch each key as it is parsed);
    on damaged frames it must say what datapath.protocol.batch.decode_frames says."""
    rng = random.Random(100 + seed)
    entries, _ = random_entry_set(rng, 50)
    nic = SoftNic(Snapshot.build(entries), burst_messages=rng.choice([40, 16_384]))
    keys = entries.key_rows.keys.tolist()
    for _ in range(4):
        buf, offsets, lengths = random_burst(rng, keys, rng.randint(1, 60), malformed=0.4)
        if rng.random() < 0.3:  # offsets and lengths that lie outside the buffer
            offsets[rng.randrange(len(offsets))] = len(buf) + 8
            lengths[rng.randrange(len(lengths))] = -1
        exact = rng.random() < 0.8
        batch = new_message_batch(len(nic.batch))
        status = np.zeros(len(offsets), np.uint8)
        types = np.zeros(len(offsets), np.uint8)
        decoded = decode_frames(buf, offsets, lengths, batch, status, types, exact=exact)
        result = nic.process(buf, offsets, lengths, exact=exact)
        assert (result.frames, result.messages) == (decoded.frames, decoded.messages)
        assert nic.status[:len(offsets)].tolist() == status.tolist()
        done = result.frames  # beyond it, frame types are left as they were
        assert nic.frame_types[:done].tolist() == types[:done].tolist()
        assert nic.batch[:result.messages].tobytes() == batch[:decoded.messages].tobytes()


def _ring_outputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    return SoftNic.ring_outputs(n)


@pytest.mark.parametrize("seed", range(8))
def test_a_ring_matches_the_twin_burst_by_burst(seed):
    rng = random.Random(200 + seed)
    entries, _ = random_entry_set(rng, rng.choice([5, 80, 700]))
    burst_messages = rng.choice([12, 64, 16_384])
    nic = SoftNic(Snapshot.build(entries), burst_messages=burst_messages, burst_frames=64,
                  digest_entries=rng.choice([4, 4096]))
    state = TwinState(len(nic._digests))
    keys = entries.key_rows.keys.tolist()
    buf, offsets, lengths = random_burst(rng, keys, rng.randint(1, 300), max_messages=4)
    burst = rng.choice([1, 3, 16, 64])
    descriptors, verdicts = _ring_outputs(2_000)
    result = nic.process_ring(buf, offsets, lengths, descriptors, verdicts, burst_frames=burst)
    twin_descs, twin_verdicts, twin_frames = run_twin(
        bytes(buf), offsets.tolist(), lengths.tolist(), nic.snapshot.tables, state, burst,
        burst_messages)
    # a damaged msg_count larger than the batch stops both before that frame
    assert result.frames == twin_frames
    assert twin_frames == len(offsets) or burst_messages < 16_384
    assert verdicts[:result.messages].tolist() == twin_verdicts
    assert [tuple(int(x) for x in d) for d in descriptors[:result.descriptors]] == twin_descs
    assert nic._counters.tolist() == state.counters
    assert nic._malformed.tolist() == state.malformed
    counts = {row: [int(nic._key_counts[2 * row]), int(nic._key_counts[2 * row + 1])]
              for row in range(len(keys)) if nic._key_counts[2 * row]}
    assert counts == state.key_counts
    assert [tuple(int(x) for x in d) for d in nic.drain_digests()] == list(state.digests)
    assert result.bursts >= -(-result.frames // burst)


def test_a_ring_decides_like_the_same_frames_burst_by_burst():
    rng = random.Random(7)
    entries, _ = random_entry_set(rng, 300)
    keys = entries.key_rows.keys.tolist()
    buf, offsets, lengths = random_burst(rng, keys, 500)
    ring_nic, burst_nic = SoftNic(Snapshot.build(entries)), SoftNic(Snapshot.build(entries))
    descriptors, verdicts = _ring_outputs(4_000)
    ring = ring_nic.process_ring(buf, offsets, lengths, descriptors, verdicts, burst_frames=32)
    got_verdicts, got_descs = [], []
    for start in range(0, len(offsets), 32):
        first = len(got_verdicts)
        r = burst_nic.process(buf, offsets[start:start + 32], lengths[start:start + 32])
        got_verdicts += burst_nic.verdicts[:r.messages].tolist()
        for d in burst_nic.descriptors[:r.descriptors]:
            got_descs.append((int(d["offset"]), int(d["target"]), int(d["index"]) + first))
    assert verdicts[:ring.messages].tolist() == got_verdicts
    assert [(int(d["offset"]), int(d["target"]), int(d["index"]))
            for d in descriptors[:ring.descriptors]] == got_descs
    assert ring_nic.counters() == burst_nic.counters()
    assert ring_nic.key_counters().as_dict() == burst_nic.key_counters().as_dict()
    assert ring.bursts == -(-len(offsets) // 32)


def test_a_ring_stops_before_a_burst_its_outputs_cannot_hold():
    nic = _nic(_rows((5, KeyAction.FORWARD, 1, 0)))
    frame = codec.encode_data_frame([{"topic_key": 5}] * 3)
    buf, offsets, lengths = _frames(*[frame] * 10)
    descriptors, verdicts = _ring_outputs(14)
    first = nic.process_ring(buf, offsets, lengths, descriptors, verdicts, burst_frames=2)
    assert (first.frames, first.messages, first.bursts) == (4, 12, 2)
    assert nic.counters()["frames"] == 4 and nic.counters()["forwarded"] == 12
    rest = nic.process_ring(buf, offsets[first.frames:], lengths[first.frames:],
                            *_ring_outputs(100), burst_frames=2)
    assert (rest.frames, rest.messages) == (6, 18)
    with pytest.raises(OffloadUserError, match="burst_frames"):
        nic.process_ring(buf, offsets, lengths, descriptors, verdicts, burst_frames=0)
    with pytest.raises(OffloadUserError, match="ring_outputs"):
        nic.process_ring(buf, offsets, lengths, verdicts, descriptors)
