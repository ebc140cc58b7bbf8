"""The free egress ports of one appliance: a pool over the 16-bit logical port space.

Ports are handed out lowest first (1, 2, 3, ... skipping the CPU port); a port given back is
handed out again before any fresh one. Only the ports handed out and given back are stored:
the pool holds a counter and a list of the returned ports, never the 65,534 free ones (a
list of them would be ~2.3 MiB of Python ints for an appliance that uses a few hundred).
"""

from __future__ import annotations


class PortPool:
    """Free ports ``first..last`` without ``skip``; ``pop``, ``append`` and ``len`` as the
    list it replaces (``append`` gives a port back)."""

    def __init__(self, first: int, last: int, skip: int) -> None:
        self._next = first
        self._last = last
        self._skip = skip
        self._returned: list[int] = []
        self._fresh = max(0, last - first + 1) - (1 if first <= skip <= last else 0)
        """Ports never handed out."""

    def __len__(self) -> int:
        return self._fresh + len(self._returned)

    def __bool__(self) -> bool:
        return len(self) > 0

    def pop(self) -> int:
        """A free port; IndexError when none is left (as ``list.pop``)."""
        if self._returned:
            return self._returned.pop()
        if self._fresh == 0:
            raise IndexError("no egress port is free")
        if self._next == self._skip:
            self._next += 1
        port = self._next
        self._next += 1
        self._fresh -= 1
        return port

    def append(self, port: int) -> None:
        """Give ``port`` back."""
        self._returned.append(port)
