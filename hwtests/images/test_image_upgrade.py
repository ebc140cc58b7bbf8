"""An upgrade: boot image N with a config disk, power it off, boot image N+1 (another image
file: here the edge-default build of the same tree, the only other build a test run has) with
the same config disk, and the appliance comes back with the same name, id and role."""

from __future__ import annotations

import textwrap
from pathlib import Path

from appliance.ops.image.boot import Guest, config_disk, free_port

READY_DEADLINE_S = 240.0


def test_replaced_image_keeps_identity_from_config_disk(image: Path, tmp_path: Path) -> None:
    from appliance.ops.image.build import build

    from .conftest import IMAGE_DIR

    successor = IMAGE_DIR / build("edge", IMAGE_DIR)["image"]
    config = tmp_path / "topicwire.toml"
    config.write_text(textwrap.dedent("""
        [appliance]
        name = "upgraded"
        id = 4242
        role = "core"

        [mgmt]
        listen = "0.0.0.0:8470"
        """))
    disk = config_disk(tmp_path / "cfg.vfat", config)
    seen = []
    for n, path in enumerate((image, successor)):
        guest = Guest(path, tmp_path / f"boot{n}", config_drive=disk, mgmt_port=free_port(),
                      name=f"boot{n}").start()
        try:
            ready = guest.wait_ready(READY_DEADLINE_S)
            code, status = guest.http("/status")
            assert code == 200, guest.tail()
            node = status["node"]
            seen.append((node["name"], node.get("id"), node.get("role")))
            print(f"{path.name}: {seen[-1]} ready {ready['ready_s']} s")
            off_s = guest.powerdown()  # ACPI's power button: systemd stops it (SIGTERM)
            print(f"{path.name}: QEMU ended {off_s:.1f} s after the power button")
            assert guest.proc.returncode == 0, guest.tail()
            assert "SIGTERM received" in "\n".join(guest.lines), guest.tail()
        finally:
            guest.kill()
    assert seen[0] == seen[1] and seen[0][0] == "upgraded", seen
