"""UDP multicast channel: join/leave groups on an explicit interface, bounded TTL, loopback option.

**Safety rule.** A multicast datagram whose socket names no interface leaves through the
default route (eth0 here) and reaches the real network. ``MulticastChannel`` therefore refuses
to exist without an explicit ``interface`` (an IPv4 address configured here, such as
``127.0.0.1``, or an interface name such as ``lo``/``eth1``), refuses the wildcard
``0.0.0.0``, sets ``IP_MULTICAST_IF`` before anything can be sent, reads it back to verify,
and bounds the TTL by ``MULTICAST_MAX_TTL`` (1: the local link only). Every send goes through
that socket, so there is no way to send multicast from this class without the interface.

Receiving binds to ``(group, port)`` with ``SO_REUSEADDR`` (several receivers per host) and
clears ``IP_MULTICAST_ALL`` so only joined groups arrive. Loopback multicast needs
``ip link set lo multicast on``. Sending and the batched I/O are the UDP channel's
(``udp.DatagramChannel``).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct

from channels.errors import ChannelDeviceError, ChannelUserError, os_error
from channels.udp import (
    UDP_RCVBUF_BYTES,
    UDP_SNDBUF_BYTES,
    DatagramChannel,
    check_port,
    make_udp_socket,
    parse_ipv4,
)

MULTICAST_MAX_TTL = 1
"""Highest TTL a multicast channel accepts: 1 keeps datagrams on the local link (0: this host
only). Routed multicast deployments raise it through configuration, deliberately."""
MULTICAST_DEFAULT_TTL = 1
IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)
"""Linux: 0 = deliver only the groups this socket joined."""

_MULTICAST_NET = ipaddress.IPv4Network("224.0.0.0/4")


def _group(group: str) -> str:
    parse_ipv4(group, "multicast group")
    if ipaddress.IPv4Address(group) not in _MULTICAST_NET:
        raise ChannelUserError(f"{group!r} is not a multicast group (224.0.0.0/4); "
                               "use UdpChannel for unicast")
    return group


class MulticastChannel(DatagramChannel):
    """``MulticastChannel("239.1.2.3", 47470, interface="127.0.0.1")``: send to and receive a group.

    ``join=False`` makes a send-only channel (bound to an ephemeral port on the interface, so
    unicast replies such as NAKs reach it). ``send(frames)`` without ``dest`` goes to the group.
    """

    kind = "mcast"
    multicast_sender = True

    def __init__(self, group: str, port: int, *, interface: str | None, ttl: int =
                 MULTICAST_DEFAULT_TTL, loopback: bool = True, join: bool = True,
                 rcvbuf_bytes: int = UDP_RCVBUF_BYTES, sndbuf_bytes: int = UDP_SNDBUF_BYTES,
                 kernel_timestamps: bool = True, name: str | None = None,
                 stamp_send_ts: bool = True) -> None:
        self.group = _group(group)
        check_port(port, allow_zero=False)
        self.port = port
        self._if_addr, self._if_index = _interface(interface)
        if not isinstance(ttl, int) or not 0 <= ttl <= MULTICAST_MAX_TTL:
            raise ChannelUserError(f"multicast TTL {ttl!r} is outside [0, {MULTICAST_MAX_TTL}]; "
                                   "TTL 1 keeps frames on the local link")
        self.interface = interface
        self.ttl = ttl
        self._joined: set[str] = set()
        sock = make_udp_socket(rcvbuf_bytes, sndbuf_bytes, reuse_address=join)
        try:
            self._set_interface(sock)
            try:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, int(loopback))
                sock.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_ALL, 0)
            except OSError as exc:
                raise os_error("setting multicast TTL/loopback", exc) from None
            bind = (group, port) if join else (self._if_addr or "0.0.0.0", 0)
            try:
                sock.bind(bind)
            except OSError as exc:
                raise os_error(f"binding multicast {bind[0]}:{bind[1]}", exc) from None
            super().__init__(sock, default_dest=(group, port), kernel_timestamps=
                             kernel_timestamps, name=name or f"mcast:{group}:{port}@{interface}",
                             stamp_send_ts=stamp_send_ts, rcvbuf_bytes=rcvbuf_bytes)
            if join:
                self.join_group(group)
        except BaseException:
            sock.close()
            raise

    # --- interface ---------------------------------------------------------------------------
    def _mreqn(self, group: str = "0.0.0.0") -> bytes:
        """struct ip_mreqn {multiaddr, address, ifindex}."""
        return (socket.inet_aton(group) + socket.inet_aton(self._if_addr or "0.0.0.0")
                + struct.pack("=i", self._if_index))

    def _set_interface(self, sock: socket.socket) -> None:
        try:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, self._mreqn())
        except OSError as exc:
            raise os_error(f"selecting multicast interface {self.interface!r}", exc) from None
        chosen = sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, 4)
        if self._if_addr and socket.inet_ntoa(chosen) != self._if_addr:
            raise ChannelDeviceError(f"multicast interface {self.interface!r} did not stick "
                                     f"(kernel has {socket.inet_ntoa(chosen)}); refusing to send")

    def join_group(self, group: str) -> None:
        """Receive ``group`` on this channel's interface (``IP_ADD_MEMBERSHIP``)."""
        self._check_open()
        _group(group)
        if group in self._joined:
            return
        try:
            self._sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, self._mreqn(group))
        except OSError as exc:
            raise os_error(f"joining {group} on {self.interface!r}", exc) from None
        self._joined.add(group)

    def leave_group(self, group: str) -> None:
        """Stop receiving ``group`` (``IP_DROP_MEMBERSHIP``)."""
        self._check_open()
        if group not in self._joined:
            raise ChannelUserError(f"{self.name} has not joined {group}; nothing to leave")
        try:
            self._sock.setsockopt(socket.IPPROTO_IP, socket.IP_DROP_MEMBERSHIP,
                                  self._mreqn(group))
        except OSError as exc:
            raise os_error(f"leaving {group} on {self.interface!r}", exc) from None
        self._joined.discard(group)

    @property
    def groups(self) -> frozenset[str]:
        return frozenset(self._joined)


def _interface(interface: str | None) -> tuple[str | None, int]:
    """(address, ifindex) of an explicit interface; refuses None, '' and the wildcard."""
    if not interface:
        raise ChannelUserError(
            "refusing to open a multicast channel without an explicit interface: multicast "
            "would leave through the default route (eth0); pass interface='127.0.0.1' (or "
            "'lo') on loopback, or the namespace's own address")
    try:
        address = ipaddress.IPv4Address(interface)
    except ValueError:
        try:
            return None, socket.if_nametoindex(interface)
        except OSError as exc:
            raise os_error(f"finding interface {interface!r}", exc.errno or errno.ENODEV) from None
    if address.is_unspecified or address.is_multicast:
        raise ChannelUserError(
            f"interface {interface!r} is not one interface's address; the wildcard would pick "
            "the default route (eth0): pass interface='127.0.0.1' or the namespace's address")
    return str(address), 0
