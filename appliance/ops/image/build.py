"""``topicwire image build``: a bootable appliance disk image (docs/images.md).

One image serves every appliance: the role, identity, addresses and neighbours come from a
config disk labelled APPCFG (or the kernel command line) at boot; ``--role`` only picks the
default config baked in for a boot without either. The build, as root, without loop mounts
or a daemon:

1. the project's wheel and its runtime dependencies' wheels (``pip wheel``; the host's pip
   cache, PyPI for what it lacks) in a wheelhouse;
2. ``mmdebstrap --mode=root --variant=minbase`` of Debian 12 from the mirror this machine's
   apt uses (its own deb822 sources file), with a kernel, initramfs, systemd, rdma-core and
   python3; a customize hook writes the units and scripts (``guest_files``), makes the venv
   /opt/topicwire from the wheelhouse (no index), locks root's password, enables the units and
   runs ``topicwire warm --reproducible`` with ``NUMBA_CPU_NAME=generic`` in the new root (its
   own network namespace: only its loopback) so the compiled kernels ship in the image, the
   same bytes from build to build (appliance/ops/warm_order.py);
3. ``mkfs.ext4 -d`` of that tree into a raw file, ``qemu-img convert -c -O qcow2``, and the
   kernel and initrd copied beside it for QEMU's direct kernel boot.

The root filesystem of step 2 is kept under the output's ``.build`` keyed by a digest of
everything that goes in (the project's sources, these files, the package list, the apt
sources): a second build of the same tree redoes only step 3 (seconds).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from appliance.ops.image import guest_files
from datapath.errors import UserError

ROOT = Path(__file__).resolve().parents[3]
SUITE = "bookworm"
APT_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
PACKAGES = ("linux-image-amd64", "initramfs-tools", "systemd-sysv", "udev", "kmod",
            "e2fsprogs", "python3", "python3-venv", "iproute2", "rdma-core",
            "ibverbs-providers", "ibverbs-utils", "python3-pyverbs", "dbus",
            "systemd-boot-efi")
"""dbus: systemd-logind, which powers the guest off on ACPI's power button (QEMU's
``system_powerdown``), needs it. systemd-boot-efi: the UEFI boot loader the disk step puts on
the image's EFI system partition (only its ``systemd-bootx64.efi``; nothing in the root runs
it). python3-pyverbs: the RDMA channel's verbs (Debian's, built
against its libibverbs; the venv loads that one package from dist-packages)."""
INITRAMFS_CONF = """# the image's: only the modules in modules.d/topicwire (the virtio disk, ext4),
# not Debian's MODULES=most (every storage driver: an initrd three times the size, loaded
# through fw_cfg and unpacked under TCG at each boot)
MODULES=list
"""
INITRAMFS_MODULES = """# the root disk (virtio-blk on virtio-pci) and its filesystem
virtio_pci
virtio_blk
ext4
crc32c_generic
"""
"""Written by mmdebstrap's setup hook, before the kernel's package makes its initramfs: a
list, not ``MODULES=dep`` (that one reads the build machine's devices, not the guest's).
Loaded at every boot: the virtio root's."""
INITRAMFS_HOOK = """#!/bin/sh
# the image's: the storage drivers of a root disk on bare metal or a non-virtio VM disk
# (SATA/AHCI as /dev/sda, NVMe, virtio-scsi) in the initrd too, loaded by the initramfs's udev
# only when such a controller is there (the root is found by its label, approot); and USB's
# host controllers and mass storage, so a config stick (label APPCFG) is probed while the
# initramfs runs, before the config unit looks for it
PREREQ=""
prereqs() { echo "$PREREQ"; }
case "$1" in prereqs) prereqs; exit 0 ;; esac
. /usr/share/initramfs-tools/hook-functions
manual_add_modules ahci sd_mod nvme virtio_scsi
manual_add_modules xhci_pci xhci_hcd ehci_pci ehci_hcd usb_storage uas
"""
MASKED_UNITS = ("e2scrub_reap.service", "e2scrub_all.timer", "apt-daily.timer",
                "apt-daily-upgrade.timer", "dpkg-db-backup.timer", "fstrim.timer")
