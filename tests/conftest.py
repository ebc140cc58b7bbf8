"""Test-wide settings: numba kernels run bounds-checked, with their own compile cache.

A kernel that reads past a buffer raises IndexError here instead of reading garbage, so the
property tests can prove the decoders stay inside their frames.

Before the first test, that cache is warmed as ``topicwire warm`` warms an appliance's
(``appliance/ops/warm.py``; a no-op once done for these kernel sources): a kernel compiling
for the first time in the middle of a test holds the interpreter for seconds, and an
appliance or client running in the test's process then misses its heartbeats (a session
ended under load in CI that way, while ``publish_batch`` compiled its packing kernel).
"""

import os
import sys
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("NUMBA_BOUNDSCHECK", "1")
os.environ.setdefault(
    "NUMBA_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".venv" / "numba-cache-tests")
)


@pytest.fixture(scope="session", autouse=True)
def _warm_test_kernels():
    """Compile every kernel into the tests' cache before the first test (see the module
    docstring). A warm-up that fails is reported and the tests go on (kernels then compile
    at first use, as before)."""
    from datapath import jit

    if jit.warmed():
        return
    from appliance.ops.warm import run_warm

    try:
        run_warm(say=lambda line: print(f"tests: {line}", file=sys.stderr, flush=True))
    except Exception as exc:  # reported, not fatal: see the docstring
        warnings.warn(f"tests: warming the tests' kernel cache failed ({exc}); kernels "
                      "compile at first use", stacklevel=1)
