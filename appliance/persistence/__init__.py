"""Persistence: an append-only log per stream in checksummed segment files (``StreamLog``).

The storage of the caching engine (issue 21; appliance/cache/ keeps one log per ``[cache]``
pattern in it). Layout in layout.py, tunables in settings.py, kernels in _kernels.py;
docs/fault-tolerance.md.
"""

from appliance.persistence.log import LogCounters, ReplayBatch, StreamLog
from appliance.persistence.settings import FSYNC_BATCH, FSYNC_INTERVAL, LogConfig

__all__ = ["FSYNC_BATCH", "FSYNC_INTERVAL", "LogConfig", "LogCounters", "ReplayBatch",
           "StreamLog"]