"""Debian's periodic and boot-time housekeeping that an appliance (root filesystem rebuilt by
an upgrade, no apt) does not need."""
EXCLUDES = ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/locale/*", "/usr/share/info/*")
SOURCE_DIRS = ("appliance", "datapath", "channels", "nic_offload", "bench")
HOST_TOOLS = {"mmdebstrap": "mmdebstrap", "qemu-img": "qemu-utils", "mkfs.ext4": "e2fsprogs"}
IMAGE_NAME = "topicwire"
SLACK_BYTES = 300 << 20
"""Free space left on the root filesystem past what the tree needs (logs, state)."""


def say(text: str) -> None:
    print(f"image: {text}", file=sys.stderr, flush=True)


def check_host() -> None:
    if os.geteuid() != 0:
        raise UserError("image: the build needs root (mmdebstrap --mode=root, chroot); run it "
                        "as root")
    missing = [pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None]
    if missing:
        raise UserError(f"image: missing {' '.join(sorted(set(missing)))}; `make setup` "
                        "installs them (or apt-get install them)")
    if not APT_SOURCES.exists():
        raise UserError(f"image: {APT_SOURCES} is missing: the build uses the Debian mirror "
                        "this machine's apt uses, in its deb822 file")


HOST_ONLY = ("appliance/ops/image/boot.py", "appliance/ops/cli/image_cmd.py",
             "appliance/ops/image/guest_files.py", "appliance/ops/image/build.py",
             "appliance/ops/image/compare.py")
"""In the image's venv too, but only the host runs them: a change there does not rebuild the
root filesystem (guest_files' units and scripts are written at the disk step, each build;
what this module puts into the root filesystem, the mmdebstrap command, its hooks and the
package list, is in the digest by value: ``inputs_digest``)."""


def _source_files() -> list[Path]:
    files = [ROOT / "pyproject.toml"]  # not README.md: only the wheel's description
    for folder in SOURCE_DIRS:
        files += sorted(p for p in (ROOT / folder).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts
                        and p.suffix not in (".pyc", ".nbi", ".nbc")
                        and str(p.relative_to(ROOT)) not in HOST_ONLY)
    return files


def inputs_digest() -> str:
    """What the root filesystem depends on: the sources, these modules, packages, mirror."""
    h = hashlib.sha256()
    for path in _source_files():
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(repr((PACKAGES, EXCLUDES, SUITE, INITRAMFS_CONF, INITRAMFS_MODULES,
                   INITRAMFS_HOOK, sys.version_info[:2])).encode())
    work = Path("/WORK")
    h.update(repr(_mmdebstrap_cmd(work)).encode())
    h.update(_hook_script(work / "overlay", work / "wheels").encode())
    h.update(APT_SOURCES.read_bytes())
    return h.hexdigest()[:16]


def _stream(cmd: list[str], label: str, env: dict[str, str] | None = None,
            keep: Callable[[str], bool] = lambda _line: True) -> None:
    """Run ``cmd``, its output as progress lines (``label| ...``); fail with its tail."""
    started = time.monotonic()
    tail: list[str] = []
    # not this process's NUMBA_* (importing datapath sets NUMBA_CACHE_DIR to the host's cache):
    # the image's commands would otherwise make that host path inside the image
    base = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**base, **(env or {})}, errors="replace")
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-40:]
        if line and keep(line):
            print(f"image: {label}| {line} [{time.monotonic() - started:.0f} s]",
                  file=sys.stderr, flush=True)
    if proc.wait() != 0:
        raise UserError(f"image: {label} failed (exit {proc.returncode}): "
                        + " / ".join(tail[-12:]))


def wheelhouse(work: Path) -> Path:
    """The project's wheel and every runtime dependency's, for Python 3.11 on x86-64."""
    out = work / "wheels"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    say("wheels: the project and its runtime dependencies (pip cache, then PyPI)")
    _stream([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "-w",
             str(out), str(ROOT)], "pip",
            keep=lambda line: line.startswith(("Saved", "Building", "Collecting",
                                               "Downloading")))
    return out


def _hook_script(overlay: Path, wheels: Path) -> str:
    venv = guest_files.VENV
    warm_env = ("NUMBA_CPU_NAME=generic NUMBA_CACHE_DIR=/var/cache/topicwire/numba "
                "HOME=/root PYTHONUNBUFFERED=1 TOPICWIRE_WARM_TIMEOUT_S=600")
    return f"""#!/bin/sh
set -eu
r="$1"
echo "hook: units, scripts and the default config"
cp -a {overlay}/. "$r"/
echo "hook: venv {venv} from the wheelhouse"
chroot "$r" python3 -m venv {venv}
mkdir -p "$r/tmp/wheels" && cp {wheels}/*.whl "$r/tmp/wheels/"
chroot "$r" {venv}/bin/pip install -q --no-index --disable-pip-version-check \
    --find-links /tmp/wheels topicwire
rm -rf "$r/tmp/wheels" "$r/root/.cache"
clamp() {{
    # modification times after the commit's (SOURCE_DATE_EPOCH) set to it: the tree records
    # the commit, not when the build ran (docs/images.md, "Reproducibility")
    e="${{SOURCE_DATE_EPOCH:-}}"
    if [ -n "$e" ]; then
        # not /proc, /sys, /dev: mmdebstrap's mounts for the hooks (-xdev still visits the
        # mount points themselves)
        find "$r" -xdev \\( -path "$r/proc" -o -path "$r/sys" -o -path "$r/dev" \\) -prune \
            -o -newermt "@$e" -exec touch -h -d "@$e" {{}} +
    fi
}}
echo "hook: times clamped to SOURCE_DATE_EPOCH before numba stamps its sources' times"
clamp
echo "hook: byte-compiled once for all (unchecked-hash .pyc: no source read or hashed at import)"
chroot "$r" {venv}/bin/python -m compileall -q -f -j 0 --invalidation-mode unchecked-hash \
    {venv}/lib
chroot "$r" {venv}/bin/topicwire --version
ln -sf {venv}/bin/topicwire "$r/usr/local/bin/topicwire"
echo "hook: root's password locked, units enabled"
chroot "$r" passwd -l root
chroot "$r" systemctl enable systemd-networkd.service topicwire-rxe.service topicwire.service
chroot "$r" systemctl mask systemd-networkd-wait-online.service
echo "hook: masked what an appliance does not run (they compete with its start under TCG)"
chroot "$r" systemctl mask {" ".join(MASKED_UNITS)}
echo "hook: topicwire warm --reproducible (NUMBA_CPU_NAME=generic), own network namespace"
unshare --net chroot "$r" /bin/sh -c \
    'ip link set lo up && ip link set lo multicast on && \
     env {warm_env} {venv}/bin/topicwire warm --reproducible'
rm -f "$r"/dev/shm/* 2>/dev/null || true
rm -rf "$r"/var/cache/apt/*.bin "$r"/var/lib/apt/lists/* "$r"/root/.cache
echo "hook: times clamped again (the .pyc files, numba's cache: nothing reads their times)"
clamp
"""


def _write_files(tree: Path, role: str) -> None:
    """guest_files' units, scripts and ``role``'s default config into ``tree`` (the hook's
    overlay, and again into the cached root filesystem at each disk step)."""
    for path, mode, text in guest_files.files(role):
        target = tree / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_if_changed(target, text)
        if target.stat().st_mode & 0o7777 != mode:
            target.chmod(mode)


def _write_if_changed(target: Path, text: str) -> None:
    """Written only when its text changed: an unchanged file keeps its times, so two disk
    steps from one root filesystem give the same bytes (docs/images.md, "Reproducibility")."""
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


def clamp_times(rootfs: Path, raw: Path, epoch: int, tree_epoch: int = 0,
                offset: int = 0) -> int:
    """The change, creation and access times of every file in the ext4 ``raw`` made by
    ``mkfs.ext4 -d rootfs`` set to ``epoch`` (the commit's time; nanoseconds zero) with
    ``debugfs -w``: mkfs copies them from the tree, where they record when the build ran
    (and the access times move with mkfs's own reads), and no tool sets a change time in a
    tree. Modification times are kept (numba's cache index holds each source file's: the
    cache would be stale with any other), except those the customize hook's clamp did not
    reach (the device nodes in /dev, the cache's .complete) and any later than
    ``tree_epoch`` (the time the root filesystem's build clamped to, written in its
    .complete; default ``epoch``): mmdebstrap's clean-up after the hook, a file the disk
    step rewrote: set to ``tree_epoch``. The number of entries."""
    limit = tree_epoch or epoch
    commands, entries = [], 0
    for path in [rootfs, *sorted(rootfs.rglob("*"))]:
        name = "/" + str(path.relative_to(rootfs)) if path != rootfs else "/"
        if '"' in name or "\n" in name:
            raise UserError(f"image: {name!r}: a name debugfs cannot be given")
        quoted = f'"{name}"'
        fields = [("ctime", f"@{epoch}"), ("ctime_extra", "0"), ("crtime", f"@{epoch}"),
                  ("crtime_extra", "0"), ("atime", f"@{epoch}"), ("atime_extra", "0")]
        # what the hook's clamp did not reach (mmdebstrap's /dev nodes, the cache's .complete:
        # made when the build ran, nothing reads their times) and anything later than epoch
        if (name.startswith(("/dev/", "/.complete")) or name == "/dev"
                or path.lstat().st_mtime > limit):
            fields += [("mtime", f"@{limit}"), ("mtime_extra", "0")]
        commands += [f"sif {quoted} {field} {value}" for field, value in fields]
        entries += 1
    script = raw.with_suffix(".debugfs")
    script.write_text("\n".join(commands) + "\n")
    device = f"{raw}?offset={offset}" if offset else str(raw)
    # its own write time in the superblock: the commit's too
    done = subprocess.run(["debugfs", "-w", "-f", str(script), device],
                          capture_output=True, text=True, errors="replace",
                          env={**os.environ, "E2FSPROGS_FAKE_TIME": str(epoch)})
    script.unlink()
    errors = [line for line in done.stderr.splitlines()
              if line.strip() and not line.startswith("debugfs ")]
    if done.returncode != 0 or errors:
        raise UserError("image: debugfs (setting the files' times) failed: "
                        + " / ".join(errors[:5] or [done.stderr.strip()]))
    return entries


def _mmdebstrap_cmd(work: Path) -> list[str]:
    """mmdebstrap of the root filesystem into ``work``/rootfs-tmp, with the initramfs's
    files (``work``/initramfs) and the customize hook (``work``/customize.sh)."""
    initramfs = work / "initramfs"
    setup_hook = (f'mkdir -p "$1/etc/initramfs-tools" "$1/usr/share/initramfs-tools" && '
                  f'cp -r {initramfs}/conf.d {initramfs}/hooks "$1/etc/initramfs-tools/" && '
                  f'cp -r {initramfs}/modules.d "$1/usr/share/initramfs-tools/"')
    return ["mmdebstrap", "--mode=root", "--variant=minbase", "--verbose",
            "--include=" + ",".join(PACKAGES),
            *[f"--dpkgopt=path-exclude={p}" for p in EXCLUDES],
            f"--setup-hook={setup_hook}", f"--customize-hook={work / 'customize.sh'} \"$1\"",
            SUITE, str(work / "rootfs-tmp"), str(APT_SOURCES)]


def bootstrap(work: Path, digest: str) -> Path:
    """The image's root filesystem (cached as ``rootfs-<digest>``)."""
    rootfs = work / f"rootfs-{digest}"
    if (rootfs / ".complete").exists():
        say(f"root filesystem: cached ({rootfs.name}; same sources, packages and mirror)")
        return rootfs
    for old in work.glob("rootfs-*"):
        shutil.rmtree(old, ignore_errors=True)
    wheels = wheelhouse(work)
    overlay = work / "overlay"
    shutil.rmtree(overlay, ignore_errors=True)
    _write_files(overlay, "core")
    initramfs = work / "initramfs"
    shutil.rmtree(initramfs, ignore_errors=True)
    (initramfs / "conf.d").mkdir(parents=True)
    (initramfs / "modules.d").mkdir()
    (initramfs / "hooks").mkdir()
    (initramfs / "hooks" / "topicwire-storage").write_text(INITRAMFS_HOOK)
    (initramfs / "hooks" / "topicwire-storage").chmod(0o755)
    (initramfs / "conf.d" / "topicwire.conf").write_text(INITRAMFS_CONF)
    (initramfs / "modules.d" / "topicwire").write_text(INITRAMFS_MODULES)
    hook = work / "customize.sh"
    hook.write_text(_hook_script(overlay, wheels))
    hook.chmod(0o755)
    tmp = work / "rootfs-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = _mmdebstrap_cmd(work)
    env = {}
    epoch = _source_date_epoch()
    if epoch:
        env["SOURCE_DATE_EPOCH"] = epoch
    say(f"root filesystem: mmdebstrap {SUITE} ({len(PACKAGES)} packages and their "
        "dependencies), then the venv and the numba warm-up")
    _stream(cmd, "mmdebstrap", env=env, keep=_mmdebstrap_progress)
    (tmp / ".complete").write_text(f"{epoch}\n")  # the hook's SOURCE_DATE_EPOCH
    tmp.rename(rootfs)
    return rootfs


def _mmdebstrap_progress(line: str) -> bool:
    """The lines worth showing: phases, downloads, package unpacks, the hook's own."""
    if line.startswith(("I: ", "E: ", "W: ", "hook:", "warm", "topicwire", "Get:")):
        return True
    return line.startswith(("Unpacking", "Setting up"))


def _source_date_epoch() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def _tree_bytes(path: Path) -> int:
    done = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0])


def make_ext4(tree: Path, raw: Path, size: int, digest: str, epoch: int,
              name: str = "image", offset: int = 0) -> None:
    """``raw``: an ext4 filesystem (label approot) of ``tree``, ``size`` bytes, without a
    loop mount; its UUID and directory hash seed from ``digest``, its own times and (with
    ``clamp_times``) every file's change, creation and access times from ``epoch``.
    ``offset``: the filesystem goes ``offset`` bytes into ``raw``, an existing disk file (a
    partition of it: ``mkfs.ext4 -E offset``, ``debugfs FILE?offset=``); 0: ``raw`` is made,
    the filesystem alone."""
    if not offset:
        raw.unlink(missing_ok=True)
        with open(raw, "wb") as f:
            f.truncate(size)
    uuid = "-".join((digest[:8], digest[8:12], "4" + digest[13:16], "8" + digest[1:4],
                     digest[:12]))
    env = {"E2FSPROGS_FAKE_TIME": str(epoch)} if epoch else {}
    extended = f"hash_seed={uuid}" + (f",offset={offset}" if offset else "")
    _stream(["mkfs.ext4", "-q", "-F", "-b", "4096", "-L", guest_files.ROOT_LABEL, "-U", uuid, "-E",
             extended, "-d", str(tree), str(raw), *([f"{size >> 10}k"] if offset else [])],
            "mkfs.ext4", env=env)
    if epoch:
        say(f"{name}: every file's change, creation and access times set to the commit's "
            f"({epoch}; debugfs -w)")
        marker = tree / ".complete"
        stamp = marker.read_text().strip() if marker.exists() else ""
        entries = clamp_times(tree, raw, epoch, int(stamp) if stamp.isdigit() else 0,
                              offset=offset)
        say(f"{name}: {entries} entries")


ESP_BYTES = 128 << 20
"""The EFI system partition: FAT32 (the UEFI specification's for a fixed disk; mkfs.fat makes
FAT32 from about 33 MiB), holding systemd-boot, its loader entry, the kernel and the initrd
(about 16 MB), room for more."""
ALIGN = 1 << 20
"""Partitions start on MiB boundaries (the GPT and its entries fit in the first MiB; the
backup GPT in the last)."""
SECTOR = 512
ESP_TYPE = "c12a7328-f81f-11d2-ba4b-00a0c93ec93b"
LINUX_DATA_TYPE = "0fc63daf-8483-4772-8e79-3d69d8477de4"
BOOT_EFI = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi"
"""systemd-boot (Debian's systemd-boot-efi, in the image's root filesystem), copied to the
ESP's /EFI/BOOT/BOOTX64.EFI: the removable-media path every x86-64 UEFI firmware boots
without a boot entry of its own."""
LOADER_ENTRY = "loader/entries/topicwire.conf"


def loader_files(commit: str) -> dict[str, str]:
    """systemd-boot's configuration on the ESP: boot the one entry at once (no menu; hold a
    key at power-on for it), no command-line editor at the console (the image has no
    password login; the command line is changed by editing the entry on the ESP)."""
    from appliance.ops.image.boot import KERNEL_ARGS

    return {
        "loader/loader.conf": "default topicwire.conf\ntimeout 0\neditor no\n",
        LOADER_ENTRY: (f"title topicwire appliance ({commit})\n"
                       "linux /topicwire/vmlinuz\n"
                       "initrd /topicwire/initrd.img\n"
                       # a screen too on bare metal; the last console= (the serial port)
                       # gets systemd's and the appliance's lines, as under QEMU
                       f"options console=tty0 {KERNEL_ARGS}\n"),
    }


def make_esp(path: Path, kernel: Path, initrd: Path, boot_efi: Path, commit: str,
             digest: str, epoch: int) -> None:
    """``path``: the FAT32 EFI system partition (mkfs.vfat on a file, mtools: no mount) with
    systemd-boot as the fallback loader, its entry, the kernel and the initrd; its volume id
    from ``digest``, its files' times ``epoch`` (``mkfs.fat --invariant``, mtools'
    SOURCE_DATE_EPOCH and ``mcopy -m``)."""
    for tool, pkg in (("mkfs.vfat", "dosfstools"), ("mcopy", "mtools")):
        if shutil.which(tool) is None:
            raise UserError(f"image: {tool} is missing (Debian package {pkg}; make setup)")
    path.unlink(missing_ok=True)
    env = {"SOURCE_DATE_EPOCH": str(epoch)} if epoch else {}
    _stream(["mkfs.vfat", "--invariant", "-C", "-F", "32", "-n", "TWESP", "-i", digest[:8],
             str(path), str(ESP_BYTES >> 10)], "mkfs.vfat", env=env)
    _stream(["mmd", "-i", str(path), "::/EFI", "::/EFI/BOOT", "::/loader",
             "::/loader/entries", "::/topicwire"], "mmd", env=env)
    stage = path.with_suffix(".stage")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        pairs = [(boot_efi, "EFI/BOOT/BOOTX64.EFI"), (kernel, "topicwire/vmlinuz"),
                 (initrd, "topicwire/initrd.img")]
        for name, text in loader_files(commit).items():
            staged = stage / name.replace("/", "_")
            staged.write_text(text)
            pairs.append((staged, name))
        for source, name in pairs:
            staged = stage / ("f_" + name.replace("/", "_"))
            shutil.copyfile(source, staged)
            if epoch:
                os.utime(staged, (epoch, epoch))
            _stream(["mcopy", "-m", "-i", str(path), str(staged), f"::/{name}"], "mcopy",
                    env=env)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _guid(text: str) -> bytes:
    import uuid

    return uuid.UUID(text).bytes_le


def _digest_guid(digest: str, what: str) -> str:
    import uuid

    return str(uuid.UUID(hashlib.sha256(f"{digest}:{what}".encode()).hexdigest()[:32]))


def write_gpt(disk: Path, size: int, parts: list[tuple[str, str, int, int, str]],
              disk_guid: str) -> None:
    """A protective MBR, the GPT and its backup on ``disk`` (``size`` bytes) for ``parts``:
    (type GUID, partition GUID, first byte, size in bytes, name). Written here (no sfdisk
    on a minimal Debian, no loop device), every GUID given: the same bytes at each build."""
    import struct
    import zlib

    sectors = size // SECTOR
    last = sectors - 1
    entries = bytearray(128 * 128)
    for n, (type_guid, part_guid, first, length, name) in enumerate(parts):
        entries[n * 128:(n + 1) * 128] = struct.pack(
            "<16s16sQQQ72s", _guid(type_guid), _guid(part_guid), first // SECTOR,
            (first + length) // SECTOR - 1, 0, name.encode("utf-16-le"))
    entries_crc = zlib.crc32(entries)

    def header(current: int, backup: int, entries_lba: int) -> bytes:
        fields = [b"EFI PART", 0x00010000, 92, 0, 0, current, backup, 34, last - 33,
                  _guid(disk_guid), entries_lba, 128, 128, entries_crc]
        fmt = "<8sIIIIQQQQ16sQIII"
        crc = zlib.crc32(struct.pack(fmt, *fields))
        fields[3] = crc
        return struct.pack(fmt, *fields).ljust(SECTOR, b"\0")

    mbr = bytearray(SECTOR)
    mbr[446:462] = struct.pack("<B3sB3sII", 0, b"\x00\x02\x00", 0xEE, b"\xff\xff\xff", 1,
                               min(last, 0xFFFFFFFF))
    mbr[510:512] = b"\x55\xaa"
    with open(disk, "r+b") as f:
        f.write(mbr)
        f.write(header(1, last, 2))
        f.write(entries)
        f.seek((last - 32) * SECTOR)
        f.write(entries)
        f.write(header(last, 1, last - 32))


def _copy_into(source: Path, disk: Path, offset: int) -> None:
    """``source``'s bytes into ``disk`` at ``offset``, its all-zero MiBs skipped (sparse)."""
    zero = bytes(ALIGN)
    with open(source, "rb") as src, open(disk, "r+b") as dst:
        at = offset
        while chunk := src.read(ALIGN):
            if chunk != zero[:len(chunk)]:
                dst.seek(at)
                dst.write(chunk)
            at += len(chunk)


def make_disk(rootfs: Path, role: str, out: Path, digest: str) -> dict:
    """The qcow2 image of ``rootfs`` with ``role``'s default config, kernel and initrd."""
    _write_files(rootfs, role)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    stamp = {"commit": commit, "inputs_digest": digest, "role_default": role}
    _write_if_changed(rootfs / "etc/topicwire/image.json",
                      json.dumps(stamp, sort_keys=True) + "\n")
    epoch = int(_source_date_epoch() or 0)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{IMAGE_NAME}-{role}"
    raw = out / f".{name}.raw"
    size = _tree_bytes(rootfs) * 12 // 10 + SLACK_BYTES
    size = (size + ALIGN - 1) // ALIGN * ALIGN
    vmlinuz = sorted((rootfs / "boot").glob("vmlinuz-*"))
    initrd = sorted((rootfs / "boot").glob("initrd.img-*"))
    if not vmlinuz or not initrd:
        raise UserError(f"image: {rootfs}/boot has no vmlinuz-* or initrd.img-*")
    boot_efi = rootfs / BOOT_EFI.lstrip("/")
    if not boot_efi.exists():
        raise UserError(f"image: {boot_efi} is missing (Debian's systemd-boot-efi: the root "
                        "filesystem predates the boot loader; delete its cache to rebuild it)")
    # GPT: the EFI system partition (systemd-boot, kernel, initrd), then the root (ext4)
    root_at = ALIGN + ESP_BYTES
    disk_bytes = root_at + size + ALIGN
    raw.unlink(missing_ok=True)
    with open(raw, "wb") as f:
        f.truncate(disk_bytes)
    say(f"{name}: ext4 of the tree ({size >> 20} MiB, mkfs.ext4 -d, no loop mount) as the "
        f"second partition of a GPT disk")
    make_ext4(rootfs, raw, size, digest, epoch, name, offset=root_at)
    esp = out / f".{name}.esp"
    say(f"{name}: EFI system partition ({ESP_BYTES >> 20} MiB FAT32: systemd-boot, its "
        "loader entry, the kernel and initrd; mkfs.vfat and mtools, no mount)")
    make_esp(esp, vmlinuz[-1], initrd[-1], boot_efi, commit, digest, epoch)
    _copy_into(esp, raw, ALIGN)
    esp.unlink()
    write_gpt(raw, disk_bytes,
              [(ESP_TYPE, _digest_guid(digest, "esp"), ALIGN, ESP_BYTES, "EFI system"),
               (LINUX_DATA_TYPE, _digest_guid(digest, "root"), root_at, size,
                guest_files.ROOT_LABEL)],
              _digest_guid(digest, "disk"))
    qcow = out / f"{name}.qcow2"
    say(f"{name}: qemu-img convert -c -O qcow2")
    _stream(["qemu-img", "convert", "-c", "-O", "qcow2", str(raw), str(qcow)], "qemu-img")
    raw.unlink()
    shutil.copyfile(vmlinuz[-1], out / f"{name}.vmlinuz")
    shutil.copyfile(initrd[-1], out / f"{name}.initrd")
    manifest = {"image": qcow.name, "commit": commit, "role_default": role,
                "kernel": vmlinuz[-1].name,
                "inputs_digest": digest, "qcow2_bytes": qcow.stat().st_size,
                "virtual_bytes": disk_bytes, "root_bytes": size, "suite": SUITE,
                "partitions": {"esp": [ALIGN, ESP_BYTES], "root": [root_at, size]}}
    (out / f"{name}.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def build(role: str, out: Path, cache: Path | None = None) -> dict:
    """Build (or rebuild from the cached root filesystem) the image; print the figures."""
    started = time.monotonic()
    check_host()
    out = out.resolve()
    work = (cache or (out / ".build")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    digest = inputs_digest()
    say(f"inputs digest {digest} (sources, packages, mirror)")
    # the disk step's inputs besides the root filesystem: the units and scripts, the loader
    # entry (the kernel command line), this module (the disk's layout)
    disk_key = hashlib.sha256((digest + role + repr(loader_files(""))).encode()
                              + Path(guest_files.__file__).read_bytes()
                              + Path(__file__).read_bytes()).hexdigest()[:16]
    previous = out / f"{IMAGE_NAME}-{role}.json"
    if previous.exists() and (out / f"{IMAGE_NAME}-{role}.qcow2").exists():
        manifest = json.loads(previous.read_text())
        if manifest.get("disk_key") == disk_key and (work / f"rootfs-{digest}").exists():
            say(f"{manifest['image']}: current (same inputs and units); nothing to do")
            return manifest
    rootfs = bootstrap(work, digest)
    manifest = make_disk(rootfs, role, out, digest)
    manifest["disk_key"] = disk_key
    seconds = time.monotonic() - started
    manifest["build_seconds"] = round(seconds, 1)
    (out / f"{IMAGE_NAME}-{role}.json").write_text(json.dumps(manifest, indent=1,
                                                              sort_keys=True) + "\n")
    print(f"image: {out / manifest['image']}: {manifest['qcow2_bytes'] / 1e6:.0f} MB qcow2 "
          f"({manifest['virtual_bytes'] >> 20} MiB GPT disk: {ESP_BYTES >> 20} MiB ESP, "
          f"{manifest['root_bytes'] >> 20} MiB ext4 root), built in {seconds:.0f} s", flush=True)
    return manifest
