"""``mqtt.state_dir``: the edge's persistent sessions, their queued and unacknowledged QoS 1/2
deliveries and its retained messages survive a restart and a ``kill -9`` (a real ``topicwire
run`` on a real disk, paho-mqtt and scripted peers); the state store's journal read back,
its torn or corrupt tail cut, its compaction and the bounds."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from types import SimpleNamespace

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.config import parse_config
from appliance.edge.mqtt import codec, journal, store
from appliance.edge.mqtt.codec import PacketType
from appliance.edge.mqtt.meta import MessageMeta
from appliance.edge.mqtt.state import Delivery, SubOptions
from appliance.edge.mqtt.store import JOURNAL, StateStore
from appliance.errors import ConfigError
from tests.appliance.helpers import CLI, free_port, run_appliance, stop, write_config
from tests.edge import conftest
from tests.edge.conftest import (
    DEADLINE_S,
    counter,
    edge_doc,
    read_packet,
    start_edge,
    wait_counter,
    wait_for,
)
from tests.edge.peers import Peer
from tests.edge.test_run_edge import mqtt_status

N = 40


def edge_toml(mqtt_port: int, mgmt_port: int, udp_port: int) -> str:
    return f"""
[appliance]
name = "edge-state"
role = "edge"

[clients]
udp = "127.0.0.1:{udp_port}"

[pm]
require_passwords = false

[pm.identities.anonymous]
publish = ["#"]
subscribe = ["#"]

[mqtt]
listen = "127.0.0.1:{mqtt_port}"
allow_anonymous = true
state_dir = "state"

