"""A guaranteed stream towards an appliance outlives a spell in which that appliance is
unreachable and forgotten by the routing (its link state aged out); it restarts only when the
appliance itself restarts (a new epoch).

The data-path half: two GuaranteedPlanes (A, node 1, sending to destination D, node 2)
exchange frames in process (the stand-ins of tests/appliance/test_guaranteed_refusal.py).
A's tables lose D (no next hop, no epoch) while messages go on; when D is back with the same
epoch, D's receiver, which never lost its stream state, must get every message once and in
order. The control half: an appliance whose link state ages out keeps the interest of an
origin with guaranteed patterns (so its ``g:`` egress and epoch stay) and forgets one
without.
"""

from __future__ import annotations

import time

from appliance.config import LSA_MAX_AGE_REFRESHES, parse_config
from appliance.control.agent import ControlAgent
from appliance.control.auth import FabricAuth
from appliance.control.routing import Lsa
from appliance.dataplane.agent import DataPlaneAgent, ForwardingTables
from appliance.dataplane.guaranteed import RELIABLE_STREAM_BIT, GuaranteedPlane
from appliance.dataplane.names import FABRIC
from datapath.topics.registry import KeyRegistry
from nic_offload.compiler import OffloadCompiler
from nic_offload.snapshot import SnapshotSwitch
from nic_offload.softnic import SoftNic
from tests.appliance.test_guaranteed_refusal import _DataPath, _exchange, _message, _plane

A, D = 1, 2
PUBLISHER = 5
MS = 1_000_000
EPOCH = D
"""D's epoch: a stand-in plane's is its node id (test_guaranteed_refusal._plane)."""


def _tables(reachable: bool, epoch: int | None = EPOCH) -> ForwardingTables:
    return ForwardingTables(A, next_hop={D: D} if reachable else {},
                            epochs={} if epoch is None else {D: epoch})


def _run(a: GuaranteedPlane, d: GuaranteedPlane, now: int, cycles: int) -> int:
    for _ in range(cycles):
        now += 2 * MS
        for plane in (a, d):
            plane.run_timers(now)
            plane.flush(now)
        _exchange(a, d, now)
    return now


def _delivered(d: GuaranteedPlane) -> list[int]:
    return [int.from_bytes(m[0:8]) for _, _, m in d.take_delivered()]


def test_a_sender_outlives_its_destination_being_forgotten_and_resumes_its_stream():
    a = _plane(_DataPath(A, D), 1_472)
    d = _plane(_DataPath(D, A), 1_472)
    now, key = 10 * MS, 100
    for _ in range(5):
        a.to_node(D, PUBLISHER, *_message(key, b"x"), now)
        key += 1
    now = _run(a, d, now, 5)
    assert _delivered(d) == list(range(100, 105))
    sender = a.senders[("n", D, PUBLISHER | RELIABLE_STREAM_BIT)].sender

    # D unreachable, then forgotten (its link state and interest aged out): the sender stays
    a.dp.tables = _tables(reachable=False)
    a.on_tables(a.dp.tables)
    for _ in range(5):
        a.to_node(D, PUBLISHER, *_message(key, b"x"), now)
        key += 1
    now = _run(a, d, now, 5)
    a.dp.tables = _tables(reachable=False, epoch=None)
    a.on_tables(a.dp.tables)
    assert a.senders[("n", D, PUBLISHER | RELIABLE_STREAM_BIT)].sender is sender
    now = _run(a, d, now, 5)
    assert a.counters["guaranteed_unroutable"] > 0 and _delivered(d) == []

    # heard again, same epoch: the same stream goes on and D recovers what it missed
    a.dp.tables = _tables(reachable=True)
    a.on_tables(a.dp.tables)
    for _ in range(5):
        a.to_node(D, PUBLISHER, *_message(key, b"x"), now)
        key += 1
    now = _run(a, d, now, 200)
    assert _delivered(d) == list(range(105, 115))
    assert d.counters["guaranteed_loss_events"] == 0
    assert a.senders[("n", D, PUBLISHER | RELIABLE_STREAM_BIT)].sender is sender


