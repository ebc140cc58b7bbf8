"""Base of the RDMA hardware tests: find two RDMA ends or skip, saying why (rdma-core's
tests/base.py is the model: a base class that turns "no device" into a skip).

The ends are the two soft-RoCE devices ``hwtests/guest/provision.sh --devices`` makes (rxe0 on
192.168.200.1, rxe1 on 192.168.200.2, the two ends of a veth pair). On a machine with other
RDMA hardware and no such pair, both ends use the first IPv4 RoCE v2 GID found (the device
loops the traffic back). Where the launcher sets ``TOPICWIRE_HWTEST_REQUIRE_RDMA=1`` (inside
its guest) a missing device fails the tests instead: CI must not pass by skipping.
"""

from __future__ import annotations

import functools
import ipaddress
import os
from dataclasses import dataclass

import pytest

PAIR_ADDRESSES = ("192.168.200.1", "192.168.200.2")
"""The veth pair's addresses (provision.sh)."""
REQUIRE_RDMA_ENV = "TOPICWIRE_HWTEST_REQUIRE_RDMA"


@dataclass(frozen=True)
class RdmaEnds:
    """Where the two ends of a test connection live."""

    listen: str
    """IPv4 address the accepting end binds (its RDMA device follows from it)."""
    connect_from: str
    """IPv4 address the connecting end binds."""
    devices: str
    """What was found, for messages."""


@functools.cache
def find_ends() -> RdmaEnds | str:
    """The two ends, or the reason there are none."""
    from channels import _rdma_verbs as verbs
    from channels.rdma import RdmaGidError, RdmaNoDeviceError, RdmaPortDownError

    try:
        names = verbs.device_names()
    except RdmaNoDeviceError as exc:
        return str(exc)
    try:
        a, b = (verbs.choose_port_gid(address) for address in PAIR_ADDRESSES)
        return RdmaEnds(PAIR_ADDRESSES[0], PAIR_ADDRESSES[1], f"{a.device}, {b.device}")
    except (RdmaGidError, RdmaPortDownError):
        pass
    try:
        only = verbs.choose_port_gid(None, device=names[0])
    except (RdmaGidError, RdmaPortDownError) as exc:
        return f"{', '.join(names)} found, but no usable IPv4 GID: {exc}"
    mapped = ipaddress.IPv6Address(only.gid).ipv4_mapped
    if mapped is None:
        return (f"{only.device} has no IPv4-mapped GID (the TCP set-up needs an IPv4 address "
                "on the RDMA netdev); run hwtests/guest/provision.sh --devices")
    return RdmaEnds(str(mapped), str(mapped), f"{only.device} (loopback)")


def require_rdma() -> RdmaEnds:
    """The ends; skips the calling test (or fails it where RDMA is required) without them."""
    ends = find_ends()
    if isinstance(ends, RdmaEnds):
        return ends
    message = f"no RDMA here: {ends}"
    if os.environ.get(REQUIRE_RDMA_ENV) == "1":
        pytest.fail(f"{message} (and {REQUIRE_RDMA_ENV}=1: this machine was set up to have it)")
    pytest.skip(message)


class RdmaTestCase:
    """Base class of the RDMA tests: ``self.ends`` is set, or the test is skipped."""

    ends: RdmaEnds

    @pytest.fixture(autouse=True)
    def _rdma_ends(self) -> None:
        self.ends = require_rdma()

    def pair(self, **options: object) -> tuple:
        """(accepting end, connecting end): a connected pair of RdmaChannels."""
        import threading

        from channels.rdma import RdmaChannel, RdmaListener

        accepted: list = []
        failed: list = []
        with RdmaListener((self.ends.listen, 0), **options) as listener:
            def accept() -> None:
                try:
                    accepted.append(listener.accept(timeout_ns=120_000_000_000))
                except Exception as exc:  # handed to the test's thread below
                    failed.append(exc)

            thread = threading.Thread(target=accept)
            thread.start()
            try:
                near = RdmaChannel(connect=listener.address, bind=self.ends.connect_from,
                                   **options)
            except BaseException:
                listener.close()  # wakes the accepting thread
                thread.join()
                for channel in accepted:
                    channel.close()
                raise
            thread.join()
        if failed:
            near.close()
            raise failed[0]
        return accepted[0], near
