"""The cache's side of NAKs served from it, without threads: a kept guaranteed message is
found by its sequence on the stream to the cache's session and read back; one above the
highest kept is waited for, then answered as not kept; a request over the queue's bound is
refused at once, and a malformed one is counted (appliance/cache/naks.py)."""

from __future__ import annotations

import json

from appliance.cache.agent import CacheAgent
from appliance.cache.layout import decode
from appliance.cache.settings import CACHE_NAK_QUEUE, CACHE_NAK_WAIT_NS
from appliance.client.messages import Message
from appliance.config import CACHE_NAK_MESSAGES_PER_NAK, parse_config
from appliance.dataplane.cache_naks import CacheNaks, SenderCacheMap
from datapath.protocol.admin_layout import SeqRange
from datapath.topics.registry import KeyRegistry

ORIGIN, STREAM = 5, 6 | 0x8000_0000


class _DataPath:
    def __init__(self) -> None:
        self.commands: list[tuple] = []

    def command(self, name: str, *args) -> None:
        self.commands.append((name, *args))

    def offer_admin(self, channel: str, dest: int, frame: bytes) -> bool:
        return True


def _agent(tmp_path) -> tuple[CacheAgent, _DataPath]:
    cfg = parse_config({"appliance": {"name": "unit"}, "clients": {"udp": "127.0.0.1:47999"},
                        "cache": {"dir": str(tmp_path), "patterns": ["orders/#"]}})
    dp = _DataPath()
    return CacheAgent(cfg, cfg.cache, dp, KeyRegistry()), dp


def _guaranteed(seq: int, topic: str = "orders/a") -> Message:
    return Message(topic, b"p%d" % seq, 11, seq, 1_000 + seq, 0, 0, 2, ORIGIN, STREAM, 0, True)


def _ask(agent, rid, seqs):
    agent.on_nak_request(json.dumps({"id": rid, "origin": ORIGIN, "stream": STREAM & 0x7FFF_FFFF,
                                     "seqs": seqs}).encode())


def test_kept_messages_are_read_back_by_their_sequence_and_the_rest_is_not_kept(tmp_path):
    agent, dp = _agent(tmp_path)
    try:
        for seq in (1, 2, 3, 5):  # 4 never reached the cache
            agent._on_guaranteed(_guaranteed(seq))
        agent._on_guaranteed(_guaranteed(6, topic="other/b"))  # no pattern of this cache
        agent._on_guaranteed(_guaranteed(7))
        agent.do_work(0)
        _ask(agent, 7, [2, 4, 5, 6])
        agent.do_work(1)
        (name, rid, records), = [c for c in dp.commands if c[0] == "cache_nak_answer"]
        assert rid == 7
        assert [decode(r[1])[8] if r else r for r in records] == [b"p2", None, b"p5", None]
        assert [r[0] for r in records if r] == [1_002, 1_005]  # the publish times
        assert agent.naks.counters["nak_records_read"] == 2
        assert agent.naks.counters["nak_not_kept"] == 2
    finally:
        agent.close()


def test_a_message_not_kept_yet_is_waited_for_then_answered(tmp_path):
    agent, dp = _agent(tmp_path)
    try:
        agent._on_guaranteed(_guaranteed(1))
        agent.do_work(0)
        _ask(agent, 1, [2])
        agent.do_work(1)
        assert not dp.commands  # 2 may still be on its way
        agent._on_guaranteed(_guaranteed(2))
        agent.do_work(2)
        assert dp.commands[-1][2][0][0] == 1_002
        _ask(agent, 2, [3])
        agent.do_work(3)
        assert len(dp.commands) == 1
        agent.naks._queue[0] = (agent.naks._queue[0][0], -CACHE_NAK_WAIT_NS)  # waited out
        agent.do_work(4)
        assert dp.commands[-1][1:] == (2, [None])
    finally:
        agent.close()


