"""Shared subscription groups across edges (``mqtt.shared_namespace``, shared_view.py): a
fabric of edge A (the fabric's P&M), a core and edge B (remote P&M), a member of
``$share/g/t/#`` at each edge (paho): every message reaches one member of the fabric; when
the member at edge B leaves, edge B withdraws and every later message reaches the member at
edge A. Then the view itself: the owner rule, expiry of a silent edge, the bounds, hostile
announcements, and bad settings."""

from __future__ import annotations

import queue
import socket
import struct
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from appliance.config import ConfigError, parse_config
from appliance.edge.mqtt import codec, shared_handoff, shared_view
from appliance.edge.mqtt.shared import SharedRouter
from appliance.edge.mqtt.shared_handoff import encode_handoff, parse_handoff
from appliance.edge.mqtt.shared_view import SharedView, owner_of, parse_announcement
from appliance.edge.mqtt.state import SubOptions
from appliance.edge.node import EdgeAppliance
from tests.edge.conftest import DEADLINE_S, counter, edge_doc, port_of, read_packet, wait_for
from tests.edge.peers import Peer
from tests.edge.test_fabric_metadata import _peer_b, _ready, edge_core_edge

NS = 11
SHARE = {"shared_namespace": NS, "shared_identity": "edges"}
GROUP = "g/t/#"


def _entitle_the_view(doc_a: dict) -> None:
    """At the P&M (edge A): the announcements' namespace exists, identity ``edges`` uses it."""
    doc_a["appliance"]["namespaces"] = [0, NS]
    doc_a["pm"]["identities"]["edges"] = {"publish": ["#"], "subscribe": ["#"],
                                          "namespaces": [NS]}


@pytest.fixture(scope="module")
def fabric() -> Iterator[tuple[EdgeAppliance, EdgeAppliance]]:
    with edge_core_edge(SHARE, _entitle_the_view) as (edge_a, edge_b, _):
        for edge in (edge_a, edge_b):
            wait_for(lambda e=edge: e.mqtt.status()["shared"]["logged_in"],
                     what="the shared view's session logged in")
        yield edge_a, edge_b


def _view(edge: EdgeAppliance) -> list[int] | None:
    return edge.mqtt.status()["shared"]["groups"].get(GROUP)


def _drain(peer: Peer, into: list[bytes]) -> None:
    while True:
        try:
            msg = peer.messages.get_nowait()
        except queue.Empty:
            return
        if msg.topic.startswith("t/"):
            into.append(msg.payload)


def _collect(members: list[Peer], want: set[bytes]) -> list[list[bytes]]:
    """What each member got of the topics ``t/...`` once ``want`` all arrived (a deadline)."""
    got: list[list[bytes]] = [[] for _ in members]
    deadline = time.monotonic() + DEADLINE_S
    while not want <= {p for g in got for p in g}:
        assert time.monotonic() < deadline, f"missing {sorted(want - set(sum(got, [])))[:5]}"
        for peer, into in zip(members, got, strict=True):
            _drain(peer, into)
        time.sleep(0.02)
    return got