[mgmt]
listen = "127.0.0.1:{mgmt_port}"
"""


class Edge:
    """``topicwire run`` on one config, started again as often as a test wants."""

    def __init__(self, tmp_path) -> None:
        self.port, self.mgmt = free_port(), free_port()
        self.config = write_config(tmp_path / "edge.toml",
                                   edge_toml(self.port, self.mgmt, free_port()))
        self.state = tmp_path / "state"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Edge:
        self.proc = run_appliance(self.config)
        wait_for(lambda: self.status().get("listeners"), what="the edge's listeners")
        return self

    def status(self) -> dict:
        return mqtt_status(f"http://127.0.0.1:{self.mgmt}")

    def counter(self, name: str) -> int:
        return self.status().get("counters", {}).get(name, 0)

    def end(self, how: signal.Signals) -> None:
        assert self.proc is not None
        if how == signal.SIGKILL:
            self.proc.kill()
            self.proc.wait(DEADLINE_S)
        else:
            assert stop(self.proc) == 0
        self.proc = None

    def close(self) -> None:
        if self.proc is not None:
            stop(self.proc)


def persistent(edge, client_id: str, version: int) -> Peer:
    props = None
    if version == 5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 600
    return Peer(edge, client_id, user=None, version=version, clean=False, props=props)


def receive(peer: Peer, n: int) -> list[tuple[str, bytes, int]]:
    return [(m.topic, m.payload, m.qos) for m in (peer.next() for _ in range(n))]


@pytest.mark.parametrize(("version", "how"), [(4, signal.SIGKILL), (5, signal.SIGKILL),
                                              (5, signal.SIGTERM)],
                         ids=["3.1.1-kill-9", "5.0-kill-9", "5.0-sigterm"])
def test_queued_messages_and_retained_ones_survive_the_edge(tmp_path, version, how):
    edge = Edge(tmp_path).start()
    try:
        sub = persistent(edge, "keeper", version)
        assert sub.rc == 0 and not sub.session_present
        assert sub.subscribe("plant/#", 1) == 1
        sub.close()
        wait_for(lambda: edge.status().get("sessions_offline") == 1, what="offline session")
        with Peer(edge, "pub", user=None, version=version) as pub:
            for i in range(N):  # each waits for its PUBACK
                pub.publish(f"plant/{i}", b"m%d" % i, 1)
            pub.publish("config/mode", b"eco", 1, retain=True)
            pub.publish("config/gone", b"x", 1, retain=True)
            pub.publish("config/gone", b"", 1, retain=True)  # cleared
        edge.end(how)
        edge.start()
        status = edge.status()
        assert status["sessions_offline"] == 1 and status["retained_messages"] == 1
        assert edge.counter("store_sessions_restored") == 1
        again = persistent(edge, "keeper", version)
        try:
            assert again.session_present
            assert receive(again, N) == [(f"plant/{i}", b"m%d" % i, 1) for i in range(N)]
            assert again.subscribe("config/#", 1) == 1
            m = again.next()
            assert (m.topic, m.payload, m.retain) == ("config/mode", b"eco", True)
            with Peer(edge, "pub2", user=None) as pub:  # the subscription is still there
                pub.publish("plant/live", b"live", 1)
            assert again.next().payload == b"live"  # (and nothing twice before it)
        finally:
            again.close()
        # (/status answers from the management child's latest snapshot: wait for one that
        # has the syncs)
        wait_for(lambda: edge.counter("store_syncs") > 0, what="store_syncs in /status")
    finally:
        edge.close()


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None,
                    reason="mosquitto-clients is not installed (make test installs it)")
def test_mosquitto_clients_find_their_session_after_a_kill_9(tmp_path):
    edge = Edge(tmp_path).start()
    at = ["-h", "127.0.0.1", "-p", str(edge.port), "-V", "mqttv311"]
    try:
        subprocess.run(["mosquitto_sub", *at, "-i", "mq-keeper", "-c", "-q", "1", "-t",
                        "line/#", "-E"], check=True, timeout=DEADLINE_S)
        wait_for(lambda: edge.status().get("sessions_offline") == 1, what="offline session")
        lines = "".join(f"line {i}\n" for i in range(20))
        subprocess.run(["mosquitto_pub", *at, "-q", "1", "-t", "line/x", "-l"], input=lines,
                       text=True, check=True, timeout=DEADLINE_S)  # exits after its PUBACKs
        edge.end(signal.SIGKILL)
        edge.start()
        back = subprocess.run(["mosquitto_sub", *at, "-i", "mq-keeper", "-c", "-q", "1", "-t",
                               "line/#", "-C", "20", "-W", str(int(DEADLINE_S))],
                              capture_output=True, text=True, timeout=DEADLINE_S + 5)
        assert back.stdout.splitlines() == [f"line {i}" for i in range(20)], back.stderr
    finally:
        edge.close()


def raw_connect(port: int, client_id: str) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
    sock.sendall(codec.encode_connect(client_id, version=4, keep_alive_s=60, clean=False))
    first, body = read_packet(sock)
    assert first >> 4 == PacketType.CONNACK and body[1] == 0, body
    return sock, body


def subscribe_packet(packet_id: int, topic_filter: str, qos: int) -> bytes:
    f = topic_filter.encode()
    body = packet_id.to_bytes(2, "big") + len(f).to_bytes(2, "big") + f + bytes((qos,))
    return bytes((0x82, len(body))) + body


def read_publish(sock: socket.socket) -> tuple[bool, int, str, bytes]:
    """(dup, packet id, topic, payload) of the next PUBLISH."""
    first, body = read_packet(sock)
    assert first >> 4 == PacketType.PUBLISH, (first, body)
    tlen = int.from_bytes(body[:2], "big")
    topic = body[2:2 + tlen].decode()
    pid = int.from_bytes(body[2 + tlen:4 + tlen], "big")
    return bool(first & 0x08), pid, topic, body[4 + tlen:]


@pytest.mark.parametrize("how", [signal.SIGKILL], ids=["kill-9"])
def test_a_delivery_sent_but_not_acknowledged_survives_a_kill_9(tmp_path, how):
    edge = Edge(tmp_path).start()
    try:
        sock, _ = raw_connect(edge.port, "slow")
        sock.sendall(subscribe_packet(1, "job/#", 1))
        first, body = read_packet(sock)
        assert first >> 4 == PacketType.SUBACK and body[-1] == 1
        with Peer(edge, "pub", user=None) as pub:
            pub.publish("job/1", b"unacked", 1)   # PUBACKed to the publisher
        dup, _, topic, payload = read_publish(sock)  # sent, never acknowledged
        assert (dup, topic, payload) == (False, "job/1", b"unacked")
        edge.end(how)
        sock.close()
        edge.start()
        sock, body = raw_connect(edge.port, "slow")
        assert body[0] & 1  # session present
        dup, pid, topic, payload = read_publish(sock)
        assert (topic, payload) == ("job/1", b"unacked")
        sock.sendall(codec.encode_ack(PacketType.PUBACK, pid, 4))
        # the flow completed: its record goes (a third start has nothing to send again)
        sock.close()
        edge.end(signal.SIGTERM)
        edge.start()
        sock, body = raw_connect(edge.port, "slow")
        assert body[0] & 1
        with Peer(edge, "pub", user=None) as pub:
            pub.publish("job/2", b"next", 1)
        assert read_publish(sock)[2:] == ("job/2", b"next")
        assert edge.counter("store_deliveries_restored") == 0
        sock.close()
    finally:
        edge.close()


def test_qos2_flows_in_both_directions_survive_a_restart(tmp_path):
    """In process, stopped and started again on the same state dir: an outgoing QoS 2 past
    PUBREC gets its PUBREL again; an incoming one awaiting PUBREL is not published twice."""
    state = str(tmp_path / "state")
    expiry = [(codec.PROP["session_expiry_interval"], 300)]
    edge = start_edge(state_dir=state)
    try:
        sock, _ = conftest.raw_connect(edge, "forgetful", clean=False)
        sock.sendall(codec.encode_subscribe(1, [("redo/q2", 2)]))
        assert read_packet(sock) == (0x90, b"\x00\x01\x02")
        with Peer(edge, "redo-pub") as pub:
            pub.publish("redo/q2", b"two", 2)
            first, body = read_packet(sock)
            assert first == 0x34 and body[2:9] == b"redo/q2"
            id2 = body[9:11]
        sock.sendall(codec.encode_ack(PacketType.PUBREC, int.from_bytes(id2, "big")))
        assert read_packet(sock) == (0x62, id2)       # PUBREL; no PUBCOMP sent
        sock_in, _ = conftest.raw_connect(edge, "q2-in", 5, clean=False, props=expiry)
        sock_in.sendall(codec.encode_publish("q2in/a", b"once", 2, packet_id=5,
                                             version=codec.V5))
        assert read_packet(sock_in) == (0x50, b"\x00\x05")   # PUBREC; no PUBREL sent
        sock.close()
        sock_in.close()
        wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 2)
    finally:
        edge.stop()
    edge = start_edge(state_dir=state)
    try:
        assert counter(edge, "store_sessions_restored") == 2
        sock, body = conftest.raw_connect(edge, "forgetful", clean=False)
        assert body[0] == 1
        assert read_packet(sock) == (0x62, id2)        # past PUBREC: PUBREL again
        sock.sendall(codec.encode_ack(PacketType.PUBCOMP, int.from_bytes(id2, "big")))
        with Peer(edge, "q2-in-watch") as watch:
            assert watch.subscribe("q2in/#", 1) == 1
            sock_in, body = conftest.raw_connect(edge, "q2-in", 5, clean=False, props=expiry)
            assert body[0] == 1
            sock_in.sendall(codec.encode_publish("q2in/a", b"once", 2, dup=True, packet_id=5,
                                                 version=codec.V5))  # not published again
            assert read_packet(sock_in) == (0x50, b"\x00\x05")
            sock_in.sendall(codec.encode_ack(PacketType.PUBREL, 5, codec.V5))
            assert read_packet(sock_in) == (0x70, b"\x00\x05")   # PUBCOMP, id known
            with Peer(edge, "q2-in-marker") as marker:
                marker.publish("q2in/marker", b"m", 1)
            assert watch.next().payload == b"m"             # no "once" before it
        wait_for(lambda: not edge.mqtt.sessions["forgetful"].inflight)
        sock.close()
        sock_in.close()
    finally:
        edge.stop()
    st, _ = opened(state)  # both flows ended: nothing of them is left on disk
    assert [(s.client_id, s.deliveries, s.awaiting_rel) for s in sorted(
        st.stored_sessions(), key=lambda s: s.client_id)] == [
        ("forgetful", [], set()), ("q2-in", [], set())]
    st.close()


def test_a_will_waiting_for_its_delay_survives_a_restart(tmp_path):
    """In process: two 5.0 persistent sessions drop with a delayed will; the edge stops
    before either is due. After the start one is due (1 s: published, retained), the other
    (600 s) still waits and is cancelled by its client's return."""
    state = str(tmp_path / "state")
    expiry = [(codec.PROP["session_expiry_interval"], 600)]

    def will(delay: int, payload: bytes) -> codec.Will:
        return codec.Will("will/t", payload, 1, True, [(codec.PROP["will_delay_interval"],
                                                        delay)])
    edge = start_edge(state_dir=state)
    try:
        soon, _ = conftest.raw_connect(edge, "soon", 5, clean=False, props=expiry,
                                       will=will(1, b"soon gone"))
        late, _ = conftest.raw_connect(edge, "late", 5, clean=False, props=expiry,
                                       will=will(600, b"late gone"))
        soon.close()  # dropped: their wills wait
        late.close()
        wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 2)
    finally:
        edge.stop()
    edge = start_edge(state_dir=state)
    try:
        assert edge.mqtt.sessions["late"].will is not None
        with Peer(edge, "will-watch") as watch:
            assert watch.subscribe("will/#", 1) == 1
            assert watch.next().payload == b"soon gone"  # retained, or live
            sock, body = conftest.raw_connect(edge, "late", 5, clean=False, props=expiry)
            assert body[0] == 1  # back before its will's delay: cancelled
            assert edge.mqtt.sessions["late"].will is None
            sock.close()
        assert counter(edge, "wills_published") == 1
    finally:
        edge.stop()


