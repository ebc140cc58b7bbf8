"""Argument checks of the client API: each refuses with a ``ClientError`` saying what it
accepts, before anything is sent (a bad value must never reach the codec as an exception).

Topics and patterns are native (``/`` levels, ``+`` and ``#`` wildcards, docs/topics.md). A
NATS-style dot subject with a wildcard token (``prices.>``, ``a.*.c``) is refused with its
native spelling: taken as it is, it would be one literal level that no one publishes to.
A dotted name without wildcards (``prices.eu``) stays what it is natively: one level.
"""

from __future__ import annotations

import math

from appliance.client.errors import ClientError
from datapath.topics.algebra import TopicError, split_pattern, split_topic
from datapath.topics.syntax import dot_subject_refusal

MAX_IDENTITY_BYTES = 255
"""Longest identity a login carries (its HELLO name field, docs/protocol.md)."""
MAX_NAMESPACE = 2**32 - 1
MAX_SCHEMA_ID = 2**16 - 1


def _native(text: object, kind: str) -> str:
    try:
        (split_topic if kind == "topic" else split_pattern)(text)
    except TopicError as exc:
        raise ClientError(str(exc).removeprefix("topics: ")) from None
    refusal = dot_subject_refusal(text, kind)
    if refusal is not None:
        raise ClientError(refusal)
    return text


def check_topic(topic: object) -> str:
    """A concrete native topic (what ``publish`` takes)."""
    return _native(topic, "topic")


def check_pattern(pattern: object) -> str:
    """A native subscription pattern (what ``subscribe`` takes)."""
    return _native(pattern, "pattern")


def check_int(name: str, value: object, high: int) -> int:
    """An integer 0..``high`` (namespace, schema id)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise ClientError(f"{name} is an integer from 0 to {high}, not {value!r}")
    return value


def check_identity(identity: object) -> str:
    """A login identity: text of 1..MAX_IDENTITY_BYTES UTF-8 bytes."""
    if not isinstance(identity, str):
        raise ClientError(f"identity is a string, not {type(identity).__name__}")
    try:
        size = len(identity.encode("utf-8"))
    except UnicodeEncodeError:
        raise ClientError(f"identity {identity!r} is not valid UTF-8 text") from None
    if not 0 < size <= MAX_IDENTITY_BYTES:
        raise ClientError(f"identity of {size} UTF-8 bytes; give 1 to {MAX_IDENTITY_BYTES}")
    return identity


def check_seconds(name: str, value: object) -> float:
    """A finite, non-negative number of seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value >= 0):
        raise ClientError(f"{name} is a finite number of seconds >= 0, not {value!r}")
    return float(value)
