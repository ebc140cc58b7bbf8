"""Where numba keeps compiled kernels, and loading them before traffic arrives.

numba's on-disk cache keys a kernel on its own source file only: a kernel that calls a kernel
of another module keeps its old machine code after that other module changes. So the cache
lives in a directory named by a digest of *every* kernel module's source (``KERNEL_MODULES``),
of the modules whose constants they bake in (``BAKED_MODULES``), of the Python version and
of the settings that change generated code (``NUMBA_BOUNDSCHECK``, ``NUMBA_CPU_NAME``):
editing any kernel or layout selects a new, empty directory, and a stale kernel cannot be
loaded. ``configure()`` runs when ``datapath`` is imported, before any kernel module
is decorated.

Where (``cache_root()``): ``NUMBA_CACHE_DIR`` when set (the tests and the soft-RoCE guest set
it), else ``<venv>/var/cache/topicwire-numba`` inside a writable virtual environment (so an
image or a venv carries its cache), else ``~/.cache/topicwire/numba``.

``topicwire warm`` (``appliance.ops.warm``, run by ``make setup``) fills the directory by
running real traffic of every kind and then writes ``warm.json`` there, naming every
signature the traffic compiled. ``preload()`` loads every signature the cache holds for the
kernel modules a process has imported (a load takes milliseconds; a compile takes seconds and
holds the interpreter), so an appliance or a client compiles nothing once it runs.
``signature_count()`` lets the appliance report a kernel that compiled after start anyway.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("topicwire.jit")

ROOT = Path(__file__).resolve().parent.parent
"""The directory that holds the project's packages (the repository, or site-packages)."""

KERNEL_MODULES = (
    "datapath.protocol._kernels",
    "channels.base",
    "channels._mmsg",
    "channels.shm",
    "channels.stats",
    "channels.tcp",
    "channels._rdma_kernels",
    "nic_offload.softnic._kernels",
    "nic_offload.softnic.ingress_acl",
    "appliance.dataplane._kernels",
    "appliance.ops.telemetry._kernels",
    "appliance.persistence._kernels",
    "appliance.cache._kernels",
    "appliance.edge.mqtt._kernels",
    "bench._fabric_kernels",
    "bench._mqtt_codec_kernels",
)
"""Every module that defines numba kernels (tests/datapath/test_jit.py keeps it complete)."""
BAKED_MODULES = (
    "datapath.config",
    "datapath.protocol.frame_layout",
    "datapath.protocol.message_layout",
)
"""Modules whose constants the kernels read when they compile (a bound, a layout's offsets,
the known message flags): numba bakes them into the machine code and would keep the old ones
when only these change, so they are in the digest too."""

CACHE_PREFIX = "k-"
"""Names of the digest directories under the cache root."""

WARM_STAMP = "warm.json"
"""File in the cache directory that ``topicwire warm`` writes when its traffic has run."""

_configured: Path | None = None
_preloaded: set[str] = set()
"""Dispatchers whose cached signatures ``preload`` loaded (each index is read once per
process: every ``connect()`` calls it)."""


def _module_file(name: str) -> Path:
    return ROOT.joinpath(*name.split(".")).with_suffix(".py")


