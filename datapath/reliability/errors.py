"""Errors of the reliable transport (component-prefixed, in the datapath.errors tree).

A user error: it refuses a configuration that cannot work (a window of zero messages, a frame
size off the 8-byte grid) and says which setting to change. Nothing on the receive path
raises: hostile or malformed frames are counted and dropped.
"""

from __future__ import annotations

from datapath.errors import UserError


class ReliabilityError(UserError):
    """A reliability setting that cannot work ("reliability: ...; what to do")."""

    component = "reliability"

