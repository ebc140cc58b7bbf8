"""Exactly once for MQTT QoS 2 across a crash of the publishing edge
(appliance/edge/mqtt/exactly_once.py). A crash is what it leaves on disk: the state store's
journal is append-only and synced, so the journal of an edge stopped later, cut after a
chosen record, is the journal of an edge killed right after that record. The edge started
again on it publishes the not-retired publish again, as after a ``kill -9``; the
subscribers that had the message must not get it twice."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from paho.mqtt.packettypes import PacketTypes

from appliance.config import parse_config
from appliance.edge.mqtt import journal, store
from appliance.edge.mqtt.exactly_once import RecentIds
from appliance.edge.mqtt.state import Delivery
from appliance.edge.node import EdgeAppliance
from tests.edge.conftest import counter, edge_doc, wait_counter, wait_for
from tests.edge.peers import Peer
from tests.edge.test_fabric_metadata import _next_on, _ready, edge_core_edge, props


def cut_journal_after(state_dir: Any, keep: Callable[[bytes], bool]) -> None:
    """Leave the journal as a crash right after its first record ``keep`` accepts would."""
    path = state_dir / store.JOURNAL
    bodies, _ = journal.read(path, store.MAGIC, store.MAGIC_READ)
    at = next(i for i, body in enumerate(bodies) if keep(body))
    path.write_bytes(store.MAGIC + b"".join(journal.frame(b) for b in bodies[:at + 1]))


def put_of(space: int, payload: bytes = b"") -> Callable[[bytes], bool]:
    return lambda body: body[0] == store.PUT and body[1] == space and body.endswith(payload)


def test_a_qos2_publish_sent_again_after_a_crash_reaches_another_edge_once(tmp_path):
    state, docs = tmp_path / "state", []

    def with_state(doc: dict) -> None:  # (edge A's document, kept to start it again)
        doc["mqtt"]["state_dir"] = str(state)
        docs.append(doc)

    with edge_core_edge(edit_a=with_state) as (edge_a, edge_b, native):
        sub = Peer(edge_b, "eo-sub", user=None, version=5)
        at_core = native.subscribe("eo/#", qos="guaranteed")  # a native subscriber too
        again = None
        try:
            assert sub.subscribe("eo/#", 2) == 2
            with Peer(edge_a, "eo-pub", version=5) as pub:
                _ready(pub, [sub], "eo")
                pub.publish("eo/1", b"once", 2)  # PUBREC came: its record is on disk
                got = _next_on(sub, "eo/1")
                assert (got.payload, got.qos) == (b"once", 2)
            edge_a.stop()  # (a clean stop: the publish is retired, then cut back)
            cut_journal_after(state, put_of(store.INBOUND, b"once"))
            again = EdgeAppliance(parse_config(docs[0])).start()
            assert counter(again, "store_inbound_republished") == 1
            wait_counter(edge_b, "deliveries_duplicates_dropped", 1)
            wait_for(lambda: native.connection_counters()["republished_dropped"] == 1,
                     what="the native subscriber dropping the copy")
            with Peer(again, "eo-pub2", version=5) as pub:
                pub.publish("eo/2", b"after", 2)
            got = _next_on(sub, "eo/2")  # the copy of eo/1 did not come before it
            assert (got.topic, got.payload) == ("eo/2", b"after")
            native_got = _native_until(at_core, "eo/2")
            assert native_got == [("eo/1", b"once"), ("eo/2", b"after")], native_got
        finally:
            sub.close()
            if again is not None:
                again.stop()


def _native_until(sub: Any, topic: str) -> list[tuple[str, bytes]]:
    """The messages of ``sub`` up to the first on ``topic``, but ``_ready``'s probes (a
    deadline for each)."""
    got: list[tuple[str, bytes]] = []
    while not got or got[-1][0] != topic:
        msg = sub.get(timeout=30)
        assert msg is not None, f"no message on {topic!r} after {got}"
        if "/probe" not in msg.topic:
            got.append((msg.topic, msg.payload))
    return got


def test_a_persistent_session_that_completed_a_qos2_flow_does_not_get_it_again(tmp_path):
    """The subscriber is on the publishing edge: its PUBCOMP came, its delivery record was
    deleted, and the edge crashed before the publish was retired."""
    state = tmp_path / "state"
    doc = edge_doc(state_dir=str(state))
    edge = EdgeAppliance(parse_config(doc)).start()
    expiry = props(PacketTypes.CONNECT, SessionExpiryInterval=600)
    try:
        sub = Peer(edge, "pc-sub", version=5, clean=False, props=expiry)
        assert sub.subscribe("pc/#", 2) == 2
        with Peer(edge, "pc-pub", version=5) as pub:
            pub.publish("pc/1", b"first", 2)
            got = sub.next()
            assert (got.topic, got.payload, got.qos) == ("pc/1", b"first", 2)
            wait_for(lambda: edge.mqtt.store._done, what="the completed flow recorded")
        sub.close()
        edge.stop()
        cut_journal_after(state, put_of(store.DONE))
        edge = EdgeAppliance(parse_config(doc)).start()
        assert counter(edge, "store_inbound_republished") == 1
        with Peer(edge, "pc-sub", version=5, clean=False, props=expiry) as sub:
            assert sub.session_present
            wait_counter(edge, "store_duplicates_skipped", 1)
            with Peer(edge, "pc-pub", version=5) as pub:
                pub.publish("pc/2", b"second", 2)
            got = sub.next()
            assert (got.topic, got.payload) == ("pc/2", b"second")
    finally:
        edge.stop()


def test_a_qos2_delivery_to_a_persistent_session_waits_for_its_record():
    """Unit: the PUBLISH goes to the client only from the record's sync callback."""
    from appliance.edge.mqtt.sessions import SessionState

    synced: list[Callable[[bool], None]] = []
    sent: list[int] = []
    server = _FakeServer(synced)
    state = SessionState.__new__(SessionState)
    state.server, state.stored, state.inflight = server, True, {}
    state._unrecorded, state._ids, state.count = set(), itertools.cycle([7]), lambda *a: None
    state.conn = _FakeConn(sent)
    d = Delivery("t", b"x", 2)
    state._send_new(d)
    assert sent == [] and state.inflight == {7: d} and state._unrecorded == {7}
    synced.pop()(True)
    assert sent == [7] and state._unrecorded == set()


class _FakeServer:
    def __init__(self, synced: list) -> None:
        self.store = self
        self._synced = synced

    def sent(self, _state: Any, _pid: int, _d: Any, on_synced: Any = None) -> None:
        self._synced.append(on_synced)


class _FakeConn:
    closing = False

    def __init__(self, sent: list[int]) -> None:
        self._sent = sent

    def send_publish(self, _d: Any, packet_id: int, _dup: bool) -> bool:
        self._sent.append(packet_id)
        return True


def test_recent_ids_forget_the_oldest_beyond_their_capacity():
    ids = RecentIds(2)
    # (3,) pushes (1,) out; (1,) again pushes (2,) out
    assert [ids.seen_before(k) for k in [(1,), (2,), (1,), (3,), (1,), (2,)]] == [
        False, False, True, False, False, False]
    assert len(ids) == 2
    off = RecentIds(0)
    assert not off.seen_before((1,)) and not off.seen_before((1,))


def test_recent_ids_add_says_when_the_oldest_was_forgotten():
    ids = RecentIds(2)
    assert [ids.add(k) for k in [(1,), (2,), (2,), (3,)]] == [False, False, False, True]
    assert (1,) not in ids and (2,) in ids and (3,) in ids
    off = RecentIds(0)
    assert not off.add((1,)) and (1,) not in off
