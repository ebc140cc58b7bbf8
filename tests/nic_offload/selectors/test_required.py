"""required_attributes: what every event a selector selects carries (what makes content
routing's exactly-once delivery hold, docs/routing.md)."""

import random

import pytest

from nic_offload.selectors import compile_selector
from nic_offload.selectors.required import required_attributes


@pytest.mark.parametrize("text, required", [
    ("", set()),
    ("a = 1", {"a"}),
    ("a = 1 AND b > 2", {"a", "b"}),
    ("a = 1 OR b > 2", set()),
    ("(a = 1 AND c = 2) OR (a = 3 AND b = 4)", {"a"}),
    ("NOT (a = 1)", {"a"}),
    ("a <> 1", {"a"}),
    ("a NOT IN ('x', 'y') AND b LIKE 'q%'", {"a", "b"}),
    ("a IS NULL AND b = 1", {"b"}),
    ("a IS NOT NULL", {"a"}),
    ("NOT (a IS NULL OR b = 2)", {"a", "b"}),
    ("a * b > 10", set()),
    ("flag", {"flag"}),
    ("a BETWEEN 1 AND 3", {"a"}),
])
def test_required_attributes_are_those_every_selected_event_carries(text, required):
    assert required_attributes(text) == required


def test_required_attributes_hold_on_random_events():
    """An event lacking a required attribute is never selected (checked by evaluation)."""
    rng = random.Random(4)
    texts = ["a = 1 AND (b > 2 OR b IS NULL)", "NOT (a = 1 OR c = 2)", "a IN (1, 2) OR a > 5",
             "(a = 1 OR b = 1) AND c NOT BETWEEN 2 AND 3", "a IS NOT NULL AND NOT b IS NULL"]
    for text in texts:
        selector, required = compile_selector(text), required_attributes(text)
        for _ in range(300):
            event = {name: rng.choice([None, 0, 1, 2, 3, 6, "x"]) for name in "abc"
                     if rng.random() < 0.7}
            if selector.evaluate(event):
                assert required <= {k for k, v in event.items() if v is not None}, (text, event)
