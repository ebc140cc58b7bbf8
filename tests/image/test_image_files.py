"""The appliance image's boot-time files and QEMU command (docs/images.md), without booting:
the root found by label, the state disk's script and unit, the disk buses ``Guest`` offers.
The boots themselves are hwtests/images."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from appliance.ops.image import boot, guest_files
from datapath.errors import UserError


def _files() -> dict[str, str]:
    return {path: text for path, _mode, text in guest_files.files("core")}


def test_root_is_found_by_label_not_by_device_name() -> None:
    assert _files()["/etc/fstab"].split()[0] == "LABEL=approot"
    assert "root=LABEL=approot" in boot.KERNEL_ARGS.split()
    assert "/dev/vd" not in _files()["/usr/local/sbin/topicwire-config"]


@pytest.mark.parametrize("script", ["topicwire-config", "topicwire-state", "topicwire-rxe",
                                    "topicwire-wait"])
def test_scripts_are_valid_shell(script: str) -> None:
    text = _files()[f"/usr/local/sbin/{script}"]
    assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0


def test_the_appliance_unit_waits_for_the_state_disk_and_stops_before_its_unmount() -> None:
    unit = _files()["/etc/systemd/system/topicwire.service"]
    assert "Requires=topicwire-config.service topicwire-state.service" in unit
    assert "After=var-lib-topicwire-state.mount" in unit
    state = _files()["/etc/systemd/system/topicwire-state.service"]
    assert "Before=topicwire.service" in state and "After=topicwire-config.service" in state


def _state_script(tmp_path: Path, config_text: str) -> subprocess.CompletedProcess:
    """topicwire-state with no state disk (blkid finds nothing) and its paths under tmp."""
    text = _files()["/usr/local/sbin/topicwire-state"]
    config = tmp_path / "topicwire.toml"
    config.write_text(config_text)
    text = (text.replace("mnt=/var/lib/topicwire/state", f"mnt={tmp_path}/state")
            .replace("config=/run/topicwire/config/topicwire.toml", f"config={config}")
            .replace("blkid -t LABEL=appstate", "true"))
    return subprocess.run(["sh", "-c", text], capture_output=True, text=True)


def test_no_state_disk_is_fine_unless_the_config_names_its_directory(tmp_path: Path) -> None:
    done = _state_script(tmp_path, '[mqtt]\nlisten = "0.0.0.0:1883"\n')
    assert done.returncode == 0 and "no state disk" in done.stdout
    done = _state_script(tmp_path, f'[mqtt]\nstate_dir = "{tmp_path}/state/mqtt"\n')
    assert done.returncode == 1
    assert "the config names" in done.stdout and "mkfs.ext4 -L appstate" in done.stdout


def test_guest_root_buses_and_state_drive(tmp_path: Path) -> None:
    image = tmp_path / "t.qcow2"
    for suffix in (".qcow2", ".vmlinuz", ".initrd"):
        image.with_suffix(suffix).write_bytes(b"")
    state = tmp_path / "state.ext4"
    cmd = " ".join(boot.Guest(image, tmp_path, root_bus="ahci", state_drive=state,
                              forwards=[(11883, 1883)]).cmd)
    assert "-device ahci,id=ahci0 -device ide-hd,drive=root,bus=ahci0.0" in cmd
    assert f"file={state},format=raw,if=virtio" in cmd
    assert "hostfwd=tcp:127.0.0.1:11883-:1883" in cmd
    cmd = " ".join(boot.Guest(image, tmp_path, root_bus="nvme").cmd)
    assert "-device nvme,drive=root,serial=approot" in cmd and "if=virtio,snapshot" not in cmd
    with pytest.raises(UserError, match="root bus 'scsi'"):
        boot.Guest(image, tmp_path, root_bus="scsi")


def _ext4(tree: Path, raw: Path, clamp: bool) -> bytes:
    from appliance.ops.image import build

    if clamp:
        build.make_ext4(tree, raw, 8 << 20, "0123456789abcdef", 1700000000)
    else:
        real = build.clamp_times
        build.clamp_times = lambda *_a: 0
        try:
            build.make_ext4(tree, raw, 8 << 20, "0123456789abcdef", 1700000000)
        finally:
            build.clamp_times = real
    return raw.read_bytes()


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("mkfs.ext4", "debugfs")),
                    reason="mkfs.ext4 and debugfs (e2fsprogs) are needed")
def test_the_filesystem_of_one_tree_is_the_same_bytes_whenever_it_is_made(
        tmp_path: Path) -> None:
    """mkfs.ext4 -d copies each file's change and access times, which say when the tree was
    written and read; make_ext4 sets them from the commit's time: the same tree gives the
    same bytes after its files were read and their change times moved."""
    tree = tmp_path / "tree"
    (tree / "etc" / "sub").mkdir(parents=True)
    (tree / "etc" / "a.conf").write_text("a\n")
    (tree / "etc" / "sub" / "b with space").write_text("b\n" * 3000)
    (tree / "link").symlink_to("etc/a.conf")
    images = {}
    for clamp in (True, False):
        for n in (1, 2):
            for path in tree.rglob("*"):  # new access and change times, the same mtime
                if path.is_file() and not path.is_symlink():
                    path.read_bytes()
                    os.utime(path, ns=((1_600_000_000 + n) * 10**9, path.stat().st_mtime_ns))
            images[clamp, n] = _ext4(tree, tmp_path / f"{clamp}{n}.raw", clamp)
    assert images[True, 1] == images[True, 2]
    assert images[False, 1] != images[False, 2]  # what the clamp removes
