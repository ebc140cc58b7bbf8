"""``topicwire image boot``: one appliance image under QEMU, until it reports ready.

The guest: QEMU in TCG (KVM is not usable on every host, and not here), direct kernel boot
with the kernel and initrd ``image build`` put beside the image (or, ``firmware="uefi"``,
OVMF booting the disk through its own boot loader: systemd-boot on its EFI system
partition), the image as a virtio disk
in snapshot mode (writes are dropped at exit: the image stays as built), the config on a small
FAT disk labelled APPCFG, the serial console on QEMU's standard output, and one NIC on QEMU's
user network with ``restrict=on`` (the guest reaches nothing outside; the host reaches it only
through the ports forwarded from 127.0.0.1). ``Guest.powerdown`` presses ACPI's power button
over QMP: systemd stops the appliance (SIGTERM: the drain) and powers the guest off, which
ends QEMU.

UDP cannot be forwarded usefully: with ``restrict=on`` libslirp drops every datagram the
guest sends (replies to a forwarded port included). Native clients reach a guest through a
tap NIC in a network namespace (``wrap=["ip", "netns", "exec", NS]`` and a ``-netdev tap``
in ``netdevs``: hwtests/images/test_image_fabric.py), or a bridge of the operator's own.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from appliance.ops.image import guest_files
from datapath.errors import UserError

QEMU = "qemu-system-x86_64"
MEMORY_MB = 1024
CPUS = 2
BOOT_GOAL_S = 45.0
"""The boot-to-ready goal under TCG on a 2-core host (issue 18): printed, met or missed."""
UNUSED_MODULES = ("floppy", "pcspkr", "piix4_smbus", "ata_piix", "ata_generic", "pata_acpi",
                  "psmouse", "serio_raw", "kvm", "kvm_amd", "kvm_intel", "cfg80211", "drm",
                  "dm_mod", "fuse", "loop", "efi_pstore", "aesni_intel", "ghash_clmulni_intel",
                  "sha1_ssse3", "sha256_ssse3", "sha512_ssse3", "polyval_clmulni",
                  "crc32_pclmul", "crct10dif_pclmul")
"""Modules udev and systemd would load for the emulated PC's devices and ``-cpu max``'s
features (the floppy and IDE controllers, PC speaker, SMBus, PS/2 mouse, KVM, the CPU's
crypto) and ``modprobe@`` units (drm, device mapper, fuse, loop): nothing the appliance uses,
and each load costs the guest's CPU while the appliance starts (``modprobe.blacklist``)."""
KERNEL_ARGS = (f"console=ttyS0 root=LABEL={guest_files.ROOT_LABEL} rw quiet panic=-1 "
               "net.ifnames=0 i8042.noaux no_timer_check modprobe.blacklist="
               + ",".join(UNUSED_MODULES))
"""``no_timer_check``: the kernel's check that the PIT's interrupt reaches the IO-APIC,
which under TCG on a loaded host times out and panics the boot (``IO-APIC + timer doesn't
work!``, seen once at host load 12); a usual argument for virtual machines."""
READY_RE = re.compile(r"topicwire: appliance (\S+) \(id (\d+)\) ready")
CONFIG_ERROR_RE = re.compile(r"topicwire: (config: .*)")
FAILED_RE = re.compile(r"(Failed to start topicwire|topicwire\.service: Failed|"
                       r"topicwire-config: (no topicwire\.toml|cannot mount).*|"
                       r"topicwire-state: (the config names|the state disk \S+ has errors|"
                       r"cannot mount).*)")
FIRMWARES = ("direct", "uefi")
"""How ``Guest`` boots the image: ``direct``, QEMU's direct kernel boot (``-kernel``/``-initrd``
from the build, SeaBIOS; the tests' default), or ``uefi``: OVMF (UEFI firmware) boots the
disk through its own boot loader (systemd-boot on the EFI system partition), as bare metal
and ``virt-install --boot uefi`` do."""
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS.fd")
"""Debian's ovmf: the firmware (read-only) and the template of its variable store (each guest
gets a writable copy)."""
CONFIG_BUSES = ("virtio", "usb")
"""The config disk as a virtio disk, or as a USB stick (``usb-storage`` on an xHCI
controller), as on bare metal."""
ROOT_BUSES = ("virtio", "ahci", "nvme")
"""How ``Guest`` attaches the image: a virtio disk (/dev/vda), a SATA disk on an AHCI
controller (/dev/sda, as on most bare metal) or an NVMe disk (/dev/nvme0n1); the image finds
its root by label on each."""
TAIL_LINES = 40
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def say(text: str) -> None:
    print(f"image: {text}", file=sys.stderr, flush=True)


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def uefi_firmware() -> tuple[Path, Path]:
    """OVMF's code and variables template, or a UserError naming the package."""
    for path in (OVMF_CODE, OVMF_VARS):
        if not path.exists():
            raise UserError(f"image: {path} is missing (Debian package ovmf, the UEFI "
                            "firmware `--firmware uefi` boots the image with; make setup)")
    return OVMF_CODE, OVMF_VARS