def test_each_message_reaches_one_member_across_edges_and_a_withdrawn_edge_is_taken_over(
        fabric):
    edge_a, edge_b = fabric
    ids = sorted([edge_a.config.node_id, edge_b.config.node_id])
    with Peer(edge_a, "sh-a", version=5) as member_a, Peer(edge_a, "sh-pub") as pub:
        member_b = _peer_b(edge_b, "sh-b")
        try:
            for member in (member_a, member_b):
                assert member.subscribe("$share/g/t/#", 1) == 1
                assert member.subscribe("ready/#", 0) == 0
            _ready(pub, [member_a, member_b], "ready")  # edge B's interest reached edge A
            for edge in (edge_a, edge_b):
                wait_for(lambda e=edge: _view(e) == ids, what="both edges in the view")
            before = {e: (counter(e, "shared_remote_owner"), counter(e, "shared_delivered"))
                      for e in (edge_a, edge_b)}
            first = [f"m{i}".encode() for i in range(200)]
            for i, payload in enumerate(first):
                pub.publish(f"t/{i}", payload, 1)
            got_a, got_b = _collect([member_a, member_b], set(first))
            # each message once: delivered by one edge, dropped by the other
            for kind in (0, 1):
                wait_for(lambda k=kind: sum(counter(e, ("shared_remote_owner",
                                                        "shared_delivered")[k]) - before[e][k]
                                            for e in (edge_a, edge_b)) >= 200,
                         what="every message decided at both edges")
            assert sorted(got_a + got_b) == sorted(first)
            assert got_a and got_b, "each edge owns some of the messages"
            assert [counter(e, "shared_delivered") - before[e][1]
                    for e in (edge_a, edge_b)] == [len(got_a), len(got_b)]
        finally:
            member_b.close()  # clean start, no expiry: its session ends, edge B withdraws
        wait_for(lambda: _view(edge_a) == [edge_a.config.node_id],
                 what="edge A's view without edge B")
        wait_for(lambda: edge_b.mqtt.status()["shared"]["announced"] == 0
                 and _view(edge_b) == [edge_a.config.node_id], what="edge B withdrew")
        second = [f"n{i}".encode() for i in range(100)]
        for i, payload in enumerate(second):
            pub.publish(f"t/{i}", payload, 1)
        (again,) = _collect([member_a], set(second))
        assert sorted(p for p in again if p.startswith(b"n")) == sorted(second)


def test_an_edge_fallen_silent_expires_from_the_view_and_its_share_goes_to_the_others(
        fabric, monkeypatch):
    """Edge B stops announcing (as if dead, no withdrawal): after ``EXPIRY_S`` edge A's view
    holds edge A alone and edge A's member gets every message (edge B, still up here,
    delivers its own share too: the duplicates of a view that differs)."""
    edge_a, edge_b = fabric
    ids = sorted([edge_a.config.node_id, edge_b.config.node_id])
    with Peer(edge_a, "sx-a", version=5) as member_a, Peer(edge_a, "sx-pub") as pub, \
            _peer_b(edge_b, "sx-b") as member_b:
        for member in (member_a, member_b):
            assert member.subscribe("$share/g/t/#", 1) == 1
        wait_for(lambda: _view(edge_a) == ids, what="edge B in edge A's view")
        expired = counter(edge_a, "shared_view_expired")
        monkeypatch.setattr(edge_b.mqtt.shared_view, "_announce", lambda native, groups: True)
        wait_for(lambda: counter(edge_a, "shared_view_expired") > expired
                 and _view(edge_a) == [edge_a.config.node_id], what="edge B expired at A")
        third = [f"x{i}".encode() for i in range(20)]
        for i, payload in enumerate(third):
            pub.publish(f"t/{i}", payload, 1)
        (got,) = _collect([member_a], set(third))
        assert sorted(p for p in got if p.startswith(b"x")) == sorted(third)
        assert _view(edge_b) == ids  # edge B still counts edge A (its announcements go on)


# --- the view, apart from the fabric --------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _view_of(node_id: int, clock: _Clock, flags: dict[str, int] | None = None,
             since: dict[str, float] | None = None) -> SharedView:
    """A view whose router has ``flags`` (groups joined ``since``, else long ago)."""
    counters: dict[str, int] = {}
    server = SimpleNamespace(
        node_id=node_id, counters=counters,
        count=lambda name, n=1: counters.__setitem__(name, counters.get(name, 0) + n),
        shared_router=SimpleNamespace(flags=lambda: dict(flags or {}), since=since or {}),
        loop=SimpleNamespace(call_later=lambda *a: SimpleNamespace(cancel=lambda: None)))
    view = SharedView(server, NS, "edges", clock=clock)  # type: ignore[arg-type]
    view.local_changed()
    return view


