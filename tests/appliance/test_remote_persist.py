"""Persisted reports between appliances, at unit level (appliance/dataplane/remote_persist.py
and the control agent's PERSISTED handling, control/fabric.py): what the caching appliance
reports per stream, what the publisher's appliance does with each entry, and that a forged,
unknown, unsolicited or impossible report is refused and counted without moving a gate. The
end-to-end cases (two real appliances, real files) are in test_cache_ack_remote.py."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

from appliance.config import NeighbourConfig
from appliance.control.auth import FabricAuth
from appliance.control.fabric import FabricSide
from appliance.control.state import Neighbour
from appliance.dataplane import remote_persist as rp
from appliance.dataplane.guaranteed import _Gate
from appliance.dataplane.names import PERSISTED_CHANNEL
from datapath.protocol import admin_layout as al
from datapath.protocol.codec import encode_admin
from datapath.protocol.frame_layout import FrameType

R = rp.RELIABLE
SESSION = 7
CACHING = 2
"""The caching appliance's node id (the publisher's appliance is 1)."""


def _publisher_side(waiting: list[tuple[int, int]], sent: int) -> SimpleNamespace:
    """The parts of a ``GuaranteedPlane`` the waiter uses (a unit test of ``Waiter``): one
    publisher's gate, its sender towards the caching appliance having taken ``sent``
    positions."""
    gate = _Gate("clients-udp")
    gate.waiting.extend(waiting)
    failed: list[tuple[int, int, str]] = []
    plane = SimpleNamespace(
        gates={SESSION: gate}, counters=Counter(), _busy=set(), failed=failed,
        senders={("n", CACHING, SESSION | R): SimpleNamespace(
            sender=SimpleNamespace(next_seq=sent + 1, pending=[]))},
        _persist_failed=lambda session, seq, why: failed.append((session, seq, why)))
    plane.waiter = rp.Waiter(plane, CACHING, "core2")
    return plane


def test_an_entry_acknowledges_what_it_covers_and_no_more():
    plane = _publisher_side([(10, 1), (11, 2), (12, 3)], sent=3)
    plane.waiter.take([[SESSION | R, 1, 2, 0, ""]])
    assert list(plane.gates[SESSION].waiting) == [(12, 3)]
    assert plane.counters["guaranteed_persisted_acks"] == 2 and not plane.failed
    plane.waiter.take([[SESSION | R, 1, 2, 0, ""]])  # the same again (a resend): nothing
    assert plane.counters["guaranteed_persisted_acks"] == 2


def test_a_failed_position_ends_the_publishers_session_naming_the_caching_appliance():
    plane = _publisher_side([(10, 1), (11, 2), (12, 3)], sent=3)
    plane.waiter.take([[SESSION | R, 1, 1, 2, "the cache's queue was full"]])
    assert list(plane.gates[SESSION].waiting) == [(11, 2), (12, 3)]
    assert plane.failed == [(SESSION, 11, "core2: the cache's queue was full")]


def test_a_position_before_the_stream_was_followed_is_failed_not_acknowledged():
    plane = _publisher_side([(10, 1), (11, 2)], sent=2)
    plane.waiter.take([[SESSION | R, 2, 2, 0, ""]])  # followed from 2: 1 is not covered
    assert plane.counters["guaranteed_persisted_acks"] == 0
    assert plane.failed and plane.failed[0][:2] == (SESSION, 10)


def test_unknown_or_impossible_entries_are_refused_and_counted():
    plane = _publisher_side([(10, 1), (11, 2)], sent=2)
    plane.waiter.take([[99 | R, 1, 2, 0, ""],  # no such publisher
                       [SESSION, 1, 2, 0, ""]])  # not a guaranteed stream
    assert plane.counters["persist_remote_entries_unknown"] == 2
    plane.waiter.take([[SESSION | R, 1, 5, 0, ""],  # beyond what was sent
                       [SESSION | R, 1, 2, 2, "x"]])  # failed at a position it settled
    assert plane.counters["persist_remote_entries_refused"] == 2
    assert len(plane.gates[SESSION].waiting) == 2 and not plane.failed


def _caching_side(present: bool = True) -> tuple[SimpleNamespace, list[dict]]:
    out: list[dict] = []

    def to_inbox(channel, data):
        assert channel == PERSISTED_CHANNEL
        out.append(json.loads(data))
        return True

    plane = SimpleNamespace(counters=Counter(), cache_present=lambda: present,
                            dp=SimpleNamespace(to_inbox=to_inbox))
    return plane, out


def test_the_caching_side_reports_what_went_to_the_cache_once_persisted():
    plane, out = _caching_side()
    rep = rp.Reporter(plane)
    for pos in (1, 2, 3):
        rep.routed(1, SESSION | R, pos)
    rep.to_cache(1, SESSION | R, 2, 40)  # position 2 went to the cache as its 40
    rep.emit(0)
    assert out[-1] == {"to": 1, "streams": [[SESSION | R, 1, 1, 0, ""]]}
    rep.persisted(1, SESSION, 39)  # one from before the stream was followed: not ours
    assert plane.counters["persist_remote_untracked"] == 1
    assert rep.streams[(1, SESSION | R)].failed == 0
    rep.persisted(1, SESSION, 40)  # (the cache's stream id, without the bit)
    rep.emit(1)
    assert out[-1]["streams"] == [[SESSION | R, 1, 3, 0, ""]]
    rep.to_cache(1, SESSION | R, 3, 41)
    rep.unkept(1, SESSION, 41, 41, "too large")
    rep.emit(2)
    assert out[-1]["streams"] == [[SESSION | R, 1, 2, 3, "too large"]]


def test_the_caching_side_follows_nothing_while_its_cache_is_not_there():
    plane, out = _caching_side(present=False)
    rep = rp.Reporter(plane)
    rep.routed(1, SESSION | R, 1)
    rep.emit(0)
    assert not rep.streams and not out
    present = [True]
    plane.cache_present = lambda: present[0]
    rep.routed(1, SESSION | R, 2)
    present[0] = False  # its cache's session ended: a followed stream fails there
    rep.routed(1, SESSION | R, 3)
    present[0] = True
    rep.routed(1, SESSION | R, 4)  # back: never settled past 3
    rep.emit(1)
    assert out[-1]["streams"][0][:4] == [SESSION | R, 2, 2, 3]


def test_the_followed_streams_are_bounded(monkeypatch):
    monkeypatch.setattr(rp, "MAX_STREAMS", 2)
    plane, out = _caching_side()
    rep = rp.Reporter(plane)
    rep.routed(1, 1 | R, 1)
    rep.to_cache(1, 1 | R, 1, 1)  # waits
    rep.routed(1, 2 | R, 1)  # nothing waits: the one to go
    rep.routed(1, 3 | R, 5)
    assert set(rep.streams) == {(1, 1 | R), (1, 3 | R)}
    assert plane.counters["persist_remote_streams_evicted"] == 1
    rep.to_cache(1, 3 | R, 5, 1)
    rep.routed(1, 4 | R, 9)  # both wait: refused, and told failed at once
    assert (1, 4 | R) not in rep.streams
    assert plane.counters["persist_remote_streams_refused"] == 1
    assert out[-1]["streams"][0][:4] == [4 | R, 9, 8, 9]


# --- the control agent: where a PERSISTED document comes from -------------------------------
KEY = bytes(range(32))


def _control_side(remote: str = "core2") -> SimpleNamespace:
    """The parts of the control agent ``FabricSide._on_fabric`` uses (a unit test of its
    PERSISTED handling): neighbours core2 (node 2) and core3 (node 3), both up."""
    commands: list[tuple] = []
    nbs = {}
    for peer, (name, node) in enumerate((("core2", 2), ("core3", 3)), start=100):
        nbs[peer] = Neighbour(NeighbourConfig(name, ("127.0.0.1", 47000 + peer)), peer,
                              node_id=node, up=True)
    side = SimpleNamespace(
        by_peer=nbs, node_id=1, auth=FabricAuth(KEY, 1, 1_000), counters=Counter(),
        cfg=SimpleNamespace(name="core1", persist_remote=remote), commands=commands,
        dp=SimpleNamespace(command=lambda *args: commands.append(args)),
        _log_once=lambda *args: None, _bad_document=lambda *args: None)
    side._on_fabric_control = lambda *args: FabricSide._on_fabric_control(side, *args)
    return side


def _persisted_frame(source: int, key: bytes = KEY) -> bytes:
    auth = FabricAuth(key, 1, 2_000 + source)
    frame = encode_admin(FrameType.CONTROL, [al.Control(al.ControlKind.PERSISTED, json.dumps(
        {"streams": [[SESSION | R, 1, 2, 0, ""]]}))], source_session=source, dest_session=1,
        send_ts_ns=1, auth=auth.next_auth())
    return bytes(auth.sign(frame))


def test_a_persisted_report_of_the_configured_neighbour_reaches_the_data_path():
    side = _control_side()
    FabricSide._on_fabric(side, 100, _persisted_frame(2), 0)
    assert side.commands == [("remote_persisted", [[SESSION | R, 1, 2, 0, ""]])]
    assert side.counters["persisted_reports_received"] == 1


def test_a_forged_or_unsolicited_report_is_refused_and_counted():
    side = _control_side()
    FabricSide._on_fabric(side, 100, _persisted_frame(2, key=bytes(32)), 0)  # another key
    assert side.auth.rejected["bad_mac"] == 1
    FabricSide._on_fabric(side, 101, _persisted_frame(3), 0)  # core3 is not cache.remote
    assert side.counters["persisted_reports_refused"] == 1
    FabricSide._on_fabric(side, 100, _persisted_frame(3), 0)  # core3's frame at core2's
    assert side.counters["neighbour_id_mismatch"] == 1  # address
    assert side.commands == []
    side = _control_side(remote=None)  # no cache.remote here at all
    FabricSide._on_fabric(side, 100, _persisted_frame(2), 0)
    assert side.counters["persisted_reports_refused"] == 1 and side.commands == []


def test_the_caching_appliance_sends_a_report_to_that_neighbour_only():
    from appliance.control.agent import ControlAgent

    sent: list[tuple] = []
    side = _control_side()
    side.neighbours = {nb.config.name: nb for nb in side.by_peer.values()}
    side._to_neighbour = lambda nb, ftype, entries: sent.append((nb.node_id, ftype, entries))
    side._control = lambda kind, doc: ControlAgent._control(side, kind, doc)
    doc = {"to": 3, "streams": [[SESSION | R, 1, 2, 0, ""]]}
    ControlAgent._send_persisted(side, json.dumps(doc).encode())
    [(node, ftype, [entry])] = sent
    assert (node, ftype, entry.kind) == (3, FrameType.CONTROL, al.ControlKind.PERSISTED)
    assert json.loads(entry.document) == {"streams": doc["streams"]}
    side.by_peer[101].up = False  # not an up neighbour: counted, not sent
    ControlAgent._send_persisted(side, json.dumps(doc).encode())
    assert len(sent) == 1 and side.counters["persisted_reports_unroutable"] == 1


def _beacon_frame(source: int, patterns: list[str]) -> bytes:
    auth = FabricAuth(KEY, 1, 3_000 + source)
    frame = encode_admin(FrameType.CONTROL, [al.Control(al.ControlKind.PERSISTED, json.dumps(
        {"streams": [], "patterns": patterns}))], source_session=source, dest_session=1,
        send_ts_ns=1, auth=auth.next_auth())
    return bytes(auth.sign(frame))


def test_publishes_are_taken_only_while_the_neighbours_cache_interest_is_known_here():
    from appliance.control.agent import ControlAgent

    side = _control_side()
    side.neighbours = {nb.config.name: nb for nb in side.by_peer.values()}
    side.cache, side._remote_patterns, side._remote_ready = None, None, False
    side._tables_dirty, side._pending_snapshot = True, None
    side.interest = {2: (1, 1, frozenset(), frozenset({(0, "orders/#"), (0, "fx/#")}))}
    ControlAgent._persisted_timers(side, 0)
    assert side.commands == []  # no beacon yet: not ready
    FabricSide._on_fabric(side, 100, _beacon_frame(2, ["orders/#"]), 0)
    assert side.commands == []  # a beacon moves no gate
    ControlAgent._persisted_timers(side, 1)
    assert side.commands == []  # the tables that route to its cache are not built yet
    side._tables_dirty, side._pending_snapshot = False, object()
    ControlAgent._persisted_timers(side, 1)
    assert side.commands == []  # ... nor sent to the data path
    side._pending_snapshot = None
    ControlAgent._persisted_timers(side, 1)
    assert side.commands == [("remote_ready", True)]
    side.interest[2] = (1, 2, frozenset(), frozenset({(0, "fx/#")}))  # withdrawn
    ControlAgent._persisted_timers(side, 2)
    assert side.commands[-1] == ("remote_ready", False)
    side.interest[2] = (1, 3, frozenset(), frozenset({(0, "orders/#")}))
    ControlAgent._persisted_timers(side, 3)
    side.by_peer[100].up = False  # the neighbour is down
    ControlAgent._persisted_timers(side, 4)
    assert side.commands[-2:] == [("remote_ready", True), ("remote_ready", False)]


def test_the_cache_counts_as_there_only_once_it_said_it_is_subscribed():
    """Between the cache session's login and its subscriptions, a neighbour's message routed
    here does not reach it: it must not be reported settled (the Reporter follows nothing
    while the cache is not there)."""
    from appliance.dataplane.guaranteed import GuaranteedPlane

    plane = SimpleNamespace(_cache_ready=None, dp=SimpleNamespace(sessions={5: object()}))
    assert not GuaranteedPlane.cache_present(plane)  # logged in, not subscribed yet
    GuaranteedPlane.cache_ready(plane, 5)
    assert GuaranteedPlane.cache_present(plane)
    del plane.dp.sessions[5]  # its session ended
    assert not GuaranteedPlane.cache_present(plane)
