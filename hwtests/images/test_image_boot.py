"""Appliance images booted under QEMU on this host (TCG): ready within the deadline, the
management API through a forwarded loopback port, a clean power-off by the management API's
shutdown command (the ACPI power button's is test_image_upgrade's), a refused config.

QEMU's only network here is its user network with ``restrict=on`` (nothing leaves the host;
the host reaches the guest through ports forwarded from 127.0.0.1).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from appliance.ops.image.boot import BootFailure, Guest, free_port

READY_DEADLINE_S = 240.0
"""Fail past this (TCG on a shared 2-core host); the goal, 45 s, is printed, not asserted."""
GOAL_S = 45.0
TOKEN = "image-test-token"


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topicwire.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_good_config_ready_status_and_clean_poweroff(image: Path, tmp_path: Path) -> None:
    config = _config(tmp_path, """
        [appliance]
        name = "imgcore"
        role = "core"

        [clients]
        udp = "0.0.0.0:47471"

        [mgmt]
        listen = "0.0.0.0:8470"
        token = "{TOKEN}"
        """.replace("{TOKEN}", TOKEN))
    port = free_port()
    guest = Guest(image, tmp_path, config, mgmt_port=port, name="good").start()
    try:
        ready = guest.wait_ready(READY_DEADLINE_S)
        print(f"boot-to-ready: {ready['ready_s']} s after QEMU started (ready line "
              f"{ready['ready_line_s']} s; goal {GOAL_S:.0f} s: "
              f"{'met' if ready['ready_s'] <= GOAL_S else 'missed'})")
        assert guest.http("/status")[0] == 401, guest.tail()  # reads beyond loopback: token
        code, status = guest.http("/status", token=TOKEN)
        assert code == 200, guest.tail()
        assert status["node"]["name"] == "imgcore", status["node"]
        code, _ = guest.http("/metrics", token=TOKEN)
        assert code in (200, 0)  # /metrics is text: http() parses JSON only
        answer, off_s = guest.shutdown(TOKEN)
        print(f"power-off: QEMU ended {off_s:.1f} s after POST /shutdown ({answer})")
        assert guest.proc.returncode == 0, guest.tail()
        console = "\n".join(guest.lines)
        for line in ("shutdown requested through the management API (image boot)",
                     "draining (shutdown through the management API: image boot)",
                     "drained in", "appliance stopped",
                     "topicwire: shutdown through the management API: powering off"):
            assert line in console, (line, guest.tail())
    finally:
        guest.kill()


def test_bad_config_is_reported(image: Path, tmp_path: Path) -> None:
    config = _config(tmp_path, """
        [appliance]
        name = "imgbad"
        role = "core"
        id = "seven"

        [mgmt]
        listen = "0.0.0.0:8470"
        """)
    guest = Guest(image, tmp_path, config, name="bad").start()
    try:
        with pytest.raises(BootFailure) as failure:
            guest.wait_ready(READY_DEADLINE_S)
        print(f"refused {guest.elapsed():.1f} s after QEMU started: {failure.value}")
        assert failure.value.config_error is not None, failure.value.tail
        assert "appliance.id" in failure.value.config_error
    finally:
        guest.kill()