def boot_files(image: Path) -> tuple[Path, Path]:
    """The kernel and initrd ``image build`` wrote beside ``image``."""
    stem = image.with_suffix("")
    kernel, initrd = Path(f"{stem}.vmlinuz"), Path(f"{stem}.initrd")
    for path in (image, kernel, initrd):
        if not path.exists():
            raise UserError(f"image: {path} is missing (topicwire image build writes the "
                            ".qcow2, .vmlinuz and .initrd together)")
    return kernel, initrd


def config_disk(path: Path, config: Path | None, extra: Sequence[Path] = ()) -> Path:
    """A FAT disk labelled APPCFG with ``config`` as topicwire.toml and ``extra`` files
    (key files, tokens, ``*.network`` for systemd-networkd) beside it."""
    for tool, pkg in (("mkfs.vfat", "dosfstools"), ("mcopy", "mtools")):
        if shutil.which(tool) is None:
            raise UserError(f"image: {tool} is missing (Debian package {pkg}; make setup)")
    path.unlink(missing_ok=True)
    subprocess.run(["mkfs.vfat", "-C", "-n", guest_files.CONFIG_LABEL, str(path), "2048"],
                   check=True, capture_output=True)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        if config is not None:
            toml = Path(tmp) / "topicwire.toml"
            shutil.copyfile(config, toml)
            files.append(toml)
        files += [Path(p) for p in extra]
        if files:
            subprocess.run(["mcopy", "-i", str(path), *map(str, files), "::/"], check=True,
                           capture_output=True)
    return path