def _msg(i: int) -> Any:
    return SimpleNamespace(origin=7, stream=0x8000_0000_0000_0000 | 3,
                           publish_ts_ns=1_700_000_000_000_000_000 + i, topic=f"t/{i}")


def _agreeing_views(clock: Any) -> dict[int, Any]:
    """The views of edges 3, 5 and 9, each with a connected member of ``GROUP`` and each
    holding the other two's announcement."""
    views = {n: _view_of(n, clock, {GROUP: 1}) for n in (3, 5, 9)}
    for n, view in views.items():
        for other in views:
            if other != n:
                view.apply(other, 1, 1, {GROUP: 1})
    return views


def test_edges_with_one_view_agree_on_one_owner_per_message_and_a_silent_edge_expires():
    clock = _Clock()
    views = _agreeing_views(clock)
    owners = [[n for n, v in views.items() if v.owns(GROUP, 1, _msg(i))] for i in range(300)]
    assert all(len(o) == 1 for o in owners)  # one owner per message, the same for all
    assert {o[0] for o in owners} == {3, 5, 9}
    assert owner_of([3, 5, 9], GROUP, _msg(4)) == owners[4][0]  # stable (no salted hash)
    # edge 9 falls silent: after EXPIRY_S the others share its messages between them
    clock.now += shared_view.EXPIRY_S / 2
    for n in (3, 5):
        views[n].apply(3 if n == 5 else 5, 1, 2, {GROUP: 1})
    assert views[3].candidates(GROUP, 1) == [3, 5, 9]
    clock.now += shared_view.EXPIRY_S / 2 + 0.1
    for n in (3, 5):
        assert views[n].candidates(GROUP, 1) == [3, 5]
        views[n]._tick()
        assert views[n].server.counters["shared_view_expired"] == 1
    assert all(sum(views[n].owns(GROUP, 1, _msg(i)) for n in (3, 5)) == 1 for i in range(100))


def test_connected_members_are_preferred_and_edges_without_members_are_not_candidates():
    view = _view_of(3, _Clock(), {GROUP: 1})
    view.apply(5, 1, 1, {GROUP: 0, "other/x": 1})   # edge 5: offline members only
    assert view.candidates(GROUP, 1) == [3]          # this edge has a connected member
    assert view.candidates(GROUP, 0) == [3, 5]       # nobody connected: every member edge
    assert view.candidates(GROUP, None) == [5]       # no member here: never the owner
    assert not view.owns(GROUP, None, _msg(1))
    view.apply(5, 1, 2, {})                          # withdrawn
    assert view.candidates(GROUP, None) == [] and view.index == {}
    view.apply(5, 1, 1, {GROUP: 1})                  # older than what is held: ignored
    assert view.index == {} and view.server.counters["shared_view_stale"] == 1


def test_the_view_is_bounded_and_hostile_announcements_are_refused(monkeypatch):
    monkeypatch.setattr(shared_view, "MAX_EDGES", 2)
    monkeypatch.setattr(shared_view, "MAX_GROUPS", 3)
    view = _view_of(3, _Clock(), {f"g{i}/t": 1 for i in range(5)})
    for edge in (4, 5, 6):
        view.apply(edge, 1, 1, {f"g{i}/t": 1 for i in range(5)})
    assert sorted(view.remote) == [4, 5] and all(len(e.groups) == 3
                                                 for e in view.remote.values())
    counters = view.server.counters
    assert counters["shared_view_edges_full"] == 1 and counters["shared_view_groups_full"] == 2
    view.local_changed()
    assert len(view.local) == 5 and len(view._groups) == 3
    assert counters["shared_view_groups_not_announced"] == 1
    for bad in (b"", b"[]", b"{\"boot\": 1, \"seq\": -1, \"groups\": {}}",
                b"{\"boot\": 1, \"seq\": 1, \"groups\": {\"g/t\": 2}}",
                b"{\"boot\": true, \"seq\": 1, \"groups\": {}}", b"\xff"):
        assert parse_announcement(bad) is None
    assert parse_announcement(b"{\"boot\": 1, \"seq\": 2, \"groups\": {\"g/t\": 0}}") == (
        1, 2, {"g/t": 0})


