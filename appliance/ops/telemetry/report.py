"""``topicwire routes report``: latency percentiles and loss per path over time, as a PNG.

One panel per path (neighbour -> appliance on a channel): p50, p99 and p99.9 latency (log
scale, left axis) and probe loss (%, right axis) per point of ``step`` (default: the
telemetry window, coarsened so that a path has at most ``MAX_POINTS`` points). Route changes
are vertical lines on the panels of the links the old or the new path uses, labelled
``source>destination``: from ``--routes FILE``'s ``changes``, or computed from the same
telemetry with the selector's hysteresis over evaluation windows of ``step``.
Reads the store with pyarrow and aggregates with pandas on the machine that draws (the
aggregation is ``aggregate.aggregate``, the Spark job's twin); bad files and rows are left
out and listed under the figure.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from appliance.ops.telemetry.aggregate import aggregate, check_rows, path_name
from appliance.ops.telemetry.config import (
    HYSTERESIS_MARGIN,
    HYSTERESIS_MIN_GAIN,
    HYSTERESIS_WINDOWS,
)
from appliance.ops.telemetry.costs import parse_weights, select_routes
from appliance.ops.telemetry.errors import RoutesError
from appliance.ops.telemetry.store import read_windows

MAX_POINTS = 2_000
"""Points per path at most (the step grows to keep to it)."""
PANEL_COLUMNS = 3
PANEL_INCHES = (5.0, 2.6)


def render(telemetry: str | os.PathLike[str], out: str | os.PathLike[str], *,
           step_ns: int | None = None, routes: str | os.PathLike[str] | None = None,
           margin: float | None = None, k: int | None = None,
           min_gain: float | None = None) -> dict[str, Any]:
    """Draw the report; returns what it drew: ``{"out", "paths", "points", "changes",
    "excluded"}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    table, problems = read_windows(telemetry)
    table, row_problems = check_rows(table)
    problems += row_problems
    if table.num_rows == 0:
        raise RoutesError(f"no usable telemetry windows in {telemetry}")
    starts = table["window_start_ns"].to_numpy()
    window = int(table["window_ns"].to_numpy().min())
    span = int(starts.max() - starts.min()) + window
    if step_ns is None:
        step_ns = window * max(1, math.ceil(span / window / MAX_POINTS))
    stats = aggregate(table, step_ns)
    if routes is not None:
        try:
            changes = json.loads(Path(routes).read_text())["changes"]
        except (OSError, ValueError, KeyError) as exc:
            raise RoutesError(f"--routes {routes}: not a route table ({exc})") from None
    else:
        selector, _, _ = select_routes(stats, parse_weights([]),
                                       margin=HYSTERESIS_MARGIN if margin is None else margin,
                                       k=HYSTERESIS_WINDOWS if k is None else k,
                                       min_gain=HYSTERESIS_MIN_GAIN if min_gain is None
                                       else min_gain)
        changes = selector.changes
    by_path: dict[tuple[str, str, str], list] = {}
    for s in stats:
        by_path.setdefault((s.appliance, s.neighbour, s.channel), []).append(s)
    paths = sorted(by_path)
    t0 = int(starts.min())
    cols = min(PANEL_COLUMNS, len(paths))
    rows = math.ceil(len(paths) / cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, sharex=True,
                             figsize=(PANEL_INCHES[0] * cols, PANEL_INCHES[1] * rows + 1.2))
    marked = 0
    for ax, key in zip(axes.flat, paths):
        series = sorted(by_path[key], key=lambda s: s.eval_start_ns)
        x = [(s.eval_start_ns - t0) / 1e9 for s in series]
        for attr, label, style in (("p50_ns", "p50", "-"), ("p99_ns", "p99", "--"),
                                   ("p999_ns", "p99.9", ":")):
            ax.plot(x, [(getattr(s, attr) or math.nan) / 1e3 for s in series], style,
                    label=label, linewidth=1.2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
        ax.set_title(f"{key[1]} -> {key[0]} ({key[2]})", fontsize=9)
        ax.set_ylabel("latency (us)", fontsize=8)
        ax.tick_params(labelsize=7)
        loss_ax = ax.twinx()
        loss_ax.plot(x, [100 * s.loss for s in series], color="tab:red", linewidth=0.8,
                     label="loss %")
        loss_ax.set_ylim(bottom=0, top=max(1.0, max(100 * s.loss for s in series) * 1.2))
        loss_ax.tick_params(labelsize=7, colors="tab:red")
        link = (key[1], key[0])
        for c in changes:
            used = [p for p in (c.get("from"), c.get("to")) if p]
            if any(link in set(zip(p, p[1:])) for p in used):
                at = (c["eval_start_ns"] - t0) / 1e9
                ax.axvline(at, color="black", linewidth=0.8, alpha=0.7)
                ax.annotate(f"{c['source']}>{c['destination']}", (at, 1.0),
                            xycoords=("data", "axes fraction"), fontsize=6, rotation=90,
                            va="top", ha="right", xytext=(-2, -2), textcoords="offset points",
                            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})
                marked += 1
    for ax in list(axes.flat)[len(paths):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7, loc="upper left")
    for ax in axes[-1]:
        ax.set_xlabel(f"seconds since {_utc(t0)} (points every {step_ns / 1e9:g} s)",
                      fontsize=8)
    note = f"{len(paths)} paths, {len(changes)} route changes"
    if problems:
        note += f"; excluded: {len(problems)} (" + "; ".join(
            f"{os.path.basename(p.what) if '<-' not in p.what else p.what}: {p.reason}"
            for p in problems[:3]) + (" ..." if len(problems) > 3 else "") + ")"
    fig.suptitle("topicwire path telemetry", fontsize=11)
    fig.text(0.01, 0.005, note, fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return {"out": str(out), "paths": [path_name(*p) for p in paths],
            "points": sum(len(v) for v in by_path.values()), "changes": len(changes),
            "marked": marked, "step_ns": step_ns,
            "excluded": [{"what": p.what, "reason": p.reason, "rows": p.rows}
                         for p in problems]}


def _utc(ns: int) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns // 1_000_000_000))
