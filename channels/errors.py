"""The channels package's errors: every one names the component ``channels`` and says what to do.

``ChannelError`` is the package's root; ``ChannelUserError`` is a bad argument (address,
size, option), ``ChannelDeviceError`` an OS failure carrying its errno (port in use,
missing interface, a socket or mmap that failed). ``ChannelClosedError`` is raised when a
closed channel is used.
"""

from __future__ import annotations

import errno as _errno
import os

from datapath.errors import DeviceError, TopicwireError, UserError

COMPONENT = "channels"


class ChannelError(TopicwireError):
    """Base of every error the channels raise."""

    component = COMPONENT


class ChannelUserError(UserError, ChannelError):
    """A bad argument: an address that does not parse, a size out of range, an unsafe option."""

    component = COMPONENT


class ChannelDeviceError(DeviceError, ChannelError):
    """An OS resource failed (socket, bind, join, mmap); ``errno`` says which way."""

    component = COMPONENT


class ChannelClosedError(ChannelUserError):
    """The channel was used after ``close()``."""


_HINTS = {
    _errno.EADDRINUSE: "another socket holds this address; pick another port or stop its owner",
    _errno.EADDRNOTAVAIL: "the address is not configured on any interface here; "
                          "use 127.0.0.1 or an address of this host/namespace",
    _errno.ENODEV: "no such interface here; check `ip -br addr` in this namespace",
    _errno.EACCES: "permission denied; run as root or pick a port above 1023",
    _errno.EPERM: "not permitted; run as root",
    _errno.ENETUNREACH: "no route to that address; send only to loopback or namespace hosts",
    _errno.ECONNREFUSED: "nobody listens there; start the peer first",
    _errno.EMSGSIZE: "a frame is larger than the channel allows; send smaller frames",
    _errno.ENOSPC: "no space left (is /dev/shm full?); free it or use a smaller ring",
    _errno.ENOENT: "no such file; start the ring's creator first",
}


def os_error(what: str, err: int | OSError) -> ChannelDeviceError:
    """A ``ChannelDeviceError`` for ``what`` failing with ``err`` (an errno or an OSError)."""
    code = err.errno if isinstance(err, OSError) else int(err)
    code = code or 0
    hint = _HINTS.get(code, "see the errno")
    name = _errno.errorcode.get(code, str(code))
    return ChannelDeviceError(f"{what} failed: {name} ({os.strerror(code)}); {hint}",
                              errno=code)
