"""JMS message selectors: parse, evaluate, match many at once, offload as ACL ranges.

- ``compile_selector(text).evaluate(event)``: one selector, one event (the reference
  semantics: JMS 2.0 selectors with three-valued logic, ``evaluator``);
- ``SelectorIndex``: many subscribers' selectors matched per event through shared sorted
  predicate lists (seed 003's improved JMS filtering algorithm, ``index``);
- ``to_ranges`` / ``to_raw_ranges``: a selector as per-field disjoint intervals, the form of
  the offload's content ACL tables, or None when it cannot be said that way (``ranges``).

The language and its semantics are documented in docs/selectors.md.
"""

from nic_offload.selectors.errors import NotOffloadableError, SelectorError, SelectorSyntaxError
from nic_offload.selectors.evaluator import Selector, compile_selector
from nic_offload.selectors.grammar import parse
from nic_offload.selectors.index import SelectorIndex

__all__ = [
    "NotOffloadableError",
    "Selector",
    "SelectorError",
    "SelectorIndex",
    "SelectorSyntaxError",
    "compile_selector",
    "parse",
]
