"""The ``topicwire`` command: one argparse tree, one module per subcommand group.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` to a function ``(args) -> int`` (the exit code). Command modules import their
heavy dependencies inside the handler, so ``topicwire --help`` stays fast.
Exit codes: 0 success/true, 1 false (predicates), 2 invalid input (argparse and UserError).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from datapath.errors import TopicwireError, UserError

COMMAND_MODULES = (
    "appliance.ops.cli.run_cmd",
    "appliance.ops.cli.pubsub_cmd",
    "appliance.ops.cli.replay_cmd",
    "appliance.ops.cli.status_cmd",
    "appliance.ops.cli.routes_cmd",
    "appliance.ops.cli.topic_cmd",
    "appliance.ops.cli.subs_cmd",
    "appliance.ops.cli.pcap_cmd",
    "appliance.ops.cli.p4_cmd",
    "appliance.ops.cli.bench_cmd",
    "appliance.ops.cli.demo_cmd",
    "appliance.ops.cli.warm_cmd",
    "appliance.ops.cli.completion_cmd",
)


class _Version(argparse.Action):
    """``--version``: the build's line (computed only when asked for: it may run git)."""

    def __init__(self, option_strings: list[str], dest: str, **kw: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        from appliance.build_info import version_line

        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The full parser, every command module registered."""
    parser = argparse.ArgumentParser(
        prog="topicwire",
        description="topicwire: publish/subscribe messaging appliance tools.",
    )
    parser.add_argument("--version", action=_Version,
                        help="print the version, source commit, Python and numba, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except UserError as exc:  # the message names the component and what to do
        print(f"topicwire: {exc}", file=sys.stderr)
        return 2
    except TopicwireError as exc:
        print(f"topicwire: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
