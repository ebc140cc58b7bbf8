"""Snapshots are immutable and swap atomically under a running software NIC."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from datapath.protocol import codec
from nic_offload import buffers, model
from nic_offload.acl import AclClass, Verdict, compile_class
from nic_offload.errors import OffloadUserError
from nic_offload.model import EntrySet, KeyAction, KeyRows
from nic_offload.snapshot import Snapshot, SnapshotSwitch
from nic_offload.softnic import SoftNic
from nic_offload.softnic.layout import MessageVerdict
from tests.nic_offload.helpers import QUOTE

KEYS = list(range(1000, 1400))
CONTENTS = 5
SWAP_PAUSE_S = 0.0005


def _entries(version: int) -> EntrySet:
    """Version v forwards key i to port (i + 37 v) % 500 and accepts price < 100 (v % 5)."""
    content = version % CONTENTS
    rows = KeyRows(np.array(KEYS, np.uint64), np.full(len(KEYS), KeyAction.FORWARD, np.uint8),
                   np.array([(i + 37 * content) % 500 for i in range(len(KEYS))], np.uint32),
                   np.ones(len(KEYS), np.uint16))
    acl = AclClass.parse(1, QUOTE, [f"(price < {100 * content}, ACCEPT, REJECT)"])
    return EntrySet(model.DEFAULT_SPEC, rows, tuple(compile_class(acl, model.DEFAULT_SPEC)),
                    (), version)


def _expected(version: int, prices: list[int]) -> np.ndarray:
    """Per message: the port it goes to under ``version``, -1 when the ACL rejects it."""
    content = version % CONTENTS
    acl = AclClass.parse(1, QUOTE, [f"(price < {100 * content}, ACCEPT, REJECT)"])
    return np.array([(i + 37 * content) % 500 if acl.evaluate(QUOTE.encode({"price": p}))
                     is Verdict.ACCEPT else -1 for i, p in enumerate(prices)], np.int64)


class _Traffic:
    """Every key once per pass (50 messages a frame, ``passes`` passes) and, for each
    version, where each message must go."""

    def __init__(self, versions: int, passes: int = 1) -> None:
        prices = [(i * 53) % 450 for i in range(len(KEYS))]
        frames = [codec.encode_data_frame(
            [{"topic_key": k, "payload": QUOTE.encode({"price": p})}
             for k, p in zip(KEYS[i:i + 50], prices[i:i + 50])])
            for i in range(0, len(KEYS), 50)] * passes
        self.lengths = np.array([len(f) for f in frames], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.buf = np.frombuffer(b"".join(frames), np.uint8).copy()
        self.expected = {v: np.tile(_expected(v, prices), passes)
                         for v in range(1, versions + 1)}

    def run_and_check(self, nic: SoftNic) -> int:
        """One burst; fail unless every message went where the burst's version says."""
        result = nic.process(self.buf, self.offsets, self.lengths)
        got = np.full(result.messages, -1, np.int64)
        forwarded = nic.descriptors[:result.descriptors]
        got[forwarded["index"]] = forwarded["target"]
        mixed = np.flatnonzero(got != self.expected[result.version])
        assert not len(mixed), (f"a burst of version {result.version} sent messages "
                                f"{mixed[:5].tolist()} elsewhere: versions mixed")
        assert (nic.verdicts[:result.messages] != MessageVerdict.NOT_PROCESSED).all()
        return result.version


def test_no_burst_ever_sees_a_half_updated_table():
    versions = 120
    first = Snapshot.build(_entries(1))
    snapshots = [first]
    for v in range(2, versions + 1):  # all rows and the ACL change at every version
        snapshots.append(snapshots[-1].evolve(_entries(v), np.arange(len(KEYS)), True))
    switch = SnapshotSwitch(first)
    nic = SoftNic(switch)
    traffic = _Traffic(versions)
    done = threading.Event()

    def swapper() -> None:
        for snap in snapshots[1:]:
            switch.publish(snap)
            time.sleep(SWAP_PAUSE_S)  # let bursts run between swaps, and during them
        done.set()

    seen: set[int] = set()
    thread = threading.Thread(target=swapper)
    thread.start()
    while not done.is_set():
        seen.add(traffic.run_and_check(nic))
    thread.join()
    assert len(seen) > versions // 4  # bursts really ran across many swaps


def test_publishing_an_older_version_is_refused():
    switch = SnapshotSwitch(Snapshot.build(_entries(3)))
    with pytest.raises(OffloadUserError, match="not newer"):
        switch.publish(Snapshot.build(_entries(2)))
    switch.publish(Snapshot.build(_entries(4)))
    assert switch.current.version == 4 and switch.swaps == 1


def test_a_snapshot_cannot_be_changed_in_place():
    snap = Snapshot.build(_entries(1))
    for array in (snap.tables.slots, snap.tables.bound_lo, snap.tables.class_root,
                  snap.entries.key_rows.keys, snap.entries.key_rows.actions):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1


def test_evolving_needs_a_newer_version():
    snap = Snapshot.build(_entries(2))
    with pytest.raises(OffloadUserError, match="increase"):
        snap.evolve(_entries(2), np.arange(3), False)


def test_compiling_and_swapping_while_a_data_path_thread_runs_never_mixes_versions():
    """The data path runs in its own thread (the kernel releases the GIL); the control
    thread compiles each next version from the current one (patching the other of its two
    slot buffers when no burst holds it, else a copy) and publishes it while bursts are in
    flight. Every burst must be exactly one
    version, and publishes must have landed while bursts ran (else nothing raced)."""
    versions = 60
    switch = SnapshotSwitch(Snapshot.build(_entries(1)))
    nic = SoftNic(switch)
    traffic = _Traffic(versions, passes=10)
    stop = threading.Event()
    outcome: dict = {"raced": 0, "seen": set(), "error": None}

    def data_path() -> None:
        try:
            while not stop.is_set():
                swaps = switch.swaps
                outcome["seen"].add(traffic.run_and_check(nic))
                outcome["raced"] += switch.swaps != swaps
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=data_path)
    thread.start()
    try:
        current = switch.current
        for v in range(2, versions + 1):  # compiled here, while bursts run
            current = current.evolve(_entries(v), np.arange(len(KEYS)), True)
            switch.publish(current)
            time.sleep(SWAP_PAUSE_S)
    finally:
        stop.set()
        thread.join()
    if outcome["error"] is not None:
        raise outcome["error"]
    assert outcome["raced"] > 0, "no publish landed while a burst ran"
    assert len(outcome["seen"]) > versions // 4
    # versions were made in the buffer the data path had left (two buffers patched in turn,
    # nic_offload/buffers.py), not only in copies: the race covered that path too
    assert buffers._PAIRS[current.tables]["slots"].patched > 0
