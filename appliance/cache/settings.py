"""The ``[cache]`` config table and the caching engine's tunables (units in the names).

```toml
[cache]                            # optional: this appliance keeps what matches its patterns
dir = "/var/lib/topicwire/cache"   # one log per pattern under it (made if missing)
patterns = ["orders/#"]            # topic patterns (namespace 0) whose messages are kept
fsync = "batch"                    # "batch": fdatasync per batch appended; "interval": every
fsync_interval_ms = 10             #   fsync_interval_ms at most after the first unsynced one
retention_bytes = 0                # per pattern log; 0: no size limit
retention_hours = 0                # 0: no age limit
max_disk_bytes = 0                 # all the logs together; 0: no limit (else >= 4 MiB per
                                   #   pattern): the oldest segments of any log go first
acknowledge = "received"           # "persisted": a local client's guaranteed message on
                                   #   the patterns is acknowledged once on disk
```

or, at an appliance without a cache whose publishers' guaranteed messages must be on a
neighbour's disk before they are acknowledged (docs/fault-tolerance.md, "Persisted by a
neighbour's cache"):

```toml
[cache]
remote = "NEIGHBOUR"               # a [[neighbours]] name; its [cache] has acknowledge =
acknowledge = "persisted"          #   "persisted" too (required here)
```

and, beside either form or alone, the neighbour whose cache serves this appliance's clients'
replay and durable requests that no cache here keeps (docs/fault-tolerance.md, "Replay and
durable subscriptions from a neighbour's cache"; default: ``remote``, when given):

```toml
[cache]
serve_from = "NEIGHBOUR"           # a [[neighbours]] name with a [cache]
```

``appliance/config.py`` hands the raw table here; every check raises the config's own
``ConfigError`` naming the key (exit code 2 from ``topicwire run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.persistence.settings import (
    FSYNC_INTERVAL_MS,
    FSYNC_POLICIES,
    SEGMENT_BYTES,
    LogConfig,
)

MAX_CACHE_PATTERNS = 64
"""``cache.patterns`` holds at most this many: one open log each (the bound on the logs)."""
CACHE_MAX_PAYLOAD_BYTES = 32 * 1024
"""Larger messages (payload and header block) are not kept (counted ``cache_too_large``): a
replayed message travels whole in one page frame."""
CACHE_QUEUE_MESSAGES = 262_144
"""Messages received and not yet appended; more are dropped and counted
(``cache_dropped_queue_full``)."""
CACHE_APPEND_BATCH_MESSAGES = 4_096
"""Messages appended per duty cycle before a commit (the ``batch`` policy's batch)."""
REPLAY_PAGE_FRAMES = 8
"""A replay page is at most this many frames (of the client channel's frame size, 65,472
bytes with room for the session's MAC)."""
REPLAY_PAGE_BYTES = 512 * 1024
"""... and at most about this many bytes of frames (one message always)."""
REPLAY_PAGE_MESSAGES = 8_192
"""... and at most this many messages."""
REPLAY_OUTBOX_FRAMES = 64
"""A page is built only while fewer replay frames than this wait in the data path's outbox
(the frames in flight of all sessions; the rest wait as requests, each session's bounded by
``REPLAYS_PENDING_PER_SESSION``)."""
REPLAY_SCAN_RECORDS = 65_536
"""Records one page looks at (of other topics too) before it answers with what it has."""
REPLAY_READ_CHUNK_BYTES = 256 * 1024
"""A page reads its log this much at a time."""
REPLAYS_PENDING = 256
"""Replay requests waiting for the cache's thread, all sessions; more are refused (busy)."""
REPLAYS_PENDING_PER_SESSION = 4
"""... per client session."""
RELAY_CHANNEL = "neighbour"
"""Not a channel: the answers to requests a neighbour forwarded (``cache.serve_from`` there)
go to the control agent under this name (``CacheAgent.relay_out``), which sends them on the
link (appliance/control/remote_replay.py)."""
FORWARDED_PAGE_BYTES = 64 * 1024
"""A page answering a forwarded request holds about this many bytes of frames at most (one
message always): it crosses the link in parts of a frame each."""
FORWARDED_PENDING_PER_NEIGHBOUR = 64
"""Forwarded requests of one neighbour waiting for the cache's thread; one more is refused
(busy). Each of its client sessions has ``REPLAYS_PENDING_PER_SESSION`` at most, and all
requests together ``REPLAYS_PENDING``."""
FORWARDED_PARKED = 256
"""Forwarded durable requests held for new messages (all neighbours); past it a request
that finds nothing new is answered at once with an empty page (the client asks again)."""
RELAY_PAGES_WAITING = 8
"""Answers waiting for the control agent to send them on the link; no page is built while
this many wait."""
RETENTION_CHECK_INTERVAL_NS = 10_000_000_000
"""How often the logs' retention is enforced."""
MIN_SEGMENT_BYTES = 1 << 20
CACHE_IDENTITY = "$cache"
"""The identity of the appliance's own cache session (entitled by the appliance itself to
subscribe to ``cache.patterns``; it proves a password made at each start)."""
COMPONENT = "cache"
ACKNOWLEDGE_POLICIES = ("received", "persisted")
"""``cache.acknowledge``: when a local publisher's guaranteed message on the patterns is
acknowledged (docs/fault-tolerance.md, "Acknowledged once persisted")."""
STORE_RETRY_INTERVAL_NS = 1_000_000_000
"""A failed write or sync of the logs is tried again this often (with what it held)."""
CACHE_NAK_INDEX_MESSAGES = 1 << 17
"""Per (origin, publishing session): the last guaranteed messages kept whose place in the
logs NAKs served from the cache can find (appliance/cache/naks.py; a power of two, 2 MiB of
index per stream)."""
CACHE_NAK_INDEX_STREAMS = 64
"""Streams indexed at most (the oldest made goes first)."""
CACHE_NAK_QUEUE = 64
"""Requests of the data path waiting for the cache's thread; one more is refused."""
CACHE_NAK_SEQS_PER_REQUEST = 4_096
"""Messages one request may ask for (the data path asks for at most
``CACHE_NAK_MESSAGES_PER_NAK``)."""
CACHE_NAK_READ_BYTES = 1 << 20
"""Record bytes one request reads at most; the rest is refused (asked again)."""
CACHE_NAK_READ_BYTES_PER_S = 32 << 20
"""Record bytes all requests read per second at most (a token bucket of one second's worth)."""
CACHE_NAK_WAIT_NS = 200_000_000
"""A message asked for that the cache has not kept yet (above the highest of its stream) is
waited for this long (it may still be on its way), then answered as not kept."""


@dataclass(frozen=True)
class RemotePersist:
    """``[cache] remote = "NAME"`` (no cache here; the neighbour ``remote``'s cache persists
    what this appliance's publishers publish before they are acknowledged) and/or
    ``serve_from = "NAME"`` alone (no cache here; replay and durable requests go to that
    neighbour's cache)."""

    remote: str | None
    serve_from: str | None = None


SERVE_FROM_KEY = "serve_from"
"""``cache.serve_from``: the neighbour whose cache answers the replay and durable requests
this appliance's own cache cannot (none here, or a pattern outside ``cache.patterns``)."""


@dataclass(frozen=True)
class CacheSettings:
    dir: Path
    patterns: tuple[str, ...]
    fsync: str = "batch"
    fsync_interval_ms: int = FSYNC_INTERVAL_MS
    retention_bytes: int = 0
    retention_hours: int = 0
    acknowledge: str = "received"
    max_disk_bytes: int = 0
    """The bound on all the logs' segments together (0: none); past it the cache deletes the
    oldest sealed segments of any log (``CacheStore.enforce_disk_limit``)."""
    serve_from: str | None = None
    """``cache.serve_from``: the neighbour whose cache answers what this one does not keep."""

    def log_config(self) -> LogConfig:
        """How each pattern's log writes, syncs and retains. A size limit needs several
        segments (the newest is never deleted): segments are then a quarter of it, and with
        ``max_disk_bytes`` at most a quarter of its share per pattern, so the newest
        segments of every log together stay well under the bound."""
        from appliance.cache.layout import record_payload_bytes

        segment = SEGMENT_BYTES
        if self.retention_bytes:
            segment = max(MIN_SEGMENT_BYTES, min(SEGMENT_BYTES, self.retention_bytes // 4))
        if self.max_disk_bytes:
            share = self.max_disk_bytes // (4 * len(self.patterns))
            segment = max(MIN_SEGMENT_BYTES, min(segment, share))
        return LogConfig(fsync=self.fsync, fsync_interval_ms=self.fsync_interval_ms,
                         segment_bytes=segment,
                         max_payload_bytes=record_payload_bytes(CACHE_MAX_PAYLOAD_BYTES),
                         retention_max_age_ms=self.retention_hours * 3_600_000,
                         retention_max_bytes=self.retention_bytes)


def _error(key: str, what: str) -> Exception:
    from appliance.errors import ConfigError

    return ConfigError(f"{key}: {what}")


def _parse_remote(table: dict) -> RemotePersist:
    """``[cache]`` naming a neighbour's cache (``remote``): nothing is kept here, so the
    keys of a cache of its own are refused rather than ignored."""
    from appliance.config_files import show

    p = "cache."
    named = "cache.remote" if "remote" in table else "cache.serve_from alone"
    own = sorted(set(table) - {"remote", "acknowledge", SERVE_FROM_KEY})
    if own:
        raise _error(p + own[0], f"not with {named}: this appliance keeps nothing (the "
                     "neighbour's [cache] has dir, patterns and the rest)")
    serve_from = _serve_from(table)
    if "remote" not in table:
        if "acknowledge" in table:
            raise _error(p + "acknowledge", "not with cache.serve_from alone: this "
                         "appliance keeps nothing (cache.remote names a neighbour's cache "
                         "to persist for it)")
        return RemotePersist(None, serve_from)
    remote = table["remote"]
    if not isinstance(remote, str) or not remote:
        raise _error(p + "remote", f"must be the name of a neighbour (a string), not "
                     f"{show(remote)}")
    acknowledge = table.get("acknowledge")
    if acknowledge != "persisted":
        raise _error(p + "acknowledge", "must be \"persisted\" with cache.remote (what "
                     f"else the neighbour's cache would be named for), not {show(acknowledge)}")
    return RemotePersist(remote, serve_from or remote)


def _serve_from(table: dict) -> str | None:
    from appliance.config_files import show

    name = table.get(SERVE_FROM_KEY)
    if name is not None and (not isinstance(name, str) or not name):
        raise _error("cache." + SERVE_FROM_KEY, "must be the name of a neighbour with a "
                     f"[cache] (a string), not {show(name)}")
    return name


def parse_cache(table: Any, base: Path, has_client_endpoint: bool
                ) -> CacheSettings | RemotePersist | None:
    """``[cache]``; None when absent."""
    if table is None:
        return None
    from appliance.config_files import show, writable_dir
    from appliance.ops.telemetry.settings import _int, _known

    p = "cache."
    if not isinstance(table, dict):
        raise _error("cache", "must be a table ([cache])")
    if "remote" in table or (SERVE_FROM_KEY in table and not {"dir", "patterns"} & set(table)):
        return _parse_remote(table)
    _known(table, {"dir", "patterns", "fsync", "fsync_interval_ms", "retention_bytes",
                   "retention_hours", "acknowledge", "max_disk_bytes", SERVE_FROM_KEY}, p)
    serve_from = _serve_from(table)
    directory = table.get("dir")
    if not isinstance(directory, str) or not directory:
        raise _error(p + "dir", "required: the directory the cache's logs are kept in")
    path = writable_dir(directory, p + "dir", base)
    patterns = table.get("patterns")
    if patterns is None:
        raise _error(p + "patterns", "required: the topic patterns whose messages are kept, "
                     "such as [\"orders/#\"]")
    from appliance.config_files import topic_patterns

    patterns = topic_patterns(patterns, p + "patterns", MAX_CACHE_PATTERNS)
    if not patterns:
        raise _error(p + "patterns", "must not be empty: list the topic patterns to keep")
    if len(set(patterns)) != len(patterns):
        raise _error(p + "patterns", "lists a pattern twice")
    fsync = table.get("fsync", "batch")
    if fsync not in FSYNC_POLICIES:
        raise _error(p + "fsync", f"must be one of {', '.join(map(repr, FSYNC_POLICIES))}, "
                     f"not {show(fsync)}")
    interval = _int(table, "fsync_interval_ms", p, FSYNC_INTERVAL_MS, 1, 60_000)
    if "fsync_interval_ms" in table and fsync != "interval":
        raise _error(p + "fsync_interval_ms", "only for cache.fsync = \"interval\"")
    size = _int(table, "retention_bytes", p, 0, 0, 2**62)
    if 0 < size < 4 * MIN_SEGMENT_BYTES:
        raise _error(p + "retention_bytes", f"must be 0 (no limit) or at least "
                     f"{4 * MIN_SEGMENT_BYTES} (four segments of 1 MiB), not {size}")
    hours = _int(table, "retention_hours", p, 0, 0, 24 * 365 * 100)
    disk = _int(table, "max_disk_bytes", p, 0, 0, 2**62)
    least = 4 * MIN_SEGMENT_BYTES * len(patterns)
    if 0 < disk < least:
        raise _error(p + "max_disk_bytes", f"must be 0 (no limit) or at least {least} (four "
                     f"segments of 1 MiB for each of the {len(patterns)} patterns), not "
                     f"{disk}")
    acknowledge = table.get("acknowledge", "received")
    if acknowledge not in ACKNOWLEDGE_POLICIES:
        raise _error(p + "acknowledge", f"must be one of "
                     f"{', '.join(map(repr, ACKNOWLEDGE_POLICIES))}, not {show(acknowledge)}")
    if not has_client_endpoint:
        raise _error("cache", "needs clients.udp or clients.shm: the cache receives what it "
                     "keeps through a client session of the appliance's own")
    return CacheSettings(path, tuple(patterns), fsync, interval, size, hours, acknowledge,
                         disk, serve_from)
