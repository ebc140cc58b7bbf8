"""Memory for the software NIC's large tables: zeroed arrays on huge pages.

A lookup in a key table of a million keys, and the per-key counter it bumps, each land on a
random line of tens of megabytes: with 4 KiB pages nearly every one also misses the TLB and
waits for a page walk. Hardware NIC drivers and DPDK keep such tables on huge pages; here
arrays of ``HUGE_PAGE_BYTES`` or more are anonymous mappings aligned to a huge page and
advised ``MADV_HUGEPAGE`` (transparent huge pages: the kernel backs them with 2 MiB pages
when its setting is ``always`` or ``madvise``, as on Debian, and with small pages
otherwise; the contents are the same either way). Smaller arrays are plain numpy arrays
aligned to a cache line.
"""

from __future__ import annotations

import mmap

import numpy as np

from nic_offload.softnic import layout as L

HUGE_PAGE_BYTES = 2 * 1024 * 1024
"""The x86-64 and arm64 (4 KiB granule) transparent huge page size."""


def zeroed(n: int, dtype: np.dtype | type) -> np.ndarray:
    """A zeroed, writable 1-D array of ``n`` items starting on a cache line (on a huge page
    when it is at least ``HUGE_PAGE_BYTES``; see the module docstring)."""
    dtype = np.dtype(dtype)
    nbytes = n * dtype.itemsize
    if nbytes >= HUGE_PAGE_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
        area = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES,
                         flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        area.madvise(mmap.MADV_HUGEPAGE)
        raw = np.frombuffer(area, np.uint8)  # keeps the mapping alive
        align = HUGE_PAGE_BYTES
    else:
        raw = np.zeros(nbytes + L.CACHE_LINE_BYTES, np.uint8)
        align = L.CACHE_LINE_BYTES
    skip = -raw.ctypes.data % align
    return raw[skip : skip + nbytes].view(dtype)


def huge_page_bytes(array: np.ndarray) -> int:
    """Bytes of the mapping that holds ``array``'s first byte which the kernel backs with
    huge pages now (``AnonHugePages`` in /proc/self/smaps; 0 where that is not readable)."""
    address = array.ctypes.data
    inside = False
    try:
        text = open("/proc/self/smaps").read()
    except OSError:
        return 0
    for line in text.splitlines():
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1]) * 1024
    return 0
