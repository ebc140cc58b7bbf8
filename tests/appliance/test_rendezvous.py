"""Rendezvous content routing's control part (appliance/control/rendezvous.py) over a stand-in
agent: the config key, where rules are registered, what moves when the ring changes, counts
and routes from neighbours, the bound on registrations held."""

from types import SimpleNamespace

import pytest

from appliance.config import ConfigError, parse_config
from appliance.control import rendezvous as rdv_mod
from appliance.control.content_routing import MessageDedup, RendezvousRing
from appliance.control.rendezvous import Rendezvous, key_text, required_of
from appliance.control.state import Session
from datapath.protocol.admin_layout import ControlKind


def test_the_mode_is_a_config_key_flood_by_default_and_a_wrong_value_names_the_key():
    assert parse_config({"appliance": {"name": "a"}}).routing_content == "flood"
    cfg = parse_config({"appliance": {"name": "a"},
                        "routing": {"content": "rendezvous", "popular_share": 0.3}})
    assert (cfg.routing_content, cfg.popular_share) == ("rendezvous", 0.3)
    with pytest.raises(ConfigError, match="routing.content: must be one of 'flood', "
                                          "'rendezvous', not 'dht'"):
        parse_config({"appliance": {"name": "a"}, "routing": {"content": "dht"}})
    with pytest.raises(ConfigError, match="routing.popular_share"):
        parse_config({"appliance": {"name": "a"}, "routing": {"popular_share": 1.5}})
    with pytest.raises(ConfigError, match="routing.mode: unknown key"):
        parse_config({"appliance": {"name": "a"}, "routing": {"mode": "flood"}})


class Agent:
    """What ``Rendezvous`` reads and calls of the control agent."""

    def __init__(self, node_id: int, names: dict[int, str]) -> None:
        self.node_id, self.epoch = node_id, 1
        self.names = dict(names)
        self.cfg = SimpleNamespace(name=names[node_id], counts_interval_ms=100,
                                   popular_share=0.5, lsa_refresh_ms=1_000)
        self.paths = {(node_id, n): (1, (node_id, n)) for n in names if n != node_id}
        self.sessions: dict[int, Session] = {}
        self.interest: dict = {}
        self.dp = SimpleNamespace(published={})
        self.flooded: list[tuple[ControlKind, dict]] = []
        self._tables_dirty = self._selectors_dirty = False

    def _flood(self, kind, doc, skip=None):
        self.flooded.append((kind, doc))

    def registrations(self) -> dict[int, list]:
        """Target -> rules of the last registration document flooded to it."""
        out = {}
        for kind, doc in self.flooded:
            if kind is ControlKind.RENDEZVOUS_REGISTER:
                out[doc["target"]] = doc["rules"]
        return out


def _session(rules, plain=()):
    s = Session.__new__(Session)
    s.rules = list(rules)
    s.plain = set(plain)
    s.patterns = {(ns, p) for ns, p, _ in rules} | set(plain)
    return s


NAMES = {1: "n1", 2: "n2", 3: "n3", 4: "n4"}


def test_a_rule_is_registered_at_the_core_of_its_key_and_only_keyless_ones_are_advertised():
    agent = Agent(1, NAMES)
    rules = [(0, "md/#", "price > 100"), (0, "md/#", "a = 1 OR b = 2"),
             (0, "fx/#", "symbol = 'EUR' AND size > 5"), (0, "hdr/#", "tw_qos = 0")]
    agent.sessions[7] = _session(rules, plain=[(0, "news/#")])
    rdv = Rendezvous(agent)
    rdv.do_work(1)
    ring = RendezvousRing(NAMES.values())
    by_name = {v: k for k, v in NAMES.items()}
    placed = {}  # selector -> (target core, key): flooded to others, held here for itself
    for target, rules_at in agent.registrations().items():
        for _, _, selector, key in rules_at:
            placed[selector] = (target, key)
    for _, _, selector, key in rdv.held.get(1, ((0, 0), ()))[1]:
        placed[selector] = (1, key)
    for target, key in placed.values():
        assert by_name[ring.core_of(key)] == target
    # the ones that require an attribute are registered (tw_* header properties do not count)
    assert set(placed) == {"price > 100", "symbol = 'EUR' AND size > 5"}
    assert placed["price > 100"][1] == "price"
    # INTEREST: the plain pattern and the patterns with a rule that requires nothing
    assert sorted(rdv.advertised_patterns(agent.sessions[7])) == [
        (0, "hdr/#"), (0, "md/#"), (0, "news/#")]
    assert required_of("a = 1 OR b = 2") == frozenset() and key_text("x") == "x IS NOT NULL"


