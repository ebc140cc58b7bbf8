"""``topicwire warm --reproducible``: the warmed cache compiled again in a fixed order, so that
two warm-ups of the same sources on the same software give byte-identical cache files (the
appliance image's build uses it: docs/images.md "Reproducibility").

Why the traffic warm-up alone is not reproducible (measured: two warm-ups of one commit
differed in 51 of 122 cache files): numba numbers what it compiles in the order it compiles
it (each function's unique id, part of its symbol names and so of the machine code and
bitcode, and each type's ``_code`` in the pickled signatures), and the warm-up's appliances
and clients compile on several threads in whatever order the traffic reaches them. And the
type annotation kept with each compiled kernel prints the kernels it calls with their
addresses in memory, which address space randomisation moves from run to run.

So, after the traffic (which finds the signatures production meets): one process lists every
kernel's cached signatures (``collect``, kernels sorted by name, signatures by their text),
the cache files are removed, and a fresh process with address space randomisation off
(``setarch -R``: the same allocations land at the same addresses) compiles exactly that list
in that order (``compile``), with a fixed ``PYTHONHASHSEED`` (set and dict orders inside
numba's passes follow string hashes) and a fixed environment (``_fixed_env``). Measured on
the project's kernels: two such passes, from two warm-ups whose files differed, gave
identical files (docs/images.md).

Run as ``python -m appliance.ops.warm_order collect|compile PLAN [MODULE ...]``: the plan
file is a pickle of ``[(module, attribute, [signature, ...]), ...]``; ``MODULE``s default to
the kernel modules (``datapath.jit.KERNEL_MODULES``).
"""

from __future__ import annotations

import importlib
import os
import pickle
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from datapath.errors import UserError


def _dispatchers(modules: list[str]) -> list[tuple[str, str, Any]]:
    """(module, attribute, dispatcher) of every numba dispatcher defined in ``modules``,
    sorted."""
    from numba.core.registry import CPUDispatcher

    found = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional part (pyverbs) is not installed
            continue
        for attr, value in vars(module).items():
            if isinstance(value, CPUDispatcher) and value.__module__ == name:
                found.append((name, attr, value))
    return sorted(found, key=lambda t: (t[0], t[1]))


def collect(modules: list[str]) -> list[tuple[str, str, list]]:
    """The plan: every dispatcher's signatures in numba's cache, in a fixed order."""
    from datapath import jit

    return [(mod, attr, sorted(sigs, key=str))
            for mod, attr, d in _dispatchers(modules)
            if (sigs := jit._cached_signatures(d))]


def compile_plan(plan: list[tuple[str, str, list]]) -> int:
    """Compile every signature of ``plan`` in its order (into numba's cache); the count."""
    n = 0
    for mod, attr, sigs in plan:
        dispatcher = getattr(importlib.import_module(mod), attr)
        for sig in sigs:
            dispatcher.compile(sig)
            n += 1
    return n


def cache_files(directory: Path) -> list[Path]:
    """numba's cache files (index and compiled data) under ``directory``."""
    return sorted(p for p in directory.rglob("*") if p.suffix in (".nbi", ".nbc"))


def recompile_in_order(cache_dir: Path, modules: list[str] | None = None) -> int:
    """Replace the cache files under ``cache_dir`` (the current process's numba cache) by the
    same signatures compiled in a fixed order, address space randomisation off; the count.
    ``UserError`` when ``setarch`` is missing or a pass fails."""
    setarch = shutil.which("setarch")
    if setarch is None:
        raise UserError("warm: --reproducible needs setarch (util-linux) to turn address "
                        "space randomisation off; install util-linux")
    plan_file = cache_dir / "order.pickle"
    argv = [sys.executable, "-m", "appliance.ops.warm_order"]
    tail = [str(plan_file), *(modules or [])]
    env = _fixed_env(cache_dir)
    _run([*argv, "collect", *tail], env, "listing the cached signatures")
    with open(plan_file, "rb") as f:
        want = sum(len(sigs) for _, _, sigs in pickle.load(f))
    for path in cache_files(cache_dir):
        path.unlink()
    out = _run([setarch, platform.machine(), "-R", *argv, "compile", *tail], env,
               "compiling them again in order")
    plan_file.unlink()
    got = int(out.split()[-1])
    if got != want:
        raise UserError(f"warm: --reproducible compiled {got} signatures of {want}")
    return got


def _fixed_env(cache_dir: Path) -> dict[str, str]:
    """The passes' environment: the same from build to build. The process's own environment
    is allocated on its heap, so another one (an image build's temporary paths) moves every
    later object, and the addresses the annotations print, even with randomisation off."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith("NUMBA_") or k in ("PYTHONPATH", "HOME")}
    env.update(PATH="/usr/sbin:/usr/bin:/sbin:/bin", NUMBA_CACHE_DIR=str(cache_dir),
               PYTHONHASHSEED="0", LC_ALL="C.UTF-8")
    return env


def _run(argv: list[str], env: dict[str, str], what: str) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise UserError(f"warm: --reproducible: {what} failed (exit {done.returncode}): "
                        + " | ".join(tail))
    return done.stdout.strip()


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("collect", "compile"):
        print("usage: python -m appliance.ops.warm_order collect|compile PLAN [MODULE ...]",
              file=sys.stderr)
        return 2
    verb, plan_file, modules = argv[0], Path(argv[1]), argv[2:]
    if verb == "collect":
        from datapath import jit

        plan = collect(modules or list(jit.KERNEL_MODULES))
        with open(plan_file, "wb") as f:
            pickle.dump(plan, f)
        print(sum(len(sigs) for _, _, sigs in plan))
        return 0
    with open(plan_file, "rb") as f:
        plan = pickle.load(f)
    print(compile_plan(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
