"""The forwarding pipeline (appliance/dataplane/express.py) against its oracle, the general loop,
over randomized mixed traffic through a chain of three appliances.

    a (P&M) ---- b ---- c          publishers: three sessions at a, one at c
                                    subscribers: at a, b and c (client API)

Each round, the publishers at a send a random mix of frames while a's data path is held, so
a receives them as one burst mixing peers and sessions: one to three messages a frame on
topics the sender may publish, topics it may not (registered by another publisher: denied),
a topic nobody registered (unknown: parked, then expired), frames whose source session is
another publisher's (spoofed), frames from a stranger that never logged in, and malformed
frames. The publisher at c sends at the same time, so b's fabric socket receives bursts that
mix frames for b with frames in transit both ways.

The same seeded traffic runs with the pipeline on and off (the general loop alone). What
every subscriber receives (per publisher and topic: the payload of each message, in order)
must equal what the entitlements say it should, both ways; the appliances' counts of the
traffic (published and delivered per session, denied, frames from strangers, malformed
frames) must be the same both ways; and with the pipeline on, it must have taken a's mixed
bursts and b's fabric bursts.
"""

import random
import time

import numpy as np
import pytest

from appliance.client import connect
from appliance.config import parse_config
from appliance.dataplane import express as _express
from appliance.node import Appliance
from bench.fabric import _login, _request
from channels.base import FrameBatch
from channels.udp import UdpChannel
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.codec import FrameWriter
from datapath.topics.algebra import matches as topic_matches
from datapath.topics.registry import KeyRegistry
from tests.appliance.helpers import FABRIC_KEY, free_port, wait_for
from tests.appliance.test_pipeline_bursts import _hold

TOPICS = ["p/x/1", "p/y/2", "q/z/3"]
UNKNOWN = "r/u/4"
"""Registered by nobody: its messages are parked and expire."""
PUBLISHERS = {  # name -> (appliance, identity)
    "pa1": ("a", "pub-p"), "pa2": ("a", "pub-xq"), "pa3": ("a", "pub-p"), "pc1": ("c", "pub-p")}
RIGHTS = {"pub-p": ["p/#"], "pub-xq": ["p/x/#", "q/#"]}
SUBSCRIBERS = {"a-all": ("a", "#"), "a-y": ("a", "+/y/+"), "b-p": ("b", "p/#"),
               "c-x": ("c", "p/x/#"), "c-q": ("c", "q/#"), "c-all": ("c", "#")}
ROUNDS = 24
END = "end"


def _may(identity: str, topic: str) -> bool:
    return any(topic_matches(pattern, topic) for pattern in RIGHTS[identity])


def _chain():
    ports = {n: free_port() for n in "abc"}
    common = {"heartbeat_interval_ms": 50, "lsa_refresh_ms": 500}

    def config(n, neighbours, pm):
        return parse_config({
            "appliance": {"name": f"d{n}{ports[n]}", "dataplane": "thread", **common},
            "fabric": {"listen": f"127.0.0.1:{ports[n]}", "key": FABRIC_KEY},
            "neighbours": [{"name": f"d{m}{ports[m]}", "address": f"127.0.0.1:{ports[m]}"}
                           for m in neighbours],
            "clients": {"udp": f"127.0.0.1:{free_port()}"},
            "pm": pm})
    identities = {i: {"publish": r, "subscribe": []} for i, r in RIGHTS.items()}
    identities["reader"] = {"publish": [], "subscribe": ["#"]}
    apps = {"a": Appliance(config("a", "b", {"identities": identities,
                                                       "require_passwords": False})).start()}
    apps["b"] = Appliance(config("b", "ac", {"mode": "remote"})).start()
    apps["c"] = Appliance(config("c", "b", {"mode": "remote"})).start()
    return apps


def _url(app):
    host, port = app.config.clients_udp
    return f"udp://{host}:{port}"