def test_a_core_leaving_the_ring_moves_only_its_rules_withdrawing_them_there():
    agent = Agent(1, NAMES)
    rules = [(0, f"t{i}/#", f"attr{i} > 1") for i in range(40)]
    agent.sessions[7] = _session(rules)
    rdv = Rendezvous(agent)
    rdv.do_work(1)
    before = {r[2]: t for t, rs in agent.registrations().items() for r in rs}
    before.update({r[2]: 1 for r in rdv.held[1][1]})
    gone = next(t for t in (2, 3, 4) if t in before.values())
    del agent.paths[(1, gone)]  # its link state aged out: unreachable
    agent.flooded.clear()
    rdv.do_work(1 + rdv.counts_interval_ns)
    docs = agent.registrations()
    assert docs[gone] == []  # withdrawn where they were
    after = {r[2]: t for t, rs in docs.items() for r in rs}
    after.update({r[2]: 1 for r in rdv.held[1][1]})
    moved = {s for s in before if before[s] != after[s]}
    assert moved == {s for s, t in before.items() if t == gone}
    assert all(after[s] != gone for s in after)
    assert rdv.status()["ring"] == sorted(n for i, n in NAMES.items() if i != gone)


def test_counts_from_every_core_make_the_same_popular_set_and_routes_become_egress_patterns():
    agent = Agent(1, NAMES)
    agent.dp.published = {"attribute_counts": {"events": 10, "counts": {"a": 10, "b": 2}}}
    rdv = Rendezvous(agent)
    assert rdv.on_counts({"origin": 2, "epoch": 1, "seq": 5, "events": 10,
                          "counts": [["a", 9], ["b", 9]],
                          "routes": [[0, "md/#", ["b"]]]})
    assert not rdv.on_counts({"origin": 2, "epoch": 1, "seq": 5, "events": 0, "counts": [],
                              "routes": []})  # not newer: kept, not flooded on
    rdv.do_work(1)
    assert rdv.popular == frozenset({"a", "b"})  # a 19/20, b 11/20 > 0.5
    assert rdv.extra_patterns(2) == {(0, "md/#")}
    assert agent._tables_dirty and agent._selectors_dirty
    sent = [d for k, d in agent.flooded if k is ControlKind.RENDEZVOUS_COUNTS][-1]
    assert sent["events"] == 10 and ["a", 10] in sent["counts"]


def test_registrations_for_another_core_are_flooded_on_once_and_the_held_ones_are_bounded(
        monkeypatch):
    agent = Agent(1, NAMES)
    rdv = Rendezvous(agent)
    doc = {"origin": 3, "epoch": 1, "seq": 4, "target": 2, "rules": [[0, "a/#", "x > 1", "x"]]}
    assert rdv.on_register(doc) and not rdv.on_register(doc)
    monkeypatch.setattr(rdv_mod, "RENDEZVOUS_MAX_REGISTRATIONS", 1)
    mine = {"origin": 3, "epoch": 1, "seq": 5, "target": 1,
            "rules": [[0, "a/#", "x > 1", "x"], [0, "b/#", "y > 1", "y"]]}
    assert not rdv.on_register(mine)
    assert rdv.held == {} and rdv.counters["rendezvous_registrations_refused"] == 2
    mine["rules"] = mine["rules"][:1]
    mine["seq"] = 6
    rdv.on_register(mine)
    assert rdv.status()["registrations_held"] == 1


def test_later_copies_of_a_message_are_dropped_and_the_oldest_is_forgotten_first():
    dedup = MessageDedup(limit=2)
    assert dedup.first((1, 2, 3, 4)) and not dedup.first((1, 2, 3, 4))
    assert dedup.first((1, 2, 4, 5)) and dedup.first((1, 2, 5, 6))
    assert dedup.first((1, 2, 3, 4))  # forgotten: the set holds the last two
    assert dedup.dropped == 1


def test_rules_beyond_a_documents_room_are_advertised_as_in_flood_mode(monkeypatch):
    monkeypatch.setattr(rdv_mod, "REGISTRATION_BYTES", 200)
    agent = Agent(1, {1: "n1"})  # one core: every rule's target is itself
    rules = [(0, f"topic{i}/#", f"price > {i} AND symbol = 'S{i:04d}'") for i in range(10)]
    agent.sessions[7] = _session(rules)
    rdv = Rendezvous(agent)
    rdv.do_work(1)
    held = rdv.held[1][1]
    assert 0 < len(held) < 10 and len(rdv.unplaced) == 10 - len(held)
    assert rdv.counters["rendezvous_rules_flooded"] == len(rdv.unplaced)
    advertised = set(rdv.advertised_patterns(agent.sessions[7]))
    assert advertised == {(ns, p) for ns, p, _ in rdv.unplaced}
    assert agent._interest_dirty
