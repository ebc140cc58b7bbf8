"""The appliance image the tests boot: built once per session (cached by its inputs' digest
under .venv/image, so a run after no source change only remakes the disk from the cached
root filesystem); skipped with the reason where it cannot be built or QEMU cannot run,
except under CI (``CI=true``), where that fails."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = Path(os.environ.get("TOPICWIRE_IMAGE_DIR", ROOT / ".venv" / "image"))


def _cannot(why: str) -> None:
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"appliance image tests cannot run ({why}); under CI=true that fails")
    pytest.skip(f"appliance image tests cannot run: {why}")


@pytest.fixture(scope="session")
def image() -> Path:
    from hwtests.guest.launch import IMAGE_TESTS_ENV, qemu_usable

    if not os.environ.get(IMAGE_TESTS_ENV):
        pytest.skip(f"appliance images boot only under `make hwtest` "
                    f"(python -m hwtests.guest.launch images sets {IMAGE_TESTS_ENV}=1)")
    ok, why = qemu_usable()
    if not ok:
        _cannot(why)
    if os.geteuid() != 0:
        _cannot("building the image needs root (mmdebstrap --mode=root)")
    for tool in ("mmdebstrap", "qemu-img", "mkfs.vfat", "mcopy"):
        if shutil.which(tool) is None:
            _cannot(f"{tool} is missing (make setup installs it)")
    from appliance.ops.image.build import build

    manifest = build("core", IMAGE_DIR)
    print(f"image: {manifest['image']} {manifest['qcow2_bytes'] / 1e6:.0f} MB, "
          f"build {manifest['build_seconds']} s")
    return IMAGE_DIR / manifest["image"]
