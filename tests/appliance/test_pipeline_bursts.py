"""The data path's forwarding pipeline (appliance/dataplane/express.py) against its oracle, the
general loop, over bursts of one publisher of every size.

Two appliances on loopback (a: P&M, b: remote), subscribers at both (client API), and a
publisher that sends bursts of 64, 1 and 3 frames per sendmmsg (3 messages per frame, three
topics, one of which its identity may not publish), each burst arriving whole (the data path
is held in a command while it is sent), so the appliance receives bursts of those sizes.
The same traffic runs two ways: the general loop only, and the pipeline on (the default: the
pipeline over what the clients' UDP socket received and the send to UDP subscribers are then
one kernel call); what every subscriber
receives (per topic: sequence and payload, in order) and the appliances' published /
denied / delivered counts must be the same, and each path must have run where it was on.
(The order across topics follows the software NIC's descriptor order per burst, which
depends on how the bursts arrive, so it is compared per topic.)
"""

import threading
import time

import numpy as np
import pytest

from appliance.client import connect
from appliance.config import parse_config
from appliance.dataplane import express as _express
from appliance.node import Appliance
from bench.fabric import _login, _request
from channels.base import FrameBatch
from channels.udp import UdpChannel, peer_id_of
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.codec import FrameWriter
from datapath.topics.registry import KeyRegistry
from tests.appliance.helpers import FABRIC_KEY, free_port, wait_for

ALLOWED = ["p/x/1", "p/y/2"]
FORBIDDEN = "q/z"
BURSTS = [64, 1, 64, 3, 64, 1, 64, 3, 64, 1, 64, 64]
"""Frames per send (and per burst the appliance receives), round by round."""
DATA = int(fl.FrameType.DATA)
ROUNDS = len(BURSTS)
MESSAGES = sum(BURSTS)
SUBSCRIBERS = {"a-all": ("a", "#"), "a-x": ("a", "p/x/#"), "b-p": ("b", "p/#"),
               "b-q": ("b", "q/#")}


def _pair():
    fa, fb = free_port(), free_port()
    common = {"heartbeat_interval_ms": 50, "lsa_refresh_ms": 500}
    a = parse_config({
        "appliance": {"name": f"fa{fa}", "dataplane": "thread", **common},
        "fabric": {"listen": f"127.0.0.1:{fa}", "key": FABRIC_KEY},
        "neighbours": [{"name": f"fb{fb}", "address": f"127.0.0.1:{fb}"}],
        "clients": {"udp": f"127.0.0.1:{free_port()}"},
        "pm": {"require_passwords": False,
               "identities": {"pub": {"publish": ["p/#"], "subscribe": []},
                              "owner": {"publish": ["q/#"], "subscribe": []},
                              "reader": {"publish": [], "subscribe": ["#"]}}}})
    b = parse_config({
        "appliance": {"name": f"fb{fb}", "dataplane": "thread", **common},
        "fabric": {"listen": f"127.0.0.1:{fb}", "key": FABRIC_KEY},
        "neighbours": [{"name": f"fa{fa}", "address": f"127.0.0.1:{fa}"}],
        "clients": {"udp": f"127.0.0.1:{free_port()}"},
        "pm": {"mode": "remote"}})
    return Appliance(a).start(), Appliance(b).start()


def _url(app):
    host, port = app.config.clients_udp
    return f"udp://{host}:{port}"


def _bursts(session: int) -> list[FrameBatch]:
    """A batch of BURSTS[r] frames per round; each frame: one message per topic (the
    forbidden last)."""
    keyer = KeyRegistry()
    topics = [*ALLOWED, FORBIDDEN]
    keys = [keyer.key_of(t, 0) for t in topics]
    out, seq = [], 0
    for r, frames in enumerate(BURSTS):
        batch = FrameBatch(frames, 512)
        for i in range(frames):
            seq += 1
            writer = FrameWriter(memoryview(batch.buf), int(batch.offsets[i]), 512)
            writer.begin(source_session=session, stream_id=session)
            for t, key in zip(topics, keys):
                writer.append(key, seq, time.time_ns(), f"{t}|{r}|{i}".encode())
            batch.lengths[i] = writer.finish()
        batch.count = frames
        out.append(batch)
    return out


END = b"end"
MARKERS = {"a-all": 2, "a-x": 1, "b-p": 1, "b-q": 1}
"""End markers each subscriber receives: pub's (p/x/1) and the owner's (q/z)."""


def _marker(session: int, topic: str, seq: int) -> FrameBatch:
    batch = FrameBatch(1, 512)
    writer = FrameWriter(memoryview(batch.buf), 0, 512)
    writer.begin(source_session=session, stream_id=session)
    writer.append(KeyRegistry().key_of(topic, 0), seq, time.time_ns(), END)
    batch.lengths[0] = writer.finish()
    batch.count = 1
    return batch


