"""The software NIC's table memory: zeroed, aligned, writable; large tables on huge pages."""

from pathlib import Path

import numpy as np
import pytest

from nic_offload.model import KeyRows
from nic_offload.softnic import layout as L
from nic_offload.softnic.memory import HUGE_PAGE_BYTES, huge_page_bytes, zeroed
from nic_offload.softnic.tables import _build_key_table

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str | None:
    """The bracketed word of the kernel's THP setting, None without THP."""
    try:
        text = THP.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")]


@pytest.mark.parametrize("n,dtype", [(3, np.int64), (1000, np.uint64),
                                      (HUGE_PAGE_BYTES // 8 + 5, np.uint64),
                                      (HUGE_PAGE_BYTES, np.uint8)])
def test_zeroed_arrays_are_zero_writable_and_aligned(n, dtype):
    a = zeroed(n, dtype)
    assert a.shape == (n,) and a.dtype == np.dtype(dtype)
    assert a.flags.writeable and not a.any()
    align = HUGE_PAGE_BYTES if a.nbytes >= HUGE_PAGE_BYTES else L.CACHE_LINE_BYTES
    assert a.ctypes.data % align == 0
    a[:] = 7
    assert int(a[-1]) == 7 and int(a.sum()) == 7 * n


@pytest.mark.skipif(thp_mode() not in ("always", "madvise"),
                    reason="the kernel's transparent huge pages are off (or absent) here")
def test_a_large_key_table_sits_on_huge_pages():
    n = 300_000
    rows = KeyRows(np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B9),
                   np.full(n, 1, np.uint8), np.zeros(n, np.uint32), np.zeros(n, np.uint16))
    slots, _, _ = _build_key_table(rows)
    assert slots.nbytes >= 4 * HUGE_PAGE_BYTES
    assert huge_page_bytes(slots) >= HUGE_PAGE_BYTES
