"""``topicwire topic match|includes|overlaps``: the topic algebra as predicates.

Exit code 0 for true, 1 for false, 2 for invalid input (with a message on stderr); ``--json``
prints ``{"result": true|false}`` (and ``"example"`` for overlaps).
"""

from __future__ import annotations

import argparse
import json

PREDICATES = {
    "match": ("PATTERN", "TOPIC", "does PATTERN match the concrete TOPIC?"),
    "includes": ("X", "Y", "is every topic Y denotes also denoted by X?"),
    "overlaps": ("X", "Y", "is some topic denoted by both X and Y?"),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``topic`` and its three predicates."""
    parser = subparsers.add_parser("topic", help="topic algebra: match, includes, overlaps")
    predicates = parser.add_subparsers(dest="predicate", metavar="PREDICATE", required=True)
    for name, (first, second, help_text) in PREDICATES.items():
        sub = predicates.add_parser(name, help=help_text, description=help_text +
                                    " Exit code 0 if true, 1 if false, 2 if invalid.")
        sub.add_argument("first", metavar=first)
        sub.add_argument("second", metavar=second)
        sub.add_argument("--json", action="store_true", help='print {"result": true|false}')
        sub.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from datapath.topics import algebra

    example = None
    if args.predicate == "match":
        result = algebra.matches(args.first, args.second)
    elif args.predicate == "includes":
        result = algebra.includes(args.first, args.second)
    else:
        example = algebra.overlap_example(args.first, args.second)
        result = example is not None
    if args.json:
        out: dict[str, object] = {"result": result}
        if args.predicate == "overlaps":
            out["example"] = example
        print(json.dumps(out))
    else:
        print(f"{str(result).lower()} (example: {example})" if example else str(result).lower())
    return 0 if result else 1