def test_requests_over_the_bound_are_refused_and_malformed_ones_counted(tmp_path):
    agent, dp = _agent(tmp_path)
    try:
        for rid in range(CACHE_NAK_QUEUE + 1):
            _ask(agent, rid, [1, 2])
        assert dp.commands == [("cache_nak_answer", CACHE_NAK_QUEUE, [False, False])]
        agent.on_nak_request(b'{"id": 1, "origin": -1, "stream": 0, "seqs": [1]}')
        agent.on_nak_request(b"not json")
        assert agent.naks.counters["nak_requests_malformed"] == 2
        assert agent.naks.counters["nak_refused"] == 2
    finally:
        agent.close()


def test_a_senders_map_finds_runs_and_names_what_it_does_not_hold():
    cmap = SenderCacheMap(None, None, ORIGIN, STREAM)
    for s, c in ((1, 10), (2, 11), (3, 12), (5, 13), (6, 14), (9, 20)):
        cmap.add(s, c)
    assert len(cmap.runs) == 3
    assert cmap.lookup(1, 10) == [(1, 3, 10), (4, 4, None), (5, 6, 13), (7, 8, None),
                                  (9, 9, 20), (10, 10, None)]
    assert cmap.lookup(2, 2) == [(2, 2, 11)]


class _Plane:
    """The guaranteed plane and data path as ``CacheNaks`` sees them."""

    node_id = 1

    def __init__(self) -> None:
        self.dp = self
        self.sessions: dict = {}
        self.inbox: list[dict] = []

    def to_inbox(self, channel: str, data: bytes) -> bool:
        self.inbox.append(json.loads(data))
        return True


def test_what_one_nak_asks_of_the_cache_is_bounded_and_asked_once():
    plane = _Plane()
    service = CacheNaks(plane)
    service.use("$cache")
    cmap = SenderCacheMap(service, None, ORIGIN, STREAM)
    for s in range(1, 3001):
        cmap.add(s, s + 100)
    # one NAK of three ranges (the sender calls once per range, at one time)
    lost = [r for first, last in ((1, 1500), (1501, 3000), (3001, 3010))
            for r in cmap.request(None, first, last, 5)]
    assert lost == [SeqRange(3001, 3010)]  # not mapped: announced lost at once
    asked = [c for doc in plane.inbox for c in doc["seqs"]]
    assert asked == list(range(101, 101 + CACHE_NAK_MESSAGES_PER_NAK))
    assert service.counters["nak_cache_refused"] == 3000 - CACHE_NAK_MESSAGES_PER_NAK
    assert service.counters["nak_cache_misses"] == 10
    # the receiver's next NAK: what is asked already is not asked again, the rest is
    assert cmap.request(None, 1, 1100, 6) == []
    assert plane.inbox[-1]["seqs"] == list(range(101 + 1024, 101 + 1100))


def test_asks_beyond_the_rate_and_reads_beyond_the_bytes_are_refused(tmp_path, monkeypatch):
    plane = _Plane()
    service = CacheNaks(plane)
    service.use("$cache")
    cmap = SenderCacheMap(service, None, ORIGIN, STREAM)
    for s in range(1, 501):
        cmap.add(s, s)
    service._tokens, service._tokens_ns = 100.0, 5  # what is left of this second
    assert cmap.request(None, 1, 500, 5) == []
    assert len(plane.inbox[-1]["seqs"]) == 100
    assert service.counters["nak_cache_refused"] == 400
    # the cache reads at most CACHE_NAK_READ_BYTES per request: the rest is refused (False)
    import appliance.cache.naks as naks

    agent, dp = _agent(tmp_path)
    try:
        for seq in range(1, 11):
            agent._on_guaranteed(_guaranteed(seq))
        agent.do_work(0)
        one = agent.naks.index.find(ORIGIN, STREAM, 1)
        assert one is not None and one is not False
        monkeypatch.setattr(naks, "CACHE_NAK_READ_BYTES", 3 * 60)  # about three records
        _ask(agent, 9, list(range(1, 11)))
        agent.do_work(1)
        records = dp.commands[-1][2]
        read = [r for r in records if r]
        assert 0 < len(read) < 10 and records[len(read):] == [False] * (10 - len(read))
        assert agent.naks.counters["nak_refused"] == 10 - len(read)
    finally:
        agent.close()
