"""Structured logs: ``[log] format = "json"`` writes one JSON object per line; ``"text"`` lines.

    {"ts": "2025-01-01T12:00:00.123456Z", "level": "warning", "component": "appliance",
     "msg": "core1: rejected an admin frame: bad_mac (from fabric peer 42)",
     "fields": {"node": "core1"}}

``ts`` is UTC (ISO 8601, microseconds), ``level`` the lower-case level name, ``component``
the logger's name below ``topicwire.`` (``appliance``, ``mgmt``, ...), ``msg`` the formatted
message, ``fields`` what the call passed with ``extra={...}`` plus ``node`` (the appliance's
name) and, for an exception, ``exc`` (its traceback). ``configure(log_config, node)`` installs
the handler on the root logger (standard error), replacing handlers it installed before.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The ``format = "text"`` line (the one ``topicwire run`` always used)."""

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message", "asctime", "taskName"}
"""LogRecord attributes that are not ``extra`` fields."""


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def __init__(self, node: str | None = None) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {}
        if self.node is not None:
            fields["node"] = self.node
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                fields[key] = value
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            fields["exc"] = record.exc_text
        if record.stack_info:
            fields["stack"] = record.stack_info
        name = record.name
        doc = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="microseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "component": name.removeprefix("topicwire.") if name != "topicwire" else name,
            "msg": record.getMessage(),
            "fields": fields,
        }
        return json.dumps(doc, default=str, separators=(",", ":"))


class _Installed(logging.StreamHandler):
    """Marks the handler ``configure`` installed, so a second call replaces it."""


def configure(log_config: dict[str, Any], node: str | None = None,
              stream: TextIO | None = None) -> logging.Handler:
    """Log to ``stream`` (standard error) in ``log_config["format"]`` at ``["level"]``."""
    fmt = str(log_config.get("format", "text"))
    level = str(log_config.get("level", "info")).upper()
    if fmt not in ("text", "json") or level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        from appliance.config import ConfigError

        raise ConfigError(f"log: format {fmt!r} / level {level.lower()!r}: format must be "
                          "'text' or 'json', level one of debug, info, warning, error")
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _Installed):
            root.removeHandler(handler)
    handler = _Installed(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(node) if fmt == "json" else
                         logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(getattr(logging, level))
    return handler
