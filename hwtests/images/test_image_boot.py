"""Appliance images booted under QEMU on this host (TCG): ready within the deadline, the
management API through a forwarded loopback port, a clean power-off by the management API's
shutdown command and by the ACPI power button, an upgrade that keeps the config and state
disks, the root found by its label on a SATA (AHCI) and an NVMe disk, a boot through UEFI
firmware and the image's own boot loader with the config on a USB stick, a refused config, and
a config that names the state disk's directory booted without one.

The upgrade shares the first boot with the other checks (a boot under TCG is a minute): boot
image N (a virtio disk) with a config disk and a state disk, check it, publish a retained
MQTT message (kept by ``mqtt.state_dir`` on the state disk), power it off; boot image N+1
(another image file: the edge-default build of the same tree, the only other build a test run
has) as a SATA disk on AHCI (/dev/sda, as on bare metal) with the same config and state
disks: the appliance comes back with the same name, id and role, and the retained message is
there. The image is booted in snapshot mode (its writes are dropped), so only the state disk
can carry the message across.

QEMU's only network here is its user network with ``restrict=on`` (nothing leaves the host;
the host reaches the guest through ports forwarded from 127.0.0.1).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from appliance.ops.image.boot import (
    BOOT_GOAL_S,
    READY_RE,
    BootFailure,
    Guest,
    config_disk,
    free_port,
    state_disk,
)

READY_DEADLINE_S = 240.0
"""Fail past this (TCG on a shared 2-core host); the goal (BOOT_GOAL_S) is printed, not asserted."""
TOKEN = "image-test-token"
STATE_DIR = "/var/lib/topicwire/state"
RETAINED_TOPIC = "img/kept"
RETAINED = b"kept across the image replacement"
MQTT_PORT = 1883


def _mqtt(port: int, client_id: str):
    import threading

    import paho.mqtt.client as mqtt

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                         protocol=mqtt.MQTTv311)
    connected, got = threading.Event(), []
    client.on_connect = lambda *_a: connected.set()
    client.on_message = lambda _c, _u, msg: got.append((msg.topic, bytes(msg.payload),
                                                        msg.retain))
    client.connect("127.0.0.1", port, keepalive=60)
    client.loop_start()
    assert connected.wait(60), f"mqtt: no CONNACK through 127.0.0.1:{port}"
    return client, got


def _publish_retained(port: int) -> None:
    client, _ = _mqtt(port, "img-retain-pub")
    try:
        info = client.publish(RETAINED_TOPIC, RETAINED, qos=1, retain=True)
        info.wait_for_publish(60)  # the PUBACK: recorded in the state store first
        assert info.is_published(), "mqtt: no PUBACK for the retained message"
    finally:
        client.disconnect()
        client.loop_stop()


def _retained_after_upgrade(port: int, deadline_s: float = 60.0) -> list:
    import time

    client, got = _mqtt(port, "img-retain-sub")
    try:
        client.subscribe(RETAINED_TOPIC, qos=1)
        deadline = time.monotonic() + deadline_s
        while not got and time.monotonic() < deadline:
            time.sleep(0.1)
        return got
    finally:
        client.disconnect()
        client.loop_stop()


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topicwire.toml"
    path.write_text(textwrap.dedent(text))
    return path


def _first_boot(guest: Guest, mqtt_port: int) -> tuple:
    """Ready, the token on /status, /metrics, a retained MQTT message published, then POST
    /shutdown powers the guest off."""
    ready = guest.wait_ready(READY_DEADLINE_S)
    print(f"boot-to-ready: {ready['ready_s']} s after QEMU started (ready line "
          f"{ready['ready_line_s']} s; goal {BOOT_GOAL_S:.0f} s: "
          f"{'met' if ready['ready_s'] <= BOOT_GOAL_S else 'missed'})")
    assert guest.http("/status")[0] == 401, guest.tail()  # reads beyond loopback: token
    code, status = guest.http("/status", token=TOKEN)
    assert code == 200, guest.tail()
    node = status["node"]
    code, _ = guest.http("/metrics", token=TOKEN)
    assert code in (200, 0)  # /metrics is text: http() parses JSON only
    assert f"topicwire-state: state disk /dev/vdc at {STATE_DIR}" in "\n".join(guest.lines), \
        guest.tail()
    # direct kernel boot: the UEFI test's line below is not printed by every boot
    assert "booted through UEFI" not in "\n".join(guest.lines), guest.tail()
    _publish_retained(mqtt_port)
    answer, off_s = guest.shutdown(TOKEN)
    print(f"power-off: QEMU ended {off_s:.1f} s after POST /shutdown ({answer})")
    assert guest.proc.returncode == 0, guest.tail()
    console = "\n".join(guest.lines)
    for line in ("shutdown requested through the management API (image boot)",
                 "draining (shutdown through the management API: image boot)",
                 "drained in", "appliance stopped",
                 "topicwire: shutdown through the management API: powering off"):
        assert line in console, (line, guest.tail())
    return node["name"], node.get("id"), node.get("role")


def _upgraded_boot(guest: Guest, mqtt_port: int) -> tuple:
    """Ready again from a SATA disk with the same config and state disks, the retained
    message still there, then the ACPI power button powers it off."""
    ready = guest.wait_ready(READY_DEADLINE_S)
    code, status = guest.http("/status", token=TOKEN)
    assert code == 200, guest.tail()
    node = status["node"]
    print(f"upgraded (root on AHCI): {node['name']} ready {ready['ready_s']} s")
    console = "\n".join(guest.lines)
    assert f"topicwire-state: state disk /dev/vdb at {STATE_DIR}" in console, guest.tail()
    got = _retained_after_upgrade(mqtt_port)
    print(f"retained after the upgrade: {got}")
    assert got == [(RETAINED_TOPIC, RETAINED, True)], (got, guest.tail())
    off_s = guest.powerdown()  # ACPI's power button: systemd stops it (SIGTERM)
    print(f"power button: QEMU ended {off_s:.1f} s after it")
    assert guest.proc.returncode == 0, guest.tail()
    assert "SIGTERM received" in "\n".join(guest.lines), guest.tail()
    return node["name"], node.get("id"), node.get("role")


def test_ready_status_clean_poweroff_and_upgrade_keeping_the_config_disk(
        image: Path, tmp_path: Path) -> None:
    from appliance.ops.image.build import build

    from .conftest import IMAGE_DIR

    config = _config(tmp_path, f"""
        [appliance]
        name = "imgedge"
        id = 4242
        role = "edge"

        [clients]
        udp = "0.0.0.0:47471"

        [mgmt]
        listen = "0.0.0.0:8470"
        token = "{TOKEN}"

        [pm.identities.anonymous]
        publish = ["img/#"]
        subscribe = ["img/#"]

        [mqtt]
        listen = "0.0.0.0:{MQTT_PORT}"
        allow_anonymous = true
        state_dir = "{STATE_DIR}/mqtt"
        """)
    disk = config_disk(tmp_path / "cfg.vfat", config)
    state = state_disk(tmp_path / "state.ext4")
    seen = []
    for n, check in enumerate((_first_boot, _upgraded_boot)):
        path = image if n == 0 else IMAGE_DIR / build("edge", IMAGE_DIR)["image"]
        mqtt_port = free_port()
        guest = Guest(path, tmp_path / f"boot{n}", config_drive=disk, mgmt_port=free_port(),
                      name=f"boot{n}", state_drive=state, forwards=[(mqtt_port, MQTT_PORT)],
                      root_bus="virtio" if n == 0 else "ahci").start()
        try:
            seen.append(check(guest, mqtt_port))
        finally:
            guest.kill()
    assert seen[0] == seen[1] == ("imgedge", 4242, "edge"), seen


def test_bad_config_is_reported_root_on_nvme_booted_by_uefi_from_a_usb_stick(
        image: Path, tmp_path: Path) -> None:
    """Booted as on bare metal: UEFI firmware (OVMF, no -kernel) boots the image's own boot
    loader (systemd-boot on its EFI system partition) from an NVMe disk (/dev/nvme0n1), the
    root is found by its label, and the config comes from a USB stick (usb-storage on xHCI);
    the appliance refuses that config, which proves the stick was read (the image's default
    config is a good one)."""
    from appliance.ops.image.boot import OVMF_CODE, OVMF_VARS

    from .conftest import _cannot

    if not (OVMF_CODE.exists() and OVMF_VARS.exists()):
        _cannot(f"{OVMF_CODE} is missing (Debian package ovmf; make setup installs it)")
    config = _config(tmp_path, """
        [appliance]
        name = "imgbad"
        role = "core"
        id = "seven"

        [mgmt]
        listen = "0.0.0.0:8470"
        """)
    guest = Guest(image, tmp_path, config, name="bad", root_bus="nvme", firmware="uefi",
                  config_bus="usb")
    assert "-kernel" not in guest.cmd
    guest.start()
    try:
        with pytest.raises(BootFailure) as failure:
            guest.wait_ready(READY_DEADLINE_S)
        print(f"refused {guest.elapsed():.1f} s after QEMU started (UEFI): {failure.value}")
        assert failure.value.config_error is not None, failure.value.tail
        assert "appliance.id" in failure.value.config_error
        console = "\n".join(guest.lines)
        assert "topicwire-config: booted through UEFI firmware" in console, guest.tail()
        assert "topicwire-config: config from config disk /dev/sda" in console, guest.tail()
    finally:
        guest.kill()


def test_config_naming_the_state_disk_without_one_does_not_start(image: Path,
                                                                 tmp_path: Path) -> None:
    config = _config(tmp_path, f"""
        [appliance]
        name = "imgnostate"
        role = "edge"

        [mqtt]
        listen = "0.0.0.0:{MQTT_PORT}"
        state_dir = "{STATE_DIR}/mqtt"
        """)
    guest = Guest(image, tmp_path, config, name="nostate").start()
    try:
        with pytest.raises(BootFailure) as failure:
            guest.wait_ready(READY_DEADLINE_S)
        print(f"refused {guest.elapsed():.1f} s after QEMU started: {failure.value}")
        assert "topicwire-state: the config names /var/lib/topicwire/state but no disk " \
            "labelled appstate" in str(failure.value), failure.value.tail
        assert not any(READY_RE.search(line) for line in guest.lines), guest.tail()
    finally:
        guest.kill()
