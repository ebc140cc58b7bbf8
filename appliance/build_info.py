"""What build of topicwire this is: its version, the source commit, Python and numba.

Shown by ``topicwire --version``, in ``/status`` (``node.build``) and in an appliance's
start-up log line, so an operator can tell which code a running appliance is.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commit() -> str:
    """The source tree's commit (``unknown`` outside a git checkout)."""
    if not (ROOT / ".git").exists():
        return "unknown"
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def build_info() -> dict[str, str]:
    """``{"version", "commit", "python", "numba"}``."""
    return {"version": _version("topicwire"), "commit": _commit(),
            "python": platform.python_version(), "numba": _version("numba")}


def version_line() -> str:
    info = build_info()
    return (f"topicwire {info['version']} (commit {info['commit']}, Python {info['python']}, "
            f"numba {info['numba']})")