class Guest:
    """One QEMU guest of an appliance image; its console lines collected as they come."""

    def __init__(self, image: Path, workdir: Path, config: Path | None = None, *,
                 extra_files: Sequence[Path] = (), mgmt_port: int | None = None,
                 netdevs: Sequence[str] = (),
                 snapshot: bool = True, name: str = "guest", echo: bool = False,
                 config_drive: Path | None = None, wrap: Sequence[str] = (),
                 root_bus: str = "virtio", state_drive: Path | None = None,
                 forwards: Sequence[tuple[int, int]] = (), firmware: str = "direct",
                 config_bus: str = "virtio") -> None:
        self.image = Path(image).resolve()
        if firmware not in FIRMWARES:
            raise UserError(f"image: firmware {firmware!r}: one of {', '.join(FIRMWARES)}")
        if config_bus not in CONFIG_BUSES:
            raise UserError(f"image: config bus {config_bus!r}: one of "
                            f"{', '.join(CONFIG_BUSES)}")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if firmware == "direct":
            self.kernel, self.initrd = boot_files(self.image)
            boot = ["-kernel", str(self.kernel), "-initrd", str(self.initrd),
                    "-append", KERNEL_ARGS]
        else:
            if not self.image.exists():
                raise UserError(f"image: {self.image} is missing")
            code, template = uefi_firmware()
            variables = self.workdir / f"{name}-OVMF_VARS.fd"
            shutil.copyfile(template, variables)
            # no -kernel: the firmware boots the disk's /EFI/BOOT/BOOTX64.EFI (systemd-boot),
            # which boots its loader entry's kernel, initrd and command line
            boot = ["-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={code}",
                    "-drive", f"if=pflash,format=raw,unit=1,file={variables}"]
        self.name = name
        self.echo = echo
        self.mgmt_port = mgmt_port
        if config_drive is None and (config is not None or extra_files):
            config_drive = config_disk(self.workdir / f"{name}-cfg.vfat", config, extra_files)
        self.config_drive = config_drive  # None: the image's default config
        self.qmp_path = self.workdir / f"{name}.qmp"
        fwd = []
        if mgmt_port is not None:
            fwd.append(f"hostfwd=tcp:127.0.0.1:{mgmt_port}-:{guest_files.MGMT_PORT}")
        fwd += [f"hostfwd=tcp:127.0.0.1:{host}-:{guest}" for host, guest in forwards]
        user = ",".join(["user", "id=mgmt", "restrict=on", *fwd])
        snap = "on" if snapshot else "off"
        if root_bus not in ROOT_BUSES:
            raise UserError(f"image: root bus {root_bus!r}: one of {', '.join(ROOT_BUSES)}")
        root = f"file={self.image},format=qcow2,snapshot={snap}"
        first = ",bootindex=0" if firmware == "uefi" else ""  # the firmware's boot disk
        root_args = {
            "virtio": (["-drive", f"{root},if=none,id=root", "-device",
                        f"virtio-blk-pci,drive=root{first}"] if first
                       else ["-drive", f"{root},if=virtio"]),
            "ahci": ["-drive", f"{root},if=none,id=root", "-device", "ahci,id=ahci0",
                     "-device", f"ide-hd,drive=root,bus=ahci0.0{first}"],
            "nvme": ["-drive", f"{root},if=none,id=root", "-device",
                     f"nvme,drive=root,serial=approot{first}"],
        }[root_bus]
        config_args: list[str] = []
        if self.config_drive and config_bus == "usb":
            config_args = ["-device", "qemu-xhci,id=xhci", "-drive",
                           f"file={self.config_drive},format=raw,if=none,id=cfg,readonly=on",
                           "-device", "usb-storage,bus=xhci.0,drive=cfg,removable=on"]
        elif self.config_drive:
            config_args = ["-drive",
                           f"file={self.config_drive},format=raw,if=virtio,readonly=on"]
        self.state_drive = state_drive
        self.cmd = [
            *wrap, QEMU, "-accel", "tcg", "-cpu", "max", "-smp", str(CPUS), "-m", str(MEMORY_MB),
            # no default floppy, IDE CD-ROM, VGA or parallel port: the kernel probes none of
            # them (seconds under TCG); the serial console and the disks are given below
            "-nodefaults", "-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
            "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
            *boot,
            *root_args,
            *config_args,
            # the state disk is written (not snapshot): it outlives the guest and the image
            *(["-drive", f"file={state_drive},format=raw,if=virtio"] if state_drive else []),
            "-netdev", user, "-device", "virtio-net-pci,netdev=mgmt",
            *[a for nd in netdevs for a in nd.split(" ")],
        ]
        self.lines: list[str] = []
        self.events: queue.Queue[str] = queue.Queue()
        self.proc: subprocess.Popen | None = None
        self.started = 0.0

    def start(self) -> Guest:
        if shutil.which(QEMU) is None:
            raise UserError(f"image: {QEMU} is missing (Debian package qemu-system-x86)")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self._read, daemon=True, name=f"{self.name}-console").start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = ANSI_RE.sub("", raw.decode("utf-8", "replace")).rstrip("\r\n")
            line = line.replace("\r", "")
            self.lines.append(line)
            self.events.put(line)
            if self.echo:
                print(f"{self.name}| {line}", file=sys.stderr, flush=True)
        self.events.put("")

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def tail(self, n: int = TAIL_LINES) -> str:
        return "\n".join(self.lines[-n:])

    def wait_ready(self, timeout: float) -> dict:
        """Until the appliance's ready line (and ``/readyz`` 200 through the forwarded
        port): ``{"ready_s", "node", "id", ...}``; raises BootFailure with the console tail."""
        deadline = self.started + timeout
        result: dict = {}
        while "ready_line_s" not in result:
            try:
                line = self.events.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                line = None
            if line is not None:
                if m := READY_RE.search(line):
                    result.update(node=m.group(1), id=int(m.group(2)),
                                  ready_line_s=round(self.elapsed(), 1))
                    break
                if m := CONFIG_ERROR_RE.search(line):
                    raise BootFailure(f"the appliance refused its config: {m.group(1)}",
                                      self.tail(), config_error=m.group(1))
                if FAILED_RE.search(line):
                    raise BootFailure(f"the appliance did not start: {line.strip()}",
                                      self.tail())
            if self.proc is not None and self.proc.poll() is not None:
                raise BootFailure(f"QEMU exited ({self.proc.returncode}) before the appliance "
                                  "was ready", self.tail())
            if time.monotonic() > deadline:
                raise BootFailure(f"not ready after {timeout:.0f} s", self.tail())
        if self.mgmt_port is not None:
            while True:
                code, _ = self.http("/readyz")
                if code == 200:
                    result["readyz_s"] = round(self.elapsed(), 1)
                    break
                if time.monotonic() > deadline:
                    raise BootFailure(f"/readyz not 200 after {timeout:.0f} s (last {code})",
                                      self.tail())
                time.sleep(0.25)
        result["ready_s"] = result.get("readyz_s", result["ready_line_s"])
        return result

    def http(self, path: str, timeout: float = 5.0, token: str | None = None
             ) -> tuple[int, dict | None]:
        """GET ``path`` from the guest's management API (the forwarded port); ``token``: the
        bearer token (reads need it when the API listens beyond loopback with one set)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.mgmt_port}{path}")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except (OSError, ValueError):
            return 0, None

    def shutdown(self, token: str, timeout: float = 90.0) -> tuple[dict, float]:
        """The management API's ``POST /shutdown`` through the forwarded port: the appliance
        drains and exits, and its unit powers the guest off. (The answer, the seconds until
        QEMU ended); raises BootFailure when the API refused or the guest stayed up."""
        from appliance.ops.mgmt.requests import post_shutdown

        started = time.monotonic()
        try:
            answer = post_shutdown(f"http://127.0.0.1:{self.mgmt_port}", token, "image boot",
                                   10.0)
        except UserError as exc:
            raise BootFailure(f"the management API refused the shutdown: {exc}",
                              self.tail()) from None
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise BootFailure(f"the guest did not power off within {timeout:.0f} s of the "
                              "management API's shutdown", self.tail()) from exc
        return answer, time.monotonic() - started

    def qmp(self, command: str) -> dict:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(str(self.qmp_path))
            f = s.makefile("rwb")
            f.readline()  # greeting
            for cmd in ("qmp_capabilities", command):
                f.write(json.dumps({"execute": cmd}).encode() + b"\n")
                f.flush()
                while True:
                    answer = json.loads(f.readline())
                    if "return" in answer or "error" in answer:
                        break
            return answer

    def powerdown(self, timeout: float = 90.0) -> float:
        """ACPI power button; the seconds until QEMU ended (the guest powered off)."""
        started = time.monotonic()
        self.qmp("system_powerdown")
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise BootFailure(f"the guest did not power off within {timeout:.0f} s",
                              self.tail()) from exc
        return time.monotonic() - started

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def state_disk(path: Path, size_mb: int = 64) -> Path:
    """A new, empty state disk: a raw file with an ext4 filesystem labelled appstate (no loop
    mount: ``mkfs.ext4`` on the file)."""
    if shutil.which("mkfs.ext4") is None:
        raise UserError("image: mkfs.ext4 is missing (Debian package e2fsprogs; make setup)")
    path.unlink(missing_ok=True)
    with open(path, "wb") as f:
        f.truncate(size_mb << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", guest_files.STATE_LABEL, str(path)],
                   check=True, capture_output=True)
    return path


class BootFailure(Exception):
    """The guest did not become ready; ``tail`` is the console's last lines."""

    def __init__(self, message: str, tail: str, config_error: str | None = None) -> None:
        super().__init__(message)
        self.tail = tail
        self.config_error = config_error


