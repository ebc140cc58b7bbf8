"""The ``[telemetry]`` and ``[routes]`` config tables (docs/routing.md, "Configuration").

``appliance/config.py`` hands the raw tables here; each check raises the config's own
``ConfigError`` naming the key, like every other table.

```toml
[telemetry]                       # optional: measure every path, write windows
dir = "/var/lib/topicwire/telemetry"   # the store (shared storage for a cluster job)
window_ms = 1000
probe_interval_ms = 10            # a probe per neighbour this often (loss, idle latency)
retention_hours = 24

[routes]
switch_grace_ms = 500             # every appliance: old-path frames still accepted after a switch
switch_hold_ms = 100              # every appliance: a source keeps its old first hop this long
table = "/shared/routes.json"     # P&M (embedded) only: the route job's table, applied on change
poll_ms = 1000                    # P&M only: how often the table's file is looked at
duplicate = ["md/fast/#"]         # P&M only: topics sent on best and backup path at once
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.ops.telemetry.config import RETENTION_NS, WINDOW_NS

PROBE_INTERVAL_MS = 10
"""Default probe period per neighbour (``telemetry.probe_interval_ms``)."""
SWITCH_GRACE_MS = 500
"""After a path switch, frames of a pair still arriving over its old path are forwarded
along it this long (``routes.switch_grace_ms``): the old path drains instead of dropping."""
SWITCH_HOLD_MS = 100
"""When P&M's document changes a pair's path, its source keeps sending on the old path this
long (``routes.switch_hold_ms``), so the appliances of the new path have it installed before
the first frame arrives (make before break); the old path drains after (grace)."""
ROUTES_POLL_MS = 1_000
"""How often P&M looks at the route table's file (``routes.poll_ms``)."""
MAX_DUPLICATE_PATTERNS = 16_384
"""``routes.duplicate`` holds at most this many patterns (as many as P&M's document does)."""


@dataclass(frozen=True)
class TelemetrySettings:
    dir: Path
    window_ns: int = WINDOW_NS
    probe_interval_ns: int = PROBE_INTERVAL_MS * 1_000_000
    retention_ns: int = RETENTION_NS


@dataclass(frozen=True)
class RouteSettings:
    switch_grace_ns: int = SWITCH_GRACE_MS * 1_000_000
    switch_hold_ns: int = SWITCH_HOLD_MS * 1_000_000
    table: Path | None = None
    poll_ns: int = ROUTES_POLL_MS * 1_000_000
    duplicate: tuple[str, ...] = ()


def _error(key: str, what: str) -> Exception:
    from appliance.errors import ConfigError

    return ConfigError(f"{key}: {what}")


def _known(table: dict, allowed: set[str], prefix: str) -> None:
    for key in table:
        if key not in allowed:
            raise _error(prefix + key, "unknown key; known keys here: "
                         + ", ".join(sorted(allowed)))


def _int(table: dict, key: str, prefix: str, default: int, low: int, high: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        from appliance.config_files import show

        raise _error(prefix + key, f"must be an integer in [{low}, {high}], not {show(value)}")
    return value


def parse_telemetry(table: Any, base: Path) -> TelemetrySettings | None:
    """``[telemetry]``; None when absent."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise _error("telemetry", "must be a table ([telemetry])")
    p = "telemetry."
    _known(table, {"dir", "window_ms", "probe_interval_ms", "retention_hours"}, p)
    directory = table.get("dir")
    if not isinstance(directory, str) or not directory:
        raise _error(p + "dir", "required: the directory the windows are written to")
    from appliance.config_files import writable_dir

    path = writable_dir(directory, p + "dir", base)  # not under /proc or /sys; mkdir -p works
    window_ms = _int(table, "window_ms", p, WINDOW_NS // 1_000_000, 100, 3_600_000)
    if 1000 % window_ms and window_ms % 1000:
        raise _error(p + "window_ms", "must divide a second or be a multiple of one "
                     f"(windows align on the wall clock), not {window_ms}")
    probe_ms = _int(table, "probe_interval_ms", p, PROBE_INTERVAL_MS, 1, 60_000)
    hours = _int(table, "retention_hours", p, RETENTION_NS // 3_600_000_000_000, 1, 24 * 365)
    return TelemetrySettings(path, window_ms * 1_000_000, probe_ms * 1_000_000,
                             hours * 3_600_000_000_000)


def parse_routes(table: Any, base: Path, pm_mode: str) -> RouteSettings:
    """``[routes]`` (defaults when absent)."""
    if table is None:
        return RouteSettings()
    if not isinstance(table, dict):
        raise _error("routes", "must be a table ([routes])")
    p = "routes."
    _known(table, {"switch_grace_ms", "switch_hold_ms", "table", "poll_ms", "duplicate"}, p)
    if pm_mode != "embedded":
        for key in ("table", "poll_ms", "duplicate"):
            if key in table:
                raise _error(p + key, "only for pm.mode = \"embedded\" (P&M applies route "
                             "tables and floods them)")
    grace = _int(table, "switch_grace_ms", p, SWITCH_GRACE_MS, 0, 60_000)
    hold = _int(table, "switch_hold_ms", p, SWITCH_HOLD_MS, 0, 10_000)
    if hold >= grace > 0:
        raise _error(p + "switch_hold_ms", f"must be below routes.switch_grace_ms ({grace}): "
                     "the old path must drain after the source leaves it")
    path = None
    if "table" in table:
        from appliance.config_files import path_of

        path = path_of(table["table"], p + "table", base, "the path of the route job's --out "
                       "file")
    poll = _int(table, "poll_ms", p, ROUTES_POLL_MS, 10, 3_600_000)
    duplicate = table.get("duplicate", [])
    from datapath.topics.algebra import TopicError, split_pattern

    if not isinstance(duplicate, list) or not all(isinstance(x, str) for x in duplicate):
        raise _error(p + "duplicate", "must be a list of topic patterns such as [\"md/#\"]")
    if len(duplicate) > MAX_DUPLICATE_PATTERNS:
        raise _error(p + "duplicate", f"{len(duplicate)} patterns; at most "
                     f"{MAX_DUPLICATE_PATTERNS}")
    for pattern in duplicate:
        try:
            split_pattern(pattern)
        except TopicError as exc:
            raise _error(p + "duplicate",
                         f"{pattern[:60]!r}: {str(exc).removeprefix('topics: ')}") from None
    return RouteSettings(grace * 1_000_000, hold * 1_000_000, path, poll * 1_000_000,
                         tuple(duplicate))
