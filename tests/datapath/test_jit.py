"""The numba cache directory follows every kernel module's source (datapath/jit.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from datapath import jit

ROOT = Path(__file__).resolve().parents[2]
KERNEL_DECORATOR = re.compile(r"^@(numba\.)?(njit|jit|vectorize|guvectorize)\b", re.M)


def test_every_module_with_kernels_is_in_the_digest() -> None:
    found = set()
    for package in ("datapath", "channels", "nic_offload", "appliance", "bench"):
        for path in (ROOT / package).rglob("*.py"):
            if KERNEL_DECORATOR.search(path.read_text()):
                found.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    assert found == set(jit.KERNEL_MODULES)


def _digest_with(module: str, text: str, tmp_path: Path) -> str:
    """The digest of a copy of the project in which ``module`` reads ``text``."""
    tmp_path.mkdir(parents=True)
    for package in ("datapath", "channels", "nic_offload", "appliance", "bench"):
        subprocess.run(["cp", "-r", str(ROOT / package), str(tmp_path)], check=True)
    path = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
    path.write_text(text)
    code = "import datapath.jit as j; print(j.source_digest())"
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_editing_a_called_kernel_selects_another_cache_directory(tmp_path: Path) -> None:
    """The codec kernels are called from the express kernel's module: editing them must move
    the express kernel's cache too (numba alone would keep its stale machine code)."""
    callee = "datapath.protocol._kernels"
    original = ROOT.joinpath(*callee.split(".")).with_suffix(".py").read_text()
    same = _digest_with(callee, original, tmp_path / "same")
    edited = _digest_with(callee, original + "\n# an edit\n", tmp_path / "edited")
    assert same == jit.source_digest()
    assert edited != same


def test_editing_a_layout_the_kernels_read_selects_another_cache_directory(tmp_path: Path
                                                                           ) -> None:
    """A new message flag changes only message_layout.py; the kernels that check flags
    bake its constant in, so their cache must move with it."""
    module = "datapath.protocol.message_layout"
    original = ROOT.joinpath(*module.split(".")).with_suffix(".py").read_text()
    edited = _digest_with(module, original + "\n# an edit\n", tmp_path / "edited")
    assert edited != jit.source_digest()


def test_the_cache_directory_is_under_numba_cache_dir_when_set(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert jit.cache_root() == tmp_path
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / f"{jit.CACHE_PREFIX}0123"))
    assert jit.cache_root() == tmp_path  # a child process inherits the configured directory


def test_warm_prunes_only_this_checkouts_old_caches(monkeypatch, tmp_path) -> None:
    """Two checkouts sharing one cache root (one venv): a warm-up removes its own older
    digests and those of trees that are gone, never the other checkout's current cache."""
    import json
    import os
    import time

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(jit, "_configured", tmp_path / f"{jit.CACHE_PREFIX}current")
    other_tree = tmp_path / "other-checkout"
    other_tree.mkdir()
    owners = {"mine-old": str(jit.ROOT), "other": str(other_tree),
              "gone": str(tmp_path / "deleted-checkout"), "current": str(jit.ROOT)}
    for name, owner in owners.items():
        path = tmp_path / f"{jit.CACHE_PREFIX}{name}"
        path.mkdir()
        (path / jit.WARM_STAMP).write_text(json.dumps({"source_root": owner}))
    for name, age_s in (("unowned-new", 60), ("unowned-old", jit.UNOWNED_PRUNE_AGE_S + 60)):
        path = tmp_path / f"{jit.CACHE_PREFIX}{name}"
        path.mkdir()
        os.utime(path, (time.time() - age_s, time.time() - age_s))
    removed = {p.name[len(jit.CACHE_PREFIX):] for p in jit.prune_other_digests()}
    assert removed == {"mine-old", "gone", "unowned-old"}
    left = {p.name for p in tmp_path.iterdir()}
    assert {f"{jit.CACHE_PREFIX}{n}" for n in ("other", "current", "unowned-new")} <= left
