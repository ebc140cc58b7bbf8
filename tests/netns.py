"""Test hosts in network namespaces: create, wire with veth (and a bridge), inject loss, tear down.

Every namespace, link and rule is created by the test and removed when its context closes, so
traffic never leaves the machine: tests talk only to addresses inside namespaces they made.
Needs root and iproute2; ``requires_netns`` skips with the reason elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from contextlib import ExitStack

import pytest

HAVE_NETNS = os.geteuid() == 0 and shutil.which("ip") is not None
requires_netns = pytest.mark.skipif(not HAVE_NETNS, reason="network namespaces need root and "
                                    "iproute2 (make test installs iproute2; run as root)")


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


class Host:
    """One network namespace with loopback up and multicast routed to its own interfaces."""

    def __init__(self, name: str) -> None:
        self.name = name
        sh("ip", "netns", "add", name)
        self.run("ip", "link", "set", "lo", "up")
        self.addresses: list[str] = []

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", self.name, *args, check=check)

    def popen(self, args: Sequence[str], **kw: object) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.name, *args], **kw)  # type: ignore[arg-type]

    def close(self) -> None:
        sh("ip", "netns", "del", self.name, check=False)


def rmem_max_at_least(host: Host, needed: int) -> str | None:
    """Give ``host``'s namespace a ``net.core.rmem_max`` (the largest socket receive buffer
    ``SO_RCVBUF`` gets) of at least ``needed`` bytes, for a test whose sockets there need
    one that large: None when it has it, else why not (the test skips saying so). Where the
    kernel keeps the limit per namespace it is raised there only; where a namespace sees the
    host's limit (read-only) or none, the host's must be high enough already: it is never
    changed from here."""
    def limit() -> int:
        done = host.run("cat", "/proc/sys/net/core/rmem_max", check=False)
        if done.returncode == 0:
            return int(done.stdout)
        with open("/proc/sys/net/core/rmem_max") as f:  # none of its own: the host's applies
            return int(f.read())
    have = limit()
    if have >= needed:
        return None
    done = host.run("sh", "-c", f"echo {needed} > /proc/sys/net/core/rmem_max", check=False)
    if done.returncode == 0 and limit() >= needed:
        return None
    return (f"needs a socket receive buffer of {needed} bytes: net.core.rmem_max is {have} and "
            f"this kernel does not let a network namespace raise its own "
            f"({done.stderr.strip() or 'refused'}); raise it on this host: "
            f"sysctl -w net.core.rmem_max={needed}")


class Fabric:
    """Hosts joined by a bridge in its own namespace: ``fabric.add_host()`` -> Host with an IP.

    The subnet is 10.77.0.0/24 inside the test's namespaces only; multicast (224.0.0.0/4) is
    routed to each host's veth, so a multicast sender reaches every host on the bridge.
    """

    def __init__(self, prefix: str = "10.77.0") -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.prefix = prefix
        self._stack = ExitStack()
        self.hosts: list[Host] = []
        self.switch = self._new_host(f"tw{self.tag}sw")
        self.switch.run("ip", "link", "add", "br0", "type", "bridge")
        self.switch.run("ip", "link", "set", "br0", "up")

    def _new_host(self, name: str) -> Host:
        host = Host(name)
        self._stack.callback(host.close)
        return host

    def add_host(self) -> Host:
        index = len(self.hosts) + 1
        host = self._new_host(f"tw{self.tag}h{index}")
        ifname, peer = f"eth{index}", f"tw{self.tag}p{index}"
        sh("ip", "link", "add", peer, "type", "veth", "peer", "name", ifname)
        sh("ip", "link", "set", ifname, "netns", host.name)
        sh("ip", "link", "set", peer, "netns", self.switch.name)
        self.switch.run("ip", "link", "set", peer, "master", "br0")
        self.switch.run("ip", "link", "set", peer, "up")
        address = f"{self.prefix}.{index}"
        host.run("ip", "addr", "add", f"{address}/24", "dev", ifname)
        host.run("ip", "link", "set", ifname, "up")
        host.run("ip", "route", "add", "224.0.0.0/4", "dev", ifname)
        host.addresses.append(address)
        host.ifname = ifname  # type: ignore[attr-defined]
        self.hosts.append(host)
        return host

    def drop_incoming(self, host: Host, percent: float, udp_port: int | None = None) -> None:
        """Drop ``percent`` % of the UDP packets arriving at ``host`` (nftables numgen)."""
        match = f"udp dport {udp_port} " if udp_port else "meta l4proto udp "
        threshold = round(percent * 100)
        if threshold < 10000:
            match += f"numgen random mod 10000 < {threshold} "
        rule = (f"table inet twloss {{\n chain input {{\n  type filter hook input priority 0;\n"
                f"  {match}counter drop\n }}\n}}\n")
        subprocess.run(["ip", "netns", "exec", host.name, "nft", "-f", "-"], input=rule,
                       text=True, check=True, capture_output=True)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Fabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
