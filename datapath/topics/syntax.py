"""Edge syntaxes: NATS/TIBCO dot subjects and MQTT topic filters, checked and translated.

Native patterns use ``/``, ``+`` and ``#`` (``#`` anywhere, zero or more levels). At the edge:
- dot syntax: ``a.b.c``, ``*`` one token, ``>`` one or more trailing tokens (``>`` last only,
  tokens non-empty). ``*`` <-> ``+``; ``>`` <-> ``+/#``. A native ``#`` means zero or more
  levels, which one dot subject cannot say: ``slash_to_dot_subjects`` gives the exact set
  (``a/#`` -> ``a`` and ``a.>``), and ``slash_to_dot`` refuses what needs more than one.
- MQTT 3.1.1/5: filters with ``+``/``#`` as whole levels and ``#`` only last, 1..65,535 UTF-8
  bytes, no NUL; topics starting with ``$`` are not matched by a filter starting with a
  wildcard (MQTT 4.7.2). MQTT filters are native patterns; the native size bounds apply when
  one crosses into the fabric (``mqtt_to_native``).
"""

from __future__ import annotations

from datapath.topics.algebra import (
    MULTI,
    SEPARATOR,
    SINGLE,
    TopicError,
    matches_levels,
    normalize_levels,
    split_pattern,
)

DOT = "."
DOT_SINGLE = "*"
DOT_TAIL = ">"
MQTT_MAX_BYTES = 65_535
MQTT_SYSTEM_PREFIX = "$"


def dot_to_slash(subject: str) -> str:
    """``a.*.c.>`` -> ``a/+/c/+/#``: a dot-syntax subject or pattern as a native pattern."""
    if not isinstance(subject, str) or not subject:
        raise TopicError(f"invalid dot subject {subject!r}: give tokens separated by '.'")
    tokens = subject.split(DOT)
    out = []
    for i, token in enumerate(tokens):
        if not token:
            raise TopicError(f"invalid dot subject {subject!r}: token {i + 1} is empty; dot "
                             "syntax has no empty tokens")
        if token == DOT_TAIL:
            if i != len(tokens) - 1:
                raise TopicError(f"invalid dot subject {subject!r}: '>' must be the last token")
            out += [SINGLE, MULTI]
        elif token == DOT_SINGLE:
            out.append(SINGLE)
        elif SEPARATOR in token or SINGLE in token or MULTI in token or (
                DOT_SINGLE in token or DOT_TAIL in token):
            raise TopicError(f"invalid dot subject {subject!r}: token {token!r} holds a "
                             "character that is special in native topics or a wildcard that "
                             "does not occupy a whole token")
        else:
            out.append(token)
    pattern = SEPARATOR.join(out)
    split_pattern(pattern)
    return pattern


def dot_subject_refusal(text: str, kind: str) -> str | None:
    """Why a native ``kind`` (topic or pattern) written in dot syntax is refused, or None.

    ``prices.>`` or ``a.*.c`` where a native topic is expected would be one literal level that
    nothing publishes to; the refusal gives the native spelling. A dotted name without
    wildcard tokens (``prices.eu``) is a fine native level: None.
    """
    for level in text.split(SEPARATOR):
        if DOT in level and any(t in (DOT_SINGLE, DOT_TAIL) for t in level.split(DOT)):
            try:
                native = f"; write {dot_to_slash(text)!r}" if SEPARATOR not in text else ""
            except TopicError:
                native = ""
            return (f"{kind} {text!r} is in NATS dot syntax, which is not translated here: "
                    f"native {kind}s separate levels with '/' and use '+' (one level) and "
                    f"'#' (any levels){native}")
    return None


