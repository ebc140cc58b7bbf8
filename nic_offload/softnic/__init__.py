"""The software NIC: numba kernels that execute the offload tables over bursts of frames.

``run_burst`` is the NIC's kernel itself, for other kernels that call it from their own
compiled code with ``SoftNic.burst_state()`` (it writes frames, messages and descriptors
at ``RESULT_*`` of its result array); everyone else calls ``SoftNic.process``."""

from nic_offload.softnic._kernels import _R_DESCRIPTORS as RESULT_DESCRIPTORS
from nic_offload.softnic._kernels import _R_FRAMES as RESULT_FRAMES
from nic_offload.softnic._kernels import _R_MESSAGES as RESULT_MESSAGES
from nic_offload.softnic._kernels import _run as run_burst
from nic_offload.softnic.layout import DescriptorKind, MessageVerdict
from nic_offload.softnic.pipeline import BurstResult, KeyCounters, SoftNic
from nic_offload.softnic.tables import SoftTables, build_tables

__all__ = [
    "BurstResult",
    "DescriptorKind",
    "KeyCounters",
    "MessageVerdict",
    "RESULT_DESCRIPTORS",
    "RESULT_FRAMES",
    "RESULT_MESSAGES",
    "SoftNic",
    "SoftTables",
    "build_tables",
    "run_burst",
]
