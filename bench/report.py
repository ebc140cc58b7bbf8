"""The one JSON shape every ``topicwire bench ...`` prints (docs: DESIGN.md, "Benchmark output").

    {"bench": NAME, "host": {...}, "params": {...},
     "results": {"topicwire": {metric: value}, BASELINE: {metric: value}},
     "ratios": {"METRIC topicwire/BASELINE": value}}

Figures are medians over ``params["repeats"]`` runs measured side by side in one process run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

PROJECT = "topicwire"


def host_info() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def positive_int(text: str) -> int:
    """argparse type of counts and sizes: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def progress(bench: str, message: str) -> None:
    """A progress line on stderr (stdout carries only the JSON report)."""
    print(f"bench {bench}: {message}", file=sys.stderr, flush=True)


def median_of(repeats: int, measure: Callable[[], float]) -> float:
    """Run ``measure`` ``repeats`` times and return the median of what it returns."""
    if repeats < 1:
        raise ValueError("bench: repeats must be >= 1")
    return statistics.median(measure() for _ in range(repeats))


def rate_per_s(count: int, fn: Callable[[], object]) -> float:
    """Call ``fn`` once and return ``count`` divided by its wall-clock duration."""
    start = time.perf_counter_ns()
    fn()
    elapsed_ns = max(time.perf_counter_ns() - start, 1)
    return count * 1e9 / elapsed_ns


def build_report(
    bench: str,
    params: Mapping[str, Any],
    results: Mapping[str, Mapping[str, float]],
) -> dict[str, Any]:
    """Assemble the report; ratios divide topicwire's figure by each baseline's, per metric."""
    if PROJECT not in results:
        raise ValueError(f"bench: results must include {PROJECT!r}")
    ours = results[PROJECT]
    ratios: dict[str, float] = {}
    for baseline, figures in results.items():
        if baseline == PROJECT:
            continue
        for metric, value in figures.items():
            if metric in ours and value:
                ratios[f"{metric} {PROJECT}/{baseline}"] = ours[metric] / value
    return {
        "bench": bench,
        "host": host_info(),
        "params": dict(params),
        "results": {name: dict(figures) for name, figures in results.items()},
        "ratios": ratios,
    }


def dumps(report: Mapping[str, Any]) -> str:
    """The report as one JSON document."""
    return json.dumps(report, indent=2, sort_keys=False)
