"""Snapshots are immutable and swap atomically under a running software NIC."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from datapath.protocol import codec
from nic_offload import model
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


def _expected(version: int, prices: list[int]) -> list[int | None]:
    """Per message: the port it goes to under ``version``, None when the ACL rejects it."""
    content = version % CONTENTS
    acl = AclClass.parse(1, QUOTE, [f"(price < {100 * content}, ACCEPT, REJECT)"])
    return [(i + 37 * content) % 500 if acl.evaluate(QUOTE.encode({"price": p}))
            is Verdict.ACCEPT else None for i, p in enumerate(prices)]


def test_no_burst_ever_sees_a_half_updated_table():
    versions = 120
    first = Snapshot.build(_entries(1))
    snapshots = [first]
    for v in range(2, versions + 1):  # all rows and the ACL change at every version
        snapshots.append(snapshots[-1].evolve(_entries(v), np.arange(len(KEYS)), True))
    switch = SnapshotSwitch(first)
    nic = SoftNic(switch)
    prices = [(i * 53) % 450 for i in range(len(KEYS))]
    frames = [codec.encode_data_frame([{"topic_key": k, "payload": QUOTE.encode({"price": p})}
                                       for k, p in zip(KEYS[i:i + 50], prices[i:i + 50])])
              for i in range(0, len(KEYS), 50)]
    lengths = np.array([len(f) for f in frames], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    buf = np.frombuffer(b"".join(frames), np.uint8).copy()
    expected = {v: _expected(v, prices) for v in range(1, versions + 1)}

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
        result = nic.process(buf, offsets, lengths)
        seen.add(result.version)
        got: list[int | None] = [None] * result.messages
        for d in nic.descriptors[:result.descriptors]:
            got[d["index"]] = int(d["target"])
        assert got == expected[result.version], f"burst of version {result.version} mixed"
        assert (nic.verdicts[:result.messages] != MessageVerdict.NOT_PROCESSED).all()
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
