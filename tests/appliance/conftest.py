"""Fixtures shared by the appliance tests."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (a cache's logs on a disk that fills), unmounted after the test."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