def test_a_new_epoch_of_the_destination_restarts_the_stream():
    a = _plane(_DataPath(A, D), 1_472)
    a.to_node(D, PUBLISHER, *_message(100, b"x"), 10 * MS)
    a.on_tables(_tables(reachable=True, epoch=EPOCH + 1))
    assert a.senders == {} and a.counters["guaranteed_streams_restarted"] == 1
    a.dp.tables = _tables(reachable=True, epoch=EPOCH + 1)
    a.to_node(D, PUBLISHER, *_message(101, b"x"), 11 * MS)
    assert a.senders[("n", D, PUBLISHER | RELIABLE_STREAM_BIT)].sender.highest_sent in (0, 1)


def test_a_restarted_destination_refuses_the_stream_made_for_its_earlier_incarnation():
    """The race of docs/fault-tolerance.md: D restarts while A's stream to it goes on, and the
    old stream's frames reach D's new incarnation before A learns its new epoch. D must not
    take that stream up in the middle (it NAKed a beginning the old sender no longer held,
    declared it lost, and later dropped the new stream's first messages as duplicates of the
    old numbering): it refuses the old stream's frames, and once A knows the new epoch the new
    stream delivers every message from its first, once and in order."""
    a = _plane(_DataPath(A, D), 1_472)
    d = _plane(_DataPath(D, A), 1_472)
    now, key = 10 * MS, 100
    for _ in range(50):  # the old stream is well past its beginning
        a.to_node(D, PUBLISHER, *_message(key, b"x"), now)
        key += 1
    now = _run(a, d, now, 5)
    assert _delivered(d) == list(range(100, 150))

    restarted = GuaranteedPlane(_DataPath(D, A), 1_472)  # D's next incarnation: epoch 3
    restarted.use_auth(FabricAuth(bytes(range(32)), 1, EPOCH + 1, 3_000_000 * D))
    for _ in range(10):  # A still sends on the old stream (it knows only the old epoch)
        a.to_node(D, PUBLISHER, *_message(key, b"x"), now)
        key += 1
    now = _run(a, restarted, now, 20)
    receiver = restarted.receivers.get(FABRIC)
    assert _delivered(restarted) == [] and (receiver is None or not receiver.streams)
    assert restarted.counters["guaranteed_auth_refused_bad_mac"] > 0

    a.dp.tables = _tables(reachable=True, epoch=EPOCH + 1)  # A hears the new epoch
    a.on_tables(a.dp.tables)
    assert a.counters["guaranteed_streams_restarted"] == 1
    first_new = key
    for _ in range(20):
        a.to_node(D, PUBLISHER, *_message(key, b"x"), now)
        key += 1
    now = _run(a, restarted, now, 50)
    assert _delivered(restarted) == list(range(first_new, key))
    assert restarted.counters["guaranteed_loss_events"] == 0


def _control() -> ControlAgent:
    cfg = parse_config({"appliance": {"name": "held", "id": A, "lsa_refresh_ms": 100},
                        "fabric": {"key": "44" * 32}})
    registry = KeyRegistry()
    compiler = OffloadCompiler(registry)
    switch = SnapshotSwitch(compiler.build())
    dp = DataPlaneAgent(A, SoftNic(switch), {}, fabric_max_frame_bytes=1_472)
    return ControlAgent(cfg, dp, compiler, registry)


def test_an_aged_out_origin_keeps_its_guaranteed_interest_and_loses_the_rest():
    control = _control()
    now = time.monotonic_ns()
    g, b = 7, 8  # an origin with guaranteed interest, one with best-effort interest only
    for origin, gpatterns in ((g, frozenset({(0, "g/#")})), (b, frozenset())):
        control.lsdb[origin] = Lsa(origin, f"n{origin}", EPOCH, 1, ())
        control.lsa_heard_ns[origin] = now
        control.names[origin] = f"n{origin}"
        control.interest[origin] = (EPOCH, 1, frozenset({(0, "b/#")}), gpatterns)
    control._refresh_at = 0
    control._timers(now + (LSA_MAX_AGE_REFRESHES + 1) * 100 * MS)
    assert g not in control.lsdb and b not in control.lsdb
    assert g in control.interest and b not in control.interest
    assert control.counters["guaranteed_interest_held"] == 1
    control._sync_destinations()
    assert ("g", g) in control.dest_egress and ("n", g) not in control.dest_egress
    assert not any(node == b for _, node in control.dest_egress)
