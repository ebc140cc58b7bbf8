"""RDMA clients (appliance/dataplane/client_links.py, appliance/client/rdma.py), on this host.

Config checks, URL parsing and the refusals on a host without RDMA; the client channel's
composite with real UDP sockets on loopback, where only the RDMA channel an accepted client
makes is a stand-in (a UDP socket that fails as a gone RDMA peer does, from
tests/appliance/test_fabric_links.py); last, a real appliance whose RDMA client endpoint
accepts stand-ins, with real clients logging in, publishing and subscribing through it. The
RDMA channel under the composite is tested in the soft-RoCE guest:
hwtests/appliance/test_rdma_clients.py.
"""

from __future__ import annotations

import errno
import queue
import subprocess

import pytest

from appliance.client import Client, ClientError, connect
from appliance.client.rdma import parse_rdma_url
from appliance.config import ConfigError, parse_config
from appliance.dataplane import client_links
from appliance.dataplane.client_links import RDMA_CLIENT_PEER_BASE, ClientLinks
from appliance.node import Appliance
from channels.base import EACH_SLOT, FrameBatch
from channels.errors import ChannelDeviceError
from channels.rdma import rdma_available
from channels.udp import UdpChannel, peer_id_of
from tests.appliance.helpers import CLI, ROOT, free_port
from tests.appliance.test_fabric_links import (
    StandInRdma,
    _batch,
    collect,
    frame,
    tags_and_indexes,
    until,
)

NO_RDMA = pytest.mark.skipif(rdma_available()[0], reason="this host has RDMA: the refusal is "
                             "for hosts without it (the guest tests the RDMA case)")


def _doc(**clients) -> dict:
    # a thread data path: the stand-in RDMA links are objects of this process
    return {"appliance": {"name": "core1", "dataplane": "thread"},
            "pm": {"anonymous": True, "require_passwords": False},
            "clients": {"udp": "127.0.0.1:47999", **clients}}


# --- config ----------------------------------------------------------------------------------

def test_an_rdma_client_endpoint_is_parsed_with_its_device_keys():
    cfg = parse_config(_doc(rdma="10.0.0.1:47472", rdma_device="rxe0", rdma_gid_index=1))
    spec = cfg.clients_rdma
    assert (spec.local, spec.port, spec.device, spec.gid_index) == ("10.0.0.1", 47472, "rxe0", 1)
    assert parse_config(_doc()).clients_rdma is None


@pytest.mark.parametrize("clients, key", [
    ({"rdma": "10.0.0.1"}, "clients.rdma"),
    ({"rdma": "rxe0:47472"}, "clients.rdma"),
    ({"rdma": "10.0.0.1:0"}, "clients.rdma"),
    ({"rdma": "0.0.0.0:47472"}, "clients.rdma"),
    ({"rdma": "10.0.0.1:47472", "rdma_device": "rxe 0"}, "clients.rdma_device"),
    ({"rdma": "10.0.0.1:47472", "rdma_gid_index": -1}, "clients.rdma_gid_index"),
    ({"rdma_device": "rxe0"}, "clients.rdma_device"),
    ({"rdma_gid_index": 1}, "clients.rdma_gid_index"),
])
def test_a_bad_rdma_client_key_is_one_error_naming_it(clients, key):
    with pytest.raises(ConfigError) as err:
        parse_config(_doc(**clients))
    assert str(err.value).startswith(f"config: {key}:"), str(err.value)


def test_rdma_clients_need_the_client_udp_endpoint():
    doc = _doc(rdma="10.0.0.1:47472")
    del doc["clients"]["udp"]
    with pytest.raises(ConfigError, match=r"clients\.rdma: needs clients\.udp"):
        parse_config(doc)


@NO_RDMA
def test_an_rdma_client_endpoint_on_a_host_without_rdma_is_a_config_error_naming_the_key():
    cfg = parse_config(_doc(rdma=f"127.0.0.1:{free_port()}", udp=f"127.0.0.1:{free_port()}"))
    with pytest.raises(ConfigError, match=r"clients\.rdma: RDMA is not available here"):
        Appliance(cfg).start()


