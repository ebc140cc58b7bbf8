"""``python -m tests.fuzz live|decoders --seconds N ...``: see tests/fuzz/__init__.py."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# as under pytest (tests/conftest.py): kernels bounds-checked (a read past a buffer raises
# instead of reading garbage), compiled into the tests' own cache
os.environ.setdefault("NUMBA_BOUNDSCHECK", "1")
os.environ.setdefault(
    "NUMBA_CACHE_DIR", str(Path(__file__).resolve().parents[2] / ".venv" / "numba-cache-tests"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    live = sub.add_parser("live", help="hostile frames at a live appliance's ports")
    live.add_argument("--seconds", type=float, default=60.0, help="seconds at each port")
    live.add_argument("--port-kinds", default="client,fabric",
                      help="ports to fuzz, one after the other (client, fabric)")
    live.add_argument("--seed", type=int, default=None)
    live.add_argument("--json", action="store_true", help="print the summary as JSON only")
    live.add_argument("--no-triage", action="store_true",
                      help="do not replay a crash to find its frames (nothing is saved)")
    dec = sub.add_parser("decoders", help="mutated inputs through each decoder in process")
    dec.add_argument("--seconds", type=float, default=60.0, help="seconds in all")
    dec.add_argument("--seed", type=int, default=None)
    dec.add_argument("--targets", default=None, help="comma-separated (default: all)")
    dec.add_argument("--json", action="store_true", help="print the summary as JSON only")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    if args.command == "live":
        import logging

        from tests.fuzz.live import run_live

        logging.basicConfig(level=logging.ERROR)  # the refusals the fuzzer causes are many
        ports = [p.strip() for p in args.port_kinds.split(",") if p.strip()]
        bad = set(ports) - {"client", "fabric"}
        if bad or not ports:
            parser.error(f"--port-kinds takes client and/or fabric, not {','.join(bad)}")
        summary = run_live(args.seconds, ports, seed, triage=not args.no_triage)
    else:
        from tests.fuzz.decoders import run_decoders

        targets = args.targets.split(",") if args.targets else None
        # said first: a run that fails can be repeated with --seed
        print(f"fuzz decoders: seed {seed}", file=sys.stderr, flush=True)
        _limit_memory()
        summary = run_decoders(args.seconds, seed, targets)
    text = json.dumps(summary, indent=None if args.json else 1)
    print(text)
    if args.command == "live":
        from tests.fuzz.live import verdict

        print(verdict(summary), file=sys.stderr, flush=True)
    return 0 if summary["ok"] else 1


DECODERS_MEMORY_BYTES = 8 << 30
"""Address space the decoders run may take: an input that makes a decoder (or the mutator)
allocate without bound is a MemoryError found with its seed, not a host the kernel's OOM
killer has to rescue."""


def _limit_memory() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft > DECODERS_MEMORY_BYTES:
        limit = DECODERS_MEMORY_BYTES if hard == resource.RLIM_INFINITY else min(
            DECODERS_MEMORY_BYTES, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


if __name__ == "__main__":
    sys.exit(main())