class _Publisher:
    """A raw client session (the client protocol of docs/appliance.md) that writes frames."""

    def __init__(self, name, app, identity, keyer):
        host, port = app.config.clients_udp
        self.name = name
        self.identity = identity
        self.channel = UdpChannel(("127.0.0.1", 0), dest=(host, port))
        self.scratch = FrameBatch(8, 65_504)
        self.session = _login(self.channel, self.scratch, identity)
        self.keyer = keyer
        self.seq: dict[str, int] = {}
        for topic in TOPICS:
            if _may(identity, topic):
                _request(self.channel, self.scratch, fl.FrameType.REGISTRY_UPDATE,
                         [al.RegistryEntry(keyer.key_of(topic, 0), 0, topic)], self.session,
                         {"version": 0})

    def frame(self, batch, i, topics, session=None, probe=False):
        """Frame ``i`` of ``batch``: one message on each of ``topics``, numbered per topic
        (a ``probe``'s payload says so)."""
        writer = FrameWriter(memoryview(batch.buf), int(batch.offsets[i]), 512)
        source = self.session if session is None else session
        writer.begin(source_session=source, stream_id=source)
        sent = []
        for topic in topics:
            seq = self.seq[topic] = self.seq.get(topic, 0) + 1
            payload = f"{self.name}|{topic}|{'probe' if probe else seq}"
            writer.append(self.keyer.key_of(topic, 0), seq, time.time_ns(), payload.encode())
            sent.append((topic, seq, payload))
        batch.lengths[i] = writer.finish()
        return sent

    def close(self):
        self.channel.close()


def _round(rng, pubs, stranger_channel):
    """One round's sends: {publisher name: (batch, messages it carries that a subscriber
    may get, frames of its own session)}; spoofed frames are numbered by the spoofer
    (nobody gets them)."""
    out = {}
    names = [n for n in pubs if PUBLISHERS[n][0] == "a"]
    for name in names:
        pub = pubs[name]
        frames = rng.choice([0, 1, 1, 2, 3, 5, 8])
        batch = FrameBatch(max(frames + 2, 1), 512)
        sent = []
        k = ok = 0
        for _ in range(frames):
            topics = rng.sample([*TOPICS, UNKNOWN], rng.randint(1, 3))
            spoof = rng.random() < 0.1
            if spoof:  # another publisher's session as the source: refused
                other = pubs[rng.choice([n for n in names if n != name])]
                pub.frame(batch, k, topics, session=other.session)
                for topic in topics:
                    pub.seq[topic] -= 1  # numbering goes on as if it was not sent
            else:
                sent += [(pub.name, t, s, p) for t, s, p in pub.frame(batch, k, topics)]
                ok += 1
            k += 1
        if rng.random() < 0.2:  # a malformed frame from a publisher's own address
            at = int(batch.offsets[k])
            batch.buf[at : at + 40] = np.frombuffer(rng.randbytes(40), np.uint8)
            batch.lengths[k] = 40
            k += 1
        batch.count = k
        out[name] = (batch, sent, ok)
    if rng.random() < 0.3:  # a stranger's DATA frame with a made-up session
        batch = FrameBatch(1, 512)
        writer = FrameWriter(memoryview(batch.buf), 0, 512)
        writer.begin(source_session=rng.randint(1, 1 << 30), stream_id=7)
        writer.append(KeyRegistry().key_of(TOPICS[0], 0), 1, time.time_ns(), b"stranger")
        batch.lengths[0] = writer.finish()
        batch.count = 1
        out["stranger"] = (batch, [], 0)
    return out