@NO_RDMA
def test_run_exits_2_naming_clients_rdma_on_a_host_without_rdma(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f'[appliance]\nname = "c"\n[pm]\nanonymous = true\n'
                    'require_passwords = false\n[clients]\n'
                    f'udp = "127.0.0.1:{free_port()}"\nrdma = "127.0.0.1:{free_port()}"\n')
    proc = subprocess.run([*CLI, "run", "--config", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "clients.rdma" in proc.stderr and "RDMA is not available" in proc.stderr


# --- the client's URL ------------------------------------------------------------------------

def test_an_rdma_url_gives_host_and_port():
    assert parse_rdma_url("rdma://10.0.0.1:47472") == ("10.0.0.1", 47472)


@pytest.mark.parametrize("url", ["rdma://10.0.0.1", "rdma://host:1", "rdma://0.0.0.0:47472",
                                 "rdma://10.0.0.1:99999"])
def test_a_bad_rdma_url_is_a_client_error_naming_it(url):
    with pytest.raises(ClientError) as err:
        parse_rdma_url(url)
    assert url in str(err.value)


@NO_RDMA
def test_connecting_over_rdma_on_a_host_without_rdma_says_what_to_do():
    with pytest.raises(ClientError, match=r"RDMA is not available on this host.*udp://"):
        connect(f"rdma://127.0.0.1:{free_port()}", "x")


# --- the composite ---------------------------------------------------------------------------

class StandInAcceptor:
    """Hands out the channels put on ``ready``, one per ``accept``; ETIMEDOUT otherwise."""

    def __init__(self) -> None:
        self.ready: queue.Queue = queue.Queue()
        self.closed = False

    def accept(self, timeout_ns: int):
        try:
            return self.ready.get(timeout=min(timeout_ns / 1e9, 0.05))
        except queue.Empty:
            raise ChannelDeviceError("stand-in: nobody came", errno=errno.ETIMEDOUT) from None

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def clients():
    """(client channel, acceptor, new client: () -> (its stand-in link channel, its far
    end)); all closed afterwards."""
    opened: list = []

    def udp() -> UdpChannel:
        opened.append(UdpChannel(("127.0.0.1", 0)))
        return opened[-1]

    acceptor = StandInAcceptor()
    channel = ClientLinks(udp(), acceptor).start()

    def new_client():
        far = udp()
        link_channel = StandInRdma(far)
        opened.append(link_channel)
        acceptor.ready.put(link_channel)
        return link_channel, far

    yield channel, acceptor, new_client
    channel.close()
    for c in opened:
        c.close()
    assert acceptor.closed


def _link_peers(channel: ClientLinks, want: int) -> list[int]:
    def adopted() -> bool:
        channel.receive(FrameBatch(4, 256), 0)
        return len(channel.links) == want
    until(adopted, f"{want} clients adopted")
    return [link.peer_id for link in channel.links]


def test_each_accepted_client_gets_its_own_peer_id_above_every_udp_peer_id(clients):
    channel, _, new_client = clients
    fars = [new_client()[1] for _ in range(3)]
    peers = _link_peers(channel, 3)
    assert len(set(peers)) == 3 and min(peers) >= RDMA_CLIENT_PEER_BASE
    assert peer_id_of("255.255.255.255", 65_535) < RDMA_CLIENT_PEER_BASE
    for i, far in enumerate(fars):
        far.send(_batch([(frame(i, 0), 0)]), channel.links[i].channel.local_address)
    got = collect(channel, 3)
    assert sorted((f[0], peer) for f, peer in got) == [(i, peers[i]) for i in range(3)]


def test_a_send_is_split_between_rdma_clients_and_udp_clients(clients):
    channel, _, new_client = clients
    _, far_a = new_client()
    _, far_b = new_client()
    a, b = _link_peers(channel, 2)
    udp_client = UdpChannel(("127.0.0.1", 0))
    try:
        to_udp = peer_id_of(*udp_client.local_address)
        frames = [(frame(i % 3, i), (a, b, to_udp)[i % 3]) for i in range(30)]
        assert channel.send(_batch(frames), EACH_SLOT) == 30
        for far, tag in ((far_a, 0), (far_b, 1), (udp_client, 2)):
            got = tags_and_indexes([f for f, _ in collect(far, 10)])
            assert got == [(tag, i) for i in range(30) if i % 3 == tag]
    finally:
        udp_client.close()


def test_a_failed_client_channel_is_closed_counted_and_its_frames_dropped(clients):
    channel, _, new_client = clients
    gone, _ = new_client()
    _, far_b = new_client()
    a, b = _link_peers(channel, 2)
    gone.fail = True
    until(lambda: (channel.receive(FrameBatch(4, 256), 0) or True) and len(channel.links) == 1,
          "the failed client's link is removed")
    assert gone.closed
    counters = channel.status_counters()
    assert counters["rdma_clients_closed"] == 1 and counters["rdma_clients_up"] == 1
    assert counters["rdma_clients_accepted"] == 2
    assert channel.send(_batch([(frame(7, 0), a), (frame(8, 0), b)]), EACH_SLOT) == 2
    assert channel.stats.drop_reasons.get("no_link") == 1
    assert tags_and_indexes([f for f, _ in collect(far_b, 1)]) == [(8, 0)]
    _, _far_c = new_client()
    (c,) = set(_link_peers(channel, 2)) - {b}
    assert c not in (a, b)  # a peer id is never reused


def test_the_status_has_a_row_per_connected_rdma_client(clients):
    channel, _, new_client = clients
    new_client()
    new_client()
    _link_peers(channel, 2)
    rows = [name for name, part in channel.status_parts() if part.kind == "rdma"]
    assert rows == ["clients-rdma:1", "clients-rdma:2"]


# --- a real appliance, its RDMA clients' channels stand-ins ----------------------------------

def test_clients_behind_the_rdma_endpoint_log_in_publish_and_subscribe(monkeypatch):
    """The appliance's client channel is the composite; each client's channel is a UDP
    socket facing its stand-in link channel, so only the RDMA channel object is replaced."""
    acceptor = StandInAcceptor()
    monkeypatch.setattr(client_links, "open_client_links",
                        lambda cfg, udp: ClientLinks(udp, acceptor).start())
    cfg = parse_config(_doc(udp=f"127.0.0.1:{free_port()}", rdma=f"127.0.0.1:{free_port()}"))
    opened: list = []

    def rdma_client(identity: str) -> Client:
        far = UdpChannel(("127.0.0.1", 0))
        link_channel = StandInRdma(far)
        opened.extend([far, link_channel])
        acceptor.ready.put(link_channel)
        return Client(_Facing(far, link_channel.local_address), identity)

    try:
        with Appliance(cfg) as node:
            sub = rdma_client("sub")
            pub = rdma_client("pub")
            try:
                s = sub.subscribe("prices/#")
                g = sub.subscribe("orders/#", qos="guaranteed")
                for i in range(50):
                    pub.publish("prices/eu", b"p%d" % i)
                    pub.publish("orders/x", b"o%d" % i, qos="guaranteed")
                pub.flush()
                got = [s.get(timeout=10) for _ in range(50)]
                ordered = [g.get(timeout=10) for _ in range(50)]
                assert [m.payload for m in got] == [b"p%d" % i for i in range(50)]
                assert [m.payload for m in ordered] == [b"o%d" % i for i in range(50)]
                until(lambda: node.status().get("counters", {}).get("rdma_clients_up") == 2,
                      "the status counts two RDMA clients")
                names = {row["name"] for row in node.status()["channels"]}
                assert {"clients-rdma:1", "clients-rdma:2"} <= names
            finally:
                pub.close()
                sub.close()
            assert node.failure() is None
    finally:
        for c in opened:  # the appliance closed the stand-ins on its side already
            c.close()


class _Facing:
    """A client's end of a stand-in RDMA channel: a UDP socket that sends to it."""

    kind = "rdma"

    def __init__(self, sock: UdpChannel, to: tuple[str, int]) -> None:
        self.sock, self.to = sock, to

    def __getattr__(self, name: str):
        return getattr(self.sock, name)

    def send(self, frames, dest=None):
        return self.sock.send(frames, self.to)
