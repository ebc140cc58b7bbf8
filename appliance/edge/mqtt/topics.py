"""MQTT topic names and filters: MQTT's rules, the `$` rule, and the fabric's patterns.

MQTT's ``/`` levels, ``+`` (one level) and ``#`` (the rest, last level only) are a subset of
the fabric's patterns (docs/topics.md: there ``#`` may stand at any level), so a valid MQTT
filter is the same string as a fabric pattern; the fabric's own bounds (bytes, levels) are
checked too (``datapath.topics.algebra``). MQTT alone says that a filter starting with a
wildcard does not match a topic starting with ``$`` (``$SYS/...``): the fabric does not know
that rule, so the edge applies it to every delivery (``mqtt_matches``).
"""

from __future__ import annotations

from datapath.topics.algebra import TopicError, split_pattern, split_topic

SHARED_PREFIX = "$share/"


def topic_problem(topic: str) -> str | None:
    """Why ``topic`` is not a valid MQTT topic name that the fabric carries (None: valid)."""
    if not topic:
        return "an empty topic name"
    if "+" in topic or "#" in topic:
        return "a topic name with a wildcard"
    try:
        split_topic(topic)
    except TopicError as exc:
        return str(exc)
    return None


def filter_problem(topic_filter: str) -> str | None:
    """Why ``topic_filter`` is not a valid MQTT filter that the fabric carries (None: valid)."""
    if not topic_filter:
        return "an empty topic filter"
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if level == "#" and i != len(levels) - 1:
            return "'#' that is not the last level"
        if level not in ("+", "#") and ("+" in level or "#" in level):
            return f"a wildcard inside level {level!r}"
    try:
        split_pattern(topic_filter)
    except TopicError as exc:
        return str(exc)
    return None


def mqtt_matches(topic_filter: str, topic: str) -> bool:
    """MQTT's match of a valid filter and topic name, with the ``$`` rule."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f = topic_filter.split("/")
    t = topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(f) == len(t)
