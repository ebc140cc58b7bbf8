"""The ``topicwire`` command: one argparse tree, one module per subcommand group.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` to a function ``(args) -> int`` (the exit code). Command modules import their
heavy dependencies inside the handler, so ``topicwire --help`` stays fast.
Exit codes (one convention for every command, ``exit_codes``): 0 success/true, 1 runtime
failure/false, 2 usage or input error, 130 interrupted; every failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from appliance.ops.cli.exit_codes import FAILURE, INTERRUPTED, OK, USAGE, exit_code
from datapath.errors import TopicwireError

COMMAND_MODULES = (
    "appliance.ops.cli.run_cmd",
    "appliance.ops.cli.pubsub_cmd",
    "appliance.ops.cli.replay_cmd",
    "appliance.ops.cli.status_cmd",
    "appliance.ops.cli.shutdown_cmd",
    "appliance.ops.cli.move_cmd",
    "appliance.ops.cli.routes_cmd",
    "appliance.ops.cli.topic_cmd",
    "appliance.ops.cli.subs_cmd",
    "appliance.ops.cli.pcap_cmd",
    "appliance.ops.cli.dissector_cmd",
    "appliance.ops.cli.p4_cmd",
    "appliance.ops.cli.bench_cmd",
    "appliance.ops.cli.demo_cmd",
    "appliance.ops.cli.warm_cmd",
    "appliance.ops.cli.image_cmd",
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


class _Parser(argparse.ArgumentParser):
    """argparse with its refusals on one line (no usage block): the error, then where help is."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(USAGE, _line(f"{self.prog}: error: {message}; see {self.prog} --help") + "\n")


def _line(text: str) -> str:
    """``text`` as one printable line: newlines folded, undecodable characters escaped."""
    text = " ".join(text.split("\n"))
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def _say(text: str) -> None:
    print(_line(text), file=sys.stderr, flush=True)


def _module_of(argv: Sequence[str]) -> str | None:
    """The one module that registers the command ``argv`` starts with, when its name says it
    (``run`` -> ``run_cmd``); None otherwise (no command, an option first, ``pub``/``sub``)."""
    if not argv or argv[0].startswith("-"):
        return None
    name = f"appliance.ops.cli.{argv[0]}_cmd"
    return name if name in COMMAND_MODULES else None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, every command module registered; ``only``: just that module's
    commands (what ``main`` parses with when the command is known: ``topicwire run`` then
    does not import every other command's modules, seconds at an appliance's boot under
    QEMU's TCG)."""
    parser = _Parser(
        prog="topicwire",
        description="topicwire: publish/subscribe messaging appliance tools.",
    )
    parser.add_argument("--version", action=_Version,
                        help="print the version, source commit, Python and numba, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in (only,) if only else COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser(_module_of(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
        return int(args.handler(args))
    except KeyboardInterrupt:
        _say("topicwire: interrupted")
        return INTERRUPTED
    except BrokenPipeError:  # the reader went away (`| head`): not a failure
        _silence_stdout()
        return OK
    except TopicwireError as exc:  # the message names the component and what to do
        _say(f"topicwire: {exc}")
        return exit_code(exc)
    except Exception as exc:  # a bug: still one line, the traceback on request
        if os.environ.get("TOPICWIRE_TRACEBACK"):
            raise
        _say(f"topicwire: internal error: {type(exc).__name__}: {exc} (a bug; run with "
             "TOPICWIRE_TRACEBACK=1 to see where)")
        return FAILURE


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
