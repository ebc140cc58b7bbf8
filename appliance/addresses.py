"""``HOST:PORT`` as configs, the command line and ``connect`` give it: parsed and resolved once.

HOST is an IPv4 address (``10.0.0.1``), an IPv6 address in brackets (``[::1]``) or a host
name (``localhost``, ``core-1.example``), resolved when the config is loaded or the client
connects; the numeric address is what sockets use from then on. An error names the key.

IPv6 is accepted where the socket carrying it can: the TCP listeners (``mgmt.listen``). The
UDP data path (fabric, client channels) is IPv4 only for now: its batched send/receive
kernels (channels/_mmsg.py) lay out one ``sockaddr_in`` per datagram; an IPv6 address there
is refused saying so, and a host name resolves to its IPv4 address.
"""

from __future__ import annotations

import ipaddress
import re
import socket

from appliance.errors import ConfigError

MAX_HOST_NAME_CHARS = 253
_HOST_PORT = re.compile(r"(?:\[([0-9A-Fa-f:.]+)\]|([^\[\]:\s]+)):([0-9]{1,5})")
"""``host:port`` or ``[v6]:port``; the port in ASCII digits."""
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_IPV4_LIKE = re.compile(r"[0-9.]+")
IPV6_UDP_REFUSAL = ("IPv6 is not supported on the UDP data path yet (its batched socket "
                    "kernels carry IPv4 sockaddr_in); give an IPv4 address or a host name "
                    "with an IPv4 address")

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _fail(key: str, what: str) -> ConfigError:
    return ConfigError(f"{key}: {what}")


def _show(text: object) -> str:
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def split_host_port(text: object, key: str, example: str) -> tuple[str, bool, int]:
    """(host, host was bracketed, port) of ``HOST:PORT`` / ``[IPv6]:PORT``."""
    match = _HOST_PORT.fullmatch(text) if isinstance(text, str) and text.isascii() else None
    if match is None and isinstance(text, str) and text.count(":") > 1 and "[" not in text:
        raise _fail(key, f"write an IPv6 address in brackets, \"[ADDRESS]:PORT\" such as "
                    f"\"[::1]:8470\", not {_show(text)}")
    if match is None:
        raise _fail(key, f"must be \"HOST:PORT\" (an IPv4 address, [IPv6] or a host name) such "
                    f"as \"{example}\", not {_show(text)}")
    port_text = match[3]
    port = int(port_text)
    if port_text != str(port):
        raise _fail(key, f"port {port_text!r} has a leading zero; write {port}")
    return (match[1] or match[2]), match[1] is not None, port


def _literal(host: str, bracketed: bool, key: str) -> IpAddress | None:
    """The host as an address when it is written as one; None for a name."""
    if bracketed:
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            raise _fail(key, f"[{host}] is not an IPv6 address") from None
    if _IPV4_LIKE.fullmatch(host):
        try:
            return ipaddress.IPv4Address(host)
        except ValueError:
            raise _fail(key, f"{host!r} is not an IPv4 address (four numbers 0..255, no "
                        "leading zeros)") from None
    if ":" in host:
        raise _fail(key, f"write an IPv6 address in brackets: \"[{host}]:PORT\"")
    return None


def resolve(host: str, key: str, *, ipv6: bool) -> IpAddress:
    """The address of host name ``host`` (IPv4 first; IPv6 only when ``ipv6``)."""
    if len(host) > MAX_HOST_NAME_CHARS or not all(
            _LABEL.fullmatch(label) for label in host.rstrip(".").split(".")):
        raise _fail(key, f"{_show(host)} is not a host name (letters, digits and '-' in labels "
                    "separated by '.')")
    try:
        found = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise _fail(key, f"cannot resolve host name {host!r} ({reason}); give an address, or "
                    "a name this host resolves") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in found]
    for address in addresses:
        if address.version == 4:
            return address
    if ipv6 and addresses:
        return addresses[0]
    raise _fail(key, f"host name {host!r} has no IPv4 address"
                + ("" if ipv6 else f" ({IPV6_UDP_REFUSAL})"))


def host_address(text: object, key: str, *, ipv6: bool = False,
                 example: str = "127.0.0.1:47470") -> tuple[IpAddress, int]:
    """``HOST:PORT`` -> (numeric address, port); names resolved, IPv6 only when ``ipv6``."""
    host, bracketed, port = split_host_port(text, key, example)
    address = _literal(host, bracketed, key)
    if address is None:
        address = resolve(host, key, ipv6=ipv6)
    elif address.version == 6 and not ipv6:
        raise _fail(key, f"[{address}]: {IPV6_UDP_REFUSAL}")
    return address, port


def format_host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets (as URLs and ``HOST:PORT`` arguments take it)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
