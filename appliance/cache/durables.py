"""``DurableBook``: where each durable subscription of an appliance's cache stands.

A durable subscription is named by its client (``subscribe(pattern, durable=NAME)``) and
belongs to the identity that made it: (identity, name) -> its pattern, namespace and
*position*, the cache sequence of the next message it has not been handed yet. The messages
themselves are the cache's logs (one per configured pattern); a durable subscription is a
reader of one of them whose place the appliance keeps while the subscriber is away, as a
Kafka consumer group keeps its committed offset.

The book is one JSON file in the cache's directory (``durables.json``), written whole to a
temporary file, fsynced and renamed over the old one (then the directory fsynced), so a
crash leaves the old book or the new one, never a mix. Changes are written at most every
``SAVE_INTERVAL_NS`` and at close: positions acknowledged in the last interval before a
crash are acknowledged again by the subscriber's next request, or the messages after the
saved position are handed out again (at least once across an appliance crash). A book that
does not parse stops the cache's start with the file's name: starting without it would
move every durable subscription to "now" and lose what it had not read, without a word.

Why hand-written: the state is a small map written whole; a database (sqlite) would add a
second durability mechanism beside the logs for a few kilobytes.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

BOOK_FILE = "durables.json"
SAVE_INTERVAL_NS = 100_000_000
"""Changed positions reach the disk at most this long after the change."""
MAX_DURABLES = 1_024
"""Durable subscriptions one appliance keeps (all identities); one more is refused."""
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A durable subscription's name: 1 to 64 of letters, digits, '.', '_', '-'."""
FORMAT = 1


@dataclass
class Durable:
    identity: str
    name: str
    pattern: str
    namespace: int
    position: int
    """The cache sequence of the next message this subscription has not been handed."""


class DurableError(Exception):
    """A request the book refuses (the text says why and what to do)."""


class DurableBook:
    """The durable subscriptions of one cache directory (used by the cache agent's thread)."""

    def __init__(self, directory: Path, limit: int = MAX_DURABLES) -> None:
        self.path = Path(directory) / BOOK_FILE
        self.limit = limit
        self.entries: dict[tuple[str, str], Durable] = {}
        self._dirty_since_ns: int | None = None
        self.saves = 0
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT}")
            for row in doc["durables"]:
                entry = Durable(str(row["identity"]), str(row["name"]), str(row["pattern"]),
                                int(row["namespace"]), int(row["position"]))
                self.entries[(entry.identity, entry.name)] = entry
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DurableError(
                f"cache: the durable subscriptions' positions in {self.path} cannot be read "
                f"({exc}); move the file aside to start with none (their subscribers then "
                "start from the newest message)") from None

    # --- requests -----------------------------------------------------------------------------
    def open(self, identity: str, name: str, pattern: str, namespace: int, end: int,
             now_ns: int, make: bool = True) -> tuple[Durable, bool]:
        """The durable subscription (identity, name), made at ``end`` (the log's next
        sequence: it starts with what is kept from now on) when new and ``make``; (entry,
        made). Only a subscription's first request makes one: a later request of a
        subscription that was deleted meanwhile is refused, not made anew."""
        if not NAME_RE.fullmatch(name):
            raise DurableError(f"durable name {name!r}: use 1 to 64 letters, digits, '.', "
                               "'_' or '-', beginning with a letter or digit")
        entry = self.entries.get((identity, name))
        if entry is None and not make:
            raise DurableError(f"durable subscription {name!r} of {identity!r} no longer "
                               "exists (deleted); subscribe again to make it anew")
        if entry is not None:
            if (entry.pattern, entry.namespace) != (pattern, namespace):
                raise DurableError(
                    f"durable subscription {name!r} of {identity!r} is to {entry.pattern!r} "
                    f"(namespace {entry.namespace}), not {pattern!r} (namespace {namespace}); "
                    "delete it first (Client.delete_durable) or use another name")
            return entry, False
        if len(self.entries) >= self.limit:
            raise DurableError(f"cache: {self.limit} durable subscriptions exist on this "
                               "appliance; delete unused ones (Client.delete_durable)")
        entry = Durable(identity, name, pattern, namespace, end)
        self.entries[(identity, name)] = entry
        self._changed(now_ns)
        return entry, True

    def move(self, entry: Durable, position: int, now_ns: int) -> None:
        """The subscriber was handed everything before ``position`` (positions only move
        forward: an acknowledgement that arrives late changes nothing)."""
        if position > entry.position:
            entry.position = position
            self._changed(now_ns)

    def delete(self, identity: str, name: str, now_ns: int) -> bool:
        if self.entries.pop((identity, name), None) is None:
            return False
        self._changed(now_ns)
        return True

    def _changed(self, now_ns: int) -> None:
        if self._dirty_since_ns is None:
            self._dirty_since_ns = now_ns

    # --- saving -------------------------------------------------------------------------------
    def wake_at_ns(self) -> int | None:
        return None if self._dirty_since_ns is None else self._dirty_since_ns + SAVE_INTERVAL_NS

    def save_if_due(self, now_ns: int) -> bool:
        if self._dirty_since_ns is None or now_ns < self._dirty_since_ns + SAVE_INTERVAL_NS:
            return False
        self.save()
        return True

    def save(self) -> None:
        """Write the book whole and make it durable (raises OSError; the book stays dirty)."""
        if self._dirty_since_ns is None:
            return
        doc = {"format": FORMAT,
               "durables": [asdict(e) for e in sorted(self.entries.values(),
                                                      key=lambda e: (e.identity, e.name))]}
        tmp = self.path.with_name(BOOK_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._dirty_since_ns = None
        self.saves += 1

    def status(self) -> list[dict]:
        return [asdict(e) for e in self.entries.values()]
