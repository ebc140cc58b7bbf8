"""Channels: one interface over UDP unicast/multicast, shared memory, RDMA and TCP.

``from channels import FrameBatch, UdpChannel`` and so on: the names load on first use, so
importing the package does not open libc or compile kernels.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Channel": "channels.base",
    "FrameBatch": "channels.base",
    "FrameArrays": "channels.base",
    "ChannelSink": "channels.base",
    "decode_batch": "channels.base",
    "EACH_SLOT": "channels.base",
    "NO_PEER": "channels.base",
    "WAIT_FOREVER": "channels.base",
    "ChannelStats": "channels.stats",
    "ChannelError": "channels.errors",
    "ChannelUserError": "channels.errors",
    "ChannelDeviceError": "channels.errors",
    "ChannelClosedError": "channels.errors",
    "UdpChannel": "channels.udp",
    "MulticastChannel": "channels.multicast",
    "ShmChannel": "channels.shm",
    "TcpChannel": "channels.tcp",
}

__all__ = sorted([*_EXPORTS, "warm_up"])


def warm_up() -> None:
    """Load every channel kernel (numba, cached on disk) now, so the first frames do not pay
    for it: a process that starts a channel calls this before it reports ready."""
    from channels import _mmsg, base, shm, stats, tcp

    base.warm_up()
    _mmsg.warm_up()
    shm.warm_up()
    stats.warm_up()
    tcp.warm_up()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'channels' has no attribute {name!r}")
    return getattr(import_module(module), name)
