"""Two appliance images side by side: a core (P&M) and an edge, joined by a QEMU socket
network on 127.0.0.1 (TCP between the two QEMU processes; nothing leaves the host), a native
publisher at the core and a subscriber at the edge; at the edge's MQTT listener a paho-mqtt
subscriber receives the core's native messages and a paho-mqtt publisher reaches a native
subscriber at the core (anonymous MQTT: an edge with a remote P&M checks no passwords,
docs/mqtt.md; the core's P&M gives the identity ``anonymous`` its entitlements).

Client traffic cannot come through QEMU's user network here: with ``restrict=on`` libslirp
drops every UDP datagram the guest sends (its replies to a forwarded port included), and
without it the guest could reach the outside. So both QEMUs run in a network namespace the
test makes (``ip netns``), each with a tap NIC on a bridge there, and the clients run in that
namespace too (``fabric_clients.py``); the namespace has no route anywhere else.

The second test makes the same two appliances RDMA neighbours (``transport = "rdma"``,
docs/rdma.md): each image's ``topicwire-rxe`` puts soft-RoCE (rxe0) on the NIC carrying its
fabric address, the socket netdev's, and the neighbour link is an RC queue pair between the
two guests; the fabric's UDP socket then carries nothing between them. Where the guest cannot
(no rdma_rxe, no GID on the fabric NIC) it skips with the appliance's own reason.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from appliance.ops.image.boot import BootFailure, Guest, free_port

ROOT = Path(__file__).resolve().parents[2]
READY_DEADLINE_S = 300.0
EXCHANGE_DEADLINE_S = 180.0
MESSAGES = 20
BRIDGE = "10.78.0.254"
NODES = {  # name: (fabric address, fabric MAC, client address, client MAC)
    "core1": ("10.77.0.1", "52:54:00:77:00:01", "10.78.0.1", "52:54:00:78:00:01"),
    "edge1": ("10.77.0.2", "52:54:00:77:00:02", "10.78.0.2", "52:54:00:78:00:02"),
}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def netns():
    if os.geteuid() != 0:
        pytest.skip("the fabric test makes a network namespace and taps: needs root")
    name = f"twimg{secrets.token_hex(3)}"
    _ip("netns", "add", name)
    try:
        ns = ("netns", "exec", name, "ip")
        _ip(*ns[:3], "ip", "link", "set", "lo", "up")
        _ip(*ns[:3], "ip", "link", "add", "br0", "type", "bridge")
        _ip(*ns[:3], "ip", "addr", "add", f"{BRIDGE}/24", "dev", "br0")
        _ip(*ns[:3], "ip", "link", "set", "br0", "up")
        for i in range(len(NODES)):
            _ip(*ns[:3], "ip", "tuntap", "add", f"tap{i}", "mode", "tap")
            _ip(*ns[:3], "ip", "link", "set", f"tap{i}", "master", "br0", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


RDMA_PORT = 47490


def _files(tmp: Path, name: str, key: str, rdma: bool = False) -> tuple[Path, list[Path]]:
    other = "edge1" if name == "core1" else "core1"
    fabric, fabric_mac, client, client_mac = NODES[name]
    pm = ("""
        [pm]
        mode = "embedded"
        require_passwords = false

        [pm.identities.feed]
        publish = ["img/#"]
        subscribe = []

        [pm.identities.desk]
        publish = []
        subscribe = ["#"]

        [pm.identities.anonymous]
        publish = ["img/fromedge/#"]
        subscribe = ["img/#"]
        """ if name == "core1" else """
        [pm]
        mode = "remote"

        [mqtt]
        listen = "0.0.0.0:1883"
        allow_anonymous = true
        """)
    config = tmp / f"{name}.toml"
    config.write_text(textwrap.dedent(f"""
        [appliance]
        name = "{name}"
        role = "{"core" if name == "core1" else "edge"}"

        [fabric]
        listen = "{fabric}:47470"
        key = "{key}"

        [[neighbours]]
        name = "{other}"
        address = "{NODES[other][0]}:47470"
        {f'transport = "rdma"{chr(10)}        rdma_port = {RDMA_PORT}' if rdma else ""}

        [clients]
        udp = "0.0.0.0:47471"

        [mgmt]
        listen = "0.0.0.0:8470"
        """) + textwrap.dedent(pm))
    network = tmp / "10-topicwire.network"
    network.write_text(f"[Match]\nMACAddress={fabric_mac}\n\n[Network]\nAddress={fabric}/24\n"
                       "LinkLocalAddressing=no\nIPv6AcceptRA=no\n")
    clients = tmp / "11-clients.network"
    clients.write_text(f"[Match]\nMACAddress={client_mac}\n\n[Network]\nAddress={client}/24\n"
                       "LinkLocalAddressing=no\nIPv6AcceptRA=no\n")
    return config, [network, clients]


def _wait_listening(netns: str, port: int, deadline_s: float) -> None:
    """Until a TCP socket listens on ``port`` in ``netns`` (QEMU's socket netdev; a probe
    connection would take the one it accepts, so it is looked up, not dialled)."""
    deadline = time.monotonic() + deadline_s
    while not subprocess.run(["ip", "netns", "exec", netns, "ss", "-Hltn",
                              f"sport = :{port}"], capture_output=True, text=True).stdout:
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing listens on 127.0.0.1:{port} in {netns} after "
                                 f"{deadline_s:g} s (the core's QEMU)")
        time.sleep(0.05)


def _boot(image: Path, tmp_path: Path, netns: str, key: str, rdma: bool
          ) -> dict[str, Guest]:
    """Both guests started (the core's QEMU first: its socket netdev listens), not waited
    for; the caller kills them."""
    link = free_port()
    guests: dict[str, Guest] = {}
    for i, name in enumerate(NODES):
        work = tmp_path / name
        work.mkdir()
        config, networks = _files(work, name, key, rdma)
        side = f"listen=127.0.0.1:{link}" if name == "core1" else f"connect=127.0.0.1:{link}"
        guests[name] = Guest(
            image, work, config, extra_files=networks, name=name,
            wrap=["ip", "netns", "exec", netns],
            netdevs=[f"-netdev socket,id=fab,{side}",
                     f"-device virtio-net-pci,netdev=fab,mac={NODES[name][1]}",
                     f"-netdev tap,id=cl,ifname=tap{i},script=no,downscript=no",
                     f"-device virtio-net-pci,netdev=cl,mac={NODES[name][3]}"]).start()
        if name == "core1":  # its socket netdev listens before the edge's connects
            _wait_listening(netns, link, READY_DEADLINE_S)
    return guests


def _exchange(netns: str, guests: dict[str, Guest], started: float) -> dict:
    """fabric_clients in the namespace: native and MQTT streams through both appliances."""
    done = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-m",
         "hwtests.images.fabric_clients", NODES["core1"][2], NODES["edge1"][2],
         str(MESSAGES), str(EXCHANGE_DEADLINE_S)],
        cwd=ROOT, capture_output=True, text=True, timeout=EXCHANGE_DEADLINE_S + 60,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {}
    print(f"fabric: {result} ({time.monotonic() - started:.0f} s from the first QEMU "
          "start)")
    assert done.returncode == 0, (result, done.stderr[-2000:], guests["core1"].tail(),
                                  guests["edge1"].tail())
    assert result["received"] >= MESSAGES and result["mqtt_received"] >= MESSAGES
    assert result["core_received_from_mqtt"] >= MESSAGES
    return result


def test_core_and_edge_images_carry_messages(image: Path, tmp_path: Path, netns: str) -> None:
    started = time.monotonic()
    guests = _boot(image, tmp_path, netns, secrets.token_hex(32), rdma=False)
    try:
        for name, guest in guests.items():
            ready = guest.wait_ready(READY_DEADLINE_S)
            print(f"{name}: boot-to-ready {ready['ready_s']} s (two guests at once, host load "
                  f"{os.getloadavg()[0]:.1f})")
        _exchange(netns, guests, started)
        for guest in guests.values():
            guest.powerdown()
    finally:
        for guest in guests.values():
            guest.kill()


def _rxe_line(guest: Guest) -> str:
    return next((line for line in guest.lines if "topicwire-rxe:" in line),
                "(no topicwire-rxe line on the console)")


def test_core_and_edge_images_are_rdma_neighbours(image: Path, tmp_path: Path,
                                                  netns: str) -> None:
    started = time.monotonic()
    guests = _boot(image, tmp_path, netns, secrets.token_hex(32), rdma=True)
    try:
        for name, guest in guests.items():
            try:
                ready = guest.wait_ready(READY_DEADLINE_S)
            except BootFailure as exc:
                if exc.config_error and "rdma" in exc.config_error:
                    pytest.skip(f"soft-RoCE between the two guests: {name} refused its RDMA "
                                f"neighbour: {exc.config_error} ({_rxe_line(guest)})")
                raise
            print(f"{name}: boot-to-ready {ready['ready_s']} s with an RDMA neighbour "
                  f"({_rxe_line(guest)}; host load {os.getloadavg()[0]:.1f})")
            assert "rxe0 on eth1 (the fabric address" in _rxe_line(guest), guest.tail()
        result = _exchange(netns, guests, started)
        for side, other in (("core", "edge1"), ("edge", "core1")):
            fabric = result["fabric"][side]
            link = fabric["channels"].get(f"fabric-rdma:{other}")
            assert link is not None and link["kind"] == "rdma", fabric
            assert link["frames_out"] > 0 and link["frames_in"] > 0, fabric
            # everything between the two went over RDMA: the fabric's UDP socket sent nothing
            assert fabric["channels"]["fabric"]["frames_out"] == 0, fabric
            assert fabric["counters"].get("rdma_link_failures", 0) == 0, fabric
        for guest in guests.values():
            guest.powerdown()
    finally:
        for guest in guests.values():
            guest.kill()