def test_a_record_that_cannot_be_synced_is_not_acknowledged(tmp_path, monkeypatch):
    edge = start_edge(state_dir=str(tmp_path))
    try:
        sock, _ = conftest.raw_connect(edge, "unlucky")

        def failing(fd: int) -> None:
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(journal.os, "fdatasync", failing)
        sock.sendall(codec.encode_publish("w/1", b"lost?", 1, packet_id=1))
        assert conftest.closed_by_peer(sock) == b""  # closed, no PUBACK
        assert counter(edge, "store_write_errors") >= 1
        assert counter(edge, "store_acks_refused") == 1
        monkeypatch.undo()
    finally:
        edge.stop()


def test_an_unreadable_state_dir_stops_the_edge_with_one_line_naming_the_key(tmp_path):
    config = write_config(tmp_path / "edge.toml", edge_toml(free_port(), free_port(),
                                                            free_port()))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / JOURNAL).write_bytes(b"not a journal at all")
    done = subprocess.run([*CLI, "run", "--config", str(config)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("topicwire: config: mqtt.state_dir: cannot read the edge's state"), \
        last
    assert "Traceback" not in done.stderr


# --- the store alone -------------------------------------------------------------------------

def opened(path) -> tuple[StateStore, Counter]:
    counts: Counter = Counter()
    loop = asyncio.new_event_loop()
    return StateStore(path, loop, lambda k, n: counts.update({k: n})), counts


def session(client_id: str = "c1", filters: dict | None = None) -> SimpleNamespace:
    return SimpleNamespace(client_id=client_id, identity="alice", expiry_s=300, ended=False,
                           stored=False, inflight={}, queued=[], awaiting_rel=set(),
                           filters=filters or {"a/#": SubOptions(1, no_local=True, sub_id=7,
                                                                 match="a/#", seq=1)},
                           carve_outs={"a/x/#": 2})


def test_the_store_reads_back_what_it_recorded(tmp_path):
    st, _ = opened(tmp_path)
    s = session()
    sent = Delivery("a/1", b"one", 1)
    s.inflight[5] = sent
    s.queued.extend([Delivery("a/2", b"two", 2), Delivery("a/3", b"three", 1, True)])
    s.awaiting_rel.add(9)
    st.save_session(s, offline_since=123.5)
    sent.awaiting = "puback"
    st.sent(s, 5, sent)
    gone = Delivery("a/4", b"acked", 1)
    st.kept(s, gone)
    st.done(s, gone)
    st.retained("r/1", b"kept", 1)
    st.retained("r/2", b"x", 0)
    st.retained("r/2", b"", 0)
    st.inbound(1, False, "alice", "p/1", b"pub", lambda ok: None)
    other = session("c2")
    st.save_session(other)
    st.forget_session(other)
    assert st.sync(DEADLINE_S)
    st.close()
    again, counts = opened(tmp_path)
    [back] = again.stored_sessions()
    assert (back.client_id, back.identity, back.expiry_s, back.offline_since) == (
        "c1", "alice", 300, 123.5)
    assert back.filters == s.filters
    assert back.carve_outs == {"a/x/#": 2}  # (a partial unsubscribe, after the filter)
    assert [(d.topic, d.payload, d.qos, d.retain, sent_as) for _, d, sent_as in
            back.deliveries] == [("a/1", b"one", 1, False, (5, "puback")),
                                 ("a/2", b"two", 2, False, None),
                                 ("a/3", b"three", 1, True, None)]
    assert back.awaiting_rel == {9}
    assert [(t, p, q) for t, p, q, *_ in again.stored_retained()] == [("r/1", b"kept", 1)]
    [m] = again.stored_inbound()
    assert (m.qos, m.identity, m.topic, m.payload) == (1, "alice", "p/1", b"pub")
    assert again.next_seq() > m.seq  # numbers go on after the old ones
    assert not counts["store_torn_tail_bytes"]
    again.close()


def test_5_0_properties_and_expiry_are_recorded_with_messages(tmp_path):
    st, _ = opened(tmp_path)
    props = [(codec.PROP["user_property"], ("k", "v")), (codec.PROP["content_type"], "text"),
             (codec.PROP["correlation_data"], b"\x00\x01")]
    meta = MessageMeta(props, time.monotonic() + 100, True, 0)
    s = session()
    st.save_session(s)
    st.kept(s, Delivery("a/1", b"p", 1, True, meta))
    st.retained("r/1", b"kept", 1, meta=meta)
    st.retained("r/old", b"gone", 1, meta=MessageMeta([], time.monotonic() - 1))
    st.inbound(1, True, "alice", "p/1", b"pub", lambda ok: None, meta)
    st.close()
    again, _ = opened(tmp_path)
    [back] = again.stored_sessions()
    [(_, d, _)] = back.deliveries
    assert d.meta.props == props and d.meta.retain and 95 < d.meta.remaining_s(
        time.monotonic()) <= 100
    by_topic = {t: m for t, _, _, _, m in again.stored_retained()}
    assert by_topic["r/1"].props == props and by_topic["r/old"].expired(time.monotonic())
    [m] = again.stored_inbound()
    assert m.meta.props == props
    again.close()
    edge = start_edge(state_dir=str(tmp_path))  # the expired one is not set again
    try:
        assert counter(edge, "store_retained_expired") == 1
        retained = edge.mqtt.retained.messages  # (p/1: the publish sent again at start)
        assert sorted(retained) == ["p/1", "r/1"]
        assert retained["r/1"].meta.props == props and retained["p/1"].meta.props == props
    finally:
        edge.stop()


@pytest.mark.parametrize("damage", ["torn", "corrupt"])
def test_a_torn_or_corrupt_tail_is_cut_and_counted(tmp_path, damage):
    st, _ = opened(tmp_path)
    for i in range(3):
        st.retained(f"r/{i}", b"x" * 20, 1)
    st.close()
    path = tmp_path / JOURNAL
    data = bytearray(path.read_bytes())
    if damage == "torn":  # a crash in the middle of the last record
        data = data[:-5]
    else:  # a flipped bit in the last record
        data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    again, counts = opened(tmp_path)
    assert sorted(t for t, *_ in again.stored_retained()) == ["r/0", "r/1"]
    assert counts["store_torn_tail_bytes"] > 0 and counts["store_torn_tails_cut"] == 1
    again.retained("r/9", b"after", 1)  # the cut file takes new records
    again.close()
    third, counts = opened(tmp_path)
    assert sorted(t for t, *_ in third.stored_retained()) == ["r/0", "r/1", "r/9"]
    assert not counts["store_torn_tail_bytes"]
    third.close()


def test_records_that_do_not_decode_are_dropped_and_counted(tmp_path):
    st, _ = opened(tmp_path)
    s = session()
    st.save_session(s)
    st.kept(s, Delivery("a/1", b"fine", 1))
    st.put(store.SESSION, b"c9", b"not json")                    # CRC-valid, not decodable
    st.put(store.RETAINED, b"r/bad", b"\x00")
    st.put(store.DELIVERY, store.delivery_key("c1", 99), b"\x01")
    st.put(store.INBOUND, store.U64.pack(7), b"\x01")
    st.retained("r/ok", b"ok", 1)
    st.close()
    again, counts = opened(tmp_path)
    [back] = again.stored_sessions()
    assert [d.payload for _, d, _ in back.deliveries] == [b"fine"]
    assert [t for t, *_ in again.stored_retained()] == ["r/ok"]
    assert again.stored_inbound() == []
    assert counts["store_records_unreadable"] == 4
    again.close()


def test_a_directory_in_use_by_another_edge_is_refused(tmp_path):
    first, _ = opened(tmp_path)
    with pytest.raises(ConfigError, match="mqtt.state_dir: .* is in use by another running"):
        opened(tmp_path)
    first.close()
    first.close()
    opened(tmp_path)[0].close()  # free again


def test_a_file_of_another_kind_is_a_config_error(tmp_path):
    (tmp_path / JOURNAL).write_bytes(b"TWBL\x01")  # a bridge backlog
    with pytest.raises(ConfigError, match="mqtt.state_dir: cannot read"):
        opened(tmp_path)


def test_the_store_is_compacted_to_its_live_records(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "COMPACT_MIN_BYTES", 4_096)
    st, counts = opened(tmp_path)
    s = session()
    st.save_session(s)
    for _ in range(300):
        d = Delivery("a/x", b"z" * 100, 1)
        st.kept(s, d)
        st.done(s, d)
    keep = Delivery("a/keep", b"k", 1)
    st.kept(s, keep)
    assert st.sync(DEADLINE_S)
    st.retained("r/last", b"l", 1)  # (a batch after the compaction's)
    st.close()
    assert counts["store_compactions"] >= 1
    assert (tmp_path / JOURNAL).stat().st_size < 4_096
    again, _ = opened(tmp_path)
    [back] = again.stored_sessions()
    assert [d.topic for _, d, _ in back.deliveries] == ["a/keep"]
    assert [t for t, *_ in again.stored_retained()] == ["r/last"]
    again.close()


def test_a_publish_recorded_but_not_delivered_is_published_again_at_start(tmp_path):
    """The crash this covers: the publisher's PUBACK went (its INBOUND record synced), the
    subscriber's delivery record did not make it to disk. Written directly, then an edge
    starts on it (in process)."""
    st, _ = opened(tmp_path)
    s = session("late", filters={"plant/#": SubOptions(1, match="plant/#")})
    s.identity = "alice"
    st.save_session(s, offline_since=None)
    already = Delivery("plant/0", b"queued before", 1)
    st.kept(s, already)
    st.inbound(1, False, "alice", "plant/1", b"acked, not queued", lambda ok: None)
    st.inbound(1, True, "alice", "plant/2", b"retained too", lambda ok: None)
    st.close()
    edge = start_edge(state_dir=str(tmp_path))
    try:
        assert counter(edge, "store_sessions_restored") == 1
        with Peer(edge, "late", clean=False) as again:
            assert again.session_present
            assert receive(again, 3) == [("plant/0", b"queued before", 1),
                                         ("plant/1", b"acked, not queued", 1),
                                         ("plant/2", b"retained too", 1)]
        assert counter(edge, "store_inbound_republished") == 2
        assert edge.mqtt.status()["retained_messages"] == 1
        wait_for(lambda: not edge.mqtt.store.inbound_pending(), what="the records retired")
    finally:
        edge.stop()


def test_publishes_in_a_window_are_acknowledged_in_order_once_synced(tmp_path):
    """paho keeps 20 QoS 1 publishes in flight; the edge lets at most max_inflight (2)
    acknowledgements wait for the disk per connection, and sends them in order."""
    edge = start_edge(state_dir=str(tmp_path), max_inflight=2)
    try:
        with Peer(edge, "online") as sub, Peer(edge, "burst") as pub:
            assert sub.subscribe("o/#", 1) == 1
            infos = [pub.client.publish(f"o/{i}", b"%d" % i, 1) for i in range(60)]
            for info in infos:
                info.wait_for_publish(DEADLINE_S)
                assert info.is_published()
            assert [m.topic for m in (sub.next() for _ in range(60))] == [
                f"o/{i}" for i in range(60)]
        assert counter(edge, "store_records_written") >= 60
        assert counter(edge, "store_syncs") >= 1
    finally:
        edge.stop()


def test_the_bounds_hold_for_what_is_recorded_and_restored(tmp_path):
    """In process: what the queue and the retained store refuse is not recorded, and a
    restart with smaller bounds restores within them."""
    state = str(tmp_path / "state")
    edge = start_edge(state_dir=state, max_queued=3, max_retained=1)
    try:
        first = Peer(edge, "small", clean=False)
        assert first.subscribe("q/#", 1) == 1
        first.close()
        wait_for(lambda: edge.mqtt.status()["sessions_offline"] == 1)
        with Peer(edge, "pub") as pub:
            for i in range(6):
                pub.publish(f"q/{i}", b"m", 1)
            pub.publish("r/1", b"one", 1, retain=True)
            pub.publish("r/2", b"two", 1, retain=True)  # refused: max_retained 1
        wait_counter(edge, "deliveries_dropped_queue_full", 3)
        assert counter(edge, "store_deliveries_kept") == 3
    finally:
        edge.stop()
    edge = start_edge(state_dir=state, max_queued=1, max_inflight=1, max_retained=1)
    try:
        assert counter(edge, "store_deliveries_restored") == 2  # max_queued + max_inflight
        assert counter(edge, "store_retained_restored") == 1
        assert edge.mqtt.status()["retained_messages"] == 1
        with Peer(edge, "small", clean=False) as again:
            assert again.session_present
            assert [m.topic for m in (again.next(), again.next())] == ["q/0", "q/1"]
    finally:
        edge.stop()


def test_state_dir_is_relative_to_the_config_and_must_be_a_directory(tmp_path):
    doc = edge_doc(state_dir="state")
    cfg = parse_config(doc, tmp_path / "edge.toml")
    assert cfg.mqtt.state_dir == tmp_path / "state"
    assert parse_config(edge_doc()).mqtt.state_dir is None  # absent: in memory
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="mqtt.state_dir: .* is not a directory"):
        parse_config(edge_doc(state_dir="file"), tmp_path / "edge.toml")

