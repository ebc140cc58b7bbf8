"""Errors of the selector engine (component ``selectors``), in nic_offload's error tree.

A selector that does not parse raises ``SelectorSyntaxError`` with the line, the column and a
caret line under the selector text; a selector that parses but cannot mean anything (a
boolean compared with ``<``, an ``IN`` list mixing strings and numbers) raises the same class
at the offending position. ``NotOffloadableError`` says why a selector cannot become ACL
ranges, so the appliance evaluates it in software instead.
"""

from __future__ import annotations

from nic_offload.errors import OffloadUserError

COMPONENT = "selectors"


class SelectorError(OffloadUserError):
    """A selector, subscriber or event the selector engine refused."""

    component = COMPONENT


class SelectorSyntaxError(SelectorError):
    """A selector text that does not parse or does not type-check; carries the position."""

    def __init__(self, text: str, pos: int, what: str) -> None:
        self.text = text
        self.pos = max(0, min(pos, len(text)))
        self.line, self.column = line_and_column(text, self.pos)
        self.what = what
        where = (f"column {self.column}" if "\n" not in text
                 else f"line {self.line}, column {self.column}")
        super().__init__(f"syntax error at {where}: {what}\n{caret_lines(text, self.pos)}")


class NotOffloadableError(SelectorError):
    """A selector the ACL range tables cannot express; evaluate it in software."""


def line_and_column(text: str, pos: int) -> tuple[int, int]:
    """1-based line and column of character offset ``pos`` in ``text``."""
    line = text.count("\n", 0, pos) + 1
    start = text.rfind("\n", 0, pos) + 1
    return line, pos - start + 1


def caret_lines(text: str, pos: int, indent: str = "    ") -> str:
    """The line of ``text`` holding ``pos`` and a caret under that character."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    line = text[start:] if end < 0 else text[start:end]
    shown = "".join(" " if ch in "\t\r\f\v" else ch for ch in line)
    return f"{indent}{shown}\n{indent}{' ' * (pos - start)}^"
