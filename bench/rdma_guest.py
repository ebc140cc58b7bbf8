"""What ``make bench-rdma`` runs where RDMA is (the soft-RoCE guest, or a host with a device):
``topicwire bench channel --kind rdma`` with defaults sized for an emulated guest, the JSON
report written to ``--out`` (the launcher's ``--rwdir``, so the host reads it) and printed.

    python -m bench.rdma_guest --out PATH [bench channel options]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

GUEST_REPEATS = 3
"""Repeats by default: each costs ~1 min under emulation."""
GUEST_MESSAGES = 100_000


def main(argv: list[str] | None = None) -> int:
    from bench import channel
    from bench.report import dumps
    from datapath.errors import TopicwireError

    parser = argparse.ArgumentParser(prog="python -m bench.rdma_guest",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="write the JSON report here")
    channel.add_arguments(parser)
    # perftest busy-polls its completion queues: the channel's ends do the same by default
    parser.set_defaults(kind="rdma", repeats=GUEST_REPEATS, messages=GUEST_MESSAGES,
                        idle="spin")
    args = parser.parse_args(argv)
    if args.kind != "rdma":
        parser.error("this runs the RDMA benchmark only (--kind rdma)")
    try:
        report = channel.run(args)
    except TopicwireError as exc:
        print(f"bench-rdma: {exc}", file=sys.stderr)
        return 1
    text = dumps(report) + "\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