def boot_command(args: argparse.Namespace) -> int:
    mgmt_port = args.forward_mgmt or free_port()
    if args.state_disk is not None and not args.state_disk.exists():
        say(f"state disk {args.state_disk}: new, empty (ext4 labelled "
            f"{guest_files.STATE_LABEL})")
        state_disk(args.state_disk)
    with tempfile.TemporaryDirectory(prefix="topicwire-boot-") as tmp:
        guest = Guest(args.image, Path(tmp), args.config, mgmt_port=mgmt_port,
                      echo=bool(os.environ.get("TOPICWIRE_IMAGE_ECHO")),
                      root_bus=args.root_bus, state_drive=args.state_disk,
                      firmware=args.firmware, config_bus=args.config_bus)
        how = ("UEFI firmware (OVMF) and the image's boot loader" if args.firmware == "uefi"
               else "direct kernel boot")
        say(f"booting {args.image} under QEMU (TCG; {how}); management API at "
            f"http://127.0.0.1:{mgmt_port}")
        guest.start()
        try:
            ready = guest.wait_ready(args.timeout)
        except BootFailure as exc:
            guest.kill()
            print(exc.tail, file=sys.stderr)
            say(f"{exc} (console tail above)")
            return 2 if exc.config_error else 1
        except KeyboardInterrupt:
            guest.kill()
            raise
        print(f"image: appliance {ready['node']} (id {ready['id']}) ready {ready['ready_s']} s "
              f"after QEMU started (ready line at {ready['ready_line_s']} s; host load "
              f"{os.getloadavg()[0]:.1f}; goal {BOOT_GOAL_S:.0f} s: "
              f"{'met' if ready['ready_s'] <= BOOT_GOAL_S else 'missed'}); "
              f"http://127.0.0.1:{mgmt_port}/status", flush=True)
        if not args.stay:
            say("powering the guest off (ACPI power button)")
            seconds = guest.powerdown()
            say(f"guest off in {seconds:.1f} s")
            return 0
        try:
            say("running; Ctrl-C powers it off")
            assert guest.proc is not None
            guest.proc.wait()
        except KeyboardInterrupt:
            guest.powerdown()
        return 0
