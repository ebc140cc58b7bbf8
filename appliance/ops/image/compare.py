"""``topicwire image compare A B``: are two appliance images the same bytes, and if not, which
bytes differ and what they are (docs/images.md, "Reproducibility").

Steps: the two qcow2 files byte for byte (``cmp``); else their virtual disks (``qemu-img
compare``); else both converted to raw in a temporary directory and compared in 4 KiB blocks,
each differing block classified from A's ext4 layout (``dumpe2fs``): superblock and group
descriptors, bitmaps, inode tables (then each differing 256-byte inode, its fields named and
its path found with ``debugfs ncheck``), or a file's data (``debugfs icheck`` and ``ncheck``).
No mount, no loop device.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from datapath.errors import UserError

BLOCK = 4096
INODE_FIELDS = ((0x00, "mode"), (0x02, "uid"), (0x04, "size"), (0x08, "atime"),
                (0x0C, "ctime"), (0x10, "mtime"), (0x14, "dtime"), (0x18, "gid"),
                (0x1A, "links"), (0x1C, "blocks"), (0x20, "flags"), (0x28, "block map/extents"),
                (0x64, "generation"), (0x68, "xattr block"), (0x6C, "size_high"),
                (0x74, "blocks_high etc."), (0x7C, "checksum_lo"), (0x80, "extra_isize"),
                (0x82, "checksum_hi"), (0x84, "ctime_extra"), (0x88, "mtime_extra"),
                (0x8C, "atime_extra"), (0x90, "crtime"), (0x94, "crtime_extra"),
                (0x98, "version_hi"), (0x9C, "projid"), (0xA0, "in-inode xattrs"))
SHOW = 12


def _field(offset: int) -> str:
    name = INODE_FIELDS[0][1]
    for start, field in INODE_FIELDS:
        if offset >= start:
            name = field
    return name


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if done.returncode not in (0, 1):
        raise UserError(f"image compare: {' '.join(cmd[:2])} failed: {done.stderr.strip()}")
    return done.stdout


def _layout(fs: str) -> tuple[dict[int, str], list[tuple[int, int, int]], int, int]:
    """A's metadata blocks by kind, inode tables (group, first, last block), inodes per
    group, inode size (``fs``: a file, ``FILE?offset=N`` for a partition)."""
    text = _run(["dumpe2fs", fs])
    kinds: dict[int, str] = {0: "superblock"}
    tables = []
    per_group = int(re.search(r"Inodes per group:\s+(\d+)", text).group(1))
    inode_size = int(re.search(r"Inode size:\s+(\d+)", text).group(1))
    group = -1
    for line in text.splitlines():
        if m := re.match(r"Group (\d+):", line):
            group = int(m.group(1))
        for kind, pattern in (("superblock", r"superblock at (\d+)"),
                              ("group descriptors", r"Group descriptors at (\d+)-(\d+)"),
                              ("reserved GDT", r"Reserved GDT blocks at (\d+)-(\d+)"),
                              ("block bitmap", r"Block bitmap at (\d+)"),
                              ("inode bitmap", r"Inode bitmap at (\d+)")):
            if m := re.search(pattern, line):
                first = int(m.group(1))
                last = int(m.group(2)) if m.lastindex == 2 else first
                for b in range(first, last + 1):
                    kinds[b] = kind
        if m := re.search(r"Inode table at (\d+)-(\d+)", line):
            tables.append((group, int(m.group(1)), int(m.group(2))))
    return kinds, tables, per_group, inode_size


def _differing_blocks(a: Path, b: Path) -> list[int]:
    out = []
    with open(a, "rb") as fa, open(b, "rb") as fb:
        base = 0
        while True:
            ca, cb = fa.read(BLOCK * 1024), fb.read(BLOCK * 1024)
            if not ca and not cb:
                return out
            if ca != cb:
                for i in range(0, max(len(ca), len(cb)), BLOCK):
                    if ca[i:i + BLOCK] != cb[i:i + BLOCK]:
                        out.append(base + i // BLOCK)
            base += 1024


def _paths(fs: str, inodes: list[int]) -> dict[int, str]:
    names: dict[int, str] = {}
    for i in range(0, len(inodes), 200):
        text = _run(["debugfs", "-R", "ncheck " + " ".join(map(str, inodes[i:i + 200])),
                     fs])
        for line in text.splitlines()[1:]:
            parts = line.split("\t", 1)
            if len(parts) == 2 and parts[0].strip().isdigit():
                names.setdefault(int(parts[0]), parts[1])
    return names


def _root_partition(raw: Path) -> tuple[int, int, list[tuple[int, int, str]]]:
    """(offset, size) of the root filesystem in a raw disk and the disk's other partitions
    (first byte, size, name): the GPT's partition named approot (``image build``'s layout:
    the EFI system partition, then the root), or the whole file when it has no GPT (an
    image built before the boot loader)."""
    import struct

    size = raw.stat().st_size
    with open(raw, "rb") as f:
        f.seek(512)
        header = f.read(92)
        if header[:8] != b"EFI PART":
            return 0, size, []
        entries_lba, count, entry_size = struct.unpack_from("<QII", header, 72)
        f.seek(entries_lba * 512)
        table = f.read(count * entry_size)
    parts, root = [], (0, size)
    for n in range(count):
        entry = table[n * entry_size:(n + 1) * entry_size]
        if not any(entry[:16]):
            continue
        first, last = struct.unpack_from("<QQ", entry, 32)
        name = entry[56:128].decode("utf-16-le").rstrip("\0")
        span = (first * 512, (last - first + 1) * 512)
        if name == "approot":
            root = span
        else:
            parts.append((*span, name))
    return root[0], root[1], parts


def compare(a: Path, b: Path) -> dict:
    """The comparison as a dict (``identical``: the qcow2 bytes are the same)."""
    for path in (a, b):
        if not path.exists():
            raise UserError(f"image compare: {path} does not exist")
    if subprocess.run(["cmp", "-s", str(a), str(b)]).returncode == 0:
        return {"identical": True, "qcow2": "identical bytes"}
    result: dict = {"identical": False, "qcow2": "bytes differ"}
    if shutil.which("qemu-img") is None or shutil.which("dumpe2fs") is None:
        raise UserError("image compare: qemu-img and dumpe2fs are needed (qemu-utils, "
                        "e2fsprogs)")
    if subprocess.run(["qemu-img", "compare", "-q", str(a), str(b)]).returncode == 0:
        result["virtual_disk"] = "identical (only the qcow2 container differs)"
        return result
    with tempfile.TemporaryDirectory(prefix="topicwire-compare-",
                                     dir=a.resolve().parent) as tmp:
        raws = []
        for n, path in enumerate((a, b)):
            raw = Path(tmp) / f"{n}.raw"
            subprocess.run(["qemu-img", "convert", "-O", "raw", str(path), str(raw)],
                           check=True)
            raws.append(raw)
        blocks = _differing_blocks(*raws)
        offset, length, others = _root_partition(raws[0])
        first, end = offset // BLOCK, (offset + length) // BLOCK
        by_kind: Counter[str] = Counter()
        for block in [b for b in blocks if not first <= b < end]:  # outside the root
            part = next((name for start, size, name in others
                         if start <= block * BLOCK < start + size), None)
            by_kind[f"partition {part}" if part else "partition table (GPT)"] += 1
        blocks = [b - first for b in blocks if first <= b < end]
        fs = f"{raws[0]}?offset={offset}" if offset else str(raws[0])
        kinds, tables, per_group, inode_size = _layout(fs)
        per_block = BLOCK // inode_size
        inode_fields: dict[int, set[str]] = defaultdict(set)
        data_blocks = []
        with open(raws[0], "rb") as fa, open(raws[1], "rb") as fb:
            for block in blocks:
                if block in kinds:
                    by_kind[kinds[block]] += 1
                    continue
                table = next((t for t in tables if t[1] <= block <= t[2]), None)
                if table is None:
                    data_blocks.append(block)
                    continue
                by_kind["inode table"] += 1
                fa.seek(offset + block * BLOCK)
                fb.seek(offset + block * BLOCK)
                ba, bb = fa.read(BLOCK), fb.read(BLOCK)
                for slot in range(per_block):
                    ia = ba[slot * inode_size:(slot + 1) * inode_size]
                    ib = bb[slot * inode_size:(slot + 1) * inode_size]
                    if ia != ib:
                        ino = (table[0] * per_group + (block - table[1]) * per_block
                               + slot + 1)
                        inode_fields[ino] = {_field(i) for i in range(inode_size)
                                             if ia[i] != ib[i]}
        owners: Counter[int] = Counter()
        for i in range(0, len(data_blocks), 500):
            text = _run(["debugfs", "-R", "icheck " + " ".join(map(str, data_blocks[i:i + 500])),
                         fs])
            for line in text.splitlines()[1:]:
                parts = line.split()
                if len(parts) == 2 and parts[1].isdigit():
                    owners[int(parts[1])] += 1
                elif parts:
                    by_kind["blocks of no file (free in A, or the journal)"] += 1
        names = _paths(fs, sorted(set(owners) | set(inode_fields)))
        by_dir: Counter[str] = Counter()
        for ino in owners:
            parts = names.get(ino, "?").split("/")
            by_dir["/".join(parts[:5]) if "numba" in parts else "/".join(parts[:-1]) or "/"] += 1
        field_sets = Counter(", ".join(sorted(f)) for f in inode_fields.values())
        result.update({
            "differing_blocks": len(blocks),
            "metadata_blocks": dict(by_kind),
            "inodes_differing": len(inode_fields),
            "inode_fields_differing": dict(field_sets.most_common()),
            "inodes_examples": [f"{names.get(ino, f'inode {ino}')}: "
                                f"{', '.join(sorted(fields))}"
                                for ino, fields in sorted(inode_fields.items())[:SHOW]],
            "files_with_differing_data": len(owners),
            "data_blocks_differing": sum(owners.values()),
            "files_by_directory": dict(by_dir.most_common()),
            "files_examples": [f"{names.get(ino, f'inode {ino}')}: {count} blocks"
                               for ino, count in owners.most_common(SHOW)],
        })
    return result


def compare_command(a: Path, b: Path) -> int:
    import json

    result = compare(a, b)
    print(json.dumps(result, indent=1), flush=True)
    if not result["identical"]:
        print(f"image compare: {a} and {b} differ ({result.get('qcow2')}; "
              f"{result.get('virtual_disk', 'virtual disks differ')})", file=sys.stderr)
    return 0 if result["identical"] else 1
