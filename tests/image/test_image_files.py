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
        build.clamp_times = lambda *_a, **_k: 0
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


def test_uefi_guest_boots_the_disk_through_its_own_loader(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """``firmware="uefi"``: no -kernel (the image's kernel and initrd need not be beside it),
    OVMF's code read-only and a copy of its variables, the root disk first in the boot order;
    the config disk as a USB stick."""
    image = tmp_path / "t.qcow2"
    image.write_bytes(b"")
    code, template = tmp_path / "CODE.fd", tmp_path / "VARS.fd"
    code.write_bytes(b"code")
    template.write_bytes(b"vars")
    monkeypatch.setattr(boot, "OVMF_CODE", code)
    monkeypatch.setattr(boot, "OVMF_VARS", template)
    cfg = tmp_path / "cfg.vfat"
    cfg.write_bytes(b"")
    guest = boot.Guest(image, tmp_path / "w", config_drive=cfg, root_bus="nvme",
                       firmware="uefi", config_bus="usb", name="u")
    cmd = " ".join(guest.cmd)
    assert "-kernel" not in cmd and "-append" not in cmd
    assert f"if=pflash,format=raw,unit=0,readonly=on,file={code}" in cmd
    variables = tmp_path / "w" / "u-OVMF_VARS.fd"
    assert f"if=pflash,format=raw,unit=1,file={variables}" in cmd
    assert variables.read_bytes() == b"vars"
    assert "nvme,drive=root,serial=approot,bootindex=0" in cmd
    assert "-device usb-storage,bus=xhci.0,drive=cfg,removable=on" in cmd
    assert f"file={cfg},format=raw,if=none,id=cfg,readonly=on" in cmd
    cmd = " ".join(boot.Guest(image, tmp_path / "w", firmware="uefi").cmd)
    assert "virtio-blk-pci,drive=root,bootindex=0" in cmd
    with pytest.raises(UserError, match="firmware 'bios'"):
        boot.Guest(image, tmp_path, firmware="bios")
    monkeypatch.setattr(boot, "OVMF_CODE", tmp_path / "missing.fd")
    with pytest.raises(UserError, match="Debian package ovmf"):
        boot.Guest(image, tmp_path, firmware="uefi")


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("mkfs.ext4", "debugfs", "mkfs.vfat",
                                                         "mcopy", "qemu-img", "partx",
                                                         "blkid")),
                    reason="e2fsprogs, dosfstools, mtools, qemu-utils, util-linux needed")
def test_the_disk_is_gpt_with_an_efi_system_partition_and_the_root(tmp_path: Path) -> None:
    """``make_disk`` of a small tree: a GPT disk (read by util-linux's partx and blkid) with
    a FAT32 EFI system partition holding systemd-boot at the firmware's fallback path, its
    loader entry (the kernel, initrd and the command line of the direct boot) and the kernel
    and initrd, then the ext4 root labelled approot; made twice, the same bytes."""
    from appliance.ops.image import build

    tree = tmp_path / "root"
    (tree / "boot").mkdir(parents=True)
    (tree / "boot" / "vmlinuz-6.1.0-t").write_bytes(b"kernel" * 1000)
    (tree / "boot" / "initrd.img-6.1.0-t").write_bytes(b"initrd" * 1000)
    efi = tree / build.BOOT_EFI.lstrip("/")
    efi.parent.mkdir(parents=True)
    efi.write_bytes(b"MZ systemd-boot")
    (tree / ".complete").write_text("1700000000\n")
    images = []
    for n in (1, 2):
        manifest = build.make_disk(tree, "core", tmp_path / f"out{n}", "0123456789abcdef")
        images.append((tmp_path / f"out{n}" / manifest["image"]).read_bytes())
    assert images[0] == images[1]
    raw = tmp_path / "disk.raw"
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(tmp_path / "out1" /
                                                          "topicwire-core.qcow2"), str(raw)],
                   check=True)
    import shlex

    rows = [dict(pair.split("=", 1) for pair in shlex.split(line))
            for line in subprocess.run(["partx", "-P", "-b", "-o", "START,SIZE,NAME",
                                        str(raw)], capture_output=True, text=True,
                                       check=True).stdout.splitlines()]
    assert [row["NAME"] for row in rows] == ["EFI system", "approot"], rows
    esp_at, esp_size = int(rows[0]["START"]) * 512, int(rows[0]["SIZE"])
    root_at, root_size = int(rows[1]["START"]) * 512, int(rows[1]["SIZE"])
    assert (esp_at, esp_size) == (build.ALIGN, build.ESP_BYTES)
    assert root_at == build.ALIGN + build.ESP_BYTES and root_size == manifest["root_bytes"]

    def probe(offset: int) -> str:
        return subprocess.run(["blkid", "-p", "-O", str(offset), str(raw)],
                              capture_output=True, text=True).stdout
    assert 'TYPE="vfat"' in probe(esp_at) and 'VERSION="FAT32"' in probe(esp_at)
    assert 'LABEL="approot"' in probe(root_at) and 'TYPE="ext4"' in probe(root_at)

    def esp(name: str) -> bytes:
        return subprocess.run(["mtype", "-i", f"{raw}@@{esp_at}", f"::/{name}"],
                              capture_output=True, check=True).stdout
    assert esp("EFI/BOOT/BOOTX64.EFI") == b"MZ systemd-boot"
    assert esp("topicwire/vmlinuz") == b"kernel" * 1000
    assert esp("topicwire/initrd.img") == b"initrd" * 1000
    entry = esp(build.LOADER_ENTRY).decode()
    assert "linux /topicwire/vmlinuz\ninitrd /topicwire/initrd.img\n" in entry
    options = entry.split("options ", 1)[1].split()
    assert options == ["console=tty0", *boot.KERNEL_ARGS.split()]
    assert "timeout 0" in esp("loader/loader.conf").decode()
