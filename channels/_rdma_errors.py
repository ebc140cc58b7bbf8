"""Errors of the RDMA channel, under the channels package's tree (``channels.errors``).

Device trouble is a ``ChannelDeviceError`` with an errno: no device or no pyverbs (ENODEV),
a port that is down (ENETDOWN), a peer that is gone (ECONNRESET, or ESHUTDOWN when it closed
its end in order), a receiver that stopped taking packets (ENOBUFS). A GID that does not fit
the address asked for is the user's to fix (``RdmaGidError``, a ``ChannelUserError``).
"""

from __future__ import annotations

import errno

from channels.errors import ChannelDeviceError, ChannelUserError


class RdmaDeviceError(ChannelDeviceError):
    """An RDMA device, verbs call or connection failed."""


class RdmaNoDeviceError(RdmaDeviceError):
    """No RDMA device here (or no pyverbs to reach one)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, errno=errno.ENODEV)


class RdmaPortDownError(RdmaDeviceError):
    """The device's port is not ACTIVE (its netdev is down, or no link)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, errno=errno.ENETDOWN)


class RdmaPeerGoneError(RdmaDeviceError):
    """The other end went away: it closed the channel (``orderly``) or stopped answering."""

    def __init__(self, message: str, *, orderly: bool = False) -> None:
        self.orderly = orderly
        super().__init__(message, errno=errno.ESHUTDOWN if orderly else errno.ECONNRESET)


class RdmaReceiverNotReadyError(RdmaDeviceError):
    """The peer had no receive posted for our packets, retry after retry (RNR)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, errno=errno.ENOBUFS)


class RdmaGidError(ChannelUserError):
    """The GID asked for does not exist, is empty, or does not belong to the address."""
