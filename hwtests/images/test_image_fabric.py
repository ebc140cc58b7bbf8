"""Two appliance images side by side: a core (P&M) and an edge, joined by a QEMU socket
network on 127.0.0.1 (TCP between the two QEMU processes; nothing leaves the host), a native
publisher on the host at the core and a subscriber at the edge (their UDP forwarded from
127.0.0.1 by each guest's restricted user network)."""

from __future__ import annotations

import secrets
import textwrap
import time
from pathlib import Path

from appliance.ops.image.boot import Guest, free_port

READY_DEADLINE_S = 300.0
ROUTE_DEADLINE_S = 120.0
MESSAGES = 20
FABRIC = {"core1": ("10.77.0.1", "52:54:00:77:00:01"), "edge1": ("10.77.0.2", "52:54:00:77:00:02")}


def _files(tmp: Path, name: str, key: str) -> tuple[Path, Path]:
    other = "edge1" if name == "core1" else "core1"
    address, mac = FABRIC[name]
    if name == "core1":
        pm = """
            [pm]
            mode = "embedded"
            require_passwords = false

            [pm.identities.feed]
            publish = ["img/#"]
            subscribe = []

            [pm.identities.desk]
            publish = []
            subscribe = ["#"]
            """
    else:
        pm = """
            [pm]
            mode = "remote"
            """
    config = tmp / f"{name}.toml"
    config.write_text(textwrap.dedent(f"""
        [appliance]
        name = "{name}"
        role = "{"core" if name == "core1" else "edge"}"

        [fabric]
        listen = "{address}:47470"
        key = "{key}"

        [[neighbours]]
        name = "{other}"
        address = "{FABRIC[other][0]}:47470"

        [clients]
        udp = "0.0.0.0:47471"

        [mgmt]
        listen = "0.0.0.0:8470"
        """) + textwrap.dedent(pm))
    network = tmp / "10-fabric.network"
    network.write_text(f"[Match]\nMACAddress={mac}\n\n[Network]\nAddress={address}/24\n"
                       "LinkLocalAddressing=no\nIPv6AcceptRA=no\n")
    return config, network


def test_core_and_edge_images_carry_messages(image: Path, tmp_path: Path) -> None:
    from appliance.client.api import connect

    key = secrets.token_hex(32)
    link = free_port()
    guests: dict[str, Guest] = {}
    ports = {}
    try:
        for name in ("core1", "edge1"):
            work = tmp_path / name
            work.mkdir()
            config, network = _files(work, name, key)
            side = f"listen=127.0.0.1:{link}" if name == "core1" else f"connect=127.0.0.1:{link}"
            ports[name] = (free_port(), free_port(2))
            guests[name] = Guest(
                image, work, config, extra_files=[network], mgmt_port=ports[name][0],
                udp_ports=[(ports[name][1], 47471)], name=name,
                netdevs=[f"-netdev socket,id=fab,{side}",
                         f"-device virtio-net-pci,netdev=fab,mac={FABRIC[name][1]}"]).start()
            time.sleep(1.0)  # the core's socket listens before the edge connects
        for name, guest in guests.items():
            ready = guest.wait_ready(READY_DEADLINE_S)
            print(f"{name}: boot-to-ready {ready['ready_s']} s (two guests at once)")
        deadline = time.monotonic() + ROUTE_DEADLINE_S
        while True:
            _, status = guests["edge1"].http("/status")
            up = [n for n in (status or {}).get("neighbours", [])
                  if str(n.get("state", "")).lower() in ("up", "full", "established")]
            if up:
                break
            assert time.monotonic() < deadline, (status, guests["edge1"].tail())
            time.sleep(1.0)
        sub_client = connect(f"udp://127.0.0.1:{ports['edge1'][1]}", "desk")
        pub_client = connect(f"udp://127.0.0.1:{ports['core1'][1]}", "feed")
        try:
            sub = sub_client.subscribe("img/#")
            got: list[bytes] = []
            deadline = time.monotonic() + ROUTE_DEADLINE_S
            started = time.monotonic()
            sent = 0
            while len(got) < MESSAGES and time.monotonic() < deadline:
                pub_client.publish("img/ticks", f"m{sent}".encode())
                pub_client.flush()
                sent += 1
                message = sub.get(timeout=1.0)
                while message is not None:
                    got.append(bytes(message.payload))
                    message = sub.get(timeout=0.05)
            print(f"fabric: {len(got)} messages core1 -> edge1 of {sent} sent "
                  f"({time.monotonic() - started:.1f} s, the first ones before the route "
                  "settled may be dropped)")
            assert len(got) >= MESSAGES, (guests["core1"].tail(), guests["edge1"].tail())
        finally:
            pub_client.close()
            sub_client.close()
        for guest in guests.values():
            guest.powerdown()
    finally:
        for guest in guests.values():
            guest.kill()
