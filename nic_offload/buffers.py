"""Two buffers of one array, patched in turn (the "left-right" technique).

A snapshot's arrays are read-only: a burst may still run on version v while v+1 is made.
Copying a whole array per version costs O(table) per change (the software NIC's slot array
is 33 MB at 1,000,000 topics). A ``BufferPair`` keeps two buffers of the array instead:
version v is a read-only view of one of them (the *head*); v+1 is made by patching the other
buffer, which last held v-1, with the patch that made v (its ``behind`` patch) and then
with v+1's own, and its view becomes the head. Each change costs its own rows and the
previous change's rows, not the table.

Safety: the other buffer is written only when no one can read it. Readers reach a buffer
only through the view objects this pair hands out (a snapshot holds them; a burst holds
its snapshot, or the view itself as a kernel argument, for as long as it runs), and the
pair keeps a weak reference to each view: while the view of the other buffer is alive
anywhere (a burst still on v-1, a process link still holding v-1 to compare against, a
data path idle since v-1), the other buffer is not touched, and a fresh copy of the head
is made instead (what every change cost before). Readers must hold the view itself (or an
object holding it), never only a slice of it: a slice's ``base`` is the buffer, not the
view. Nothing in topicwire keeps such a slice beyond a call.

The pairs are found from the object holding the views (``pair_of``/``remember``: a
``KeyRows`` or a ``SoftTables``, weakly), so a snapshot made some other way (built whole,
unpickled from the process link) simply starts a new pair.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

Patch = Callable[[np.ndarray], Any]
"""Writes one change into a buffer in place (and may return something, e.g. a probe length);
applied twice, to each buffer in turn, so it must hold its own copy of the values."""


class BufferPair:
    """Two buffers of a 1-D array; ``advance`` makes the next version (module docstring)."""

    def __init__(self, head: np.ndarray, size: int, patch: Patch,
                 alloc: Callable[[int], np.ndarray] | None = None) -> None:
        """A pair whose head is ``head``'s values (copied: the pair owns its buffers) grown
        to ``size`` and changed by ``patch`` (``first``: what it returned)."""
        self._alloc = alloc or (lambda n: np.empty(n, head.dtype))
        buf = self._alloc(self._capacity(size, len(head)))
        buf[:len(head)] = head
        self.first = patch(buf)
        self._bufs: list[np.ndarray | None] = [buf, None]
        self._refs: list[weakref.ref | None] = [None, None]
        self._side = 0
        self._size = size
        self._behind: Patch | None = patch
        """The last change: the head has it, the other buffer not yet."""
        self.copies = 1
        """Versions made by a copy of the head (the other buffer was in use or missing)."""
        self.patched = 0
        """Versions made by patching the other buffer (no copy)."""

    @staticmethod
    def _capacity(size: int, now: int) -> int:
        return size if size <= now else max(size, 2 * now)

    def view(self) -> np.ndarray:
        """The head as a read-only view (a new object each call; the pair tracks the last)."""
        buf = self._bufs[self._side]
        assert buf is not None
        view = buf[:self._size]
        view.flags.writeable = False
        self._refs[self._side] = weakref.ref(view)
        return view

    def is_head(self, view: np.ndarray) -> bool:
        """Whether ``view`` is the view of this pair's newest version."""
        ref = self._refs[self._side]
        return ref is not None and ref() is view

    def advance(self, size: int, patch: Patch) -> tuple[np.ndarray, Any]:
        """The next version: the head's values for ``size`` elements (a longer array keeps
        the head's values where it had them; new places must be written by ``patch``),
        changed by ``patch``. Returns its read-only view and what ``patch`` returned."""
        other = 1 - self._side
        buf, ref = self._bufs[other], self._refs[other]
        head = self._bufs[self._side]
        assert head is not None
        if buf is None or len(buf) < size or (ref is not None and ref() is not None):
            # a reader may still hold the other buffer (or there is none, or it is too
            # short): a new buffer, a copy of the head; the old one is left to its readers
            buf = self._alloc(max(len(head), self._capacity(size, len(head))))
            buf[:self._size] = head[:self._size]
            self.copies += 1
        else:
            if self._behind is not None:
                self._behind(buf)  # the change the head got and this buffer did not
            self.patched += 1
        self._bufs[other] = buf
        self._refs[other] = None
        out = patch(buf)
        self._behind = patch
        self._side = other
        self._size = size
        return self.view(), out


_PAIRS: weakref.WeakKeyDictionary[Any, dict[str, BufferPair]] = weakref.WeakKeyDictionary()


def pair_of(owner: Any, name: str, view: np.ndarray) -> BufferPair | None:
    """The pair whose head is ``view``, the array ``name`` of ``owner`` (None: none yet,
    or ``owner`` is not the newest version its pair made)."""
    pairs = _PAIRS.get(owner)
    pair = None if pairs is None else pairs.get(name)
    return pair if pair is not None and pair.is_head(view) else None


def remember(owner: Any, pairs: dict[str, BufferPair]) -> None:
    """``owner``'s arrays are the heads of ``pairs`` (by name)."""
    _PAIRS[owner] = pairs


def advance(owner: Any, name: str, view: np.ndarray, size: int, patch: Patch,
            alloc: Callable[[int], np.ndarray] | None = None
            ) -> tuple[np.ndarray, Any, BufferPair]:
    """The next version of ``owner``'s array ``name`` (its current value ``view``) grown to
    ``size`` and changed by ``patch``: through its pair when ``view`` is a pair's head, else
    through a new pair (one copy). Returns its read-only view, what ``patch`` returned, and
    the pair (``remember`` it with the new owner)."""
    pair = pair_of(owner, name, view)
    if pair is None:
        pair = BufferPair(view, size, patch, alloc)
        return pair.view(), pair.first, pair
    new, out = pair.advance(size, patch)
    return new, out, pair
