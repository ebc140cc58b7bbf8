"""``topicwire bench fabric``: the command's entry. One publisher and one subscriber through a
hop (bench/fabric.py, the default), or N publishers and M subscribers (``--publishers``,
``--subscribers`` above 1: bench/fabric_fanout.py, which builds on bench/fabric.py's
processes and C relay, so the choice is made here, above both)."""

from __future__ import annotations

import argparse
from typing import Any

from bench import fabric, fabric_fanout

NAME = fabric.NAME
HELP = fabric.HELP
add_arguments = fabric.add_arguments


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The fan-out bench for more than one publisher or subscriber, else the single pair's."""
    if getattr(args, "publishers", 1) > 1 or getattr(args, "subscribers", 1) > 1:
        return fabric_fanout.run(args)
    return fabric.run(args)
