"""UDP multicast: the interface is mandatory, loopback groups, receivers in three namespaces."""

import errno
import os
import subprocess

import pytest

from channels.base import FrameBatch
from channels.errors import ChannelDeviceError, ChannelUserError
from channels.multicast import MULTICAST_MAX_TTL, MulticastChannel
from channels.udp import UdpChannel
from tests.channels.helpers import frames_batch
from tests.netns import Fabric, requires_netns

GROUP = "239.77.0.1"


@pytest.fixture(scope="module")
def loopback_multicast():
    """Loopback multicast needs the flag on lo (ENVIRONMENT.md); it is left on (harmless)."""
    if os.geteuid() == 0:
        subprocess.run(["ip", "link", "set", "lo", "multicast", "on"], check=False)
    return "127.0.0.1"


@pytest.mark.parametrize("interface", [None, ""])
def test_a_multicast_channel_refuses_to_exist_without_an_interface(interface):
    with pytest.raises(ChannelUserError, match="^channels: refusing .*explicit interface"):
        MulticastChannel(GROUP, 47001, interface=interface)


@pytest.mark.parametrize("interface", ["0.0.0.0", "239.1.1.1"])
def test_the_wildcard_or_a_group_is_not_an_interface(interface):
    with pytest.raises(ChannelUserError, match="default route"):
        MulticastChannel(GROUP, 47001, interface=interface, join=False)


def test_the_interface_argument_has_no_default():
    with pytest.raises(TypeError, match="interface"):
        MulticastChannel(GROUP, 47001)  # type: ignore[call-arg]


def test_a_missing_interface_is_a_device_error():
    with pytest.raises(ChannelDeviceError, match="nosuch0.*ENODEV") as info:
        MulticastChannel(GROUP, 47001, interface="nosuch0")
    assert info.value.errno == errno.ENODEV
    with pytest.raises(ChannelDeviceError, match="EADDRNOTAVAIL"):
        MulticastChannel(GROUP, 47001, interface="10.254.254.254", join=False)


def test_ttl_above_the_local_link_and_unicast_groups_are_refused():
    with pytest.raises(ChannelUserError, match="TTL"):
        MulticastChannel(GROUP, 47001, interface="127.0.0.1", ttl=MULTICAST_MAX_TTL + 1)
    with pytest.raises(ChannelUserError, match="not a multicast group"):
        MulticastChannel("127.0.0.1", 47001, interface="127.0.0.1")


def test_loopback_group_reaches_every_member_and_leave_stops_it(loopback_multicast):
    iface = loopback_multicast
    with MulticastChannel(GROUP, 47011, interface=iface) as a, \
            MulticastChannel(GROUP, 47011, interface="lo") as b, \
            MulticastChannel(GROUP, 47011, interface=iface, join=False) as tx, \
            UdpChannel() as replies:
        assert a.groups == {GROUP} and tx.groups == frozenset()
        assert tx.send(frames_batch(4)) == 4
        for member in (a, b):
            got = FrameBatch(8, 2048)
            assert member.receive(got, timeout_ns=2_000_000_000) == 4
            assert member.peer_address(int(got.peer_ids[0])) == tx.local_address
        # a unicast reply (say, a NAK) reaches the send-only channel's own port
        assert replies.send(frames_batch(1), dest=tx.local_address) == 1
        assert tx.receive(FrameBatch(2, 2048), timeout_ns=2_000_000_000) == 1
        b.leave_group(GROUP)
        assert tx.send(frames_batch(2)) == 2
        assert a.receive(FrameBatch(8, 2048), timeout_ns=2_000_000_000) == 2
        # one send delivers to every member on loopback before it returns: a has them, b not
        assert b.receive(FrameBatch(8, 2048), timeout_ns=0) == 0
        with pytest.raises(ChannelUserError, match="not joined"):
            b.leave_group(GROUP)


def test_loopback_multicast_between_processes(peers, loopback_multicast):
    args = ("--group", GROUP, "--port", "47012", "--interface", loopback_multicast)
    receivers = [peers("recv", "mcast", *args, "--count", "300") for _ in range(2)]
    for r in receivers:
        r.wait_ready()
    sender = peers("send", "mcast", *args, "--count", "300", "--key", "6", "--pause-s", "0.003")
    assert sender.result()["sent"] == 300
    for r in receivers:
        got = r.result()
        assert got["frames"] == 300 and got["content_ok"] and got["in_order"]


@requires_netns
def test_multicast_reaches_receivers_in_three_namespaces(peers):
    with Fabric() as fabric:
        sender_host = fabric.add_host()
        hosts = [fabric.add_host() for _ in range(3)]
        receivers = [peers("recv", "mcast", "--group", GROUP, "--port", "47013",
                           "--interface", h.addresses[0], "--count", "200", host=h)
                     for h in hosts]
        for r in receivers:
            r.wait_ready()
        sender = peers("send", "mcast", "--group", GROUP, "--port", "47013", "--interface",
                       sender_host.addresses[0], "--count", "200", "--key", "8",
                       "--pause-s", "0.003", host=sender_host)
        assert sender.result()["sent"] == 200
        for r in receivers:
            got = r.result()
            assert got["frames"] == 200 and got["content_ok"] and got["in_order"]
            assert got["by_key"] == {"8": 200}


def test_a_unicast_channel_refuses_multicast_destinations_before_sending():
    """Without IP_MULTICAST_IF a group datagram would leave through eth0: never let it go."""
    from channels.base import EACH_SLOT
    from channels.udp import peer_id_of

    with UdpChannel() as ch:
        batch = frames_batch(2)
        for dest in ((GROUP, 47020), peer_id_of(GROUP, 47020)):
            with pytest.raises(ChannelUserError, match="refuses to send to multicast group"):
                ch.send(batch, dest=dest)
        batch.peer_ids[:2] = [peer_id_of("127.0.0.1", 47020), peer_id_of(GROUP, 47020)]
        with pytest.raises(ChannelUserError, match="239.77.0.1"):
            ch.send(batch, dest=EACH_SLOT)
        assert ch.stats.frames_out == 0
    with pytest.raises(ChannelUserError, match="MulticastChannel"):
        UdpChannel(dest=(GROUP, 47020))
    with pytest.raises(ChannelUserError, match="MulticastChannel"):
        UdpChannel(dest=(GROUP, 47020), connect=True)


def test_close_twice_is_safe_for_multicast(loopback_multicast):
    ch = MulticastChannel(GROUP, 47021, interface=loopback_multicast)
    ch.close()
    ch.close()
    with pytest.raises(ChannelUserError, match="closed"):
        ch.join_group("239.77.0.2")