def slash_to_dot_subjects(pattern: str) -> list[str]:
    """The dot subjects whose union denotes exactly the native ``pattern``.

    ``a/+/c`` -> ``['a.*.c']``; ``a/+/#`` -> ``['a.>']``; ``a/#`` -> ``['a', 'a.>']``;
    ``#`` -> ``['>']`` (a topic has at least one level). A ``#`` before the last wildcard run
    cannot be said in dot syntax at all: refused.
    """
    levels = normalize_levels(split_pattern(pattern))
    for i, level in enumerate(levels):
        if level == MULTI and i != len(levels) - 1:
            raise TopicError(f"pattern {pattern!r} has '#' before its last level; dot syntax "
                             "has only a trailing '>'")
        if level not in (SINGLE, MULTI) and (not level or DOT in level or level in (
                DOT_SINGLE, DOT_TAIL)):
            raise TopicError(f"pattern {pattern!r} has level {level!r}, which dot syntax cannot "
                             "hold (empty, containing '.', or '*'/'>')")
    tokens = [DOT_SINGLE if lv == SINGLE else lv for lv in levels]
    if tokens[-1] != MULTI:
        return [DOT.join(tokens)]
    head = tokens[:-1]
    if head and head[-1] == DOT_SINGLE:  # '+/#': one or more levels, which is '>'
        return [DOT.join([*head[:-1], DOT_TAIL])]
    if not head:
        return [DOT_TAIL]
    return [DOT.join(head), DOT.join([*head, DOT_TAIL])]


def slash_to_dot(pattern: str) -> str:
    """The one dot subject that denotes exactly ``pattern``; refused when none does."""
    subjects = slash_to_dot_subjects(pattern)
    if len(subjects) != 1:
        raise TopicError(
            f"pattern {pattern!r} matches zero or more trailing levels; dot syntax has no "
            f"single equivalent: subscribe to {' and '.join(repr(s) for s in subjects)}")
    return subjects[0]


def _mqtt_levels(text: str, kind: str) -> tuple[str, ...]:
    if not isinstance(text, str) or not text:
        raise TopicError(f"invalid MQTT {kind} {text!r}: it must be 1..{MQTT_MAX_BYTES} bytes")
    if "\x00" in text:
        raise TopicError(f"invalid MQTT {kind} {text!r}: the NUL character is not allowed")
    if len(text.encode("utf-8", "surrogatepass")) > MQTT_MAX_BYTES:
        raise TopicError(f"invalid MQTT {kind}: longer than {MQTT_MAX_BYTES} bytes")
    return tuple(text.split(SEPARATOR))


def validate_mqtt_filter(topic_filter: str) -> tuple[str, ...]:
    """MQTT topic filter rules; returns the levels."""
    levels = _mqtt_levels(topic_filter, "topic filter")
    for i, level in enumerate(levels):
        if level == MULTI and i != len(levels) - 1:
            raise TopicError(f"invalid MQTT topic filter {topic_filter!r}: '#' must be the last "
                             "level")
        if level not in (SINGLE, MULTI) and (SINGLE in level or MULTI in level):
            raise TopicError(f"invalid MQTT topic filter {topic_filter!r}: a wildcard must "
                             f"occupy a whole level (level {level!r})")
    return levels


def validate_mqtt_topic_name(topic: str) -> tuple[str, ...]:
    """MQTT topic name rules (what PUBLISH carries): no wildcards."""
    levels = _mqtt_levels(topic, "topic name")
    if any(SINGLE in lv or MULTI in lv for lv in levels):
        raise TopicError(f"invalid MQTT topic name {topic!r}: wildcards are only for "
                         "subscriptions")
    return levels


def mqtt_matches(topic_filter: str, topic: str) -> bool:
    """MQTT matching, including 4.7.2: a leading wildcard does not match a '$' topic."""
    f = validate_mqtt_filter(topic_filter)
    t = validate_mqtt_topic_name(topic)
    if topic.startswith(MQTT_SYSTEM_PREFIX) and f[0] in (SINGLE, MULTI):
        return False
    return matches_levels(f, t)


def mqtt_to_native(topic_filter: str) -> str:
    """An MQTT filter as a native pattern (same text; native bounds checked)."""
    validate_mqtt_filter(topic_filter)
    split_pattern(topic_filter)
    return topic_filter