def _hold(app: Appliance, after_cycle: int | None) -> tuple[int, threading.Event]:
    """Hold the data path in a command of a duty cycle later than ``after_cycle`` (commands
    run at the start of a cycle, before its receive) until the returned event is set: (the
    cycle, the event). A command that ran in ``after_cycle`` itself returns at once and
    another is offered."""
    dp = app.dataplane
    while True:
        entered, release, cycles = threading.Event(), threading.Event(), []

        def hold(entered=entered, release=release, cycles=cycles):
            cycles.append(dp.cycle_ns)
            entered.set()
            if cycles[0] != after_cycle:
                release.wait(5)
        dp.commands.offer(hold)
        assert entered.wait(5), "the data path ran no cycle within 5 s"
        if cycles[0] != after_cycle:
            return cycles[0], release


def _watch_receives(channel: UdpChannel) -> list[tuple[int, set[int]]]:
    """Record (frames, their peers) of every receive of ``channel`` from now on (no peers
    when the burst held an admin frame): its own receive and the express path's both end in
    ``finish_receive``."""
    seen: list[tuple[int, set[int]]] = []
    finish = channel.finish_receive

    def note(batch: FrameBatch, n: int, err: int) -> int:
        got = finish(batch, n, err)
        if got:
            data = all(fl.FRAME_HEADER_STRUCT.unpack_from(batch.buf, off)[2] == DATA
                       for off in batch.offsets[:got].tolist())
            seen.append((got, set(batch.peer_ids[:got].tolist()) if data else set()))
        return got

    channel.finish_receive = note
    return seen


def _run_traffic(express: bool) -> tuple[dict, dict]:
    _express.ENABLED = express
    a, b = _pair()
    clients = []
    try:
        wait_for(lambda: len(a.status().get("routes", [])) == 2 and b.status()["node"]["pm"])
        subs = {}
        for name, (where, pattern) in SUBSCRIBERS.items():
            c = connect(_url(a if where == "a" else b), "reader")
            clients.append(c)
            subs[name] = c.subscribe(pattern)
        wait_for(lambda: sum(s["origin"] == b.config.name
                             for s in a.status()["subscriptions"]) == 2)
        # the owner registers the forbidden topic (its key is known to the tables) and probes
        # the path to b until b's interest is in a's tables
        owner = connect(_url(a), "owner")
        clients.append(owner)
        probes = []

        def probed():
            owner.publish(FORBIDDEN, b"probe", flush=True)
            msg = subs["b-q"].get(timeout=0.2)
            if msg is not None:
                probes.append(msg)
            return probes
        wait_for(probed)
        host, port = a.config.clients_udp
        channel = UdpChannel(("127.0.0.1", 0), dest=(host, port))
        scratch = FrameBatch(8, 65_504)
        try:
            session = _login(channel, scratch, "pub")
            keyer = KeyRegistry()
            for topic in ALLOWED:
                _request(channel, scratch, fl.FrameType.REGISTRY_UPDATE,
                         [al.RegistryEntry(keyer.key_of(topic, 0), 0, topic)], session,
                         {"version": 0})
            # the bursts go once a's tables hold every allowed key (a burst that came before
            # its keys' tables would be parked and rerun by the general loop instead)
            keys = np.array([keyer.key_of(t, 0) for t in ALLOWED], np.uint64)
            wait_for(lambda: bool((a.dataplane.nic.switch.current.tables.lookup(keys) != 0)
                                  .all()))
            received = _watch_receives(a.channels["clients-udp"])
            publisher = peer_id_of(*channel.local_address)
            cycle = None
            for batch in _bursts(session):
                # hold a's data path in a command while the burst is sent, so the burst
                # arrives whole in one receive (else it is taken in pieces as it arrives);
                # held in a later cycle than the last burst's, which has received it then
                cycle, release = _hold(a, cycle)
                assert channel.send(batch) == batch.count
                release.set()
            _hold(a, cycle)[1].set()  # the last burst was received alone too
            # the end markers, after everything: pub's on an allowed topic (to every
            # subscriber but b-q), the owner's on the forbidden one (to b-q and a-all)
            assert channel.send(_marker(session, ALLOWED[0], MESSAGES + 1)) == 1
        finally:
            channel.close()
        owner.publish(FORBIDDEN, END, flush=True)
        got = {}
        for name, sub in subs.items():
            got[name] = {}
            ends = 0
            while ends < MARKERS[name]:
                msg = sub.get(timeout=20)
                assert msg is not None, f"{name}: the end marker did not come within 20 s"
                if msg.payload == END:
                    ends += 1
                elif msg.payload != b"probe":
                    got[name].setdefault(msg.topic, []).append((msg.sequence, msg.payload))
            # what came before the markers is all there is (each publisher's messages reach a
            # subscriber in order); nothing else is on its way
            while (msg := sub.get(timeout=0)) is not None:
                got[name].setdefault(msg.topic, []).append((msg.sequence, msg.payload))
        # (every burst was received by now: its messages came before the end markers)
        # the publisher's bursts of DATA frames alone, sent once its keys were in a's tables
        # (another client's heartbeat or key resolution may share a receive with a burst: a
        # mixed burst's punts are the general loop's); the pipeline's counters also count
        # other clients' bursts (probes)
        pure = [n for n, peers in received if peers == {publisher}]
        # a status of each appliance that counted every delivery its subscribers received
        # (the markers last), so every count is final
        sessions = {c.session: name for c, name in zip(clients, SUBSCRIBERS)}
        where = {name: w for name, (w, _) in SUBSCRIBERS.items()}

        def final(app, side):
            status = app.status()
            delivered = {sessions[c["session"]]: c["delivered"]
                         for c in status.get("clients", []) if c["session"] in sessions}
            done = all(delivered.get(n) == subs[n].delivered
                       for n in SUBSCRIBERS if where[n] == side)
            return status if done else None
        statuses = {"a": wait_for(lambda: final(a, "a")), "b": wait_for(lambda: final(b, "b"))}
        counts = {}
        for app, side in ((a, "a"), (b, "b")):
            status = statuses[side]
            counts[app.config.name[:2]] = {
                "published": max([c["published"] for c in status["clients"]
                                  if c["identity"] == "pub"], default=0),
                # (probes went to the "#" and "q/#" subscribers: their counts vary)
                "delivered": sorted((c["subscriptions"], c["delivered"])
                                    for c in status["clients"]
                                    if c["subscriptions"] in (["p/#"], ["p/x/#"])),
                "denials": status["offload"]["publish_denied"],
                "express": status["counters"].get("express_bursts", 0),
                "express_receives": status["counters"].get("express_receives", 0),
                "udp_frames_out": [c["frames_out"] for c in status["channels"]
                                   if c["name"] == "clients-udp"],
                "pure_bursts": len(pure)}
        return got, counts
    finally:
        for c in clients:
            c.close()
        b.stop()
        a.stop()
        _express.ENABLED = True


