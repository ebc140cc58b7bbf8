"""Dot and MQTT syntaxes translate exactly, or are refused with a reason."""

import itertools

import pytest

from datapath.topics.algebra import TopicError, includes, matches
from datapath.topics.syntax import (
    dot_to_slash,
    mqtt_matches,
    mqtt_to_native,
    slash_to_dot,
    slash_to_dot_subjects,
    validate_mqtt_filter,
    validate_mqtt_topic_name,
)


@pytest.mark.parametrize("dot, slash", [
    ("a.b.c", "a/b/c"), ("a.*.c", "a/+/c"), ("a.>", "a/+/#"), (">", "+/#"), ("*", "+")])
def test_dot_subjects_translate_both_ways(dot, slash):
    assert dot_to_slash(dot) == slash
    assert slash_to_dot(slash) == dot


def _nats_matches(subject, topic_tokens):
    """NATS semantics, written independently: '*' one token, '>' one or more at the end."""
    tokens = subject.split(".")
    for i, token in enumerate(tokens):
        if token == ">":
            return len(topic_tokens) > i
        if i >= len(topic_tokens) or (token != "*" and token != topic_tokens[i]):
            return False
    return len(topic_tokens) == len(tokens)


@pytest.mark.parametrize("pattern", ["a/#", "a/+/#", "#", "a/b", "+/b/#", "#/+", "a/+/+/#"])
def test_the_dot_subject_set_denotes_exactly_the_native_pattern(pattern):
    subjects = slash_to_dot_subjects(pattern)
    for n in range(1, 5):
        for topic in itertools.product("abc", repeat=n):
            native = matches(pattern, "/".join(topic))
            assert native is any(_nats_matches(s, topic) for s in subjects), (pattern, topic)


@pytest.mark.parametrize("call, message", [
    (lambda: dot_to_slash("a..b"), "is empty"),
    (lambda: dot_to_slash("a.>.b"), "'>' must be the last token"),
    (lambda: dot_to_slash("a.b/c"), "special in native topics"),
    (lambda: dot_to_slash("a.b*"), "whole token"),
    (lambda: slash_to_dot("a/#/b"), "'#' before its last level"),
    (lambda: slash_to_dot("a/#"), "subscribe to 'a' and 'a.>'"),
    (lambda: slash_to_dot("a.b/c"), "containing '.'"),
    (lambda: slash_to_dot("a//c"), "empty"),
])
def test_what_cannot_translate_is_refused_with_the_reason(call, message):
    with pytest.raises(TopicError, match=message):
        call()


def test_mqtt_filters_allow_hash_only_last():
    assert validate_mqtt_filter("a/+/#") == ("a", "+", "#")
    with pytest.raises(TopicError, match="'#' must be the last level"):
        validate_mqtt_filter("#/a")
    with pytest.raises(TopicError, match="whole level"):
        validate_mqtt_filter("a/b+")
    with pytest.raises(TopicError, match="only for subscriptions"):
        validate_mqtt_topic_name("a/+")
    with pytest.raises(TopicError, match="65535 bytes"):
        validate_mqtt_topic_name("")


def test_mqtt_matching_keeps_dollar_topics_away_from_leading_wildcards():
    assert not mqtt_matches("#", "$SYS/broker/load")
    assert not mqtt_matches("+/broker/load", "$SYS/broker/load")
    assert mqtt_matches("$SYS/#", "$SYS/broker/load")
    assert mqtt_matches("sport/tennis/#", "sport/tennis")  # MQTT 4.7.1.2
    assert mqtt_matches("+/+", "/finance") and not mqtt_matches("+", "/finance")


def test_an_mqtt_filter_is_a_native_pattern_within_native_bounds():
    assert includes(mqtt_to_native("a/+/#"), "a/b/c")
    with pytest.raises(TopicError, match="bytes"):
        mqtt_to_native("a/" * 700)
