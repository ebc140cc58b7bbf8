"""Tunables of the persistence log (units in the names), and ``LogConfig`` that carries them."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.persistence.layout import record_bytes
from datapath.errors import UserError

SEGMENT_BYTES = 64 * 1024 * 1024
"""A segment is sealed and a new one begun when the next record would pass this size."""
INDEX_INTERVAL_BYTES = 4096
"""One sparse index entry per this many bytes of records (a seek scans at most this much)."""
MAX_PAYLOAD_BYTES = 1 << 20
"""Largest payload a record may carry (a length field above it is corruption)."""
WRITE_BUFFER_BYTES = 1 << 20
"""Records are encoded into a buffer of this size and written when it fills or on commit."""
READ_CHUNK_BYTES = 4 << 20
"""Replay reads segments this much at a time."""
FSYNC_BATCH = "batch"
"""fsync policy: every ``commit()`` writes and fsyncs (durable when it returns)."""
FSYNC_INTERVAL = "interval"
"""fsync policy: ``commit()`` writes; an fsync follows at most ``fsync_interval_ms`` later
(in ``commit`` or ``do_work``, whichever runs first once it is due)."""
FSYNC_POLICIES = (FSYNC_BATCH, FSYNC_INTERVAL)
FSYNC_INTERVAL_MS = 10
RETENTION_MAX_AGE_MS = 0
"""Sealed segments whose newest record is older than this are deleted; 0: no age limit."""
RETENTION_MAX_BYTES = 0
"""Oldest sealed segments are deleted while the log is larger than this; 0: no size limit."""
MAX_LOGS_PER_STORE = 4096
"""Streams one ``LogStore`` keeps open logs for (a bound on what peers can make it grow)."""

COMPONENT = "persistence"


@dataclass(frozen=True)
class LogConfig:
    """How one log writes, syncs and retains (checked at construction)."""

    fsync: str = FSYNC_BATCH
    fsync_interval_ms: int = FSYNC_INTERVAL_MS
    segment_bytes: int = SEGMENT_BYTES
    index_interval_bytes: int = INDEX_INTERVAL_BYTES
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    retention_max_age_ms: int = RETENTION_MAX_AGE_MS
    retention_max_bytes: int = RETENTION_MAX_BYTES

    def __post_init__(self) -> None:
        if self.fsync not in FSYNC_POLICIES:
            raise UserError(f"fsync policy {self.fsync!r} unknown; use one of "
                            f"{', '.join(FSYNC_POLICIES)}", component=COMPONENT)
        for name in ("fsync_interval_ms", "segment_bytes", "index_interval_bytes",
                     "max_payload_bytes"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"{name} must be >= 1, got {getattr(self, name)}",
                                component=COMPONENT)
        for name in ("retention_max_age_ms", "retention_max_bytes"):
            if int(getattr(self, name)) < 0:
                raise UserError(f"{name} must be >= 0 (0: no limit), got "
                                f"{getattr(self, name)}", component=COMPONENT)
        if self.segment_bytes < record_bytes(self.max_payload_bytes):
            raise UserError(f"segment_bytes {self.segment_bytes} cannot hold one record of "
                            f"max_payload_bytes {self.max_payload_bytes}; raise it",
                            component=COMPONENT)
