"""JMS message selectors: parse, evaluate, match many at once, offload as ACL ranges.

How a subscriber's selector travels through the system (docs/selectors.md, "In the
system"): a subscriber gives its selector as **text** next to its topic pattern (JMS's
``createConsumer(topic, selector)``); an empty text means no selector. The appliance
validates it once with ``compile_selector`` (a ``SelectorSyntaxError`` goes back to the
subscriber with the position), then registers it with ``SelectorIndex.add(subscriber,
text)`` at the point that delivers to that subscriber. Each message becomes an event with
``message_event`` (schema fields, ``tw_*`` header properties, application properties), and
``SelectorIndex.match(event)`` returns the subscribers whose selector is TRUE, to intersect
with those whose topic pattern matches. Where one selector guards a whole egress,
``to_raw_ranges(selector, schema)`` says whether the offload's ACL range tables can apply
it (and how), or why not.

- ``compile_selector(text).evaluate(event)``: one selector, one event (the reference
  semantics: JMS 2.0 selectors with three-valued logic, ``evaluator``);
- ``SelectorIndex``: many subscribers' selectors matched per event through shared sorted
  predicate lists (seed 003's improved JMS filtering algorithm, ``index``);
- ``to_ranges`` / ``to_raw_ranges``: a selector as per-field disjoint intervals, the form of
  the offload's content ACL tables, or None when it cannot be said that way (``ranges``).
"""

from nic_offload.selectors.errors import NotOffloadableError, SelectorError, SelectorSyntaxError
from nic_offload.selectors.evaluator import Selector, compile_selector
from nic_offload.selectors.events import HEADER_PREFIX, HEADER_PROPERTIES, message_event
from nic_offload.selectors.grammar import parse
from nic_offload.selectors.index import SelectorIndex
from nic_offload.selectors.ranges import (
    Interval,
    RawRanges,
    ValueRanges,
    to_ranges,
    to_raw_ranges,
)

__all__ = [
    "HEADER_PREFIX",
    "HEADER_PROPERTIES",
    "Interval",
    "NotOffloadableError",
    "RawRanges",
    "Selector",
    "SelectorError",
    "SelectorIndex",
    "SelectorSyntaxError",
    "ValueRanges",
    "compile_selector",
    "message_event",
    "parse",
    "to_ranges",
    "to_raw_ranges",
]
