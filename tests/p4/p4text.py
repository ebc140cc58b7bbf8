"""A reader for the declarations of p4/topicwire/topicwire.p4 that the golden tests compare:
constants, header and struct layouts, actions, tables, direct counters and digests.

Not a P4 parser: it reads this program's declaration style (one declaration per statement,
as written there) with regular expressions, and fails loudly when it finds none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PROGRAM = Path(__file__).resolve().parents[2] / "p4" / "topicwire" / "topicwire.p4"
P4INFO = PROGRAM.with_name("topicwire.p4info.txt")


@dataclass(frozen=True)
class Table:
    name: str
    keys: tuple[tuple[str, str], ...]
    """(expression, match kind) in order."""
    actions: tuple[str, ...]
    default_action: str
    size: int
    counters: str | None


@dataclass(frozen=True)
class Program:
    consts: dict[str, tuple[int, int]]
    """name -> (bits, value)."""
    layouts: dict[str, tuple[tuple[str, int], ...]]
    """header or struct type -> ((field, bits), ...)."""
    members: dict[str, dict[str, str]]
    """struct type -> {member name: member type name} (``headers``, ``metadata``)."""
    control: str
    actions: dict[str, tuple[tuple[str, int], ...]]
    tables: dict[str, Table]
    direct_counters: dict[str, str]
    digests: tuple[str, ...]
    apply_body: str

    def field_bits(self, expression: str) -> int:
        """Width of ``hdr.msg.topic_key`` or ``meta.acl_class``."""
        root, *path = expression.split(".")
        struct = {"hdr": "headers", "meta": "metadata"}[root]
        for i, name in enumerate(path):
            if i == len(path) - 1:
                return dict(self.layouts[struct])[name]
            struct = self.members[struct][name]
        raise KeyError(expression)


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _block(text: str, start: int) -> str:
    """The text between the brace at or after ``start`` and its match."""
    open_at = text.index("{", start)
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1:i]
    raise ValueError("unbalanced braces")


def read_program(path: Path = PROGRAM) -> Program:
    text = _strip_comments(path.read_text())
    consts = {m[2]: (int(m[1]), int(m[3], 0)) for m in re.finditer(
        r"const\s+bit<(\d+)>\s+(\w+)\s*=\s*(0x[0-9A-Fa-f]+|\d+)\s*;", text)}
    layouts, members = {}, {}
    for m in re.finditer(r"\b(header|struct)\s+(\w+)\s*\{", text):
        body = _block(text, m.start())
        fields = re.findall(r"bit<(\d+)>\s+(\w+)\s*;", body)
        layouts[m[2]] = tuple((name, int(bits)) for bits, name in fields)
        members[m[2]] = {name: kind for kind, name in re.findall(r"(\w+)\s+(\w+)\s*;", body)}
    control_match = re.search(r"\bcontrol\s+(TopicwireIngress)\s*\(", text)
    assert control_match, "no control TopicwireIngress"
    body = _block(text, control_match.end())
    actions = {}
    for m in re.finditer(r"\baction\s+(\w+)\s*\(([^)]*)\)", body):
        params = re.findall(r"bit<(\d+)>\s+(\w+)", m[2])
        actions[m[1]] = tuple((name, int(bits)) for bits, name in params)
    tables = {}
    for m in re.finditer(r"\btable\s+(\w+)\s*\{", body):
        tbody = _block(body, m.start())
        keys = tuple(re.findall(r"([\w.]+)\s*:\s*(exact|range|ternary|lpm)\s*;",
                                _block(tbody, tbody.index("key"))))
        acts = tuple(re.findall(r"(\w+)\s*;", _block(tbody, tbody.index("actions"))))
        default = re.search(r"default_action\s*=\s*(\w+)\s*\(", tbody)
        size = re.search(r"\bsize\s*=\s*(\d+)\s*;", tbody)
        counters = re.search(r"\bcounters\s*=\s*(\w+)\s*;", tbody)
        tables[m[1]] = Table(m[1], keys, acts, default[1] if default else "",
                             int(size[1]) if size else 0, counters[1] if counters else None)
    direct = dict((name, kind) for kind, name in re.findall(
        r"direct_counter\s*\(\s*CounterType\.(\w+)\s*\)\s*(\w+)\s*;", body))
    digests = tuple(re.findall(r"\bdigest\s*<\s*(\w+)\s*>", body))
    apply_at = [m.start() for m in re.finditer(r"\bapply\s*\{", body)][-1]
    return Program(consts, layouts, members, control_match[1], actions, tables, direct,
                   digests, _block(body, apply_at))
