"""The software NIC: numba kernels that execute the offload tables over bursts of frames."""

from nic_offload.softnic.layout import DescriptorKind, MessageVerdict
from nic_offload.softnic.pipeline import BurstResult, KeyCounters, SoftNic
from nic_offload.softnic.tables import SoftTables, build_tables

__all__ = [
    "BurstResult",
    "DescriptorKind",
    "KeyCounters",
    "MessageVerdict",
    "SoftNic",
    "SoftTables",
    "build_tables",
]
