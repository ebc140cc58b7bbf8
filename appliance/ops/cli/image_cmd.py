"""``topicwire image build|boot``: bootable appliance disk images (docs/images.md).

    topicwire image build [--role core|edge] [--out DIR]
    topicwire image boot IMAGE [--config FILE] [--forward-mgmt PORT] [--timeout S]
                               [--firmware direct|uefi] [--config-bus virtio|usb]

``build`` (as root) writes DIR/topicwire-ROLE.qcow2 with its kernel, initrd and a manifest;
one image serves every role, ``--role`` picks only the default config baked in. ``boot``
boots an image under QEMU (TCG), its config on a small disk labelled APPCFG, and waits for
the appliance's ready line on the serial console: it prints the boot-to-ready seconds, or
the console's tail and exits 1 (2 when the appliance refused its config).
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_OUT = Path(".venv/image")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``image build`` and ``image boot``."""
    parser = subparsers.add_parser("image", help="build and boot appliance disk images "
                                   "(QEMU)")
    sub = parser.add_subparsers(dest="image_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="build a bootable appliance image (as root)")
    b.add_argument("--role", choices=("core", "edge"), default="core",
                   help="the default config baked in (a config disk replaces it)")
    b.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                   help=f"where the image goes (default {DEFAULT_OUT})")
    b.set_defaults(handler=run_build)
    s = sub.add_parser("boot", help="boot an image under QEMU and wait until it is ready")
    s.add_argument("image", type=Path, metavar="IMAGE", help="the .qcow2 from image build")
    s.add_argument("--config", type=Path, metavar="FILE",
                   help="the appliance's TOML config (checked here first, then put on a "
                   "config disk with the files beside it that it names); default: the "
                   "image's own")
    s.add_argument("--forward-mgmt", type=int, default=0, metavar="PORT",
                   help="127.0.0.1:PORT on the host reaches the guest's management API "
                   "(port 8470 in the guest; 0: a free port)")
    s.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="give up when not ready after this long (default 300: TCG on a "
                   "busy host)")
    s.add_argument("--root-bus", choices=("virtio", "ahci", "nvme"), default="virtio",
                   help="attach the image as a virtio disk (default), a SATA disk on AHCI "
                   "(/dev/sda, as on bare metal) or an NVMe disk: the root is found by label")
    s.add_argument("--firmware", choices=("direct", "uefi"), default="direct",
                   help="direct: QEMU loads the kernel and initrd beside the image (default); "
                   "uefi: UEFI firmware (OVMF, Debian package ovmf) boots the disk through "
                   "its own boot loader, as bare metal does")
    s.add_argument("--config-bus", choices=("virtio", "usb"), default="virtio",
                   help="attach the config disk as a virtio disk (default) or as a USB stick "
                   "(as on bare metal)")
    s.add_argument("--state-disk", type=Path, metavar="FILE",
                   help="a raw ext4 file labelled appstate, attached read-write and mounted "
                   "at /var/lib/topicwire/state in the guest (made, empty, when missing)")
    s.add_argument("--stay", action="store_true",
                   help="once ready, keep the guest running until Ctrl-C (then power it "
                   "off cleanly)")
    s.set_defaults(handler=run_boot)
    c = sub.add_parser("compare", help="two images byte for byte; where they differ, which "
                       "ext4 blocks, inodes (and fields) and files")
    c.add_argument("a", type=Path, metavar="A", help="a .qcow2")
    c.add_argument("b", type=Path, metavar="B", help="another .qcow2")
    c.set_defaults(handler=run_compare)


def run_build(args: argparse.Namespace) -> int:
    from appliance.ops.image.build import build

    build(args.role, args.out)
    return 0


def run_boot(args: argparse.Namespace) -> int:
    from appliance.ops.image.boot import boot_command

    return boot_command(args)


def run_compare(args: argparse.Namespace) -> int:
    from appliance.ops.image.compare import compare_command

    return compare_command(args.a, args.b)
