"""``topicwire warm --reproducible`` (appliance/ops/warm_order.py): two caches of the same
kernels, compiled in different orders (so their files differ: numba numbers functions and
types in compile order, and keeps the callees' addresses in each kernel's annotation), are
byte-identical once each is compiled again in the fixed order with address space
randomisation off."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.ops.warm_order import cache_files, recompile_in_order

pytestmark = pytest.mark.skipif(shutil.which("setarch") is None,
                                reason="setarch (util-linux) is not installed")

KERNELS = '''
import numba


@numba.njit(cache=True)
def inner(x):
    return x * 3 + 1


@numba.njit(cache=True)
def outer(a):
    s = 0
    for v in a:
        s += inner(v)
    return s
'''

SEED = '''
import sys
import numpy as np
import datapath  # noqa: F401  (points numba's cache at NUMBA_CACHE_DIR/k-<digest>)
import twk_order as k

calls = [lambda: k.outer(np.arange(3)), lambda: k.outer(np.arange(3.0)),
         lambda: k.inner(1), lambda: k.inner(1.5)]
for call in (calls if sys.argv[1] == "forward" else calls[::-1]):
    call()
'''


def _snapshot(cache: Path) -> dict[str, bytes]:
    return {str(p.relative_to(cache)): p.read_bytes() for p in cache_files(cache)}


def test_two_caches_compiled_in_different_orders_become_identical(tmp_path: Path,
                                                                  monkeypatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "twk_order.py").write_text(KERNELS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(src), str(Path(__file__).resolve().parent.parent),
         os.environ.get("PYTHONPATH", "")]))
    caches = {}
    for name, order in (("a", "forward"), ("b", "backward")):
        env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / name))
        subprocess.run([sys.executable, "-c", SEED, order], env=env, check=True, timeout=300)
        (caches[name],) = (tmp_path / name).glob("k-*")
    seeds = {name: _snapshot(cache) for name, cache in caches.items()}
    assert len(seeds["a"]) == 6 and seeds["a"].keys() == seeds["b"].keys()  # 2 indexes, 2+2
    assert seeds["a"] != seeds["b"]  # the orders differ, and so do the bytes
    for cache in caches.values():
        assert recompile_in_order(cache, ["twk_order"]) == 4
    again = {name: _snapshot(cache) for name, cache in caches.items()}
    assert again["a"].keys() == seeds["a"].keys()
    assert again["a"] == again["b"]