def source_digest() -> str:
    """Digest of every kernel module's source and of what changes the generated code."""
    h = hashlib.sha256()
    for name in KERNEL_MODULES + BAKED_MODULES:
        h.update(name.encode())
        try:
            h.update(_module_file(name).read_bytes())
        except OSError:
            h.update(b"<missing>")
    h.update(sys.version.encode())
    for var in ("NUMBA_BOUNDSCHECK", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_OPT"):
        h.update(f"{var}={os.environ.get(var, '')}".encode())
    return h.hexdigest()[:16]


def _writable(path: Path) -> bool:
    probe = path
    while not probe.exists():
        probe = probe.parent
    return os.access(probe, os.W_OK)


def cache_root() -> Path:
    """The directory holding one digest directory per kernel source state."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    if env:
        path = Path(env)
        return path.parent if path.name.startswith(CACHE_PREFIX) else path
    if sys.prefix != sys.base_prefix:
        venv = Path(sys.prefix) / "var" / "cache" / "topicwire-numba"
        if _writable(venv):
            return venv
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "topicwire" / "numba"


def cache_dir() -> Path:
    """This process's numba cache directory (set by ``configure``)."""
    return _configured if _configured is not None else configure()


def configure() -> Path:
    """Point numba's cache at ``cache_root()/k-<digest>`` (for this process and its
    children); called when ``datapath`` is imported."""
    global _configured
    path = cache_root() / f"{CACHE_PREFIX}{source_digest()}"
    os.environ["NUMBA_CACHE_DIR"] = str(path)
    numba_config = sys.modules.get("numba.core.config")
    if numba_config is not None:
        numba_config.CACHE_DIR = str(path)
    _configured = path
    return path


def dispatchers(import_all: bool = False) -> dict[str, Any]:
    """The numba dispatchers of the kernel modules this process imported (of all of them
    with ``import_all``), by ``module.name``. Looked up again only when the set of imported
    kernel modules changed (a status refresh asks every 250 ms; an idle appliance should not
    walk every kernel module's namespace each time)."""
    from numba.core.registry import CPUDispatcher

    if import_all:
        for name in KERNEL_MODULES:
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except ImportError:  # an optional part (pyverbs) is not installed
                    continue
    loaded = tuple(name for name in KERNEL_MODULES if sys.modules.get(name) is not None)
    cached = _DISPATCHERS.get(loaded)
    if cached is not None:
        return dict(cached)
    found: dict[str, Any] = {}
    for name in loaded:
        for attr, value in vars(sys.modules[name]).items():
            if isinstance(value, CPUDispatcher) and value.__module__ == name:
                found[f"{name}.{attr}"] = value
    _DISPATCHERS.clear()
    _DISPATCHERS[loaded] = found
    return dict(found)


_DISPATCHERS: dict[tuple[str, ...], dict[str, Any]] = {}
"""``dispatchers()``'s last answer, by the kernel modules imported when it was made."""


def _cached_signatures(dispatcher: Any) -> list[tuple]:
    """The signatures numba's cache index holds for this dispatcher on this CPU."""
    cache = getattr(dispatcher, "_cache", None)
    cache_file = getattr(cache, "_cache_file", None)
    if cache_file is None:
        return []
    codegen = dispatcher.targetctx.codegen()
    out = []
    for key in cache_file._load_index():
        sig = key[0]
        if cache._index_key(sig, codegen) == key:
            out.append(sig)
    return out


def preload() -> dict[str, Any]:
    """Load every cached signature of the imported kernel modules' dispatchers not preloaded
    before in this process; returns ``{"signatures": n, "seconds": s, "warmed": bool}``
    (``warmed``: ``topicwire warm`` ran for these sources). Never compiles: only what the
    cache holds is loaded."""
    started = time.perf_counter()
    loaded = 0
    try:
        for name, dispatcher in dispatchers().items():
            if name in _preloaded:  # its cache index was read once already in this process
                continue
            for sig in _cached_signatures(dispatcher):
                if sig not in dispatcher.overloads:
                    dispatcher.compile(sig)
                loaded += 1
            _preloaded.add(name)
    except Exception as exc:  # numba's cache internals moved: run without the preload
        log.warning("jit: cannot preload numba's cache in %s (%s: %s); kernels compile on "
                    "first use", cache_dir(), type(exc).__name__, exc)
    return {"signatures": loaded, "seconds": round(time.perf_counter() - started, 3),
            "warmed": warmed()}


def signature_count() -> int:
    """Signatures compiled or loaded in this process, all imported kernels together (grows
    only when a kernel meets new argument types)."""
    return sum(len(d.overloads) for d in dispatchers().values())


def signatures(import_all: bool = False) -> dict[str, list[str]]:
    """Every dispatcher's loaded signatures as text, by ``module.name``."""
    return {name: sorted(str(sig) for sig in d.signatures)
            for name, d in dispatchers(import_all).items() if d.signatures}


def stamp_path() -> Path:
    return cache_dir() / WARM_STAMP


def warm_record() -> dict | None:
    """What ``topicwire warm`` wrote for these sources, or None."""
    try:
        return json.loads(stamp_path().read_text())
    except (OSError, ValueError):
        return None


def warmed() -> bool:
    """``topicwire warm`` ran for these sources and the cache still holds what it compiled."""
    record = warm_record()
    return bool(record) and record.get("digest") == cache_dir().name


def write_warm_record(record: dict) -> None:
    path = stamp_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**record, "digest": cache_dir().name, "source_root": str(ROOT)},
                              indent=1, sort_keys=True))
    tmp.replace(path)