def _run(seed: int, pipeline: bool) -> tuple[dict, dict, dict]:
    _express.ENABLED = pipeline
    rng = random.Random(seed)
    apps = _chain()
    clients, pubs = [], {}
    stranger = UdpChannel(("127.0.0.1", 0), dest=apps["a"].config.clients_udp)
    try:
        wait_for(lambda: all(len(app.status().get("routes", [])) == 6 for app in apps.values()),
                 timeout_s=30)
        subs = {}
        for name, (where, pattern) in SUBSCRIBERS.items():
            c = connect(_url(apps[where]), "reader")
            clients.append(c)
            subs[name] = c.subscribe(pattern)
        keyer = KeyRegistry()
        for name, (where, identity) in PUBLISHERS.items():
            pubs[name] = _Publisher(name, apps[where], identity, keyer)
        got = {name: {} for name in SUBSCRIBERS}
        probed = {name: set() for name in SUBSCRIBERS}

        def take(name, timeout):
            msg = subs[name].get(timeout=timeout)
            if msg is not None:
                payload = msg.payload.decode()
                pub = payload.split("|")[0]
                if payload.endswith("|probe"):
                    probed[name].add((msg.topic, pub))
                else:
                    got[name].setdefault((msg.topic, pub), []).append(payload)
            return msg

        def expected(name, upto):
            pattern = SUBSCRIBERS[name][1]
            out = {}
            for pub, topic, _, payload in upto:
                if topic_matches(pattern, topic) and _may(PUBLISHERS[pub][1], topic):
                    out.setdefault((topic, pub), []).append(payload)
            return out

        # every subscriber's interest is everywhere: probes from each publisher on each
        # topic it may publish, again until every subscriber has one of each it should get
        everything = [(p.name, t, 0, "") for p in pubs.values() for t in TOPICS
                      if _may(p.identity, t)]

        def interest_everywhere():
            for pub in pubs.values():
                for topic in TOPICS:
                    if _may(pub.identity, topic):
                        batch = FrameBatch(1, 512)
                        pub.frame(batch, 0, [topic], probe=True)
                        batch.count = 1
                        pub.channel.send(batch)
            for name in SUBSCRIBERS:
                while take(name, 0.1) is not None:
                    pass
            return all(probed[name] >= set(expected(name, everything)) for name in SUBSCRIBERS)
        wait_for(interest_everywhere, timeout_s=30, interval_s=0.2)
        sent: list[tuple[str, str, int, str]] = []

        def caught_up(upto):
            for name in SUBSCRIBERS:
                want = sum(len(v) for v in expected(name, upto).values())
                while sum(len(v) for v in got[name].values()) < want:
                    if take(name, 0.2) is None:
                        return False
            return True

        def markers():
            """A marker from every publisher on every topic it may publish, and wait for
            them: what each publisher sent before on a topic has arrived too."""
            for pub in pubs.values():
                for topic in TOPICS:
                    if _may(pub.identity, topic):
                        batch = FrameBatch(1, 512)
                        sent.extend((pub.name, t, s, p)
                                    for t, s, p in pub.frame(batch, 0, [topic]))
                        batch.count = 1
                        pub.channel.send(batch)
            wait_for(lambda: caught_up(sent), timeout_s=30)
        sessions = {c.session: name for c, name in zip(clients, SUBSCRIBERS)}
        names = {p.session: n for n, p in pubs.items()}

        def final(app):
            status = app.status()
            for c in status.get("clients", []):
                if c["session"] in sessions and c["delivered"] != subs[
                        sessions[c["session"]]].delivered:
                    return None
            return status

        def counts():
            """Per appliance, once every delivery the subscribers received is counted."""
            out = {}
            for where, app in apps.items():
                status = wait_for(lambda app=app: final(app))
                out[where] = {
                    "clients": {names.get(s["session"], sessions.get(s["session"])):
                                (s["published"], s["delivered"]) for s in status["clients"]},
                    "denied": status["offload"]["publish_denied"],
                    "transit": status["counters"].get("transit_frames", 0),
                    "strangers": status["counters"].get("unknown_client_frames", 0),
                    "malformed": status["offload"]["malformed"],
                    **{k: status["counters"].get(k, 0) for k in PATHS if k != "transit"},
                }
            return out
        # the probes are all in (and counted) before the traffic: counts from here on
        markers()
        before = counts()
        cycle = None
        shape = {"bursts": 0, "mixed": 0, "frames": 0}
        """The rounds at a: bursts with frames of a session, of several, and those frames."""
        # the rounds: a's publishers (and a stranger) while a is held, c's publisher meanwhile
        for _ in range(ROUNDS):
            sends = _round(rng, pubs, stranger)
            frames = rng.choice([1, 2, 4])
            cbatch = FrameBatch(frames, 512)
            for i in range(frames):
                topics = rng.sample([*TOPICS, UNKNOWN], rng.randint(1, 2))
                sent += [("pc1", t, s, p) for t, s, p in pubs["pc1"].frame(cbatch, i, topics)]
            cbatch.count = frames
            own = [n for name, (_, _, n) in sends.items() if n]
            shape["bursts"] += bool(own)
            shape["mixed"] += len(own) > 1
            shape["frames"] += sum(own)
            # a held in a cycle after the last round's: that one received the last round
            cycle, release = _hold(apps["a"], cycle)
            for name, (batch, messages, _) in sends.items():
                channel = stranger if name == "stranger" else pubs[name].channel
                if batch.count:
                    assert channel.send(batch) == batch.count
                sent += messages
            pubs["pc1"].channel.send(cbatch)
            release.set()
        _hold(apps["a"], cycle)[1].set()  # the last round was received alone too
        markers()  # after everything
        for name in SUBSCRIBERS:  # the markers came last: nothing else is on its way
            while take(name, 0) is not None:
                pass
        want = {name: expected(name, sent) for name in SUBSCRIBERS}
        after = counts()
        delta = {}
        for where in apps:
            one, other = after[where], before[where]
            delta[where] = {
                "clients": sorted((n, p - other["clients"][n][0], d - other["clients"][n][1])
                                  for n, (p, d) in one["clients"].items()),
                **{k: one[k] - other[k] for k in ("denied", "transit", "strangers", *PATHS)},
                "malformed": one["malformed"]}
        return {"got": got, "want": want, "shape": shape}, delta
    finally:
        for c in clients:
            c.close()
        for p in pubs.values():
            p.close()
        stranger.close()
        for app in reversed(list(apps.values())):
            app.stop()
        _express.ENABLED = True