def test_a_group_new_at_an_edge_takes_its_share_after_the_join_grace():
    clock = _Clock()
    view = _view_of(3, clock, {GROUP: 1}, since={GROUP: clock.now})
    assert view.local == {}                         # not announced yet
    assert view.owns(GROUP, 1, _msg(1))             # alone: its members get everything
    view.apply(5, 1, 1, {GROUP: 1})
    assert not any(view.owns(GROUP, 1, _msg(i)) for i in range(50))  # edge 5 has them all
    clock.now += shared_view.JOIN_GRACE_S
    view.local_changed()
    assert view.local == {GROUP: 1} and view._groups == {GROUP: 1}
    assert view.candidates(GROUP, 1) == [3, 5]
    assert 0 < sum(view.owns(GROUP, 1, _msg(i)) for i in range(50)) < 50


@pytest.mark.parametrize("mqtt, error", [
    ({"shared_namespace": 11}, "mqtt.shared_identity: required"),
    ({"shared_identity": "edges"}, "mqtt.shared_namespace: required"),
    ({"shared_namespace": 0, "shared_identity": "edges"}, "mqtt.shared_namespace"),
    ({"shared_namespace": 11, "shared_identity": "nobody"}, "not in pm.identities"),
    ({"shared_namespace": 9, "shared_identity": "edges", "retained_namespace": 9,
      "retained_identity": "edges"}, "mqtt.shared_namespace: 9 is also"),
])
def test_bad_shared_view_settings_are_refused_naming_the_key(mqtt, error):
    doc = edge_doc(**mqtt)
    doc["pm"]["identities"]["edges"] = {"publish": ["#"], "subscribe": ["#"]}
    with pytest.raises(ConfigError, match=error):
        parse_config(doc)


# --- hand-offs: no QoS 1/2 message lost when an edge's last member leaves -------------------
HANDOFF_GROUP = "h/u/#"


