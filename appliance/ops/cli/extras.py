"""The optional parts of the package (pyproject.toml's extras) and the check a command makes
before it needs one.

``pip install topicwire`` gives what runs appliances and clients; the Spark route job, its
charts and the benchmark that runs it need an extra. A command that needs a missing one ends
with one line naming the extra to install (exit 2), before anything else runs:

    topicwire: cli: routes compute needs pyspark, which is not installed; install the
    routes extra: pip install 'topicwire[routes]'
"""

from __future__ import annotations

import importlib.util

from datapath.errors import UserError

EXTRAS = {
    "routes": ("pyspark", "pandas", "matplotlib"),
    "bench": ("pyspark", "pandas"),
}
"""Extra -> the modules it installs (pyproject.toml's optional-dependencies;
tests/test_packaging.py holds the two together)."""


class MissingExtraError(UserError):
    """A command needs a module of an extra that is not installed."""

    component = "cli"


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(extra: str, command: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise ``MissingExtraError`` unless every module ``command`` needs of ``extra`` (all of
    the extra's by default) is installed."""
    for module in modules if modules is not None else EXTRAS[extra]:
        if not installed(module):
            raise MissingExtraError(f"{command} needs {module}, which is not installed; install "
                                    f"the {extra} extra: pip install 'topicwire[{extra}]'")
