"""``CacheAgent`` without its threads: replay requests are bounded per session and in all
(a refusal says busy), a page goes out as its frames, then a REPLAY_RESULT naming them,
through the data path's admin outbox, and what it does not keep is counted (too large, gaps
in a publisher's sequence)."""

from __future__ import annotations

import json

from appliance.cache.agent import CacheAgent
from appliance.cache.settings import (
    CACHE_MAX_PAYLOAD_BYTES,
    REPLAYS_PENDING,
    REPLAYS_PENDING_PER_SESSION,
)
from appliance.client.messages import Message
from appliance.client.replay import decode_page
from appliance.config import parse_config
from datapath.protocol.codec import decode_frame
from datapath.protocol.replay_layout import REPLAY_STREAM_ID
from datapath.topics.registry import KeyRegistry


class _Outbox:
    def __init__(self) -> None:
        self.frames: list[tuple[str, int, bytes]] = []

    def offer_admin(self, channel: str, dest: int, frame: bytes) -> bool:
        self.frames.append((channel, dest, bytes(frame)))
        return True


def _agent(tmp_path) -> tuple[CacheAgent, _Outbox]:
    cfg = parse_config({"appliance": {"name": "unit"}, "clients": {"udp": "127.0.0.1:47999"},
                        "cache": {"dir": str(tmp_path), "patterns": ["orders/#"]}})
    out = _Outbox()
    return CacheAgent(cfg, cfg.cache, out, KeyRegistry()), out


def _msg(seq: int, payload: bytes = b"x", topic: str = "orders/a", key: int = 11) -> Message:
    return Message(topic, payload, key, seq, 1_000 + seq, 0, 0, 0, 5, 6, 0)


def test_pending_replays_are_bounded_per_session_and_in_all(tmp_path):
    agent, _ = _agent(tmp_path)
    try:
        doc = {"id": 1, "pattern": "orders/#"}
        for rid in range(1, REPLAYS_PENDING_PER_SESSION + 1):
            assert agent.submit(1, "clients-udp", 9, {**doc, "id": rid}) is None
        assert agent.submit(1, "clients-udp", 9, doc) is None  # a repeat: not queued again
        assert len(agent._requests) == REPLAYS_PENDING_PER_SESSION
        why, reason = agent.submit(1, "clients-udp", 9, {**doc, "id": 99})
        assert why == "busy" and reason.startswith("cache: this session has")
        session = 2
        while len(agent._requests) < REPLAYS_PENDING:
            assert agent.submit(session, "clients-udp", 9, doc) is None
            session += 1
        assert agent.submit(session + 1, "clients-udp", 9, doc)[0] == "busy"
        assert agent.submit(3, "clients-udp", 9, {"id": 1, "pattern": "other/#"})[0] == \
            "pattern"
    finally:
        agent.close()


def test_a_page_goes_out_as_a_replay_result_and_what_is_not_kept_is_counted(tmp_path):
    agent, out = _agent(tmp_path)
    try:
        for msg in (_msg(1), _msg(2), _msg(5), _msg(6, bytes(CACHE_MAX_PAYLOAD_BYTES + 1)),
                    _msg(7),
                    _msg(1, topic="other/b", key=12)):
            agent._on_message(msg)
        agent.do_work(0)
        assert agent.counters["kept"] == 4 and agent.counters["too_large"] == 1
        assert agent.counters["missed"] == 2  # 3 and 4 never arrived
        assert agent.submit(4, "clients-udp", 9, {"id": 8, "pattern": "orders/#",
                                                  "from_seq": 2}) is None
        agent.do_work(0)
        channel, dest, frame = out.frames[-1]
        entry = decode_frame(frame).admin()[1][0]
        doc = json.loads(entry.document)
        assert (channel, dest, doc["id"], doc["done"]) == ("clients-udp", 9, 8, True)
        assert doc["frames"] == 1 and doc["count"] == 3
        page = out.frames[-2]
        assert page[:2] == ("clients-udp", 9)
        header = decode_frame(page[2]).header
        assert (header.stream_id, header.dest_session) == (REPLAY_STREAM_ID, 4)
        messages = decode_page([page[2]], "orders/#")
        assert [m.sequence for m in messages] == [2, 5, 7]
        # a loss marker in the place of 3 and 4 (missed) and of 6 (too large): never replayed
        assert [m.cache_seq for m in messages] == [2, 4, 6]
        assert agent.counters["loss_markers"] == 2
        assert {(m.origin, m.stream, m.topic) for m in messages} == {(5, 6, "orders/a")}
        assert doc["next_seq"] == 7 and "losses" not in doc  # a replay names none
    finally:
        agent.close()


def _durable(agent, out, rid: int, pattern: str, **more) -> dict:
    assert agent.submit(4, "clients-udp", 9, {"id": rid, "pattern": pattern,
                                              "durable": "d" + pattern[-1], **more},
                        "viewer") is None
    agent.do_work(0)
    return json.loads(decode_frame(out.frames[-1][2]).admin()[1][0].document)


def test_a_durable_page_names_what_the_cache_did_not_keep_in_its_place(tmp_path):
    agent, out = _agent(tmp_path)
    try:
        assert _durable(agent, out, 1, "orders/a")["accepted"]  # made at the log's end: 1
        assert _durable(agent, out, 2, "orders/b")["accepted"]
        for msg in (_msg(1), _msg(2), _msg(5), _msg(6, bytes(CACHE_MAX_PAYLOAD_BYTES + 1)),
                    _msg(7)):
            agent._on_message(msg)
        agent.do_work(0)
        doc = _durable(agent, out, 3, "orders/a", from_seq=1)
        assert doc["count"] == 4 and doc["next_seq"] == 7
        assert doc["losses"] == [
            {"at": 3, "reason": "CACHE_MISSED", "messages": 2, "topic": "orders/a",
             "origin": 5, "stream": 6, "first_seq": 3, "last_seq": 4},
            {"at": 5, "reason": "CACHE_TOO_LARGE", "messages": 1, "topic": "orders/a",
             "origin": 5, "stream": 6, "first_seq": 6, "last_seq": 6}]
        # another topic's durable subscription is told nothing: none of it was lost
        doc = _durable(agent, out, 4, "orders/b", from_seq=1)
        assert doc["count"] == 0 and "losses" not in doc
        assert agent.counters["durables_loss_events"] == 2
        assert agent.counters["durables_lost_messages"] == 3
        # a stream's loss at the cache's session (topics not known): every durable is told
        from appliance.client.messages import Loss

        agent._on_loss(Loss(5, 0x8000_0001, 40, 49, 10, "RECOVERY_TIMEOUT", 0, 0))
        agent.do_work(0)
        doc = _durable(agent, out, 5, "orders/b", from_seq=7)
        assert [(x["at"], x["reason"], x["messages"], x["topic"], x["first_seq"])
                for x in doc["losses"]] == [(7, "CACHE_LOST", 10, "orders/#", 40)]
    finally:
        agent.close()