class _Silent:
    """A raw MQTT 3.1.1 member of ``$share/h/u/#`` at an edge that reads every PUBLISH and
    acknowledges none (its deliveries stay in flight at the edge until it leaves)."""

    def __init__(self, edge: EdgeAppliance, client_id: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port_of(edge)), timeout=DEADLINE_S)
        self.sock.sendall(codec.encode_connect(client_id, version=codec.V311))  # anonymous
        first, body = read_packet(self.sock)
        assert first >> 4 == codec.PacketType.CONNACK and body[1] == 0, body
        self.got: list[bytes] = []
        self.probed = threading.Event()
        """A probe (``hready/...``) reached it: edge B's interest is at edge A."""
        self.sock.sendall(codec.encode_subscribe(1, [("$share/" + HANDOFF_GROUP, 1),
                                                     ("hready/#", 0)]))
        first, body = read_packet(self.sock)
        assert first >> 4 == codec.PacketType.SUBACK and body[2:] == b"\x01\x00", body
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while True:
                first, body = read_packet(self.sock)
                if first >> 4 != codec.PacketType.PUBLISH:
                    continue
                (tlen,) = struct.unpack_from(">H", body)
                topic = body[2:2 + tlen].decode()
                at = 2 + tlen + (2 if (first >> 1) & 3 else 0)  # (no PUBACK, ever)
                if topic.startswith("hready/"):
                    self.probed.set()
                else:
                    self.got.append(body[at:])
        except (OSError, ConnectionError):
            return

    def unsubscribe_and_disconnect(self) -> None:
        filt = ("$share/" + HANDOFF_GROUP).encode()
        self.sock.sendall(codec.packet(codec.PacketType.UNSUBSCRIBE, 0b0010, struct.pack(
            ">HH", 2, len(filt)) + filt))
        self.sock.sendall(bytes([codec.PacketType.DISCONNECT << 4, 0]))
        self.sock.close()

    def kill(self) -> None:
        """The socket reset (no DISCONNECT): the edge sees the connection drop."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def _group_view(edge: EdgeAppliance) -> list[int] | None:
    return edge.mqtt.status()["shared"]["groups"].get(HANDOFF_GROUP)


HANDOFF_COUNTERS = ("shared_handoffs_left", "shared_handoffs_owed", "shared_handoffs_sent",
                    "shared_handoffs_received", "shared_handoffs_delivered",
                    "shared_handoffs_dropped_duplicate", "shared_handoffs_remote_owner")


class _HeldAnnouncements:
    """Edge A applies nothing edge B announces while held (as if B's withdrawal were slow
    on its way), then the latest (monkeypatched ``SharedView.apply``)."""

    def __init__(self, edge_a: EdgeAppliance, edge_b: EdgeAppliance, monkeypatch) -> None:
        self.view = edge_a.mqtt.shared_view
        self.loop = edge_a.mqtt.loop
        self.original = self.view.apply
        self.b = edge_b.config.node_id
        self.latest: tuple | None = None
        monkeypatch.setattr(self.view, "apply", self._apply)

    def _apply(self, edge: int, *args: Any) -> None:
        if edge == self.b:
            self.latest = args
        else:
            self.original(edge, *args)

    def release(self) -> None:
        self.view.apply = self.original
        if self.latest is not None:
            self.loop.call_soon_threadsafe(self.original, self.b, *self.latest)


@pytest.mark.parametrize("leave", ["socket_killed", "unsubscribe_disconnect",
                                   "withdrawal_late"])
def test_no_qos1_message_is_lost_when_the_last_member_of_an_edge_leaves_mid_stream(
        fabric, leave, monkeypatch):
    """A member at each edge, QoS 1 messages published steadily at edge A; the member at
    edge B (raw) never acknowledges, then leaves mid-stream (its socket reset, or UNSUBSCRIBE
    and DISCONNECT). Its unacknowledged and queued messages are handed off, and so are those
    edge A left to edge B before B's withdrawal reached it (``withdrawal_late``: edge A
    applies B's announcements only once B handed off some of those): the member at edge A
    gets every message, each once."""
    edge_a, edge_b = fabric
    ids = sorted([edge_a.config.node_id, edge_b.config.node_id])
    tag = leave[:4]
    with Peer(edge_a, f"hh-a-{tag}", version=5) as member_a, \
            Peer(edge_a, f"hh-pub-{tag}") as pub:
        assert member_a.subscribe("$share/" + HANDOFF_GROUP, 1) == 1
        silent = _Silent(edge_b, f"hh-b-{tag}")
        deadline = time.monotonic() + DEADLINE_S
        while True:  # until edge B's interest reached edge A (a probe, asked again)
            assert time.monotonic() < deadline, "no probe reached edge B's member"
            pub.publish(f"hready/{tag}", b"probe", 0)
            if silent.probed.wait(0.05):
                break
        for edge in (edge_a, edge_b):
            wait_for(lambda e=edge: _group_view(e) == ids, what="both edges in the view")
        before = {e: {n: counter(e, n) for n in HANDOFF_COUNTERS} for e in (edge_a, edge_b)}
        sent: list[int] = []
        stop = threading.Event()

        def publish() -> None:
            while not stop.is_set():
                i = len(sent)
                pub.publish(f"u/{tag}/{i}", f"{tag}-{i}".encode(), 1)
                sent.append(i)

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        try:
            wait_for(lambda: len(silent.got) >= 20, what="edge B's member holding 20 "
                                                          "unacknowledged messages")
            marks = [len(sent)]
            if leave == "withdrawal_late":
                held = _HeldAnnouncements(edge_a, edge_b, monkeypatch)
                silent.kill()
                wait_for(lambda: counter(edge_b, "shared_handoffs_owed")
                         - before[edge_b]["shared_handoffs_owed"] >= 5,
                         what="edge B handing off 5 messages edge A left to it")
                held.release()
            elif leave == "socket_killed":
                silent.kill()
            else:
                silent.unsubscribe_and_disconnect()
            marks.append(len(sent))
            wait_for(lambda: _group_view(edge_a) == [edge_a.config.node_id],
                     what="edge A's view without edge B")
            after_view = len(sent)
            marks.append(after_view)
            wait_for(lambda: len(sent) >= after_view + 30, what="30 more messages")
        finally:
            stop.set()
            publisher.join(DEADLINE_S)
        silent.thread.join(DEADLINE_S)
        total = len(sent)
        want = {f"{tag}-{i}".encode() for i in range(total)}
        got: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while not want <= set(got):
            try:
                msg = member_a.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"lost at edge A's member: {sorted(want - set(got))[:10]} of {total}; "
                    f"edge B's member had {len(silent.got)} unacknowledged; "
                    f"{_shared_counters(edge_a)}; {_shared_counters(edge_b)}; published at "
                    f"the leave, the withdrawal, edge A's view alone: {marks}") from None
            if msg.topic.startswith("u/"):
                got.append(msg.payload)
        moved = {e: {n: counter(e, n) - before[e][n] for n in HANDOFF_COUNTERS}
                 for e in (edge_a, edge_b)}
        # every message reached the member at edge A, once (edge A remembers what it
        # delivered); those edge B's member held unacknowledged came by hand-off
        assert len(got) == len(set(got)) == total, (len(got), total, moved)
        unacked = set(silent.got)
        assert unacked and unacked <= want
        assert moved[edge_b]["shared_handoffs_left"] >= len(unacked), moved
        assert moved[edge_b]["shared_handoffs_sent"] >= len(unacked), moved
        assert moved[edge_a]["shared_handoffs_received"] >= len(unacked), moved
        assert moved[edge_a]["shared_handoffs_delivered"] >= len(unacked), moved
        if leave == "withdrawal_late":  # the ones edge A left to edge B: delivered at A
            assert moved[edge_a]["shared_handoffs_delivered"] >= len(unacked) + 5, moved


def _shared_counters(edge: EdgeAppliance) -> dict[str, int]:
    return {k: v for k, v in edge.mqtt.status()["counters"].items()
            if k.startswith(("shared_", "deliveries_", "native_"))}


# --- hand-offs, apart from the fabric -------------------------------------------------------
def _handoff(**kw: Any) -> shared_handoff.Handoff:
    fields = {"key": HANDOFF_GROUP, "origin": 7, "stream": 0x8000_0003,
              "publish_ts_ns": 1_700_000_000_000_000_001, "topic": "u/1", "qos": 1,
              "headers": {"mqtt.qos": "1", "mqtt.correlation_data": b"\x00\xff"},
              "payload": b"hello"}
    return shared_handoff.Handoff(**{**fields, **kw})


def test_a_handoff_round_trips_and_bad_ones_are_refused(monkeypatch):
    h = _handoff()
    back = parse_handoff(encode_handoff(h))
    assert back == shared_handoff.Handoff(HANDOFF_GROUP, 7, 3, h.publish_ts_ns, "u/1", 1,
                                          h.headers, b"hello")
    assert back.ident == h.ident == (HANDOFF_GROUP, 7, 3, h.publish_ts_ns, "u/1")
    good = encode_handoff(h)
    key, topic = HANDOFF_GROUP.encode(), b"u/1"

    def with_fields(key: bytes = key, topic: bytes = topic, qos: int = 1,
                    block: bytes = b"", magic: bytes = b"TWH1") -> bytes:
        return struct.pack(">4sQQqBHHH", magic, 7, 3, 1, qos, len(key), len(topic),
                           len(block)) + key + topic + block + b"x"

    assert parse_handoff(with_fields()) is not None
    for bad in (b"", good[:20], with_fields(magic=b"TWH2"), with_fields(qos=0),
                with_fields(qos=3), good[:40],                      # lengths past the end
                with_fields(key=b"\xff/u/#"), with_fields(key=b"u/#"[:1]),  # no GROUP/
                with_fields(key=b"h+/u/#"), with_fields(key=b"h/u/#/x"),   # filter invalid
                with_fields(topic=b"v/1"),                          # not the group's filter
                with_fields(topic=b"u/+"), with_fields(block=b"\x00" * 7)):
        assert parse_handoff(bad) is None, bad
    monkeypatch.setattr(shared_handoff, "HANDOFF_MAX_BYTES", len(good) - 1)
    assert parse_handoff(good) is None                             # too large
    with pytest.raises(ValueError, match="at most"):
        encode_handoff(h)


def test_bad_handoffs_reaching_the_view_are_counted_and_good_ones_go_to_the_router():
    view = _view_of(3, _Clock())
    calls: list[Any] = []
    view.server.loop.call_soon_threadsafe = lambda fn, *a: calls.append((fn, a))
    view.server.shared_router.handed = "handed"

    def arrive(payload: bytes, origin: int = 5) -> None:
        view._on_native(SimpleNamespace(origin=origin, topic=shared_handoff.HANDOFF_TOPIC,
                                        payload=payload))

    arrive(b"garbage")
    arrive(encode_handoff(_handoff()) + b"\x00" * 0, origin=3)  # this edge's own: ignored
    arrive(encode_handoff(_handoff()))
    assert view.server.counters == {"shared_handoffs_bad": 1}
    assert calls == [("handed", (5, _handoff(stream=3)))]


def test_a_handoff_is_owned_by_one_edge_among_the_candidates_without_the_handing_edge():
    clock = _Clock()
    views = _agreeing_views(clock)
    owners = [[n for n in (3, 5) if views[n].owns(GROUP, 1, _msg(i), exclude=9)]
              for i in range(200)]
    assert all(len(o) == 1 for o in owners) and {o[0] for o in owners} == {3, 5}
    # the same edge that owns the message once edge 9's withdrawal arrived (and which
    # then recognises a hand-off of a message it delivered already)
    after = _view_of(3, clock, {GROUP: 1})
    after.apply(5, 1, 1, {GROUP: 1})
    assert [o[0] == 3 for o in owners] == [after.owns(GROUP, 1, _msg(i)) for i in range(200)]
    # edge 9 was the only one with a connected member: the offline ones take its hand-offs
    for n in (3, 5):
        views[n].local = {GROUP: 0}
        views[n].apply(3 if n == 5 else 5, 1, 2, {GROUP: 0})
    assert views[3].candidates(GROUP, 0) == [9]
    assert views[3].candidates(GROUP, 0, exclude=9) == [3, 5]
    assert all(sum(views[n].owns(GROUP, 0, _msg(i), exclude=9) for n in (3, 5)) == 1
               for i in range(100))
    # an edge without a member of the group never takes one
    assert not any(views[3].owns(GROUP, None, _msg(i), exclude=9) for i in range(50))


def test_an_edge_owes_what_it_owned_before_its_withdrawal_for_the_grace_only():
    clock = _Clock()
    flags = {GROUP: 1}
    view = _view_of(3, clock, flags)
    view.server.shared_router.flags = lambda: dict(flags)
    view.apply(5, 1, 1, {GROUP: 1})
    mine = {i for i in range(100) if view.owns(GROUP, 1, _msg(i))}
    assert 0 < len(mine) < 100
    flags[GROUP] = 0                         # its last member went offline: 1 -> 0
    view.local_changed()
    del flags[GROUP]                         # then left: withdrawn (the flag before: 1)
    view.local_changed()
    assert view.local == {} and view.left[GROUP][0] == 1
    assert not any(view.owns(GROUP, None, _msg(i)) for i in range(100))
    assert {i for i in range(100) if view.owed(GROUP, _msg(i))} == mine
    clock.now += shared_handoff.HANDOFF_GRACE_S + 0.1
    assert not any(view.owed(GROUP, _msg(i)) for i in range(100))
    view._tick()
    assert view.left == {}
    flags[GROUP] = 1                         # a member again: nothing owed any more
    view.local_changed()
    assert view.left == {}


def test_the_router_delivers_a_handoff_once_and_drops_what_it_delivered_already():
    counters: dict[str, int] = {}
    router = SharedRouter(lambda name, n=1: counters.__setitem__(name,
                                                                 counters.get(name, 0) + n))
    got: list[Any] = []
    member = SimpleNamespace(ended=False, conn=object(), deliver=got.append, filters={
        "$share/" + HANDOFF_GROUP: SubOptions(1, match="u/#", group=HANDOFF_GROUP)})
    router.groups[HANDOFF_GROUP] = [member]  # type: ignore[list-item]
    owner = {"yes": True}
    router.view = SimpleNamespace(owns=lambda key, own, msg, exclude=None: owner["yes"])
    h = _handoff(headers={"mqtt.qos": "1", "mqtt.origin": "12", "mqtt.content_type": "t"})
    router.handed(5, h)
    router.handed(5, h)                      # again: delivered already
    assert [(d.topic, d.payload, d.qos, d.meta.origin, d.group) for d in got] == [
        ("u/1", b"hello", 1, 0, HANDOFF_GROUP)]
    assert got[0].meta.props == [(codec.PROP["content_type"], "t")]
    original = SimpleNamespace(origin=h.origin, stream=h.stream, publish_ts_ns=h.publish_ts_ns,
                               topic=h.topic)
    router.offer(HANDOFF_GROUP, original, None, 1)  # the original, after its hand-off
    assert len(got) == 1
    owner["yes"] = False
    router.handed(5, _handoff(publish_ts_ns=5))
    assert len(got) == 1
    assert counters == {"shared_handoffs_received": 3, "shared_handoffs_delivered": 1,
                        "shared_delivered": 1, "shared_handoffs_dropped_duplicate": 1,
                        "shared_dropped_delivered": 1, "shared_handoffs_remote_owner": 1}


def test_handoffs_wait_for_the_session_and_are_bounded(monkeypatch):
    from appliance.client.errors import ClientError, ConnectionLostError

    monkeypatch.setattr(shared_view, "HANDOFF_PENDING", 3)
    view = _view_of(3, _Clock())
    d = SimpleNamespace(ident=_handoff().ident, meta=None, qos=1, payload=b"p", topic="u/1")
    assert all(view.hand_off(d) for _ in range(3))
    assert not view.hand_off(d) and view.server.counters["shared_handoffs_dropped_full"] == 1
    outcomes = [ConnectionLostError("lost"), None, ClientError("no"), None]
    sent: list[bytes] = []

    def publish(topic: str, payload: bytes, **kw: Any) -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        sent.append(payload)

    native = SimpleNamespace(publish=publish, closed=False)
    assert not view._send_handoffs(native, view._take_outbox())  # lost: all kept, in order
    assert len(view._outbox) == 3
    assert view._send_handoffs(native, view._take_outbox())      # one refused for good
    assert len(sent) == 2 and not view._outbox
    assert {k: v for k, v in view.server.counters.items() if "handoffs" in k} == {
        "shared_handoffs_dropped_full": 1, "shared_handoffs_send_failed": 1,
        "shared_handoffs_sent": 2, "shared_handoffs_refused": 1}
    assert parse_handoff(sent[0]) == _handoff(stream=3, headers={"mqtt.qos": "1"},
                                              payload=b"p")
    view._stop.set()
    assert not view.hand_off(d)
    assert view.server.counters["shared_handoffs_dropped_stopping"] == 1
