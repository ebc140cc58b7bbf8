"""control/selector_apply.py without an appliance: which keys a session's selector rules
guard, which advertised patterns are selective, and when a destination's selectors apply."""

from collections import Counter
from types import SimpleNamespace

from appliance.control import selector_apply as sa
from appliance.control.state import Session
from datapath.topics.registry import RegistryRecord


def _session(sid, rules=(), plain=(), patterns=()):
    s = Session(sid, "x", "udp", 1, None, 100 + sid)
    s.rules = list(rules)
    s.plain = set(plain)
    s.patterns = Counter({p: 1 for p in patterns})
    return s


RECORDS = [RegistryRecord(0, "q/a", 1, 1), RegistryRecord(0, "q/b", 2, 2),
           RegistryRecord(0, "r/a", 3, 3), RegistryRecord(1, "q/a", 4, 4)]


def test_guards_name_the_keys_only_selector_rules_match():
    s = _session(1, rules=[(0, "q/#", "p > 1"), (0, "q/a", "p < 0")], plain=[(0, "q/b")])
    assert sa.guards(s, RECORDS) == {1: ("p < 0", "p > 1")}  # q/b: a plain one; r/a, ns 1: none
    assert sa.guards(_session(2), RECORDS) == {}


def test_selective_interest_leaves_out_patterns_a_plain_subscription_overlaps(monkeypatch):
    one = _session(1, rules=[(0, "q/#", "p > 1")], patterns=[(0, "q/#")])
    two = _session(2, rules=[(0, "r/#", "p > 2")], patterns=[(0, "r/#"), (0, "r/a")],
                   plain=[(0, "r/a")])
    other = _session(3, patterns=[(0, "s/#")])  # e.g. not made by a SUBSCRIBE: counts as plain
    agent = SimpleNamespace(sessions={1: one, 2: two, 3: other},
                            advertised=frozenset({(0, "q/#"), (0, "r/#"), (0, "s/#")}))
    assert sa.selective_interest(agent) == {(0, "q/#"): ("p > 1",)}
    monkeypatch.setattr(sa, "INTEREST_SELECTOR_BYTES", 8)  # too small for it: left out
    assert sa.selective_interest(agent) == {}


def test_a_destinations_selectors_apply_only_to_the_interest_they_came_with():
    agent = SimpleNamespace(
        interest={9: (1, 5, frozenset({(0, "q/#"), (0, "q/b")}), frozenset())},
        interest_selectors={9: ((1, 5), {(0, "q/#"): ("p > 1",)})})
    # q/a: only q/# matches, selective; q/b: q/b is advertised without selectors
    assert sa.node_guards(agent, 9, RECORDS) == {1: ("p > 1",)}
    agent.interest_selectors[9] = ((1, 4), {(0, "q/#"): ("p > 1",)})
    assert sa.node_guards(agent, 9, RECORDS) == {}
