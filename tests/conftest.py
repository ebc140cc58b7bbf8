"""Test-wide settings: numba kernels run bounds-checked, with their own compile cache.

A kernel that reads past a buffer raises IndexError here instead of reading garbage, so the
property tests can prove the decoders stay inside their frames.
"""

import os
from pathlib import Path

os.environ.setdefault("NUMBA_BOUNDSCHECK", "1")
os.environ.setdefault(
    "NUMBA_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".venv" / "numba-cache-tests")
)
