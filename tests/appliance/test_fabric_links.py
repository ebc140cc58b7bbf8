"""The fabric channel with RDMA neighbours (appliance/dataplane/fabric_links.py), on this host.

Real UDP sockets on loopback throughout; below the composite, an RDMA link's channel is a
stand-in (a UDP pair that can be told to push back or to fail as a gone RDMA peer does),
since this host has no RDMA. The RDMA channel itself under the composite is tested in the
soft-RoCE guest: hwtests/appliance/test_rdma_neighbours.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from appliance.config import ConfigError, parse_config
from appliance.dataplane.fabric_links import FabricLinks, RdmaLink
from appliance.node import Appliance
from channels.base import EACH_SLOT, FrameBatch
from channels.rdma import RdmaPeerGoneError, rdma_available
from channels.udp import UdpChannel, peer_id_of
from tests.appliance.helpers import FABRIC_KEY, free_port

WAIT_S = 10.0
FRAME_BYTES = 24
"""Shorter than a frame header: the channels leave the bytes as they are (no send stamp)."""


def frame(tag: int, index: int) -> bytes:
    return bytes([tag]) + index.to_bytes(4, "big") + bytes(FRAME_BYTES - 5)


def tags_and_indexes(frames: list[bytes]) -> list[tuple[int, int]]:
    return [(f[0], int.from_bytes(f[1:5], "big")) for f in frames]


class StandInRdma(UdpChannel):
    """A link's channel: a UDP socket with a default peer that takes at most ``take`` frames
    per send and raises what a gone RDMA peer raises once ``fail`` is set."""

    kind = "rdma"

    def __init__(self, far: UdpChannel, take: int = 1 << 30) -> None:
        super().__init__(("127.0.0.1", 0), dest=far.local_address, name="stand-in")
        self.take = take
        self.fail = False

    def _gone(self) -> None:
        if self.fail:
            raise RdmaPeerGoneError(f"{self.name}: the peer went away (stand-in)")

    def send(self, frames, dest=None):
        self._gone()
        buf, offsets, lengths, count = frames
        count = min(count, self.take)
        return super().send((buf, offsets, lengths, count)) if count else 0

    def receive(self, batch, timeout_ns=0):
        self._gone()
        return super().receive(batch, timeout_ns)


class StandInSetup:
    """Hands out the prepared channels one per ``open`` (blocking once they run out)."""

    def __init__(self, channels: list[StandInRdma]) -> None:
        self.channels = list(channels)
        self.opened = 0
        self._closed = threading.Event()

    def open(self):
        if self.opened == len(self.channels):
            self._closed.wait()
            raise RdmaPeerGoneError("stand-in set-up closed")
        self.opened += 1
        return self.channels[self.opened - 1]

    def close(self) -> None:
        self._closed.set()


def collect(channel, want: int, batch: FrameBatch | None = None) -> list[tuple[bytes, int]]:
    """``want`` frames (bytes, peer id) from ``channel``, polling with timeout 0."""
    batch = batch or FrameBatch(64, 256)
    got: list[tuple[bytes, int]] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < want and time.monotonic() < deadline:
        n = channel.receive(batch, 0)
        got += [(bytes(batch.frame(i)), int(batch.peer_ids[i])) for i in range(n)]
        if not n:
            time.sleep(0.001)
    return got


def until(predicate, what: str):
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"not reached within {WAIT_S} s: {what}"
        time.sleep(0.005)


@pytest.fixture
def fabric():
    """(fabric, link, link's far end, UDP neighbour, the RDMA neighbour's UDP address socket,
    setup) with one link channel ready; all closed afterwards."""
    opened = []

    def udp() -> UdpChannel:
        opened.append(UdpChannel(("127.0.0.1", 0)))
        return opened[-1]

    sock, neighbour, rdma_address, far = udp(), udp(), udp(), udp()
    setup = StandInSetup([StandInRdma(far), StandInRdma(far)])
    opened.extend(setup.channels)
    link = RdmaLink("r", peer_id_of(*rdma_address.local_address), setup, retry_ns=1_000_000,
                    backlog_frames=64, backlog_bytes=64 * FRAME_BYTES)
    channel = FabricLinks(sock, [link]).start()
    until(lambda: link.current() is not None, "the link comes up")
    yield channel, link, far, neighbour, rdma_address, setup
    channel.close()
    for c in opened:
        c.close()


def _batch(frames: list[tuple[bytes, int]]) -> FrameBatch:
    batch = FrameBatch(64, 256)
    for data, peer in frames:
        batch.append(data, peer)
    return batch


def test_a_send_goes_to_the_link_of_an_rdma_peer_and_out_the_socket_for_the_others(fabric):
    channel, link, far, neighbour, rdma_address, _ = fabric
    to_udp = peer_id_of(*neighbour.local_address)
    frames = [(frame(1 if i % 3 else 2, i), link.peer_id if i % 3 else to_udp)
              for i in range(30)]
    assert channel.send(_batch(frames), EACH_SLOT) == 30
    over_link = collect(far, 20)
    over_udp = collect(neighbour, 10)
    assert tags_and_indexes([f for f, _ in over_link]) == [(1, i) for i in range(30) if i % 3]
    assert tags_and_indexes([f for f, _ in over_udp]) == [(2, i) for i in range(0, 30, 3)]
    assert {peer for _, peer in over_udp} == {peer_id_of(*channel.local_address)}
    # nothing went to the RDMA neighbour by UDP: the socket sent the 10 frames that arrived
    # and no more, and its address has nothing (what one send puts on loopback is delivered
    # before the send returns)
    assert link.stats.frames_out == 20 and channel.stats.frames_out == 10
    assert rdma_address.receive(FrameBatch(4, 256), 0) == 0


def test_a_send_with_no_rdma_peer_is_the_sockets_own(fabric):
    channel, _, _, neighbour, _, _ = fabric
    to_udp = peer_id_of(*neighbour.local_address)
    assert channel.send(_batch([(frame(3, i), to_udp) for i in range(5)]), EACH_SLOT) == 5
    assert channel.send(_batch([(frame(4, 9), 0)]), to_udp) == 1
    got = tags_and_indexes([f for f, _ in collect(neighbour, 6)])
    assert got == [(3, 0), (3, 1), (3, 2), (3, 3), (3, 4), (4, 9)]


def test_receive_merges_the_socket_and_the_link_with_the_neighbours_peer_ids(fabric):
    channel, link, far, neighbour, _, _ = fabric
    link_channel = link.current()
    for i in range(40):
        far.send(_batch([(frame(5, i), 0)]), link_channel.local_address)
        neighbour.send(_batch([(frame(6, i), 0)]), channel.local_address)
    got = collect(channel, 80)
    from_link = [f for f, peer in got if peer == link.peer_id]
    from_udp = [f for f, peer in got if peer == peer_id_of(*neighbour.local_address)]
    assert tags_and_indexes(from_link) == [(5, i) for i in range(40)]
    assert tags_and_indexes(from_udp) == [(6, i) for i in range(40)]
    assert link.stats.frames_in == 40


def test_frames_a_link_pushes_back_wait_in_order_and_go_before_newer_ones(fabric):
    channel, link, far, _, _, _ = fabric
    link.current().take = 3
    sent = 0
    for round_ in range(4):
        frames = [(frame(7, round_ * 10 + i), link.peer_id) for i in range(10)]
        sent += channel.send(_batch(frames), EACH_SLOT)
    assert sent == 40 and link.backlog == 40 - 3 * 4  # each send offers the backlog first
    batch = FrameBatch(8, 256)
    until(lambda: (channel.receive(batch, 0), link.backlog)[1] == 0, "the backlog drains")
    got = tags_and_indexes([f for f, _ in collect(far, 40)])
    assert got == [(7, i) for i in range(40)]


def test_a_full_backlog_takes_what_fits_and_the_rest_is_refused(fabric):
    channel, link, _, _, _, _ = fabric
    link.current().take = 0
    frames = [(frame(8, i), link.peer_id) for i in range(64)]
    assert channel.send(_batch(frames), EACH_SLOT) == 64
    assert channel.send(_batch(frames[:5]), EACH_SLOT) == 0  # 64 frames held: no room
    assert link.backlog == 64


def test_a_failed_link_drops_and_counts_then_comes_back_by_itself(fabric):
    channel, link, far, _, _, setup = fabric
    first = link.current()
    first.fail = True
    batch = FrameBatch(8, 256)
    assert channel.receive(batch, 0) == 0  # the link's receive raised: it is down
    counters = channel.status_counters()
    assert counters["rdma_link_failures"] == 1 and first.closed
    # until the set-up thread has made the next channel, the neighbour's frames are dropped
    until(lambda: link.current() is not None, "the link comes back")
    assert setup.opened == 2
    counters = channel.status_counters()
    assert counters["rdma_link_connects"] == 2 and counters["rdma_links_up"] == 1
    assert counters["rdma_link_up_r"] == 1
    assert channel.send(_batch([(frame(9, 1), link.peer_id)]), EACH_SLOT) == 1
    assert tags_and_indexes([f for f, _ in collect(far, 1)]) == [(9, 1)]
    assert link.stats.frames_out == 1  # one stats object across the link's channels


def test_a_link_that_is_down_drops_its_neighbours_frames_and_counts_them():
    with UdpChannel(("127.0.0.1", 0)) as sock:
        setup = StandInSetup([])
        link = RdmaLink("r", peer_id_of("127.0.0.1", 9), setup)
        with FabricLinks(sock, [link]).start() as channel:
            assert channel.send(_batch([(frame(1, i), link.peer_id) for i in range(3)]),
                                EACH_SLOT) == 3
            assert link.stats.drop_reasons == {"link_down": 3}
            assert channel.status_counters()["rdma_links_up"] == 0
            names = [name for name, _ in channel.status_parts()]
            assert names == ["fabric-rdma:r"]


def test_the_status_has_a_row_and_counters_for_each_rdma_link(fabric):
    from appliance.dataplane.status_channels import channel_row, sample_channel

    channel, link, far, _, _, _ = fabric
    channel.send(_batch([(frame(1, i), link.peer_id) for i in range(4)]), EACH_SLOT)
    [(name, part)] = channel.status_parts()
    row = channel_row(sample_channel(name, part))
    assert (row["name"], row["kind"], row["frames_out"]) == ("fabric-rdma:r", "rdma", 4)
    assert channel.status_counters()["rdma_link_connects"] == 1
    assert channel.wait_fds() is None  # the links have no descriptor: the agent must not block
    assert len(collect(far, 4)) == 4


@pytest.mark.skipif(rdma_available()[0], reason="this host has RDMA: the refusal is for hosts "
                    "without it")
@pytest.mark.parametrize("dataplane", ["process", "thread"])
def test_an_rdma_neighbour_on_a_host_without_rdma_is_a_config_error_naming_the_key(dataplane):
    listen = free_port()
    doc = {"appliance": {"name": "a", "dataplane": dataplane},
           "fabric": {"listen": f"127.0.0.1:{listen}", "key": FABRIC_KEY},
           "neighbours": [{"name": "b", "address": "127.0.0.1:47999", "transport": "rdma",
                           "rdma_port": free_port()}]}
    app = Appliance(parse_config(doc))
    with pytest.raises(ConfigError) as info:
        app.start()
    assert str(info.value).startswith("config: neighbours[0].transport: RDMA is not available")
    assert not app.channels  # the fabric channel it had opened was closed
    UdpChannel(("127.0.0.1", listen)).close()  # the fabric port was released
