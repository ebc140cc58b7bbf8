"""The standby's side of the mirror alone (appliance/control/mirror.py): records kept,
replaced, ended, expired and bounded; ``take`` only for the same identity and once; the
primary's documents cut to size. The agent is a stand-in holding counters and a send list."""

from __future__ import annotations

import json
from collections import Counter

from appliance.control import mirror as mm
from appliance.control.mirror import Mirror

S = 1_000_000_000


class Agent:
    def __init__(self) -> None:
        self.counters: Counter = Counter()
        self.sent: list[dict] = []

    def _control(self, kind, doc):
        return (kind, doc)

    def _to_neighbour(self, nb, ftype, entries):
        self.sent.extend(doc for _, doc in entries)


def test_records_are_kept_replaced_ended_and_taken_once_by_the_same_identity():
    agent, m = Agent(), Mirror(None)
    m.on_document(agent, 7, {"sessions": [[1, "reader", [[0, "a/#", 2]]],
                                          [2, "feed", []]]}, 10 * S)
    m.on_document(agent, 7, {"sessions": [[1, "reader", [[0, "a/#", 2], [0, "b", 0]]]]}, 11 * S)
    assert agent.counters["mirror_records"] == 2
    assert agent.counters["mirror_records_subscriptions"] == 2
    assert m.take(7, 1, "other", 12 * S) is None  # another identity: not its session
    assert m.take(7, 1, "reader", 12 * S) == ((0, "a/#", 2), (0, "b", 0))  # still there
    m.on_document(agent, 7, {"sessions": [[1, "reader", [[0, "a/#", 2]]]], "ended": [2]},
                  12 * S)
    assert m.take(8, 1, "reader", 12 * S) is None  # another neighbour's session 1
    assert m.take(7, 1, "reader", 12 * S) == ((0, "a/#", 2),)
    assert m.take(7, 1, "reader", 12 * S) is None  # once
    assert m.records == {} and m.kept_subscriptions == 0


def test_old_records_expire_and_the_store_is_bounded(monkeypatch):
    monkeypatch.setattr(mm, "MAX_MIRRORS", 3)
    agent, m = Agent(), Mirror(None)
    m.on_document(agent, 7, {"sessions": [[i, "r", []] for i in range(1, 6)]}, 0)
    assert len(m.records) == 3 and agent.counters["mirror_refused_full"] == 2
    late = mm.MIRROR_KEEP_NS + mm.MIRROR_REFRESH_NS + 1
    assert m.take(7, 1, "r", late) is None  # too old to use
    m.on_document(agent, 7, {"sessions": [[9, "r", []]]}, late)
    assert set(m.records) == {(7, 9)} and agent.counters["mirror_records_expired"] == 2


def test_documents_are_cut_to_size_and_ended_sessions_ride_along():
    agent = Agent()
    rows = [[i, "reader", [[0, f"topic/{i}/" + "x" * 200, 0]]] for i in range(1, 301)]
    Mirror._send(agent, None, rows, ended=[1_000, 1_001])
    assert len(agent.sent) > 1
    assert all(len(json.dumps(doc)) <= mm.MIRROR_DOC_BYTES + 512 for doc in agent.sent)
    assert [r[0] for doc in agent.sent for r in doc["sessions"]] == list(range(1, 301))
    assert [e for doc in agent.sent for e in doc.get("ended", [])] == [1_000, 1_001]
    assert agent.counters["mirror_sessions_sent"] == 300