UNOWNED_PRUNE_AGE_S = 7 * 24 * 3600
"""A digest directory that no warm-up recorded an owner for is pruned once this old."""


def _prunable(path: Path, now: float) -> bool:
    """Whether another digest's directory is this checkout's own older cache: its warm-up
    record names this source tree, or a tree that no longer exists, or (no record) it was
    last written ``UNOWNED_PRUNE_AGE_S`` ago. Another checkout sharing the cache root (one
    virtual environment for two clones) keeps its current cache."""
    try:
        record = json.loads((path / WARM_STAMP).read_text())
    except (OSError, ValueError):
        record = None
    owner = record.get("source_root") if isinstance(record, dict) else None
    if owner:
        return owner == str(ROOT) or not Path(owner).is_dir()
    try:
        return now - path.stat().st_mtime > UNOWNED_PRUNE_AGE_S
    except OSError:
        return False


def prune_other_digests() -> list[Path]:
    """Remove this checkout's cache directories of older kernel sources (stale by definition);
    not another checkout's (``_prunable``)."""
    import shutil

    removed = []
    root = cache_root()
    if not root.is_dir():
        return removed
    now = time.time()
    for path in root.iterdir():
        if (path.is_dir() and path.name.startswith(CACHE_PREFIX) and path != cache_dir()
                and _prunable(path, now)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class JitWatch:
    """An appliance's (or client's) view of its kernels: ``start()`` preloads the cache and
    remembers each dispatcher's signature count; ``check()`` names the kernels that gained a
    signature since (each logged once as a warning: it compiled on a live process)."""

    def __init__(self) -> None:
        self.preloaded: dict[str, Any] = {}
        self._base: dict[str, int] = {}
        self.late: dict[str, list[str]] = {}

    def start(self, warn: bool = True, modules: tuple[str, ...] = ()) -> JitWatch:
        """Import the kernel ``modules`` named (those the process will use later, e.g. a
        ``[cache]``'s), preload, and (``warn``) log a warning when the cache was not warmed."""
        import importlib

        for name in modules:
            importlib.import_module(name)
        self.preloaded = preload()
        if warn:
            self.warn_if_cold()
        self._base = {name: len(d.overloads) for name, d in dispatchers().items()}
        return self

    def warn_if_cold(self) -> None:
        if not self.preloaded.get("warmed", True):
            log.warning("jit: the numba cache in %s was not warmed for these kernel sources: "
                        "kernels compile on first use, holding up traffic for seconds; run "
                        "`topicwire warm` (make setup does)", cache_dir())

    def check(self) -> dict[str, list[str]]:
        """``{kernel: [signatures compiled after start]}``, all so far."""
        for name, d in dispatchers().items():
            base = self._base.setdefault(name, 0)
            if len(d.overloads) > base + len(self.late.get(name, ())):
                sigs = [str(s) for s in d.signatures[base:]]
                new = sigs[len(self.late.get(name, ())):]
                self.late[name] = sigs
                log.warning("jit: kernel %s compiled after start for %s; `topicwire warm` "
                            "does not cover this traffic", name, ", ".join(new))
        return self.late

    def status(self) -> dict[str, Any]:
        return {"cache_dir": str(cache_dir()), "warmed": bool(self.preloaded.get("warmed")),
                "preloaded_signatures": self.preloaded.get("signatures", 0),
                "preload_s": self.preloaded.get("seconds", 0.0),
                "compiled_after_start": {k: list(v) for k, v in self.check().items()}}