PATHS = ("express_bursts", "pipeline_punts", "pipeline_client_frames", "pipeline_fabric_frames",
         "transit")
"""Counts that say which way the frames went, or depend on how bursts arrived at b."""


@pytest.mark.parametrize("seed", [11, 29])
def test_the_pipeline_delivers_and_counts_mixed_traffic_exactly_as_the_general_loop(seed):
    on, on_counts = _run(seed, True)
    off, off_counts = _run(seed, False)
    # each way, every subscriber got exactly what the entitlements say, in order per
    # publisher and topic
    assert on["got"] == on["want"]
    assert off["got"] == off["want"]
    assert on["want"] == off["want"]
    # the same counts: published and delivered per session, denials, strangers, malformed
    assert ({w: {k: v for k, v in c.items() if k not in PATHS} for w, c in on_counts.items()}
            == {w: {k: v for k, v in c.items() if k not in PATHS}
                for w, c in off_counts.items()})
    # the traffic had what it should: denials at a and c, transit at b, strangers at a
    assert on_counts["a"]["denied"] > 0 and on_counts["c"]["denied"] > 0
    assert on_counts["b"]["transit"] > 0 and off_counts["b"]["transit"] > 0
    assert on_counts["a"]["strangers"] > 0
    # the pipeline took a's mixed bursts and b's fabric bursts, and punted the strangers';
    # off, it never ran
    shape = on["shape"]
    assert shape["mixed"] >= 1  # (the seed's traffic has bursts of several sessions at a)
    assert on_counts["a"]["express_bursts"] >= shape["bursts"]
    assert on_counts["a"]["pipeline_client_frames"] >= shape["frames"]
    assert on_counts["b"]["pipeline_fabric_frames"] > 0
    assert on_counts["a"]["pipeline_punts"] >= on_counts["a"]["strangers"]
    assert all(c[k] == 0 for c in off_counts.values() for k in PATHS if k != "transit")