@pytest.fixture(scope="module")
def two_ways():
    return _run_traffic(False), _run_traffic(True)


def _same_counts(one: dict, other: dict) -> bool:
    paths = ("express", "express_receives", "udp_frames_out", "pure_bursts")
    return all({k: v for k, v in one[side].items() if k not in paths}
               == {k: v for k, v in other[side].items() if k not in paths}
               for side in ("fa", "fb"))


def test_the_pipeline_ran_and_delivers_exactly_what_the_general_loop_does(two_ways):
    (slow, slow_counts), (express, express_counts) = two_ways
    # every burst of the publisher alone at a, of every size (the end marker's too), went
    # through the pipeline ...
    fa = express_counts["fa"]
    assert fa["pure_bursts"] >= ROUNDS // 2
    assert fa["express"] >= fa["pure_bursts"]
    # ... with the send to UDP subscribers in the same call (receive_forward)
    assert fa["express_receives"] >= fa["pure_bursts"]
    assert slow_counts["fa"]["express_receives"] == 0 == slow_counts["fa"]["express"]
    # b's fabric bursts went through it too
    assert express_counts["fb"]["express"] >= 1
    assert express == slow
    assert _same_counts(express_counts, slow_counts)


def test_the_reference_delivery_is_exact(two_ways):
    (slow, slow_counts), _ = two_ways
    n = MESSAGES
    every = list(range(1, n + 1))
    for name, topics in (("a-all", ALLOWED), ("a-x", ALLOWED[:1]), ("b-p", ALLOWED),
                         ("b-q", [])):
        assert sorted(slow[name]) == sorted(topics), name
        for topic in topics:  # every message once, in order, with its own payload
            assert [seq for seq, _ in slow[name][topic]] == every, (name, topic)
            assert all(p.startswith(f"{topic}|".encode()) for _, p in slow[name][topic])
    assert slow_counts["fa"]["denials"] == n  # the forbidden topic reached nobody
    # (+ 1: pub's end marker)
    assert slow_counts["fa"]["published"] == 2 * n + 1
    assert slow_counts["fa"]["delivered"] == [(["p/x/#"], n + 1)]
    assert slow_counts["fb"]["delivered"] == [(["p/#"], 2 * n + 1)]
