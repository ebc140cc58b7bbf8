"""A naming and shape check of a Prometheus scrape (promtool's ``check metrics`` rules, and the
ones docs/appliance.md states for topicwire's metrics). ``lint(text)`` returns the problems,
one line each; an empty list is a clean scrape."""

from __future__ import annotations

import math
import re

from prometheus_client.parser import text_string_to_metric_families

NAME = re.compile(r"[a-z_][a-z0-9_]*")
OWN_PREFIXES = ("topicwire_", "process_", "python_")
"""topicwire's metrics, and prometheus_client's process and platform collectors'."""
NON_BASE_UNITS = re.compile(r"_(milli|micro|nano)?(seconds?_?)?(ms|us|ns|millis|micros|nanos|"
                            r"milliseconds|microseconds|nanoseconds|minutes|hours|days|kb|mb|gb|"
                            r"kib|mib|gib|kilobytes|megabytes|bits|percent)(_|$)")
TIME_WORDS = ("latency", "rtt", "uptime", "duration", "delay", "jitter", "heard", "time",
              "age")
SIZE_WORDS = ("size", "bytes", "memory")
CLIENT_LABELS = {"identity", "session", "pattern", "topic", "client", "user", "key", "peer",
                 "quantile"}
"""Label names whose values a client would choose (and quantile: histograms only here)."""


def lint(text: str) -> list[str]:
    """Every problem of one scrape in Prometheus text format (parsed by prometheus_client)."""
    problems: list[str] = []
    for family in text_string_to_metric_families(text):
        name, kind = family.name, family.type
        where = f"{name} ({kind})"
        if not NAME.fullmatch(name):
            problems.append(f"{where}: not a snake_case name")
        if not name.startswith(OWN_PREFIXES):
            problems.append(f"{where}: not under topicwire_ (or process_/python_)")
        if not family.documentation.strip():
            problems.append(f"{where}: no HELP")
        if kind in ("summary", "untyped", "unknown"):
            problems.append(f"{where}: {kind}; use a histogram, counter or gauge")
        if NON_BASE_UNITS.search(name):
            problems.append(f"{where}: not in base units (seconds, bytes)")
        words = name.split("_")
        if any(w in words for w in TIME_WORDS) and "seconds" not in words:
            problems.append(f"{where}: a time without _seconds")
        if any(w in words for w in SIZE_WORDS) and "bytes" not in words:
            problems.append(f"{where}: a size without _bytes")
        if kind != "counter" and name.endswith("_total"):
            problems.append(f"{where}: _total on a {kind}")
        for sample in family.samples:
            if kind == "counter" and sample.name not in (name + "_total", name + "_created"):
                problems.append(f"{where}: counter sample {sample.name} without _total")
            if kind == "counter" and not sample.value >= 0:
                problems.append(f"{where}: counter {sample.name} is {sample.value}")
            bad = CLIENT_LABELS & set(sample.labels)
            if bad:
                problems.append(f"{where}: label {sorted(bad)} takes values clients choose")
        if kind == "histogram":
            problems += _histogram(family)
    return problems


def _histogram(family) -> list[str]:
    problems = []
    series: dict[tuple, dict] = {}
    for s in family.samples:
        labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        one = series.setdefault(labels, {"buckets": []})
        if s.name == family.name + "_bucket":
            one["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name == family.name + "_sum":
            one["sum"] = s.value
        elif s.name == family.name + "_count":
            one["count"] = s.value
    if not family.name.endswith(("_seconds", "_bytes")):
        problems.append(f"{family.name}: a histogram without its unit (_seconds, _bytes)")
    for labels, one in series.items():
        where = f"{family.name}{dict(labels)}"
        buckets = sorted(one["buckets"])
        if not buckets or not math.isinf(buckets[-1][0]):
            problems.append(f"{where}: no +Inf bucket")
            continue
        if any(b[1] > a[1] for b, a in zip(buckets, buckets[1:])):
            problems.append(f"{where}: buckets are not cumulative")
        if one.get("count") != buckets[-1][1]:
            problems.append(f"{where}: _count {one.get('count')} != +Inf {buckets[-1][1]}")
        if "sum" not in one:
            problems.append(f"{where}: no _sum")
    return problems


def series(text: str) -> set[tuple[str, tuple]]:
    """Every (sample name, labels) of a scrape."""
    return {(s.name, tuple(sorted(s.labels.items())))
            for family in text_string_to_metric_families(text) for s in family.samples}
