"""Telemetry and route-selection tunables (units in the names; docs/routing.md).

The latency bucket layout (``LATENCY_UNIT_NS``, ``LATENCY_SUB_BUCKETS``,
``LATENCY_OCTAVES``) is part of the stored format: windows written with one layout must be
read with the same one, so these three do not change without a new column name.
"""

from __future__ import annotations

# --- windows (appliance side) ----------------------------------------------------------------
WINDOW_NS = 1_000_000_000
"""Length of one telemetry window (config key ``telemetry.window_ms``), aligned on the wall
clock (a window starts at a multiple of it)."""
LATENCY_UNIT_NS = 64
"""Width of the finest latency bucket (a power of two): [0, 1024 ns) in 64 ns steps."""
LATENCY_SUB_BUCKETS = 16
"""Linear buckets per octave (a power of two): a bucket is at most 1/16 of its lower edge."""
LATENCY_OCTAVES = 26
"""Octaves above the linear range: the last bucket ends at 1024 ns * 2**26 (68.7 s);
larger latencies are counted in ``lat_overflow``."""
LATENCY_BUCKETS = LATENCY_SUB_BUCKETS * (LATENCY_OCTAVES + 1)
"""Buckets of the layout (432)."""
RECORDER_MAX_PEERS = 256
"""Peers one channel's recorder tracks (a power of two); frames of further peers are counted
in ``WindowRecorder.untracked_frames``."""
PROBE_STREAM_ID = 0x7FFF_FFFF
"""``stream_id`` of a probe frame (a DATA frame with no messages and a u64 sequence as its
body): the plain stream id no client session ever gets."""
PROBE_BODY_BYTES = 8
"""A probe frame's body: its per-(sender, receiver) sequence number, u64 big-endian."""
PROBE_RESTART_GAP = 1 << 20
"""A probe sequence this far below the expected one means the sender restarted."""

# --- writing -------------------------------------------------------------------------------
WRITER_QUEUE_WINDOWS = 65_536
"""Windows (rows) the writer's queue holds; a window offered to a full queue is dropped and
counted (``TelemetryWriter.dropped_windows``): the data path never waits for the disk."""
WRITER_FLUSH_INTERVAL_NS = 1_000_000_000
"""The writer writes what is queued at least this often (one Parquet file per flush and
hour partition)."""
WRITER_IDLE_SLEEP_NS = 20_000_000
"""The writer agent's sleep when idle."""
RETENTION_NS = 24 * 3600 * 1_000_000_000
"""Telemetry older than this is deleted, whole hour partitions at a time
(``telemetry.retention_hours``)."""
PRUNE_INTERVAL_NS = 60 * 1_000_000_000
"""How often the writer applies the retention."""
TEMP_FILE_MAX_AGE_NS = 3600 * 1_000_000_000
"""A temporary file this old is a crashed writer's leftover: the retention removes it."""

# --- the route job -------------------------------------------------------------------------
EVAL_WINDOW_NS = 60 * 1_000_000_000
"""Evaluation window of the route job (``--window``): telemetry windows are merged per path
over it, and every evaluation window gets one route decision."""
HYSTERESIS_MARGIN = 0.2
"""A new path must cost at most (1 - margin) x the current path's cost (``--margin``)."""
HYSTERESIS_WINDOWS = 3
"""... in this many consecutive evaluation windows before the route changes (``--k``)."""
HYSTERESIS_MIN_GAIN = 50.0
"""... and at least this much cheaper in cost units (microseconds of weighted latency,
``--min-gain``): on fast links a busy host's jitter can make one path look several times
another's for a while, which the relative margin alone would take for a better route."""
COST_WEIGHTS = {
    "p50_us": 1.0,
    "p99_us": 0.5,
    "p999_us": 0.25,
    "jitter_us": 1.0,
    "loss": 100_000.0,
    "retransmit_rate": 0.0,
    "hop_us": 1.0,
}
"""Weights of the link cost (docs/routing.md, "The cost model"); ``loss`` is in microseconds
per unit of loss fraction (1 % loss costs 1,000 us), ``retransmit_rate`` in microseconds per
retransmitted message per second, ``hop_us`` a constant per link (``--weight NAME=VALUE``)."""
LATENESS_NS = 2 * 1_000_000_000
"""An evaluation window is decided once the newest telemetry has passed its end by this much
(``--lateness``): appliances write every second, so the windows of every path are in by then;
a window that is still filling would lack links and move routes for nothing."""
MIN_LATENCY_SAMPLES = 1
"""A link enters an evaluation window's graph only with at least this many latency samples in
it (no samples: no telemetry, so no route over it)."""
FOLLOW_TRIGGER_S = 1.0
"""Micro-batch interval of ``routes compute --follow``."""
FOLLOW_MAX_WINDOWS = 1_440
"""Evaluation windows ``--follow`` keeps (a day of 60 s windows); older ones are forgotten and
the selector's replay starts from the oldest kept."""
