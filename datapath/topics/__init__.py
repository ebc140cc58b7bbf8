"""Topics: the algebra (matches/includes/overlaps), edge syntaxes, subscription lists with
positive and negative entries (seed 000), the topic index and the topic-key registry."""

from datapath.topics.algebra import (
    TopicError,
    includes,
    matches,
    overlap_example,
    overlaps,
    split_pattern,
    split_topic,
)

__all__ = [
    "TopicError",
    "includes",
    "matches",
    "overlap_example",
    "overlaps",
    "split_pattern",
    "split_topic",
]
