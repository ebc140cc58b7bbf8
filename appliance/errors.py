"""The appliance's own errors (below every module of the appliance, so each can raise them)."""

from __future__ import annotations

from datapath.errors import UserError

MAX_MESSAGE_CHARS = 1_000
"""A config message is cut to this many characters (it quotes what it refused)."""


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` as one printable line of at most ``limit`` characters: a newline, a control
    character or an invisible separator is shown as its escape (``\\n``, ``\\x00``)."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class ConfigError(UserError):
    """A refused configuration: names the key and what to do, on one line (whatever the
    refused value held)."""

    component = "config"

    def __init__(self, message: str, *, component: str | None = None) -> None:
        super().__init__(one_line(message), component=component)
